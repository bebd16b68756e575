"""Unit tests of harness.metrics (NetConfArena III-D process metrics) on hand-made trajectories."""

from __future__ import annotations

from typing import Any

import pytest

from harness.metrics import config_attempted, error_action_rate, repeat_action_rate, submitted


def call(kind: str, tool: str = "t", args: Any = None, is_error: bool = False) -> dict[str, Any]:
    return {"tool": tool, "arguments": args if args is not None else {}, "is_error": is_error, "kind": kind}


def test_error_action_rate_counts_only_config_and_validation() -> None:
    calls = [
        call("read", "get_config", is_error=True),  # a failed read is not an action error
        call("config", "apply", {"c": "a"}, is_error=True),
        call("config", "apply", {"c": "b"}),
        call("validation", "ping", {"to": "h1"}, is_error=True),
        call("validation", "ping", {"to": "h2"}),
        call("wait", "wait", is_error=True),
        call("submit", "submit"),
    ]
    assert error_action_rate(calls) == pytest.approx(2 / 4)


def test_rates_are_undefined_without_actions() -> None:
    calls = [call("read"), call("wait"), call("submit")]
    assert error_action_rate(calls) is None
    assert repeat_action_rate(calls) is None
    assert error_action_rate([]) is None


def test_repeat_action_rate_consecutive_identical() -> None:
    calls = [
        call("config", "apply", {"c": "x", "dev": "r1"}),
        call("config", "apply", {"dev": "r1", "c": "x"}),  # same arguments, other key order: repeat
        call("config", "apply", {"dev": "r1", "c": "x"}),  # repeat again
        call("config", "apply", {"dev": "r2", "c": "x"}),  # other arguments
        call("validation", "apply", {"dev": "r2", "c": "x"}),  # same tool+args, kind irrelevant: repeat
        call("wait", "wait", {"s": 1}),
        call("validation", "ping", {"to": "h1"}),
        call("wait", "wait", {"s": 1}),  # a repeated wait is not counted (not an action)
        call("validation", "ping", {"to": "h1"}),  # polling after a wait: not consecutive
        call("read", "get_config", {}),
        call("read", "get_config", {}),
    ]
    # actions: 7 (indices 0-4, 6, 8); repeats: 1, 2, 4
    assert repeat_action_rate(calls) == pytest.approx(3 / 7)


def test_a_read_before_an_identical_action_is_not_a_repeat() -> None:
    calls = [call("read", "show", {"x": 1}), call("validation", "show", {"x": 1})]
    assert repeat_action_rate(calls) == 0.0
    calls = [call("validation", "show", {"x": 1}), call("validation", "show", {"x": 1})]
    assert repeat_action_rate(calls) == 0.5


def test_config_attempted_and_submitted() -> None:
    assert not config_attempted([call("read"), call("validation"), call("submit")])
    assert config_attempted([call("config", is_error=True)])  # a rejected attempt is an attempt
    assert submitted([call("read"), call("submit")])
    assert not submitted([call("submit", is_error=True)])  # a rejected submit is not a submission
    assert not submitted([])


def test_unknown_kind_raises() -> None:
    with pytest.raises(ValueError, match="unknown call kind"):
        error_action_rate([call("configure")])
    with pytest.raises(KeyError):
        repeat_action_rate([{"tool": "x", "arguments": {}, "is_error": False}])


def test_a_dry_run_refusal_is_not_an_error_action_at_any_level() -> None:
    """harness.metrics' table (issue 19): the same rule at every level -- a refused change is an
    error action; a dry run (A3-T/A4 plan_change_set, A2 validate) saying it would be refused is
    the dry run's result."""
    from harness.metrics import DRY_RUN_TOOLS, error_action

    assert {"plan_change_set", "validate"} == DRY_RUN_TOOLS
    a3t = [call("validation", "plan_change_set", is_error=True), call("config", "apply_change_set", is_error=True),
           call("config", "apply_change_set")]
    a2 = [call("config", "edit_config"), call("validation", "validate", is_error=True), call("config", "commit", is_error=True)]
    a1 = [call("validation", "execute_validation", is_error=True), call("config", "apply_config")]
    assert error_action_rate(a3t) == pytest.approx(1 / 3)
    assert error_action_rate(a2) == pytest.approx(1 / 3)
    assert error_action_rate(a1) == pytest.approx(1 / 2)  # A1 has no dry run: a refused check counts
    assert not error_action(a3t[0]) and error_action(a3t[1])
