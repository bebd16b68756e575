"""Running a command with a deadline and bounded captured output.

Used for every command the substrate runs (inside nodes or on the host). The child gets its own
session so that a timeout kills the whole process group (``nsenter`` forks the command inside the
node's PID namespace; killing only ``nsenter`` would leave the command running).
"""

from __future__ import annotations

import contextlib
import os
import selectors
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

#: Default cap on captured bytes per stream (stdout, stderr).
DEFAULT_MAX_OUTPUT = 1 << 20
#: How often to look whether the command exited while its pipes stay open (a background child
#: holds them), and how long to keep reading after that. Not a sleep: select returns on data.
_POLL_S = 0.05
_BACKGROUND_GRACE_S = 0.1
#: After killing a timed-out or cancelled command's group: the longest wait for its pipes' EOF
#: while reading what it wrote before it died (EOF comes at once unless a writer escaped the group).
_DRAIN_S = 1.0
TRUNCATION_MARK = "\n[... output truncated by anibench: {dropped} more bytes not shown ...]\n"


@dataclass
class ExecResult:
    """Outcome of one command.

    Attributes:
        node: node the command ran in ("" for the host).
        argv: the command as given by the caller (without the namespace-entering prefix).
        returncode: exit status; negative for a signal; 124 when the deadline killed it (as GNU
            ``timeout`` does).
        stdout, stderr: decoded output (UTF-8, invalid bytes replaced), each capped at
            ``max_output`` bytes with a truncation mark.
        duration_s: wall-clock seconds from start to exit.
        timed_out: the deadline was reached and the process group was killed.
        truncated: some output was dropped.
        cancelled: the caller's cancel event was set and the process group was killed
            (returncode -9).
    """

    node: str
    argv: list[str]
    returncode: int
    stdout: str
    stderr: str
    duration_s: float
    timed_out: bool = False
    truncated: bool = False
    cancelled: bool = False
    extra: dict = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        """Exited 0 within the deadline."""
        return self.returncode == 0 and not self.timed_out

    def summary(self, limit: int = 300) -> str:
        """One line for errors: command, status and the head of stderr (or stdout)."""
        what = " ".join(self.argv)
        status = "timed out" if self.timed_out else f"exit {self.returncode}"
        text = (self.stderr.strip() or self.stdout.strip()).replace("\n", " | ")
        where = f"{self.node}: " if self.node else ""
        return f"{where}`{what[:200]}` {status}: {text[:limit]}"


