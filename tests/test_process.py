"""run_bounded (substrate/process.py): what a command printed before a timeout or a cancel killed
it reaches the caller."""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path

import pytest

from substrate.process import run_bounded


class _FiresAfter(threading.Event):
    """A cancel event that reads as set once ``path`` exists (the command created it after
    printing): the cancel then lands while what it printed is still unread in the pipe -- the
    moment a client's cancel hit a vtysh batch whose last echo was lost (CI, stop 24)."""

    def __init__(self, path: Path) -> None:
        super().__init__()
        self.path = path

    def is_set(self) -> bool:
        while not self.path.exists():
            threading.Event().wait(0.01)
        return True


@pytest.mark.parametrize("lines", [1, 3000])
def test_a_cancelled_command_keeps_everything_it_printed(tmp_path: Path, lines: int) -> None:
    flag = tmp_path / "printed"
    script = f"for i in $(seq 1 {lines}); do echo line-$i; done; echo err-tail >&2; touch {flag}; exec sleep 60"
    r = run_bounded(["bash", "-c", script], timeout_s=30, cancel=_FiresAfter(flag))
    assert r.cancelled and r.returncode == -9
    assert r.stdout.splitlines() == [f"line-{i}" for i in range(1, lines + 1)]
    assert r.stderr.strip() == "err-tail"


def test_a_timed_out_command_keeps_everything_it_printed() -> None:
    r = run_bounded(["bash", "-c", "echo before-the-deadline; exec sleep 60"], timeout_s=1)
    assert r.timed_out and r.returncode == 124
    assert r.stdout == "before-the-deadline\n"


def test_a_writer_that_escaped_the_group_does_not_hold_the_caller() -> None:
    """setsid puts a child out of the killed group and it keeps the pipe open: the caller still
    gets its answer (the drain after the kill is bounded) while that child lives."""
    r = run_bounded(["bash", "-c", "setsid sleep 120 & echo $!; exec sleep 60"], timeout_s=1)
    pid = int(r.stdout.split()[0])
    try:
        assert r.timed_out
        os.kill(pid, 0)  # still alive, still holding the pipe: run_bounded did not wait for it
    finally:
        os.kill(pid, signal.SIGKILL)
