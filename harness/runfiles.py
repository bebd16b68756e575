"""The files a run leaves in its directory, read back for the report's trajectory pages and for
the export, and the run's timeline: tool calls with the fault injections and the agent's own
events interleaved at the step where they happened.

A run directory (``results/runs/CAMPAIGN/SETTING/vN/``, :func:`harness.run.execute_run`) holds
``trajectory.jsonl`` (every tool call, recorded by the ANI server), ``verdicts.json`` (every verdict
of the observer: the task's test cases first, then the damage checks), ``agent.json`` (what the
agent said about itself: tokens, mode, stop reason, events), ``hai.json`` (the request: prompt and
files), ``tools.json`` (the server's instructions and tools) and, for the noisy agent,
``mistakes.json`` (the mistakes it made, :data:`harness.agents.mistakes.MISTAKES_FILE`). Runs stored
before some of these files existed lack them: every reader says what is missing instead of failing.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

__all__ = ["RunFiles", "TimelineEntry", "load_run_files", "timeline"]


@dataclass
class RunFiles:
    """What a run directory holds (empty where a file is missing; ``missing`` names those)."""

    run_dir: Path | None
    calls: list[dict[str, Any]] = field(default_factory=list)
    verdicts: list[dict[str, Any]] = field(default_factory=list)
    agent: dict[str, Any] = field(default_factory=dict)
    hai: dict[str, Any] | None = None
    tools: dict[str, Any] | None = None
    mistakes: Path | None = None
    """The noisy agent's ``mistakes.json`` when the run has one (other agents write none: not missing)."""
    missing: list[str] = field(default_factory=list)


def load_run_files(trajectory_path: str | None) -> RunFiles:
    """Read the files of the run whose trajectory is ``trajectory_path`` (its directory holds the
    others). Never raises: an unreadable or missing file is listed in ``missing``. Text that is not
    valid Unicode (a lone surrogate a model wrote, kept as a ``\\udXXX`` escape in a JSON file) is
    read as its escape (:func:`servers.common.recorder.valid_unicode`), so that every reader can
    write what it read as UTF-8."""
    from harness.agents.mistakes import MISTAKES_FILE
    from harness.run import AGENT_FILE, HAI_FILE, TOOLS_FILE, VERDICTS_FILE
    from servers.common import read_trajectory
    from servers.common.recorder import valid_unicode

    if not trajectory_path:
        return RunFiles(None, missing=["trajectory (the run recorded none)"])
    path = Path(trajectory_path)
    out = RunFiles(path.parent)
    try:
        out.calls = sorted(valid_unicode(read_trajectory(path)), key=lambda c: c.get("seq", 0))
    except (OSError, ValueError) as e:
        out.missing.append(f"{path.name} ({e})")

    def read(name: str) -> Any:
        try:
            return valid_unicode(json.loads((path.parent / name).read_text(encoding="utf-8")))
        except (OSError, ValueError) as e:
            out.missing.append(f"{name} ({getattr(e, 'strerror', None) or e})")
            return None

    out.verdicts = read(VERDICTS_FILE) or []
    out.agent = read(AGENT_FILE) or {}
    out.hai = read(HAI_FILE)
    out.tools = read(TOOLS_FILE)
    if (path.parent / MISTAKES_FILE).is_file():
        out.mistakes = path.parent / MISTAKES_FILE
    return out


@dataclass(frozen=True)
class TimelineEntry:
    """One line of a run's timeline.

    ``kind`` is ``call`` (a tool call; ``data`` is its trajectory record), ``fault`` (a fault
    injected, cleared, or failed to inject/clear; ``data`` is the injector's event) or ``agent``
    (something the agent did that the server does not see; ``data`` is the event). ``step`` is the
    call's sequence number, the step a fault event was logged at (it happened before that call),
    or the number of calls the agent had made when it noted the event.
    """

    kind: Literal["call", "fault", "agent"]
    step: int | None
    data: dict[str, Any]


def timeline(calls: list[dict[str, Any]], faults: list[dict[str, Any]],
             events: list[dict[str, Any]]) -> list[TimelineEntry]:
    """Interleave a run's tool calls, fault events and agent events in the order they happened.

    The injector acts before the k-th call (``step`` k, :class:`substrate.faults.FaultEvent`) and
    the agent notes an event after its k-th call (``step`` k), so between calls k and k+1 come the
    agent's events of step k, then the fault events of step k+1. Fault events without a step (the
    final clearing) or past the last call come last.

    Args:
        calls: trajectory records (each with ``seq``), any order.
        faults: the run record's fault events, in the order they were logged.
        events: the agent's events (``AgentOutcome.events``), in order.

    Returns:
        The entries in time order.
    """
    seqs = [c.get("seq", 0) for c in calls]
    last = max(seqs, default=0)
    keyed: list[tuple[tuple[int, int], TimelineEntry]] = []
    for c, seq in zip(calls, seqs, strict=True):
        keyed.append(((seq, 1), TimelineEntry("call", seq, c)))
    for e in events:  # after the call of its step
        step = e.get("step")
        keyed.append(((min(step, last) if isinstance(step, int) else last, 2), TimelineEntry("agent", step, e)))
    for f in faults:  # before the call of its step, after the agent's events of the step before
        step = f.get("step")
        keyed.append(((min(step - 1, last) if isinstance(step, int) else last, 3), TimelineEntry("fault", step, f)))
    keyed.sort(key=lambda k: k[0])  # stable: events of one place keep their logged order
    return [entry for _, entry in keyed]
