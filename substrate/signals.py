"""Turning SIGTERM (and SIGHUP) into an exception, so that ``with`` blocks and ``finally`` clauses
run and labs are destroyed when a process is asked to stop. Ctrl-C already raises
KeyboardInterrupt."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator


class Terminated(BaseException):
    """Raised in the main thread when the process receives SIGTERM or SIGHUP.

    A BaseException (like KeyboardInterrupt) so that ``except Exception`` does not swallow it.
    """


def _raise(signum: int, frame: object) -> None:
    raise Terminated(f"received signal {signal.Signals(signum).name}")


@contextlib.contextmanager
def terminate_gracefully() -> Iterator[None]:
    """Within the block, SIGTERM/SIGHUP raise :class:`Terminated` in the main thread.

    Outside the main thread (where Python cannot install handlers) this does nothing.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = {s: signal.signal(s, _raise) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


@contextlib.contextmanager
def cleanup_shield() -> Iterator[None]:
    """Within the block, Ctrl-C and SIGTERM are ignored, so that a second interrupt cannot cut
    a clean-up (destroying a lab) short. Main thread only; elsewhere it does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = {s: signal.signal(s, signal.SIG_IGN) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)
