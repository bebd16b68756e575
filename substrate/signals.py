"""Turning SIGTERM (and SIGHUP) into an exception, so that ``with`` blocks and ``finally`` clauses
run and labs are destroyed when a process is asked to stop; and keeping Ctrl-C from being lost.

Python raises a signal's exception wherever the main thread happens to be, which may be a
weakref callback or a ``__del__`` (e.g. a ThreadPoolExecutor's ``weakref_cb``): there the
exception is printed as "Exception ignored in ..." and dropped, and the process carries on as if
nothing had happened (a campaign interrupted that way ran to its end and exited 0; CI, stop 24).
So the handler also records the signal, and long loops call :func:`raise_if_interrupted` at their
safe points: a dropped interrupt then takes effect at the next one."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator


class Terminated(BaseException):
    """Raised in the main thread when the process receives SIGTERM or SIGHUP.

    A BaseException (like KeyboardInterrupt) so that ``except Exception`` does not swallow it.
    """


_received: int | None = None  # the stop signal received within terminate_gracefully, if any
_depth = 0  # nesting of terminate_gracefully blocks


def _exception(signum: int) -> BaseException:
    if signum == signal.SIGINT:
        return KeyboardInterrupt()
    return Terminated(f"received signal {signal.Signals(signum).name}")


def _raise(signum: int, frame: object) -> None:
    global _received
    _received = signum
    raise _exception(signum)


def raise_if_interrupted() -> None:
    """Raise the stop signal received within the enclosing :func:`terminate_gracefully` block
    (KeyboardInterrupt for SIGINT, :class:`Terminated` otherwise), if one was received -- also
    when its first raise was swallowed where Python could not propagate it. Call it at the safe
    points of long loops (between runs). Does nothing when no signal was received."""
    if _received is not None:
        raise _exception(_received)


@contextlib.contextmanager
def terminate_gracefully() -> Iterator[None]:
    """Within the block, SIGTERM/SIGHUP raise :class:`Terminated` and SIGINT raises
    KeyboardInterrupt in the main thread, and the signal is remembered for
    :func:`raise_if_interrupted` until the outermost block ends.

    Outside the main thread (where Python cannot install handlers) this does nothing.
    """
    global _received, _depth
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    if _depth == 0:
        _received = None
    # a SIGINT the process was started ignoring (a background job) stays ignored, as Python does
    stops = [s for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
             if not (s == signal.SIGINT and signal.getsignal(s) == signal.SIG_IGN)]
    old = {s: signal.signal(s, _raise) for s in stops}
    _depth += 1
    try:
        yield
    finally:
        _depth -= 1
        for s, h in old.items():
            signal.signal(s, h)
        if _depth == 0:
            _received = None


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
