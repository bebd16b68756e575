"""Host-side loader of the SRv6 eBPF programs: one program instance per route.

Nodes never hold CAP_BPF: this module, run by the host process, loads every program, pins it on
a private bpffs, has the REAL iproute2 install the route inside the node's namespace (``ip -n NS
-batch -``, so errors, exit codes and batch line numbers are iproute2's), then removes the pins.
The route then holds the only reference to its programs: deleting or flushing the route, or
deleting its device, frees them. Nothing is left on bpffs.

Per route (``RouteSpec``): the object (``bpf/NAME.c``, built by :mod:`.build`) is opened from
memory with libbpf (ctypes over ``libbpf.so.1``), its ``.rodata`` (the ``const volatile``
configuration globals) replaced by the caller's bytes, named maps optionally replaced by shared
fds (the per-node ``tunsrc`` map, :class:`NodeMaps`), the programs of the requested hooks
loaded (others get autoload off), pinned as
``<bpffs>/pins/<pid>-<batch>/<route>-<hook>/<basename>`` and the object closed at once (the pin
holds the programs, the programs their maps: O(1) open fds for any batch size).
iproute2 names a pinned route program ``<basename>:[*fsobj]`` (iproute2 lib/bpf_legacy.c
``bpf_load_common``) and the kernel keeps and dumps that name (net/core/lwt_bpf.c,
``LWT_BPF_PROG_NAME``, up to 256 bytes), so ``ip route show`` prints
``encap bpf in <basename>:[*fsobj] xmit <basename>:[*fsobj]``: the basename, chosen by the
caller, can carry an encoding of the route's parameters (at most :data:`MAX_BASENAME` bytes).

bpffs: the pins live on a bpffs mounted at ``$ANIBENCH_STATE_ROOT/bpffs`` (default
``/run/anibench/bpffs``), NOT under ``/sys/fs/bpf``: ``ip -n NS`` / ``ip netns exec`` remount
``/sys`` in a private mount namespace (iproute2 lib/namespace.c netns_switch), which hides a
bpffs mounted on ``/sys/fs/bpf``. iproute2 may create ``ip``, ``tc``, ``xdp`` at the root of
the bpffs it finds (ours); they stay empty.

Programs (``bpf/``; behaviour details in each file's header comment):

- ``encap.c`` -- H.Encaps / H.Encaps.Red, hooks ``in`` (forwarded, as seg6_input) and
  ``xmit`` (local, as seg6_output); :func:`encap_program`. Route headroom = the kernel's
  seg6_lwt_headroom (40 + 8 + 16 n), so the route MTU shrinks as with seg6.
- ``encap_gso.c`` -- one tc program per node on the GSO helper device (:func:`gso_helper_up`):
  GSO skbs that bpf_lwt_push_encap cannot encapsulate (SRH present, or IPv4 payload:
  net/core/lwt_bpf.c handle_gso_encap accepts only GRE/UDP/IPv6-in-IPv6) are re-encapsulated
  there with bpf_skb_adjust_room(BPF_F_ADJ_ROOM_ENCAP_L3_IPV6), so the kernel's own GSO
  segments them. Without the helper such skbs are dropped (TCP through the router stalls).
- ``end.c`` -- End and End with NEXT-C-SID, hook ``xmit``; :func:`end_program`. The SID
  route is a forwarding route: its device's MTU counts in ip6_forward (give ``sr0`` MTU 65535).

Verified on kernel 6.18.44 (Firecracker guest), libbpf 1.1.2, iproute2 6.1.0, clang 14:
program types lwt_in/lwt_xmit/sched_cls load; lwt_in has bpf_lwt_push_encap but neither
bpf_skb_store_bytes, bpf_redirect nor bpf_fib_lookup (no LWT type has fib_lookup); lwt_xmit
has store_bytes, change_head, l3_csum_replace, redirect, push_encap; BPF_LWT_REROUTE works on
both; bpffs refuses pin names containing a dot (EPERM); the kernel dumps the LWT program name
iproute2 gives it (``<basename>:[*fsobj]``, 246-byte basename tested) but not ``headroom``.
Timing (2 cores): about 2.2-2.5 ms per encap route (load+pin; ``ip -batch`` 0.05 ms/route) for
1,000 routes in one batch.

Thread safety: all libbpf calls are serialised by a module lock (libbpf's print callback is
global).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import itertools
import os
import shutil
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from substrate.dataplane.ebpf import build
from substrate.errors import SubstrateError

#: iproute2 hooks of ``encap bpf``.
HOOKS: tuple[str, ...] = ("in", "out", "xmit")
#: Longest pin basename: iproute2's annotation buffer is 256 bytes with ``:[*fsobj]`` and NUL.
MAX_BASENAME = 246
#: bpffs refuses names with a dot (EPERM: reserved for the kernel's own files such as
#: maps.debug); the others would break the ``ip -batch`` line.
_BAD_BASENAME_CHARS = set(" \t\r\n/\\\"'#.")

BPF_MAP_TYPE_ARRAY = 2


class BpfError(SubstrateError):
    """libbpf or the kernel refused an operation (open, load, pin, map access).

    Attributes:
        errno: the positive errno, when known (0 otherwise).
        log: what libbpf printed meanwhile (includes the verifier log of a failed load).
    """

    def __init__(self, message: str, err: int = 0, log: str = ""):
        super().__init__(message + (f": {os.strerror(err)} (errno {err})" if err else "") + (f"\n{log}" if log else ""))
        self.errno = err
        self.log = log


class RouteInstallError(SubstrateError):
    """``ip -batch`` failed; the routes of the lines before ``line`` were installed.

    Attributes:
        returncode: iproute2's exit code.
        stderr: iproute2's error output, untouched.
        line: the 1-based batch line iproute2 reported as failed (``Command failed -:N``), or 0.
        installed: the :class:`InstalledRoute` of the lines before ``line``.
        dropped_prog_ids: ids of the programs loaded for the other lines (freed with their
            pins, so gone once the kernel's RCU grace period ends).
    """

    def __init__(self, returncode: int, stderr: str, line: int, installed: list[InstalledRoute],
                 dropped_prog_ids: list[int] | None = None):
        super().__init__(f"ip -batch failed (exit {returncode}, line {line}): {stderr.strip()}")
        self.returncode = returncode
        self.stderr = stderr
        self.line = line
        self.installed = installed
        self.dropped_prog_ids = dropped_prog_ids or []


# --------------------------------------------------------------------------------------------
# libbpf over ctypes

_lock = threading.RLock()
_lib: ctypes.CDLL | None = None
_log: list[str] = []
_PRINT_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p)
_print_cb = None
_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


class _OpenOpts(ctypes.Structure):
    """``struct bpf_object_open_opts`` of libbpf 1.1 (fields up to kernel_log_level)."""

    _fields_ = [
        ("sz", ctypes.c_size_t),
        ("object_name", ctypes.c_char_p),
        ("relaxed_maps", ctypes.c_bool),
        ("pin_root_path", ctypes.c_char_p),
        ("_attach_prog_fd", ctypes.c_uint32),
        ("kconfig", ctypes.c_char_p),
        ("btf_custom_path", ctypes.c_char_p),
        ("kernel_log_buf", ctypes.c_char_p),
        ("kernel_log_size", ctypes.c_size_t),
        ("kernel_log_level", ctypes.c_uint32),
    ]


def _libbpf() -> ctypes.CDLL:
    global _lib, _print_cb
    if _lib is not None:
        return _lib
    try:
        lib = ctypes.CDLL("libbpf.so.1", use_errno=True)
    except OSError as e:
        from substrate.errors import EnvironmentProblem

        raise EnvironmentProblem("libbpf.so.1 not found: install libbpf1 (Debian: apt-get install libbpf1)") from e
    P, I, S, U32 = ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t, ctypes.c_uint32
    sig = {
        "bpf_object__open_mem": (P, [P, S, P]),
        "bpf_object__load": (I, [P]),
        "bpf_object__close": (None, [P]),
        "bpf_object__find_map_by_name": (P, [P, ctypes.c_char_p]),
        "bpf_object__find_program_by_name": (P, [P, ctypes.c_char_p]),
        "bpf_object__next_program": (P, [P, P]),
        "bpf_program__name": (ctypes.c_char_p, [P]),
        "bpf_program__set_autoload": (I, [P, ctypes.c_bool]),
        "bpf_program__fd": (I, [P]),
        "bpf_map__set_initial_value": (I, [P, P, S]),
        "bpf_map__initial_value": (P, [P, ctypes.POINTER(S)]),
        "bpf_map__reuse_fd": (I, [P, I]),
        "bpf_map__fd": (I, [P]),
        "bpf_obj_pin": (I, [I, ctypes.c_char_p]),
        "bpf_obj_get_info_by_fd": (I, [I, P, ctypes.POINTER(U32)]),
        "bpf_prog_get_fd_by_id": (I, [U32]),
        "bpf_map_get_fd_by_id": (I, [U32]),
        "bpf_map_lookup_elem": (I, [I, P, P]),
        "bpf_map_update_elem": (I, [I, P, P, ctypes.c_uint64]),
        "bpf_map_create": (I, [I, ctypes.c_char_p, U32, U32, U32, P]),
        "libbpf_num_possible_cpus": (I, []),
        "libbpf_set_print": (P, [_PRINT_FN]),
    }
    for name, (res, args) in sig.items():
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = res, args
    _libc.vsnprintf.restype = ctypes.c_int
    _libc.vsnprintf.argtypes = [ctypes.c_char_p, ctypes.c_size_t, ctypes.c_char_p, ctypes.c_void_p]

    def _print(level: int, fmt: bytes, ap: int) -> int:
        buf = ctypes.create_string_buffer(4096)
        _libc.vsnprintf(buf, len(buf), fmt, ap)
        if level <= 1:  # LIBBPF_WARN, LIBBPF_INFO (LIBBPF_DEBUG = 2 dropped)
            _log.append(buf.value.decode(errors="replace"))
        return 0

    _print_cb = _PRINT_FN(_print)
    lib.libbpf_set_print(_print_cb)
    _lib = lib
    return lib


def _err(rc: int) -> int:
    """libbpf 1.x returns -errno; pointer-returning calls set errno."""
    return -rc if rc < 0 else (ctypes.get_errno() or errno.EINVAL)


def _take_log() -> str:
    text = "".join(_log).strip()
    _log.clear()
    return text


def _info(fd: int, size: int = 256) -> bytes:
    lib = _libbpf()
    buf = ctypes.create_string_buffer(size)
    ln = ctypes.c_uint32(size)
    rc = lib.bpf_obj_get_info_by_fd(fd, buf, ctypes.byref(ln))
    if rc:
        raise BpfError("bpf_obj_get_info_by_fd", _err(rc))
    return buf.raw


def pin_program(fd: int, path: str | Path) -> None:
    """Pin program (or map) ``fd`` at ``path`` on a bpffs (no dot in the last component).

    Raises:
        BpfError: the kernel refused (EEXIST, EPERM for a dotted name, ENOENT, ...).
    """
    with _lock:
        rc = _libbpf().bpf_obj_pin(fd, str(path).encode())
    if rc:
        raise BpfError(f"pin {path}", _err(rc))


def prog_id(fd: int) -> int:
    """Kernel id of a loaded program, from its fd (``bpf_prog_info.id``)."""
    with _lock:
        return int.from_bytes(_info(fd)[4:8], "little")


# --------------------------------------------------------------------------------------------
# bpffs


def bpffs_root() -> Path:
    """The private bpffs the pins go to (mounted on first use; one mount per boot).

    Raises:
        BpfError: the mount failed.
    """
    from substrate.paths import STATE_ROOT

    root = STATE_ROOT / "bpffs"
    root.mkdir(parents=True, exist_ok=True)
    with open("/proc/self/mounts") as f:
        if any(ln.split()[1] == str(root) and ln.split()[2] == "bpf" for ln in f if len(ln.split()) > 2):
            return root
    res = subprocess.run(["mount", "-t", "bpf", "-o", "mode=0700", "bpf", str(root)], capture_output=True, text=True)
    if res.returncode != 0:
        raise BpfError(f"cannot mount bpffs on {root}: {res.stderr.strip()}")
    return root


def pins_dir() -> Path:
    """Where :func:`install_routes` pins, one ``<pid>-<n>`` directory per batch, removed when
    the batch returns (iproute2 itself may create ``ip``, ``tc/globals``, ``xdp`` at the bpffs
    root, and the kernel shows ``maps.debug``/``progs.debug`` there)."""
    d = bpffs_root() / "pins"
    d.mkdir(exist_ok=True)
    return d


# --------------------------------------------------------------------------------------------
# per-node maps


class NodeMaps:
    """The maps shared by all the programs of one node: today only ``tunsrc``.

    ``tunsrc``: BPF_MAP_TYPE_ARRAY named "tunsrc", key ``__u32``, 3 entries of 16 bytes (IPv6
    addresses, network order, all zero = unset), read per packet by H.Encaps/H.Encaps.Red:

    - key 0: the node's ``ip sr tunsrc`` (net/ipv6/seg6.c), :meth:`set_tunsrc`;
    - key 1: the node's default source, :meth:`set_default_source`, used when key 0 is unset
      and the route carries no source of its own (``encap_program(src=...)``). The kernel
      picks that source per packet (ipv6_dev_get_saddr); LWT programs cannot, so the host
      must set it (e.g. the node's loopback or locator address) and refresh it if it changes;
    - key 2: first 4 bytes = ifindex of the node's GSO helper device (:func:`gso_helper_up`),
      0 = none (GSO skbs that need an SRH or carry IPv4 are then dropped, see encap.c).

    Every route of the node sees a change on its next packet, no reload.

    The map lives while this object holds its fd or any loaded program uses it. Use
    :meth:`from_prog` to find the map again from a route's program id (e.g. in another process).
    """

    def __init__(self, fd: int | None = None):
        with _lock:
            lib = _libbpf()
            if fd is None:
                fd = lib.bpf_map_create(BPF_MAP_TYPE_ARRAY, b"tunsrc", 4, 16, 3, None)
                if fd < 0:
                    raise BpfError("bpf_map_create(tunsrc)", _err(fd))
        self.tunsrc_fd: int = fd

    @classmethod
    def from_prog(cls, prog_id_: int) -> NodeMaps:
        """The NodeMaps of the node whose route runs program ``prog_id_``.

        Raises:
            BpfError: no such program, or it has no ``tunsrc`` map.
        """
        fd = _map_fd_of_prog(prog_id_, "tunsrc")
        return cls(fd)

    def set_tunsrc(self, addr: str | None, *, _key: int = 0) -> None:
        """Set (``addr``) or unset (None or ``::``) the node's tunnel source.

        Raises:
            ValueError: not an IPv6 address.  BpfError: the map update failed.
        """
        import ipaddress

        value = ipaddress.IPv6Address(addr or "::").packed
        with _lock:
            key = ctypes.c_uint32(_key)
            buf = ctypes.create_string_buffer(value, 16)
            rc = _libbpf().bpf_map_update_elem(self.tunsrc_fd, ctypes.byref(key), buf, 0)
            if rc:
                raise BpfError("bpf_map_update_elem(tunsrc)", _err(rc))

    def set_default_source(self, addr: str | None) -> None:
        """Set (or unset) the node's default encapsulation source (key 1). Raises like
        :meth:`set_tunsrc`."""
        self.set_tunsrc(addr, _key=1)

    def tunsrc(self, *, _key: int = 0) -> str:
        """The current tunnel source (``::`` when unset)."""
        import ipaddress

        with _lock:
            key = ctypes.c_uint32(_key)
            buf = ctypes.create_string_buffer(16)
            rc = _libbpf().bpf_map_lookup_elem(self.tunsrc_fd, ctypes.byref(key), buf)
            if rc:
                raise BpfError("bpf_map_lookup_elem(tunsrc)", _err(rc))
        return str(ipaddress.IPv6Address(buf.raw[:16]))

    def set_gso_ifindex(self, ifindex: int) -> None:
        """Record the node's GSO helper device (key 2; 0 = none): see :func:`gso_helper_up`, which
    also keeps ``gso``: (its ifindex, its tc program's id), for a check that it is intact."""
        with _lock:
            key = ctypes.c_uint32(2)
            buf = ctypes.create_string_buffer(ifindex.to_bytes(4, "little") + bytes(12), 16)
            rc = _libbpf().bpf_map_update_elem(self.tunsrc_fd, ctypes.byref(key), buf, 0)
            if rc:
                raise BpfError("bpf_map_update_elem(tunsrc[2])", _err(rc))

    def default_source(self) -> str:
        """The node's default source (``::`` when unset)."""
        return self.tunsrc(_key=1)

    def close(self) -> None:
        if self.tunsrc_fd >= 0:
            os.close(self.tunsrc_fd)
            self.tunsrc_fd = -1

    def __enter__(self) -> NodeMaps:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# --------------------------------------------------------------------------------------------
# loading


@dataclass(frozen=True)
class ProgramSpec:
    """One program instance (one object load) for one route.

    Attributes:
        obj: object name: ``bpf/<obj>.c`` (``encap``, ``end``, ``decap``, ...).
        hooks: iproute2 hook (``in``/``out``/``xmit``) -> C function name in the object.
        rodata: the whole ``.rodata`` image (the object's ``const volatile`` globals, in their
            C layout); must be exactly the section's size. ``b""`` keeps the compiled defaults.
        maps: map name in the object -> fd to reuse instead of creating it (e.g.
            ``{"tunsrc": node_maps.tunsrc_fd}``).
        basename: the pin file's name, shown by ``ip route`` as ``<basename>:[*fsobj]``.
        headroom: iproute2 ``headroom N`` (0 = none): bytes the program pushes; the kernel
            subtracts it from the route's MTU as it does for seg6 (lwtunnel_headroom).
    """

    obj: str
    hooks: Mapping[str, str]
    rodata: bytes = b""
    maps: Mapping[str, int] = field(default_factory=dict)
    basename: str = "anibench"
    headroom: int = 0


class LoadedObject:
    """A loaded object: its programs' fds and ids. Close it once the route holds the programs.

    Attributes:
        fds: hook -> program fd.  ids: hook -> kernel program id.
    """

    def __init__(self, ptr: int, fds: dict[str, int], ids: dict[str, int]):
        self._ptr = ptr
        self.fds = fds
        self.ids = ids

    def close(self) -> None:
        if self._ptr:
            with _lock:
                _libbpf().bpf_object__close(self._ptr)
            self._ptr = 0

    def __enter__(self) -> LoadedObject:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


_obj_cache: dict[str, tuple[float, bytes]] = {}


def _object_bytes(name: str) -> bytes:
    path = build.build(name)
    mtime = path.stat().st_mtime
    hit = _obj_cache.get(name)
    if hit is None or hit[0] != mtime:
        hit = (mtime, path.read_bytes())
        _obj_cache[name] = hit
    return hit[1]


def rodata_size(obj: str) -> int:
    """Size in bytes of ``obj``'s ``.rodata`` (what :attr:`ProgramSpec.rodata` must be)."""
    with _lock:
        lib = _libbpf()
        data = _object_bytes(obj)
        ptr = _open(lib, obj, data)
        try:
            m = lib.bpf_object__find_map_by_name(ptr, b".rodata")
            if not m:
                return 0
            sz = ctypes.c_size_t(0)
            lib.bpf_map__initial_value(m, ctypes.byref(sz))
            return sz.value
        finally:
            lib.bpf_object__close(ptr)


def _open(lib: ctypes.CDLL, obj: str, data: bytes) -> int:
    opts = _OpenOpts(sz=ctypes.sizeof(_OpenOpts), object_name=obj.encode())
    ptr = lib.bpf_object__open_mem(data, len(data), ctypes.byref(opts))
    if not ptr:
        raise BpfError(f"bpf_object__open_mem({obj})", ctypes.get_errno() or errno.EINVAL, _take_log())
    return ptr


def reopen(ids: Mapping[str, int]) -> dict[str, int] | None:
    """New fds of programs already loaded (``{hook: program id}``, as :attr:`LoadedObject.ids`), or
    None when any of them is gone: a program is freed once no route and no fd holds it, and the
    kernel does not hand its id out again soon (idr_alloc_cyclic, kernel/bpf/syscall.c). The
    caller closes the fds."""
    fds: dict[str, int] = {}
    with _lock:
        lib = _libbpf()
        for hook, pid in ids.items():
            fd = lib.bpf_prog_get_fd_by_id(pid)
            if fd < 0:
                for f in fds.values():
                    os.close(f)
                return None
            fds[hook] = fd
    return fds


def load(spec: ProgramSpec) -> LoadedObject:
    """Open, configure and load one instance of ``spec.obj``.

    Raises:
        EnvironmentProblem: libbpf or clang missing, or the source does not compile.
        ValueError: unknown hook, wrong ``rodata`` size, unknown function or map name.
        BpfError: libbpf/kernel refused (the verifier log is in ``.log``).
    """
    for hook in spec.hooks:
        if hook not in HOOKS and hook != "tc":
            raise ValueError(f"unknown hook {hook!r} (use {', '.join(HOOKS)}, or tc for a tc program)")
    with _lock:
        lib = _libbpf()
        _take_log()
        ptr = _open(lib, spec.obj, _object_bytes(spec.obj))
        try:
            if spec.rodata:
                m = lib.bpf_object__find_map_by_name(ptr, b".rodata")
                if not m:
                    raise ValueError(f"{spec.obj}: no .rodata to configure")
                sz = ctypes.c_size_t(0)
                lib.bpf_map__initial_value(m, ctypes.byref(sz))
                if sz.value != len(spec.rodata):
                    raise ValueError(f"{spec.obj}: .rodata is {sz.value} bytes, got {len(spec.rodata)}")
                rc = lib.bpf_map__set_initial_value(m, spec.rodata, len(spec.rodata))
                if rc:
                    raise BpfError(f"{spec.obj}: set .rodata", _err(rc), _take_log())
            for name, fd in spec.maps.items():
                m = lib.bpf_object__find_map_by_name(ptr, name.encode())
                if not m:
                    raise ValueError(f"{spec.obj}: no map {name!r}")
                rc = lib.bpf_map__reuse_fd(m, fd)
                if rc:
                    raise BpfError(f"{spec.obj}: reuse fd for map {name}", _err(rc), _take_log())
            wanted = set(spec.hooks.values())
            progs: dict[str, int] = {}
            p = lib.bpf_object__next_program(ptr, None)
            while p:
                pname = lib.bpf_program__name(p).decode()
                progs[pname] = p
                lib.bpf_program__set_autoload(p, pname in wanted)
                p = lib.bpf_object__next_program(ptr, p)
            missing = wanted - set(progs)
            if missing:
                raise ValueError(f"{spec.obj}: no program {sorted(missing)} (has {sorted(progs)})")
            rc = lib.bpf_object__load(ptr)
            if rc:
                raise BpfError(f"{spec.obj}: load", _err(rc), _take_log())
            fds = {hook: lib.bpf_program__fd(progs[fn]) for hook, fn in spec.hooks.items()}
            ids = {hook: int.from_bytes(_info(fd)[4:8], "little") for hook, fd in fds.items()}
            return LoadedObject(ptr, fds, ids)
        except BaseException:
            lib.bpf_object__close(ptr)
            raise


# --------------------------------------------------------------------------------------------
# routes


@dataclass(frozen=True)
class RouteSpec:
    """One ``ip -batch`` line, optionally with a program instance.

    Attributes:
        command: the line, e.g. ``route add fc00::/64 {encap} dev eth1``; ``{encap}`` is
            replaced by ``encap bpf in pinned P xmit pinned Q [headroom N]`` (hooks in the
            order of ``program.hooks``). Without a program the line is passed as is.
        program: the instance to attach, or None.
    """

    command: str
    program: ProgramSpec | None = None


@dataclass(frozen=True)
class InstalledRoute:
    """A route iproute2 accepted. ``line``: the batch line as run (pin paths are gone now);
    ``prog_ids``: hook -> kernel program id (for :func:`read_counters`)."""

    line: str
    prog_ids: Mapping[str, int]


_batch_seq = itertools.count()


def _check_basename(name: str) -> None:
    if not name or len(name.encode()) > MAX_BASENAME or set(name) & _BAD_BASENAME_CHARS or name in (".", ".."):
        raise ValueError(f"bad pin basename {name!r} (1..{MAX_BASENAME} bytes; no dot, space, quote, '/', '\\', '#')")


def install_routes(netns: str | None, routes: Sequence[RouteSpec], *, ip: str = "ip",
                   timings: dict[str, float] | None = None) -> list[InstalledRoute]:
    """Load, pin, and install ``routes`` with one ``ip [-n NETNS] -batch -``; unpin always.

    Args:
        netns: the node's namespace name (as in ``/run/netns``), None for the caller's own.
        routes: the batch lines.
        ip: the iproute2 binary.
        timings: if given, filled with seconds spent in ``load`` (open+load+pin) and ``ip``.

    Returns:
        One :class:`InstalledRoute` per line, in order.

    Raises:
        ValueError, BpfError, EnvironmentProblem: as :func:`load` (nothing installed then).
        RouteInstallError: iproute2 failed; lines before the failed one are installed.
    """
    if not routes:
        return []
    for r in routes:
        if r.program is not None:
            _check_basename(r.program.basename)
            if "{encap}" not in r.command:
                raise ValueError(f"route line has no {{encap}} placeholder: {r.command!r}")
            if not r.program.hooks or set(r.program.hooks) - set(HOOKS):
                raise ValueError(f"a route program needs hooks among {', '.join(HOOKS)}")
    batch_dir = pins_dir() / f"{os.getpid()}-{next(_batch_seq)}"
    lines: list[str] = []
    ids: list[dict[str, int]] = []
    t0 = time.perf_counter()
    try:
        batch_dir.mkdir()
        for i, r in enumerate(routes):
            if r.program is None:
                lines.append(r.command)
                ids.append({})
                continue
            parts = ["encap bpf"]
            with load(r.program) as obj:  # closed at once: the pins hold the programs (O(1) fds)
                for hook, fd in obj.fds.items():
                    d = batch_dir / f"{i}-{hook}"
                    d.mkdir()
                    path = d / r.program.basename
                    pin_program(fd, path)
                    parts.append(f"{hook} pinned {path}")
                ids.append(dict(obj.ids))
            if r.program.headroom:
                parts.append(f"headroom {r.program.headroom}")
            lines.append(r.command.replace("{encap}", " ".join(parts)))
        t1 = time.perf_counter()
        cmd = [ip, *(["-n", netns] if netns else []), "-batch", "-"]
        res = subprocess.run(cmd, input="\n".join(lines) + "\n", capture_output=True, text=True, check=False)
        t2 = time.perf_counter()
        if timings is not None:
            timings["load"] = t1 - t0
            timings["ip"] = t2 - t1
        shown = [_unpinned(ln, batch_dir) for ln in lines]
        if res.returncode != 0:
            failed = _failed_line(res.stderr)
            n_ok = max(failed - 1, 0)
            done = [InstalledRoute(shown[k], ids[k]) for k in range(n_ok)]
            dropped = [i for k in range(n_ok, len(ids)) for i in ids[k].values()]
            raise RouteInstallError(res.returncode, res.stderr, failed, done, dropped)
        return [InstalledRoute(shown[k], ids[k]) for k in range(len(lines))]
    finally:
        shutil.rmtree(batch_dir, ignore_errors=True)


def _unpinned(line: str, batch_dir: Path) -> str:
    return line.replace(f"{batch_dir}/", "")


def _failed_line(stderr: str) -> int:
    import re

    m = re.search(r"Command failed \S*:(\d+)", stderr)
    return int(m.group(1)) if m else 0


# --------------------------------------------------------------------------------------------
# counters


@dataclass(frozen=True)
class Counters:
    """A route's counters, summed over CPUs (seg6local ``count`` semantics)."""

    packets: int
    bytes: int
    errors: int


def map_fd_of_prog(pid: int, map_name: str) -> int:
    """A new fd (caller closes it) of the map named ``map_name`` that program id ``pid`` uses
    (kernel map names are at most 15 characters).

    Raises:
        BpfError: no such program, or it uses no such map.
    """
    return _map_fd_of_prog(pid, map_name)


def _map_fd_of_prog(pid: int, map_name: str) -> int:
    lib = _libbpf()
    with _lock:
        pfd = lib.bpf_prog_get_fd_by_id(pid)
        if pfd < 0:
            raise BpfError(f"program id {pid}", _err(pfd))
        try:
            ids = (ctypes.c_uint32 * 16)()
            buf = ctypes.create_string_buffer(256)
            ctypes.memmove(ctypes.addressof(buf) + 52, ctypes.byref(ctypes.c_uint32(16)), 4)  # nr_map_ids
            ctypes.memmove(ctypes.addressof(buf) + 56, ctypes.byref(ctypes.c_uint64(ctypes.addressof(ids))), 8)
            ln = ctypes.c_uint32(256)
            rc = lib.bpf_obj_get_info_by_fd(pfd, buf, ctypes.byref(ln))
            if rc:
                raise BpfError(f"info of program {pid}", _err(rc))
            nr = int.from_bytes(buf.raw[52:56], "little")
        finally:
            os.close(pfd)
        for mid in list(ids)[: min(nr, 16)]:
            mfd = lib.bpf_map_get_fd_by_id(mid)
            if mfd < 0:
                continue
            name = _info(mfd)[24:40].split(b"\0", 1)[0].decode()
            if name == map_name:
                return mfd
            os.close(mfd)
    raise BpfError(f"program {pid} has no map {map_name!r}")


def read_counters(prog_id_: int) -> Counters:
    """The counters of the program instance ``prog_id_`` (its per-CPU ``counters`` map).

    Raises:
        BpfError: no such program (route gone) or it has no ``counters`` map.
    """
    fd = _map_fd_of_prog(prog_id_, "counters")
    try:
        with _lock:
            lib = _libbpf()
            ncpu = lib.libbpf_num_possible_cpus()
            buf = ctypes.create_string_buffer(24 * ncpu)
            key = ctypes.c_uint32(0)
            rc = lib.bpf_map_lookup_elem(fd, ctypes.byref(key), buf)
            if rc:
                raise BpfError("bpf_map_lookup_elem(counters)", _err(rc))
        tot = [0, 0, 0]
        raw = buf.raw
        for c in range(ncpu):
            for k in range(3):
                tot[k] += int.from_bytes(raw[24 * c + 8 * k: 24 * c + 8 * k + 8], "little")
        return Counters(*tot)
    finally:
        os.close(fd)


# --------------------------------------------------------------------------------------------
# configuration images of encap.c and end.c (layouts = struct encap_cfg / struct end_cfg)

#: Most segments of an encap route (the pushed header must fit LWT_BPF_MAX_HEADROOM = 256).
MAX_SEGMENTS = 13
_ENCAP_HDR_MAX = 40 + 8 + 16 * MAX_SEGMENTS
ENCAP_MODES: tuple[str, ...] = ("encap", "encap.red")


def srh_bytes(segments: Sequence[str], *, reduced: bool = False) -> bytes:
    """The SRH iproute2 builds for ``segs S1,..,Sn`` (next header 0, patched per packet):
    segments in reverse order, Segments Left = Last Entry = n-1, flags 0, tag 0. ``reduced``:
    as seg6_do_srh_encap_red leaves it: S1 removed, Last Entry n-2, Segments Left n-1; empty
    for n = 1."""
    import ipaddress

    segs = [ipaddress.IPv6Address(s).packed for s in segments]
    n = len(segs)
    if not 1 <= n <= MAX_SEGMENTS:
        raise ValueError(f"need 1..{MAX_SEGMENTS} segments, got {n}")
    listed = list(reversed(segs))  # listed[n-1] = S1
    if reduced:
        if n == 1:
            return b""
        listed = listed[:-1]
        return bytes([0, 2 * len(listed), 4, n - 1, n - 2, 0, 0, 0]) + b"".join(listed)
    return bytes([0, 2 * n, 4, n - 1, n - 1, 0, 0, 0]) + b"".join(listed)


def encap_rodata(segments: Sequence[str], *, mode: str = "encap", family: int = 6,
                 src: str | None = None, hop_limit_v4: int = 64) -> bytes:
    """The ``.rodata`` image of encap.c for ``encap seg6 mode MODE segs SEGMENTS``.

    Args:
        segments: S1..Sn, S1 first (as in ``segs S1,S2``).
        mode: ``encap`` (H.Encaps) or ``encap.red`` (H.Encaps.Red).
        family: the route's family (4 or 6): the payload the program accepts.
        src: the route's outer source, used while the node's tunsrc is unset (None: the
            node's default source, :meth:`NodeMaps.set_default_source`).
        hop_limit_v4: outer hop limit for IPv4 payloads (ip6_dst_hoplimit of the route).

    Raises:
        ValueError: bad mode, family, address, or number of segments.
    """
    import ipaddress
    import struct

    if mode not in ENCAP_MODES:
        raise ValueError(f"unknown encap mode {mode!r} (use {', '.join(ENCAP_MODES)})")
    if family not in (4, 6):
        raise ValueError(f"family must be 4 or 6, not {family!r}")
    srh = srh_bytes(segments, reduced=(mode == "encap.red"))
    da = ipaddress.IPv6Address(segments[0]).packed
    ip6 = bytearray(40)
    ip6[0] = 0x60
    ip6[6] = 43 if srh else 0
    ip6[24:40] = da
    hdr = bytes(ip6) + srh
    return struct.pack(f"<{_ENCAP_HDR_MAX}sHBBB3x16s", hdr, len(hdr), 40 if srh else 6, hop_limit_v4 & 0xFF,
                       family, ipaddress.IPv6Address(src or "::").packed)


def encap_headroom(segments: Sequence[str]) -> int:
    """The kernel's seg6_lwt_headroom for an encap/encap.red route: 40 + the full SRH."""
    return 40 + 8 + 16 * len(segments)


def encap_program(segments: Sequence[str], *, mode: str = "encap", family: int = 6, src: str | None = None,
                  hop_limit_v4: int = 64, tunsrc_fd: int | None = None,
                  basename: str = "anibench-encap", xmit_only: bool = False) -> ProgramSpec:
    """The ProgramSpec of an H.Encaps(.Red) route (hooks ``in`` and ``xmit``, the kernel's
    headroom). ``tunsrc_fd``: the node's :class:`NodeMaps` ``tunsrc_fd`` (None: a private,
    always-unset map). ``xmit_only``: hook ``xmit`` alone, so that a forwarded packet is
    encapsulated after its inner forward, netfilter's FORWARD and POSTROUTING (conntrack's
    confirmation, SNAT) seeing the inner packet first, as the kernel's seg6_input does with
    ``net.netfilter.nf_hooks_lwtunnel = 1`` (its inner hop limit restored by the program). Raises
    ValueError like :func:`encap_rodata`."""
    return ProgramSpec(
        obj="encap", hooks={"xmit": "encap_xmit"} if xmit_only else {"in": "encap_in", "xmit": "encap_xmit"},
        rodata=encap_rodata(segments, mode=mode, family=family, src=src, hop_limit_v4=hop_limit_v4),
        maps={"tunsrc": tunsrc_fd} if tunsrc_fd is not None else {},
        basename=basename, headroom=encap_headroom(segments),
    )


def end_rodata(*, next_csid: bool = False, lblen: int = 32, nflen: int = 16) -> bytes:
    """The ``.rodata`` image of end.c: End, or End with ``flavors next-csid lblen L nflen N``.

    Raises:
        ValueError: lengths the kernel refuses (not multiples of 8, or lblen + nflen > 128;
            seg6_local.c also requires both non-zero).
    """
    import struct

    if next_csid:
        if lblen % 8 or nflen % 8 or not lblen or not nflen or lblen + nflen > 128:
            raise ValueError(f"bad next-csid lengths lblen {lblen} nflen {nflen} (multiples of 8, sum <= 128)")
    return struct.pack("<BBBx", 1 if next_csid else 0, lblen // 8, nflen // 8)


def end_program(*, next_csid: bool = False, lblen: int = 32, nflen: int = 16,
                basename: str = "anibench-end") -> ProgramSpec:
    """The ProgramSpec of an End route (hook ``xmit``). Raises ValueError like :func:`end_rodata`."""
    return ProgramSpec(obj="end", hooks={"xmit": "end_xmit"},
                       rodata=end_rodata(next_csid=next_csid, lblen=lblen, nflen=nflen), basename=basename)


def route_source(netns: str | None, dst: str, *, ip: str = "ip") -> str | None:
    """The source address the kernel would pick in ``netns`` for ``dst`` (``ip -6 route get``),
    or None when there is no route or no source. A fair per-route ``src`` for
    :func:`encap_program` (the kernel uses ipv6_dev_get_saddr on the route's device)."""
    res = subprocess.run([ip, *(["-n", netns] if netns else []), "-6", "route", "get", dst],
                         capture_output=True, text=True, check=False)
    words = res.stdout.split()
    if res.returncode == 0 and "src" in words:
        return words[words.index("src") + 1]
    return None


# --------------------------------------------------------------------------------------------
# GSO helper (see bpf/encap.c and bpf/encap_gso.c)

#: Default name of a node's GSO helper device.
GSO_HELPER = "sr6gso"


def gso_helper_up(netns: str | None, node_maps: NodeMaps, *, ifname: str = GSO_HELPER,
                  ip: str = "ip", tc: str = "tc") -> int:
    """Give a node the GSO path of H.Encaps(.Red): a portless bridge ``ifname`` (MTU 65535,
    up) whose tc ingress runs encap_gso.c, its ifindex recorded in ``node_maps`` (key 2).
    Idempotent (the device is reused, the filter replaced). The tc program is pinned only
    while ``tc`` attaches it. The node needs IPv6 forwarding on (it forwards the outer packet).

    Returns:
        the helper's ifindex.

    Raises:
        BpfError: load/pin failed.  SubstrateError: ip/tc refused (message has their stderr).
    """
    import json

    pre = [*(["-n", netns] if netns else [])]

    def run(*argv: str, ok_exists: bool = False) -> str:
        res = subprocess.run(list(argv), capture_output=True, text=True, check=False)
        if res.returncode != 0 and not (ok_exists and "exists" in res.stderr):
            raise SubstrateError(f"{' '.join(argv)}: {res.stderr.strip()}")
        return res.stdout

    run(ip, *pre, "link", "add", ifname, "type", "bridge", ok_exists=True)
    run(ip, *pre, "link", "set", ifname, "mtu", "65535", "up")
    ifindex = int(json.loads(run(ip, *pre, "-j", "link", "show", "dev", ifname))[0]["ifindex"])
    obj = load(ProgramSpec(obj="encap_gso", hooks={"tc": "encap_gso_ingress"}))
    d = pins_dir() / f"{os.getpid()}-{next(_batch_seq)}"
    try:
        d.mkdir()
        pin = d / "encap_gso"
        pin_program(obj.fds["tc"], pin)
        # a clsact left with other filters (a node's, put before ours) goes whole, with them
        subprocess.run([tc, *pre, "qdisc", "del", "dev", ifname, "clsact"], capture_output=True, check=False)
        run(tc, *pre, "qdisc", "replace", "dev", ifname, "clsact")
        run(tc, *pre, "filter", "replace", "dev", ifname, "ingress", "pref", "1", "handle", "1", "bpf",
            "direct-action", "object-pinned", str(pin))
    finally:
        obj.close()
        shutil.rmtree(d, ignore_errors=True)
    node_maps.set_gso_ifindex(ifindex)
    node_maps.gso = (ifindex, obj.ids["tc"])
    return ifindex


def gso_helper_down(netns: str | None, node_maps: NodeMaps | None, *, ifname: str = GSO_HELPER,
                    ip: str = "ip") -> None:
    """Undo :func:`gso_helper_up` (forget the ifindex, delete the device and its program)."""
    if node_maps is not None and node_maps.tunsrc_fd >= 0:
        node_maps.set_gso_ifindex(0)
    subprocess.run([ip, *(["-n", netns] if netns else []), "link", "del", ifname], capture_output=True, check=False)
