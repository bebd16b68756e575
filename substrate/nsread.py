"""Reads of a node's network-namespace state from the host process, without starting a process.

A device-state capture runs on every node at every reset (:mod:`substrate.devstate`); each
process started inside a node costs 2-5 ms of CPU (fork, exec, dynamic linking), most of a
capture's cost. Two of its reads need no process:

- **sysctls**: ``/proc/sys/net`` shows the network namespace of the *thread* that looks a file
  up (``net_ctl_header_lookup`` uses ``current->nsproxy->net_ns``: linux/net/sysctl_net.c), so a
  thread that has entered the node's namespace with ``setns(2)`` reads the node's values through
  the host's ``/proc``;
- **the nftables ruleset**: libnftables (the library the ``nft`` command is built on) opens its
  netlink socket in the namespace of the calling thread, and prints ``list ruleset`` exactly as
  ``nft list ruleset`` does (same library, same default output flags).

The thread returns to its own namespace before anything else runs on it (if it cannot, the
process exits: no later command may run in a node's namespace by accident). Nothing is written.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import stat
import threading
from collections.abc import Iterable, Iterator

from substrate.errors import SubstrateError

CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(None, use_errno=True)


class NamespaceReadError(SubstrateError):
    """A namespace could not be entered or read."""


@contextlib.contextmanager
def entered(netns_path: str) -> Iterator[None]:
    """Run the body with the calling thread in the network namespace at ``netns_path``
    (``setns(2)`` affects the calling thread only); back in its own one afterwards, whatever the
    body raised.

    Raises:
        NamespaceReadError: the namespace could not be opened or entered.
    """
    own = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    try:
        try:
            target = os.open(netns_path, os.O_RDONLY)
        except OSError as e:
            raise NamespaceReadError(f"cannot open {netns_path}: {e.strerror}") from None
        try:
            if _libc.setns(target, CLONE_NEWNET) != 0:
                raise NamespaceReadError(f"cannot enter {netns_path}: {os.strerror(ctypes.get_errno())}")
        finally:
            os.close(target)
        try:
            yield
        finally:
            if _libc.setns(own, CLONE_NEWNET) != 0:  # never go on in a node's namespace
                os._exit(70)
    finally:
        os.close(own)


# -- sysctls ------------------------------------------------------------------------------------

_SYS_NET = "/proc/sys/net"


def _walk(path: str, out: list[str], *, is_dir: bool | None = None) -> None:
    """``grep -r . PATH`` from inside the namespace: every readable regular file below ``path``
    (``path`` itself if it is one), each non-empty line as ``PATH:LINE``; unreadable files
    (write-only ones, ``stable_secret`` while unset: EIO) are left out, as grep's errors are.
    Directory entries' types come from readdir (no stat per file): most of the cost is the
    open and read of each file (about 400 in the fast set, 1,000-2,000 in the full one)."""
    if is_dir is None:
        try:
            is_dir = stat.S_ISDIR(os.stat(path).st_mode)
        except OSError:
            return
    if is_dir:
        try:
            with os.scandir(path) as it:
                entries = [(e.path, e.is_dir(follow_symlinks=False)) for e in it]
        except OSError:
            return
        for sub, d in entries:
            _walk(sub, out, is_dir=d)
        return
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        data = os.read(fd, 1 << 16)
    except OSError:
        return
    finally:
        os.close(fd)
    out.extend(f"{path}:{ln}" for ln in data.decode(errors="replace").splitlines() if ln)


def _fast_roots() -> Iterator[tuple[str, bool | None]]:
    """The sysctls outside per-interface directories (every file but ``conf/IF`` and
    ``neigh/IF``; ``conf/all``, ``conf/default``, ``neigh/default`` included) and each IPv6
    interface's ``stable_secret`` (which the rtnetlink dump of :mod:`substrate.netlink` does
    not carry), as (path, whether it is a directory; None: unknown)."""
    with os.scandir(_SYS_NET) as top:
        entries = [(e.name, e.path, e.is_dir(follow_symlinks=False)) for e in top]
    for name, path, is_dir in entries:
        if name not in ("ipv4", "ipv6"):
            yield path, is_dir
            continue
        with os.scandir(path) as it:
            subs = [(e.name, e.path, e.is_dir(follow_symlinks=False)) for e in it]
        yield from ((sub_path, d) for sub, sub_path, d in subs if sub not in ("conf", "neigh"))
        yield from ((f"{path}/conf/all", True), (f"{path}/conf/default", True), (f"{path}/neigh/default", True))
        if name == "ipv6":
            yield from ((f"{path}/conf/{i}/stable_secret", False) for i in os.listdir(f"{path}/conf") if i not in ("all", "default"))


def sysctl_lines(netns_path: str, *, full: bool) -> str:
    """The namespace's sysctls under ``/proc/sys/net`` as ``grep -r .`` prints them
    (``/proc/sys/net/ipv4/ip_forward:1``, one line per non-empty line of a file), in no
    particular order.

    Args:
        full: every file; else the fast set (:func:`_fast_roots`: per-interface directories are
            compared through rtnetlink instead).

    Raises:
        NamespaceReadError: the namespace could not be entered.
    """
    out: list[str] = []
    with entered(netns_path):
        roots: Iterable[tuple[str, bool | None]] = [(_SYS_NET, True)] if full else list(_fast_roots())
        for root, is_dir in roots:
            _walk(root, out, is_dir=is_dir)
    return "\n".join(out) + "\n"


# -- nftables -----------------------------------------------------------------------------------

_nft_lock = threading.Lock()  # libnftables documents no thread safety across contexts
_nft_lib: ctypes.CDLL | None = None


def _libnftables() -> ctypes.CDLL:
    """libnftables with the prototypes used here (libnftables(3))."""
    global _nft_lib
    if _nft_lib is None:
        name = ctypes.util.find_library("nftables") or "libnftables.so.1"
        try:
            lib = ctypes.CDLL(name)
        except OSError as e:
            raise NamespaceReadError(f"libnftables is not installed ({e}): apt install libnftables1") from None
        lib.nft_ctx_new.restype = ctypes.c_void_p
        lib.nft_ctx_new.argtypes = [ctypes.c_uint32]
        lib.nft_ctx_free.argtypes = [ctypes.c_void_p]
        for fn in (lib.nft_ctx_buffer_output, lib.nft_ctx_buffer_error):
            fn.argtypes = [ctypes.c_void_p]
            fn.restype = ctypes.c_int
        for fn in (lib.nft_ctx_get_output_buffer, lib.nft_ctx_get_error_buffer):
            fn.argtypes = [ctypes.c_void_p]
            fn.restype = ctypes.c_char_p
        lib.nft_run_cmd_from_buffer.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
        lib.nft_run_cmd_from_buffer.restype = ctypes.c_int
        _nft_lib = lib
    return _nft_lib


def nft_ruleset(netns_path: str) -> str:
    """``nft list ruleset 2>&1`` of the namespace: the ruleset, then any error message.

    Raises:
        NamespaceReadError: the namespace could not be entered, or libnftables is missing.
    """
    lib = _libnftables()
    with _nft_lock, entered(netns_path):
        ctx = lib.nft_ctx_new(0)  # NFT_CTX_DEFAULT, as the nft command
        if not ctx:
            raise NamespaceReadError("libnftables: nft_ctx_new failed")
        try:
            lib.nft_ctx_buffer_output(ctx)
            lib.nft_ctx_buffer_error(ctx)
            lib.nft_run_cmd_from_buffer(ctx, b"list ruleset")
            out = (lib.nft_ctx_get_output_buffer(ctx) or b"").decode(errors="replace")
            err = (lib.nft_ctx_get_error_buffer(ctx) or b"").decode(errors="replace")
        finally:
            lib.nft_ctx_free(ctx)
    return out + err