def run_bounded(
    argv: list[str],
    *,
    timeout_s: float,
    input: str | bytes | None = None,
    max_output: int = DEFAULT_MAX_OUTPUT,
    env: dict[str, str] | None = None,
    node: str = "",
    shown_argv: list[str] | None = None,
    cancel: threading.Event | None = None,
) -> ExecResult:
    """Run ``argv`` until it exits or ``timeout_s`` passes; capture at most ``max_output`` bytes
    of each stream (the rest is read and dropped, so the child never blocks on a full pipe).

    ``cancel``: when this event is set while the command runs (checked every 50 ms), the
    command's process group is killed at once (SIGKILL) and the result says ``cancelled``.

    Raises:
        FileNotFoundError / PermissionError: the program cannot be started.
    """
    t0 = time.monotonic()
    proc = subprocess.Popen(
        argv,
        stdin=subprocess.PIPE if input is not None else subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
        env=env,
    )
    if input is not None:
        data = input.encode() if isinstance(input, str) else input
        try:
            assert proc.stdin is not None
            proc.stdin.write(data)
            proc.stdin.close()
        except BrokenPipeError:
            pass
    bufs = {1: bytearray(), 2: bytearray()}
    dropped = {1: 0, 2: 0}
    sel = selectors.DefaultSelector()
    assert proc.stdout is not None and proc.stderr is not None
    sel.register(proc.stdout, selectors.EVENT_READ, 1)
    sel.register(proc.stderr, selectors.EVENT_READ, 2)
    deadline = t0 + timeout_s

    def take(key: selectors.SelectorKey) -> None:
        chunk = os.read(key.fd, 65536)
        if not chunk:
            sel.unregister(key.fileobj)
            return
        buf = bufs[key.data]
        room = max_output - len(buf)
        if room > 0:
            buf += chunk[:room]
        dropped[key.data] += max(0, len(chunk) - max(room, 0))

    timed_out = False
    cancelled = False
    try:
        exited_at: float | None = None
        while sel.get_map():
            now = time.monotonic()
            remaining = deadline - now
            if remaining <= 0:
                timed_out = exited_at is None
                break
            if cancel is not None and cancel.is_set() and exited_at is None:
                cancelled = True
                break
            if exited_at is not None and now - exited_at > _BACKGROUND_GRACE_S:
                break  # the command exited; a background child still holds the pipes
            events = sel.select(min(remaining, _POLL_S))
            for key, _ in events:
                take(key)
            if exited_at is None and not events and proc.poll() is not None:
                exited_at = time.monotonic()
        if not timed_out and not cancelled:
            while True:  # wait for the exit, still honouring the deadline and the cancel event
                try:
                    proc.wait(timeout=min(_POLL_S, max(0.0, deadline - time.monotonic())))
                    break
                except subprocess.TimeoutExpired:
                    if time.monotonic() >= deadline:
                        timed_out = True
                        break
                    if cancel is not None and cancel.is_set():
                        cancelled = True
                        break
    finally:
        if timed_out or cancelled:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            # what the group wrote before it died is still in the pipes: read it up to EOF (all
            # writers are dead), so that the caller sees every line the command printed -- e.g.
            # vtysh's echo of the line it was running when a cancelled call killed it. Bounded:
            # a writer that escaped the group (setsid) may hold a pipe open.
            drain_until = time.monotonic() + _DRAIN_S
            while sel.get_map() and (left := drain_until - time.monotonic()) > 0:
                for key, _ in sel.select(min(left, _POLL_S)):
                    take(key)
        proc.wait()
        sel.close()
        proc.stdout.close()
        proc.stderr.close()
    for i in (1, 2):  # a stream cut at the cap keeps whole characters: a split one is dropped, not shown as U+FFFD
        if dropped[i]:
            partial = _partial_utf8_tail(bufs[i])
            if partial:
                del bufs[i][-partial:]
                dropped[i] += partial
    out, err = (bufs[i].decode(errors="replace") for i in (1, 2))
    if dropped[1]:
        out += TRUNCATION_MARK.format(dropped=dropped[1])
    if dropped[2]:
        err += TRUNCATION_MARK.format(dropped=dropped[2])
    return ExecResult(
        node=node,
        argv=list(shown_argv if shown_argv is not None else argv),
        returncode=124 if timed_out else proc.returncode,
        stdout=out,
        stderr=err,
        duration_s=time.monotonic() - t0,
        timed_out=timed_out,
        truncated=bool(dropped[1] or dropped[2]),
        cancelled=cancelled,
    )


def _partial_utf8_tail(buf: bytes | bytearray) -> int:
    """How many bytes at the end of ``buf`` begin a UTF-8 character they do not complete (0-3):
    where a byte cap split a multi-byte character (RFC 3629 lead bytes: 110xxxxx needs 1
    continuation byte, 1110xxxx 2, 11110xxx 3)."""
    for back in range(1, min(4, len(buf)) + 1):
        b = buf[-back]
        if b & 0xC0 == 0x80:  # a continuation byte: look further back for its lead byte
            continue
        need = 2 if b & 0xE0 == 0xC0 else 3 if b & 0xF0 == 0xE0 else 4 if b & 0xF8 == 0xF0 else 1
        return back if back < need else 0
    return 0


def terminate(pid: int, timeout_s: float = 5.0, alive: Callable[[int], bool] | None = None) -> None:
    """End process ``pid``: SIGTERM, a wait (polled, at most ``timeout_s``) for it to go, then
    SIGKILL if it has not. ``alive``: how to tell it still runs (default: not gone and not a
    zombie, :func:`substrate.record.pid_alive`)."""
    from substrate.record import pid_alive

    alive = alive or pid_alive
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.02)  # poll: it exits as soon as it has cleaned up
    if alive(pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
