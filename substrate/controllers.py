"""Controller processes of a lab: long-running helpers bound to one lab and one owner process
(A3-R's reconciler, issue 13). Each writes ``<lab dir>/controllers/<name>.json`` (its pid and start
time, its owner's pid and start time); it exits by itself when its owner dies or the lab directory
goes, and :func:`stop_all` (called by :meth:`substrate.lab.Lab.destroy` and by ``harness lab
cleanup`` for a lab whose owner is gone) ends any that is left.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from pathlib import Path
from typing import Any

from substrate.record import pid_alive, pid_start

DIR = "controllers"
#: Bound on the wait for a controller to die after SIGKILL (seconds; a loaded machine may take a moment to schedule it).
KILL_WAIT_S = 10.0


def _dir(lab_dir: Path | str) -> Path:
    return Path(lab_dir) / DIR


def register(lab_dir: Path | str, name: str, owner_pid: int) -> None:
    """Record the calling process as controller ``name`` of the lab, owned by ``owner_pid``."""
    d = _dir(lab_dir)
    d.mkdir(parents=True, exist_ok=True)
    info = {"pid": os.getpid(), "start": pid_start(os.getpid()), "owner_pid": owner_pid, "owner_start": pid_start(owner_pid)}
    tmp = d / f".{name}.json.tmp"
    tmp.write_text(json.dumps(info))
    tmp.replace(d / f"{name}.json")


def info(lab_dir: Path | str, name: str) -> dict[str, Any] | None:
    """The record of a running controller ``name``, or None (none, or it died)."""
    try:
        data = json.loads((_dir(lab_dir) / f"{name}.json").read_text())
    except (OSError, ValueError):
        return None
    return data if pid_alive(int(data.get("pid", 0)), int(data.get("start", 0))) else None


def owner_alive(data: dict[str, Any]) -> bool:
    return pid_alive(int(data.get("owner_pid", 0)), int(data.get("owner_start", 0)))


def signal_controller(lab_dir: Path | str, name: str, sig: int = signal.SIGUSR1) -> bool:
    """Send ``sig`` to a running controller; whether one ran."""
    data = info(lab_dir, name)
    if data is None:
        return False
    with contextlib.suppress(ProcessLookupError):
        os.kill(int(data["pid"]), sig)
    return True


def stop(lab_dir: Path | str, name: str, *, timeout_s: float = 5.0) -> bool:
    """Stop controller ``name`` (SIGTERM, then SIGKILL after ``timeout_s``); whether one ran."""
    return stop_waiting(lab_dir, name, timeout_s=timeout_s)[0]


def stop_waiting(lab_dir: Path | str, name: str, *, timeout_s: float) -> tuple[bool, bool, float]:
    """Stop controller ``name``: SIGTERM, a wait of up to ``timeout_s`` seconds for it to exit by
    itself (a controller ends its step first: A3-R's reconciler finishes its transaction), then
    SIGKILL. Returns ``(ran, exited by itself within the bound, seconds waited)``."""
    data = info(lab_dir, name)
    with contextlib.suppress(OSError):
        (_dir(lab_dir) / f"{name}.json").unlink()
    if data is None:
        return False, True, 0.0
    pid, start = int(data["pid"]), int(data.get("start", 0))
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    t0 = time.monotonic()
    while pid_alive(pid, start) and time.monotonic() - t0 < timeout_s:
        time.sleep(0.05)  # poll interval while it finishes its step
    waited = time.monotonic() - t0
    if pid_alive(pid, start):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + KILL_WAIT_S
        while pid_alive(pid, start) and time.monotonic() < deadline:
            time.sleep(0.05)  # poll interval: SIGKILL takes effect when the process next runs
        return True, False, waited
    return True, True, waited


def stop_all(lab_dir: Path | str, *, orphans_only: bool = False) -> int:
    """Stop every controller of the lab (only those whose owner died, with ``orphans_only``).
    Returns how many were stopped."""
    n = 0
    for p in sorted(_dir(lab_dir).glob("*.json")):
        data = info(lab_dir, p.stem)
        if data is None:
            with contextlib.suppress(OSError):
                p.unlink()
            continue
        if orphans_only and owner_alive(data):
            continue
        n += stop(lab_dir, p.stem)
    return n
