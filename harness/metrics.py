"""Process metrics of one run, computed from its trajectory (pure functions).

Definitions follow NetConfArena, section III-D ("Process-level evaluation", action quality and
completion mode). A trajectory is the list of tool calls recorded by the ANI server, in order; each
call is a dict with at least:

- ``tool``: the tool name;
- ``arguments``: its arguments (any JSON value);
- ``is_error``: whether the device or environment rejected the call;
- ``refused`` (optional): set when the server refused the call without executing it (budget
  spent, episode ended); such calls are not actions;
- ``kind``: one of :data:`KINDS` -- ``config`` (changes configuration), ``validation`` (a check the
  agent runs: ping, show, plan/dry-run), ``read`` (configuration retrieval), ``wait``, ``submit``,
  ``other``.

Each call is one turn (an agent that issues several tool calls in one model turn is counted once
per call: the server sees calls, not model turns).

What counts as an error action (issue 19: one table, applied the same way to every level). The
rule: a configuration or validation action the device or environment refused to carry out, in
whole or in part -- the call was answered with an error, or a device refused one of its commands
(``is_error``) -- except the answer of a dry run (:data:`DRY_RUN_TOOLS`): a dry run exists to
find what would be refused before anything is applied, so its "this change would be refused"
is its result, as a failed ping is a ping's result; counting it would make a level that offers
a dry run look worse for using it. Per level:

=====  ===============================================  ==============================================
level  error actions                                    not error actions
=====  ===============================================  ==============================================
A0     run_shell of a configuration command that        run_shell of a read-only command whose answer
       exits non-zero; any command the shell could not  is negative (a ping without reply, grep
       run (126/127) or FRR refused (``% Unknown        finding nothing): servers.a0_shell.classify
       command`` ...)
A1     apply_config or execute_validation with a        --
       command the grammar or the device refused (in
       whole or in part)
A2     edit_config, commit, lock... answered with an    validate (a dry run of the candidate) finding
       rpc-error                                        the candidate invalid
A3-T   apply_change_set refused or rolled back          plan_change_set (the dry run) refusing the
                                                        change set
A4     as A3-T                                          as A3-T
A3-R   write/patch/delete_record or commit refused      --
=====  ===============================================  ==============================================

Reads, waits and submit are never actions (:data:`ACTION_KINDS`); nor are calls the server
refused unexecuted (budget spent, episode ended).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["ACTION_KINDS", "DRY_RUN_TOOLS", "KINDS", "config_attempted", "error_action", "error_action_rate",
           "repeat_action_rate", "submitted"]

#: The kinds of call a trajectory may contain.
KINDS = frozenset({"config", "validation", "read", "wait", "submit", "other"})
#: The kinds that NetConfArena's action-quality metrics count: configuration and validation actions.
ACTION_KINDS = frozenset({"config", "validation"})
#: Dry-run tools (validation kind): their refusal is their finding, never an error action (module
#: docstring's table): A3-T/A4 ``plan_change_set``, A2 ``validate``.
DRY_RUN_TOOLS = frozenset({"plan_change_set", "validate"})

Call = Mapping[str, Any]


def _kind(call: Call) -> str:
    kind: str = call["kind"]
    if kind not in KINDS:
        raise ValueError(f"unknown call kind {kind!r} (tool {call.get('tool')!r}); expected one of {sorted(KINDS)}")
    return kind


def _actions(calls: Sequence[Call]) -> list[int]:
    # calls the server refused without executing (step budget spent, episode ended) were never
    # parsed nor sent to a device: they are not actions (NetConfArena counts "parsed" actions)
    return [i for i, c in enumerate(calls) if _kind(c) in ACTION_KINDS and not c.get("refused")]


def _same_action(a: Call, b: Call) -> bool:
    def key(c: Call) -> tuple[str, str]:
        return (c["tool"], json.dumps(c.get("arguments"), sort_keys=True, default=str))

    return key(a) == key(b)


def error_action(call: Call) -> bool:
    """Whether one action is an error action (module docstring's table): ``is_error``, unless it
    is a dry run's (:data:`DRY_RUN_TOOLS`) answer.

    Raises:
        KeyError: The call lacks ``kind``.
        ValueError: The call has an unknown ``kind``.
    """
    if _kind(call) == "validation" and call.get("tool") in DRY_RUN_TOOLS:
        return False
    return bool(call.get("is_error"))


def error_action_rate(calls: Sequence[Call]) -> float | None:
    """Fraction of configuration and validation actions rejected by the device or environment.

    Source: NetConfArena III-D, "the explicit error-action rate counts parsed configuration or
    validation actions that are rejected by the device or environment".

    Args:
        calls: The run's trajectory (see the module docstring).

    Returns:
        ``rejected / actions`` over calls of kind ``config`` or ``validation``, where rejected means
        :func:`error_action` (``is_error``, except a dry run's refusal); ``None`` when the run issued no such action (the rate is undefined, and a
        report averages only over the runs that define it).

    Raises:
        KeyError: A call lacks ``kind``.
        ValueError: A call has an unknown ``kind``.
    """
    idx = _actions(calls)
    if not idx:
        return None
    return sum(1 for i in idx if error_action(calls[i])) / len(idx)


def repeat_action_rate(calls: Sequence[Call]) -> float | None:
    """Fraction of configuration and validation actions that repeat the previous turn identically.

    Source: NetConfArena III-D, "the repeat-action rate counts consecutive turns that issue
    identical configuration or validation actions". Our reading: an action repeats when the call in
    the immediately preceding turn has the same tool and the same arguments (compared as canonical
    JSON) and is itself a configuration or validation action. A check repeated after a ``wait``
    or a read is therefore not a repeat (polling is legitimate). The rate uses the same
    denominator as :func:`error_action_rate`.

    Args:
        calls: The run's trajectory (see the module docstring).

    Returns:
        ``repeats / actions`` over calls of kind ``config`` or ``validation``; ``None`` when the run
        issued no such action.

    Raises:
        KeyError: A call lacks ``kind`` or ``tool``.
        ValueError: A call has an unknown ``kind``.
    """
    idx = _actions(calls)
    if not idx:
        return None
    actions = set(idx)
    repeats = sum(1 for i in idx if i - 1 in actions and _same_action(calls[i], calls[i - 1]))
    return repeats / len(idx)


def config_attempted(calls: Sequence[Call]) -> bool:
    """Whether the run made any configuration attempt (a ``config`` call, accepted or rejected).

    Source: NetConfArena III-D, early submission is "a submit action issued with no configuration
    attempt over the entire run".

    Raises:
        KeyError: A call lacks ``kind``.
        ValueError: A call has an unknown ``kind``.
    """
    return any(_kind(c) == "config" for c in calls)


def submitted(calls: Sequence[Call]) -> bool:
    """Whether the agent submitted: a ``submit`` call that the server accepted (not ``is_error``).

    Raises:
        KeyError: A call lacks ``kind``.
        ValueError: A call has an unknown ``kind``.
    """
    return any(_kind(c) == "submit" and not c.get("is_error") for c in calls)
