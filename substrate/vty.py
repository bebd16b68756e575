"""A direct client of FRR daemons' vty sockets, without starting ``vtysh``.

``vtysh`` is a client of the same sockets (``/var/run/frr/<daemon>.vty``): it sends each command
as a NUL-terminated string and reads the daemon's output up to a four-byte trailer -- three NUL
bytes and a status byte (0 = success; FRR lib/vty.c, ``vtysh_client_run``). Starting vtysh costs
about 24 ms of CPU (it loads every daemon's command tree); talking to the socket costs well under
a millisecond, which matters on the critical paths that read FRR state of every router: reset,
convergence waits, the observer's IS-IS checks.

What a daemon answers is its own part of the configuration (``show running-config`` after
``enable``), not vtysh's merged view: compare it with the same daemon's earlier answer, and use
vtysh where the merged configuration is needed (e.g. as a frr-reload target).
"""

from __future__ import annotations

import errno
import os
import socket
import stat
from pathlib import Path

from substrate.errors import ExecError

TRAILER = b"\0\0\0"


class VtyError(ExecError):
    """The daemon's vty socket is absent, refused the connection, or did not answer in time."""


class VtyUnreachable(VtyError):
    """No daemon listens on the socket (absent, or the connection was refused): it is not running,
    as opposed to running and not answering (frozen)."""


def vty_command(path: Path | str, commands: list[str], *, timeout_s: float = 5.0) -> list[tuple[str, int]]:
    """Run ``commands`` in order on one vty session of a daemon (``enable`` is sent first).

    Args:
        path: the daemon's vty socket (below ``/proc/PID/root/``: resolved inside that root,
            see :func:`substrate.confine.open_in_root`).
        commands: CLI commands (view/enable mode: show ..., write terminal).
        timeout_s: bound on each reply.

    Returns:
        (output, status) per command; status 0 is success, as for vtysh.

    Raises:
        VtyError: no socket or refused (VtyUnreachable), closed or too slow (a frozen daemon).
    """
    from substrate.confine import open_in_root

    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(timeout_s)
    try:
        try:
            # a node's socket, resolved inside the node (a symlink there cannot lead elsewhere)
            fd = open_in_root(path)
            try:
                if not stat.S_ISSOCK(os.fstat(fd).st_mode):
                    raise OSError(errno.ENOTSOCK, "not a socket")
                s.connect(f"/proc/self/fd/{fd}")
            finally:
                os.close(fd)
        except OSError as e:
            raise VtyUnreachable(f"cannot reach {path}: {e.strerror or e}") from None
        out = []
        for cmd in ["enable", *commands]:
            buf = bytearray()
            try:
                s.sendall(cmd.encode() + b"\0")
            except OSError as e:  # the daemon died after accepting the connection
                raise VtyUnreachable(f"{path}: the daemon went away during {cmd!r}: {e.strerror or e}") from None
            while not (len(buf) >= 4 and buf[-4:-1] == TRAILER):
                try:
                    chunk = s.recv(65536)
                except TimeoutError:
                    raise VtyError(f"{path}: no answer to {cmd!r} within {timeout_s:g} s") from None
                except OSError as e:
                    raise VtyUnreachable(f"{path}: the daemon went away during {cmd!r}: {e.strerror or e}") from None
                if not chunk:
                    raise VtyError(f"{path}: the daemon closed the session during {cmd!r}")
                buf += chunk
            out.append((buf[:-4].decode(errors="replace"), buf[-1]))
        return out[1:]
    finally:
        s.close()
