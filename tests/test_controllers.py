"""Stopping a lab's controllers (substrate/controllers.py, issue 13): graceful -- the step in
progress is waited for, for as long as the controller registered it may take -- and a controller
killed past that bound has its recovery command run. Real processes, no lab."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from substrate import controllers
from substrate.record import pid_alive

#: A controller: registers (bound and recovery command from argv), then on SIGTERM finishes its
#: "step" (a sleep of STEP seconds, the stand-in for a transaction) before it writes ``finished``
#: and exits. Recovery writes ``recovered ARGS``.
FAKE = r"""
import os, signal, sys, threading, time
from pathlib import Path
from substrate import controllers
lab, bound, step = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
stop = threading.Event()
signal.signal(signal.SIGTERM, lambda *_: stop.set())
rec = [sys.executable, "-c", "import sys; open(sys.argv[1], 'w').write('recovered ' + sys.argv[2])", f"{lab}/recovered", "x"]
controllers.register(lab, "fake", os.getppid(), stop_timeout_s=bound, recover=rec, recover_timeout_s=30)
stop.wait()
time.sleep(step)  # the step in progress when the stop came
Path(lab, "finished").write_text("yes")
"""


def start(lab: Path, bound: float, step: float) -> subprocess.Popen[bytes]:
    root = str(Path(__file__).resolve().parents[1])
    p = subprocess.Popen([sys.executable, "-c", FAKE, str(lab), str(bound), str(step)], cwd=root,
                         env={**os.environ, "PYTHONPATH": root})  # fmt: skip
    deadline = time.monotonic() + 30
    while controllers.info(lab, "fake") is None:
        assert p.poll() is None and time.monotonic() < deadline, "the fake controller did not register"
        time.sleep(0.05)  # poll interval
    return p


def test_stop_all_waits_for_the_step_in_progress(tmp_path: Path) -> None:
    """A controller whose step outlasts the default bound (the old fixed 5 s kill) but not its own
    registered bound finishes it and exits by itself; nothing is recovered."""
    p = start(tmp_path, bound=60.0, step=controllers.DEFAULT_STOP_TIMEOUT_S + 1.0)
    try:
        t0 = time.monotonic()
        assert controllers.stop_all(tmp_path) == 1
        assert p.wait(timeout=10) == 0 and (tmp_path / "finished").exists()
        assert time.monotonic() - t0 >= controllers.DEFAULT_STOP_TIMEOUT_S
        assert not (tmp_path / "recovered").exists() and controllers.info(tmp_path, "fake") is None
    finally:
        p.kill()
        p.wait()


def test_a_controller_killed_past_its_bound_is_recovered(tmp_path: Path) -> None:
    """Past its registered bound the controller is killed (its step cut half-way) and the recovery
    command it registered runs; with ``recover=False`` (a lab being destroyed) it does not."""
    for recover in (True, False):
        p = start(tmp_path, bound=0.5, step=600.0)
        try:
            assert controllers.stop_all(tmp_path, recover=recover) == 1
            p.wait(timeout=10)
            assert p.returncode == -9 and not pid_alive(p.pid) and not (tmp_path / "finished").exists()
            assert (tmp_path / "recovered").exists() is recover
            if recover:
                assert (tmp_path / "recovered").read_text() == "recovered x"
                (tmp_path / "recovered").unlink()
        finally:
            p.kill()
            p.wait()
