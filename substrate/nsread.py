"""Reads of a node's network-namespace state from the host process, without starting a process.

A device-state capture runs on every node at every reset (:mod:`substrate.devstate`); each
process started inside a node costs 2-5 ms of CPU (fork, exec, dynamic linking), most of a
capture's cost. The nftables ruleset needs no process: libnftables (the library the ``nft``
command is built on) opens its netlink socket in the namespace of the calling thread, and prints
``list ruleset`` exactly as ``nft list ruleset`` does (same library, same default output flags).
(Sysctls could be read the same way, ``/proc/sys/net`` showing the namespace of the thread that
looks a file up, but Python's per-file cost under the GIL made the capture slower than grep in
the node: see :data:`substrate.devstate.HOST_SECTIONS`.)

The thread returns to its own namespace before anything else runs on it (if it cannot, the
process exits: no later command may run in a node's namespace by accident). Nothing is written.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import threading
from collections.abc import Iterator

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
