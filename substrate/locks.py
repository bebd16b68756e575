"""Per-device configuration locks, shared by every process that mutates a lab through an ANI.

The analogue of a NETCONF ``<lock>`` on the running datastore (RFC 6241 section 7.5) or an
exclusive configuration session on a router: while one party holds a device's lock, the mutation
paths of the ANI servers (A1 apply/rollback, A2 commit, A3 apply) wait for it, up to a bound,
and then fail with an error naming the holder. The raw shell (A0) does not look at it, as a root
shell on a real box would not. The fault injector's *held lock* fault takes these locks.

Locks are ``flock(2)`` locks on ``<lab dir>/locks/<node>.lock`` (host side, never visible in a
node); the holder's description is written beside it for error messages. A lock dies with the
process holding it, so a crashed holder never leaves a device locked.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

from substrate.errors import SubstrateError

#: How often a waiting acquirer retries (seconds). Not a settle delay: it exits as soon as free.
_RETRY_S = 0.05


class ConfigLockHeld(SubstrateError):
    """A device's configuration lock stayed held by someone else for the whole bounded wait."""

    def __init__(self, node: str, holder: str | None, waited_s: float):
        self.node, self.holder, self.waited_s = node, holder, waited_s
        who = f" by {holder}" if holder else ""
        super().__init__(
            f"the configuration of {node} is locked{who}; waited {waited_s:.1f} s. "
            "Retry later or work on other devices."
        )


def lock_path(lab_dir: Path, node: str) -> Path:
    """Lock file of one node."""
    return lab_dir / "locks" / f"{node}.lock"


def holder_of(lab_dir: Path, node: str) -> str | None:
    """Description of whoever holds ``node``'s lock now, or None if it is free."""
    path = lock_path(lab_dir, node)
    try:
        fd = os.open(path, os.O_RDWR)
    except FileNotFoundError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        try:
            return Path(f"{path}.holder").read_text().strip() or "another session"
        except OSError:
            return "another session"
    else:
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


@contextlib.contextmanager
def config_lock(lab_dir: Path, nodes: Iterable[str], *, holder: str, timeout_s: float = 5.0) -> Iterator[None]:
    """Hold the configuration locks of ``nodes`` for the duration of the block.

    Locks are taken in sorted order (no deadlock between two multi-device transactions) within
    one overall deadline.

    Args:
        lab_dir: the lab's runtime directory (``Lab.dir``).
        nodes: device names.
        holder: who is asking, for others' error messages (e.g. ``"A1 server pid 123"``).
        timeout_s: bound on the total wait.

    Raises:
        ConfigLockHeld: a lock stayed held past the deadline (locks taken so far are released).
    """
    (lab_dir / "locks").mkdir(parents=True, exist_ok=True)
    fds: list[int] = []
    t0 = time.monotonic()
    try:
        for node in sorted(set(nodes)):
            path = lock_path(lab_dir, node)
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
            fds.append(fd)
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    waited = time.monotonic() - t0
                    if waited >= timeout_s:
                        raise ConfigLockHeld(node, holder_of(lab_dir, node), waited) from None
                    time.sleep(_RETRY_S)
            Path(f"{path}.holder").write_text(f"{holder} since {time.strftime('%H:%M:%S')}\n")
        yield
    finally:
        for fd in fds:
            with contextlib.suppress(OSError):
                fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)


#: The name of the lab-wide lock a reset holds (a file beside the devices' locks; no node has it).
BASELINE_LOCK = "@baseline"


@contextlib.contextmanager
def baseline_lock(lab_dir: Path, *, shared: bool, holder: str, timeout_s: float) -> Iterator[None]:
    """Hold the lab's baseline lock for the block: exclusively, a lab reset (from its start until the
    lab is at its new baseline epoch, :func:`substrate.scenario.deploy.reset`); shared, a writer of
    state that belongs to the baseline epoch and is not a device change (A3-R's commits: a commit
    acknowledged during a reset was lost when the reset made the repository again, issue 35). So a
    reset waits for such a write to end, and the write waits for a reset in progress, then sees
    the new epoch. Order: taken before any device lock (:func:`config_lock`).

    Raises:
        ConfigLockHeld: not granted within ``timeout_s`` (naming the holder of the exclusive hold).
    """
    (lab_dir / "locks").mkdir(parents=True, exist_ok=True)
    path = lock_path(lab_dir, BASELINE_LOCK)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    t0 = time.monotonic()
    try:
        while True:
            try:
                fcntl.flock(fd, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                waited = time.monotonic() - t0
                if waited >= timeout_s:
                    raise ConfigLockHeld("the lab (its baseline)", holder_of(lab_dir, BASELINE_LOCK), waited) from None
                time.sleep(_RETRY_S)
        if not shared:
            Path(f"{path}.holder").write_text(f"{holder} since {time.strftime('%H:%M:%S')}\n")
        yield
    finally:
        with contextlib.suppress(OSError):
            fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)
