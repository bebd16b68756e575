"""substrate/signals.py: a stop signal whose exception Python drops (raised inside a ``__del__``
or a weakref callback, printed as "Exception ignored in ...") still stops the loop at its next
safe point (CI, stop 24: a campaign interrupted that way ran to its end and exited 0)."""

from __future__ import annotations

import os
import signal

import pytest

from substrate.signals import Terminated, raise_if_interrupted, terminate_gracefully


class _SignalsInDel:
    """Sends ``signum`` to this process from ``__del__``: the handler's exception is raised
    there, where Python can only print it and drop it."""

    def __init__(self, signum: int) -> None:
        self.signum = signum

    def __del__(self) -> None:
        os.kill(os.getpid(), self.signum)


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")  # the drop this is about
@pytest.mark.parametrize(("signum", "exc"), [(signal.SIGINT, KeyboardInterrupt), (signal.SIGTERM, Terminated)])
def test_a_dropped_stop_signal_is_raised_at_the_next_safe_point(signum: int, exc: type[BaseException]) -> None:
    with terminate_gracefully():
        raise_if_interrupted()  # nothing received yet
        _SignalsInDel(signum)  # collected at once: the exception is raised in __del__ and dropped
        with pytest.raises(exc):
            raise_if_interrupted()
        with pytest.raises(exc):  # and again, until the block ends
            raise_if_interrupted()
    raise_if_interrupted()  # forgotten once the outermost block ends


def test_the_handlers_are_restored_after_the_block() -> None:
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    with terminate_gracefully(), terminate_gracefully():
        pass
    assert {s: signal.getsignal(s) for s in before} == before
