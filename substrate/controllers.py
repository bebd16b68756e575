"""Controller processes of a lab: long-running helpers bound to one lab and one owner process
(A3-R's reconciler, issue 13). Each writes ``<lab dir>/controllers/<name>.json`` (its pid and start
time, its owner's pid and start time); it exits by itself when its owner dies or the lab directory
goes, and :func:`stop_all` (called by :meth:`substrate.lab.Lab.destroy` and by ``harness lab
cleanup`` for a lab whose owner is gone) ends any that is left.

A stop is graceful: SIGTERM, then a wait for the controller to finish the step in progress (A3-R's
reconciler: its reconcile, whose transactions hold device configuration locks) for as long as the
controller said such a step may take when it registered (``stop_timeout_s``, derived from its own
timeouts), and only then SIGKILL. A controller killed that way may leave its step half-done: when
it registered a recovery command (``recover``), :func:`stop_all` runs it (bounded) to finish or undo
what it left (A3-R: the journaled transaction, :meth:`servers.a3_intent.transaction.Engine.recover_at_start`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

from substrate.record import pid_alive, pid_start

DIR = "controllers"
#: Bound on the wait for a controller to die after SIGKILL (seconds; a loaded machine may take a moment to schedule it).
KILL_WAIT_S = 10.0
#: Bound on the wait, after SIGTERM, for a controller that registered none of its own (seconds).
DEFAULT_STOP_TIMEOUT_S = 5.0
#: Bound on a recovery command of a controller that registered none of its own (seconds).
DEFAULT_RECOVER_TIMEOUT_S = 300.0

log = logging.getLogger("anibench.controllers")


def _dir(lab_dir: Path | str) -> Path:
    return Path(lab_dir) / DIR


def register(lab_dir: Path | str, name: str, owner_pid: int, *, stop_timeout_s: float = DEFAULT_STOP_TIMEOUT_S,
             recover: list[str] | None = None, recover_cwd: str | None = None,
             recover_timeout_s: float = DEFAULT_RECOVER_TIMEOUT_S) -> None:  # fmt: skip
    """Record the calling process as controller ``name`` of the lab, owned by ``owner_pid``.

    Args:
        stop_timeout_s: how long, after SIGTERM, it may take to finish its step in progress and
            exit (seconds): what :func:`stop_all` waits before SIGKILL.
        recover: a command (argv, run on the host in ``recover_cwd``) that finishes or undoes
            what the controller leaves when it is killed mid-step; :func:`stop_all` runs it after
            a kill, for at most ``recover_timeout_s`` seconds. None: nothing to recover.
    """
    d = _dir(lab_dir)
    d.mkdir(parents=True, exist_ok=True)
    info = {"pid": os.getpid(), "start": pid_start(os.getpid()), "owner_pid": owner_pid, "owner_start": pid_start(owner_pid),
            "stop_timeout_s": float(stop_timeout_s), "recover": list(recover) if recover else None, "recover_cwd": recover_cwd,
            "recover_timeout_s": float(recover_timeout_s)}  # fmt: skip
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


def stop(lab_dir: Path | str, name: str, *, timeout_s: float | None = None, recover: bool = True) -> bool:
    """Stop controller ``name`` (SIGTERM, then SIGKILL after ``timeout_s``, default the bound it
    registered; after a kill its recovery command runs when ``recover``, see :func:`stop_all`);
    whether one ran."""
    data = info(lab_dir, name)
    if data is None:
        stop_waiting(lab_dir, name, timeout_s=0.0)  # drops a stale record
        return False
    bound = float(timeout_s if timeout_s is not None else data.get("stop_timeout_s") or DEFAULT_STOP_TIMEOUT_S)
    ran, finished, _waited = stop_waiting(lab_dir, name, timeout_s=bound)
    if ran and not finished:
        log.warning("controller %s of %s did not stop within %.0f s of SIGTERM and was killed", name, lab_dir, bound)
        if recover:
            run_recovery(data, name)
    return ran


def run_recovery(data: dict[str, Any], name: str = "controller") -> str | None:
    """Run the recovery command a killed controller registered (``data``: its record, read
    before the kill), bounded by its ``recover_timeout_s``. Returns None when it succeeded or
    there is none, else what went wrong (also logged)."""
    argv = data.get("recover")
    if not argv:
        return None
    timeout = float(data.get("recover_timeout_s") or DEFAULT_RECOVER_TIMEOUT_S)
    try:
        r = subprocess.run(argv, cwd=data.get("recover_cwd") or None, capture_output=True, text=True, timeout=timeout,
                           stdin=subprocess.DEVNULL, check=False)  # fmt: skip
    except subprocess.TimeoutExpired:
        why = f"the recovery of killed controller {name} did not end within {timeout:g} s"
    except OSError as e:
        why = f"the recovery of killed controller {name} could not start: {e}"
    else:
        if r.returncode == 0:
            log.warning("controller %s killed; recovery: %s", name, (r.stdout.strip() or "nothing to recover")[-600:])
            return None
        why = f"the recovery of killed controller {name} failed ({r.returncode}): {(r.stderr or r.stdout).strip()[-600:]}"
    log.error("%s", why)
    return why


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


def stop_all(lab_dir: Path | str, *, orphans_only: bool = False, recover: bool = True) -> int:
    """Stop every controller of the lab (only those whose owner died, with ``orphans_only``),
    gracefully (:func:`stop`: SIGTERM, a wait of up to the bound each registered for its step in
    progress, then SIGKILL); after a kill, the controller's recovery command runs when
    ``recover`` (False: the lab is being destroyed, nothing is left to be half-applied).
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
        n += stop(lab_dir, p.stem, recover=recover)
    return n
