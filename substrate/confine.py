"""Node confinement policy of the netns backend: what a node may see of the host and how much of
the host it may use.

A node is a set of namespaces (see ``node_init.py``): a user namespace of its own owns its
network, UTS, IPC and cgroup namespaces, so root in a node holds CAP_NET_ADMIN (and every other
capability of that user namespace) over its own namespaces only. A netlink request that names
another node's namespace -- by ``IFLA_TARGET_NETNSID``, ``IFLA_LINK_NETNSID``, a PID or a
namespace file -- needs CAP_NET_ADMIN in the user namespace that owns that namespace, which a
node never has (rtnetlink ``rtnl_get_net_ns_capable`` / ``rtnl_link_get_net_capable``). Its mount
and PID namespaces stay owned by the host's user namespace, so nothing in a node can mount,
unmount, reboot(2) or enter them (not even root with every capability of its user namespace):
the masks below cannot be lifted from inside. Nested user namespaces are forbidden
(``user.max_user_namespaces`` = 0 in the node's). User and group ids map one to one onto the
host's (root in a node is uid 0): what protects the host's files is that a node cannot reach
them, not their owner.

This module holds the data of that policy and the host-side code that applies it:

- :data:`ETC_ALLOWLIST`: the host files a node's ``/etc`` holds, copied once per lab (deny by
  default: a file the host adds or replaces later never reaches a node);
- :data:`PROC_MASKED`, :data:`PROC_READONLY`, :data:`SYS_MASKED`: the ``/proc`` and ``/sys``
  entries hidden or made read-only, as container runtimes do (moby's default ``MaskedPaths`` and
  ``ReadonlyPaths``; ``/proc/sysrq-trigger`` masked outright);
- :class:`NodeLimits`: per-node cgroup limits (pids, memory) and tmpfs sizes, configurable with
  ``ANIBENCH_NODE_LIMITS``;
- cgroups: one per node (cgroup v2, or the v1 ``pids`` and ``memory`` hierarchies), and one per
  confined command inside it, so what an agent's command leaves running (``setsid cmd &``) is
  found and killed when the command returns.
"""

from __future__ import annotations

import ctypes
import os
import re
import shutil
import signal
import stat
import struct
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from substrate.errors import EnvironmentProblem

# -- files --------------------------------------------------------------------------------------

#: Host files (relative to /etc) a node's /etc holds: name service, iproute2 and protocol tables,
#: the dynamic linker cache, the alternatives symlinks (iptables, awk, ...) and shell and Python
#: defaults. A directory is copied with its content. Anything else of the host's /etc (shadow,
#: ssh keys, package-manager credentials, resolvers, machine-id, ...) is absent from nodes; a
#: listed file that others cannot read (mode o-r) is left out too. ``frr/`` and ``hostname`` are
#: each node's own; ``hosts`` is generated (:data:`ETC_HOSTS`).
ETC_ALLOWLIST: tuple[str, ...] = (
    "passwd", "group", "nsswitch.conf", "host.conf", "gai.conf",
    "protocols", "services", "ethertypes", "networks", "rpc",
    "ld.so.cache", "ld.so.conf", "ld.so.conf.d",
    "alternatives", "iproute2",
    "localtime", "timezone", "os-release", "debian_version", "mtab",
    "bash.bashrc", "profile", "inputrc", "shells",
    "python3", "python3.11", "python3.12", "python3.13", "terminfo",
)  # fmt: skip
#: A node's /etc/hosts (the host's own names stay on the host).
ETC_HOSTS = "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n"

#: /proc entries a node sees as empty (files: /dev/null bound over them; directories: an empty
#: read-only tmpfs). moby's default MaskedPaths, plus /proc/sysrq-trigger.
PROC_MASKED: tuple[str, ...] = (
    "asound", "acpi", "interrupts", "kcore", "keys", "latency_stats", "timer_list", "timer_stats",
    "sched_debug", "scsi", "sysrq-trigger",
)  # fmt: skip
#: /proc entries a node sees read-only (moby's default ReadonlyPaths). /proc/sys/net stays
#: writable: it is the node's own network namespace's.
PROC_READONLY: tuple[str, ...] = ("bus", "fs", "irq", "sys")
#: /sys entries masked (sysfs itself is mounted read-only): firmware tables, the RAPL energy
#: counters (powercap) and the per-CPU thermal throttle counters.
SYS_MASKED: tuple[str, ...] = ("firmware", "devices/virtual/powercap", "devices/system/cpu/cpu*/thermal_throttle")


def sys_masked(sys_root: Path = Path("/sys")) -> list[str]:
    """:data:`SYS_MASKED` with its patterns expanded against the host's sysfs (what they match is
    the same in every node: CPUs and firmware are not per network namespace), relative to /sys."""
    out: list[str] = []
    for p in SYS_MASKED:
        out += sorted(str(m.relative_to(sys_root)) for m in sys_root.glob(p)) if "*" in p else [p]
    return out


def stage_etc(dest: Path, source: Path = Path("/etc")) -> list[str]:
    """Copy the allowlisted files of ``source`` into ``dest`` (a lab's /etc for its nodes).

    Symlinks are copied as symlinks (a link to a file that is not copied dangles in the node);
    only regular files, directories and symlinks are copied, and a regular file only if others may
    read it. ``dest/frr`` (a directory) and ``dest/hostname`` (an empty file) are created as mount
    points for each node's own.

    Returns:
        The files and symlinks copied, relative to ``source``.
    """
    dest.mkdir(parents=True, exist_ok=True)
    copied: list[str] = []

    def copy(rel: str) -> None:
        src, dst = source / rel, dest / rel
        try:
            st = os.lstat(src)
        except OSError:
            return
        if stat.S_ISLNK(st.st_mode):
            os.symlink(os.readlink(src), dst)
        elif stat.S_ISDIR(st.st_mode):
            dst.mkdir(mode=0o755)
            for child in sorted(os.listdir(src)):
                copy(f"{rel}/{child}")
            return
        elif stat.S_ISREG(st.st_mode) and st.st_mode & stat.S_IROTH:
            shutil.copyfile(src, dst)
            os.chmod(dst, stat.S_IMODE(st.st_mode) & 0o755)
        else:
            return
        copied.append(rel)

    for rel in ETC_ALLOWLIST:
        copy(rel)
    (dest / "hosts").write_text(ETC_HOSTS)
    (dest / "frr").mkdir(exist_ok=True)
    (dest / "hostname").touch()
    return copied


# -- host-side access to a node's files ----------------------------------------------------------

_PROC_ROOT = re.compile(r"^/proc/(\d+)/root/(.+)$")
_O_PATH = 0o10000000
_RESOLVE_NO_MAGICLINKS, _RESOLVE_IN_ROOT = 0x02, 0x10
_SYS_OPENAT2 = 437  # the same number on every architecture (asm-generic)
_libc = ctypes.CDLL(None, use_errno=True)


def open_in_root(path: str | Path, flags: int = _O_PATH) -> int:
    """Open a file of a node from the host: ``path`` below ``/proc/PID/root/`` is resolved
    inside PID's root (``openat2`` with ``RESOLVE_IN_ROOT``), so a symlink a node's agent made
    there -- ``/run/frr/isisd.vty -> /proc/N/root/run/frr/isisd.vty``, or to a host file -- can
    only lead to another of the node's own files, never into the host's or another node's (the
    kernel resolves an absolute symlink met after ``/proc/PID/root`` from the *caller's* root).
    Other paths are opened as they are. Returns a descriptor (close it); for a socket, connect to
    ``/proc/self/fd/N`` (``flags`` default ``O_PATH``).

    Raises:
        OSError: absent, or it cannot be opened (``ENOSYS`` on kernels before 5.6).
    """
    m = _PROC_ROOT.match(str(path))
    if not m:
        return os.open(path, flags | os.O_CLOEXEC)
    root = os.open(f"/proc/{m.group(1)}/root", _O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        how = struct.pack("QQQ", flags | os.O_CLOEXEC, 0, _RESOLVE_IN_ROOT | _RESOLVE_NO_MAGICLINKS)
        fd = _libc.syscall(_SYS_OPENAT2, root, m.group(2).encode(), how, len(how))
        if fd < 0:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err), str(path))
        return fd
    finally:
        os.close(root)


def read_node_file(path: str | Path, limit: int = 1 << 20) -> str:
    """The text of a node's regular file (:func:`open_in_root`; a FIFO or device is refused
    without blocking).

    Raises:
        OSError: absent, not a regular file, or unreadable.
    """
    fd = open_in_root(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(f"{path}: not a regular file")
        return os.read(fd, limit).decode(errors="replace")
    finally:
        os.close(fd)


# -- limits -------------------------------------------------------------------------------------

LIMITS_ENV = "ANIBENCH_NODE_LIMITS"
_SIZE = re.compile(r"^(\d+)([kmg]?)$", re.I)


class NodeLimits(BaseModel):
    """Resource limits of every node of a lab (per node, not per lab).

    Defaults fit a router running zebra, staticd, isisd and bgpd (about 40 MiB) plus an agent's
    commands, with every tmpfs full. Override with ``ANIBENCH_NODE_LIMITS`` (comma-separated
    ``field=value``, sizes in MiB or with a k/m/g suffix), e.g.
    ``ANIBENCH_NODE_LIMITS=pids=1024,memory=1g,tmp=128m``. The limits a lab was deployed with are
    in its record (``nodes.*.limits`` of ``lab.json``).
    """

    model_config = ConfigDict(extra="forbid")

    pids: int = Field(default=512, ge=32, description="Tasks (processes and threads) of the node together (cgroup pids.max).")
    command_pids: int = Field(
        default=256, ge=8, description="Tasks of one confined (agent) command and what it starts; the rest of `pids` stays for the node's daemons.")
    memory: int = Field(default=512, ge=64, description="MiB of memory of the node together, its tmpfs pages included (cgroup memory.max; no swap).")  # fmt: skip
    tmp: int = Field(default=64, ge=1, description="MiB of /tmp (tmpfs).")
    var: int = Field(default=64, ge=1, description="MiB of /var (tmpfs: FRR's logs and state).")
    run: int = Field(default=16, ge=1, description="MiB of /run (tmpfs: FRR's sockets and PID files).")
    shm: int = Field(default=16, ge=1, description="MiB of /dev/shm (tmpfs).")
    home: int = Field(default=16, ge=1, description="MiB of /root (tmpfs, root's home).")
    etc_frr: int = Field(default=8, ge=1, description="MiB of /etc/frr (tmpfs, the node's FRR configuration).")

    def tmpfs(self) -> dict[str, str]:
        """Mount point inside the node (relative to its root) -> tmpfs ``size=`` value."""
        return {"tmp": f"{self.tmp}m", "var": f"{self.var}m", "run": f"{self.run}m",
                "dev/shm": f"{self.shm}m", "root": f"{self.home}m"}  # fmt: skip


def node_limits(spec: str | None = None) -> NodeLimits:
    """The limits given by ``spec`` (default: ``$ANIBENCH_NODE_LIMITS``; unset or empty: defaults).

    Raises:
        EnvironmentProblem: a malformed spec (unknown field, bad number), naming the fields.
    """
    spec = os.environ.get(LIMITS_ENV, "") if spec is None else spec
    values: dict[str, int] = {}
    for item in filter(None, (s.strip() for s in spec.split(","))):
        key, _, raw = item.partition("=")
        m = _SIZE.match(raw.strip())
        if not m:
            raise EnvironmentProblem(f"{LIMITS_ENV}: {item!r} is not field=number (fields: {', '.join(NodeLimits.model_fields)})")
        n, unit = int(m.group(1)), m.group(2).lower()
        key = key.strip().replace("-", "_")
        if key != "pids":
            n = {"k": max(1, n // 1024), "m": n, "g": n * 1024, "": n}[unit]
        values[key] = n
    try:
        limits = NodeLimits(**values)
    except ValidationError as e:
        err = e.errors()[0]
        raise EnvironmentProblem(
            f"{LIMITS_ENV}: {'.'.join(map(str, err['loc'])) or spec}: {err['msg']} (fields: {', '.join(NodeLimits.model_fields)})"
        ) from None
    if limits.command_pids >= limits.pids:
        raise EnvironmentProblem(f"{LIMITS_ENV}: command_pids ({limits.command_pids}) must be below pids ({limits.pids})")
    return limits


# -- cgroups ------------------------------------------------------------------------------------

#: Name of anibench's cgroup below the root of each hierarchy; a lab's is ``anibench/<lab>``.
CGROUP_ROOT_NAME = "anibench"
#: Prefix of a confined command's cgroup inside its node's.
COMMAND_CGROUP_PREFIX = "cmd-"


@dataclass(frozen=True)
class CgroupLayout:
    """Where this machine's cgroup controllers are.

    ``version`` 2: ``pids`` and ``memory`` are the same unified hierarchy. Version 1: the two
    controllers' own hierarchies. ``pids`` is also where a command's membership is tracked.
    """

    version: int
    pids: Path
    memory: Path

    def roots(self) -> list[Path]:
        return [self.pids] if self.version == 2 else [self.pids, self.memory]


def cgroup_layout(mountinfo: str | None = None) -> CgroupLayout:
    """Find the ``pids`` and ``memory`` controllers: cgroup v2 if its root offers both, else the
    v1 hierarchies.

    Raises:
        EnvironmentProblem: neither offers both (the node limits cannot be enforced).
    """
    if mountinfo is None:
        mountinfo = Path("/proc/self/mountinfo").read_text()
    v1: dict[str, Path] = {}
    v2: list[Path] = []
    for line in mountinfo.splitlines():
        pre, _, post = line.partition(" - ")
        fields, fs = pre.split(), post.split()
        if len(fields) < 5 or len(fs) < 3 or fields[3] != "/":
            continue  # only whole hierarchies (a bind of a sub-cgroup is not a root)
        if fs[0] == "cgroup2":
            v2.append(Path(fields[4]))
        elif fs[0] == "cgroup":
            for opt in fs[2].split(","):
                if opt in ("pids", "memory") and opt not in v1:
                    v1[opt] = Path(fields[4])
    for root in v2:
        try:
            controllers = (root / "cgroup.controllers").read_text().split()
        except OSError:
            continue
        if {"pids", "memory"} <= set(controllers):
            return CgroupLayout(2, root, root)
    if "pids" in v1 and "memory" in v1:
        return CgroupLayout(1, v1["pids"], v1["memory"])
    raise EnvironmentProblem(
        "no cgroup with the pids and memory controllers (cgroup v2 with both enabled at its root, or the v1 "
        "pids and memory hierarchies): node limits cannot be enforced"
    )


def _write(path: Path, value: str) -> None:
    with open(path, "w") as f:
        f.write(value)


def _mkdir(path: Path) -> None:
    try:
        path.mkdir()
    except FileExistsError:
        pass


#: Leaf cgroup, in the pids hierarchy (cgroup v2: the unified one), of a node's own processes
#: (init, FRR daemons, the harness's commands); each confined command gets a sibling of it, so no
#: cgroup both holds processes and has children (cgroup v2's no-internal-process rule).
NODE_LEAF = "main"


def create_lab_cgroups(lab: str, nodes: Iterable[str], limits: NodeLimits) -> dict[str, list[str]]:
    """Create one cgroup per node with ``limits`` (``anibench/<lab>/<node>`` in each hierarchy)::

        pids (v2: unified)  anibench/<lab>/<node>          pids.max (v2: and memory.max)
                            anibench/<lab>/<node>/main     the node's processes
                            anibench/<lab>/<node>/cmd-*    one per confined command (pids.max)
        memory (v1 only)    anibench/<lab>/<node>          memory.limit_in_bytes, the node's processes

    Returns:
        node -> the cgroups its processes join; the first one (``.../main``) tracks membership.

    Raises:
        EnvironmentProblem: no usable cgroup controllers. OSError: the cgroup filesystem refused.
    """
    lay = cgroup_layout()
    labs = [root / CGROUP_ROOT_NAME / lab for root in lay.roots()]
    if lay.version == 2:
        for d in (lay.pids, lay.pids / CGROUP_ROOT_NAME):
            _mkdir(d)
            enabled = (d / "cgroup.subtree_control").read_text().split()
            if not {"pids", "memory"} <= set(enabled):
                _write(d / "cgroup.subtree_control", "+pids +memory")
    for d in labs:
        d.mkdir(parents=True, exist_ok=True)
    if lay.version == 2:
        _write(labs[0] / "cgroup.subtree_control", "+pids +memory")
    memory = str(limits.memory << 20)
    out: dict[str, list[str]] = {}
    for node in nodes:
        dirs = [d / node for d in labs]
        for d in dirs:
            _mkdir(d)
        _write(dirs[0] / "pids.max", str(limits.pids))
        if lay.version == 2:
            _write(dirs[0] / "cgroup.subtree_control", "+pids")  # the commands' own pids.max
            _write(dirs[0] / "memory.max", memory)
            if (dirs[0] / "memory.swap.max").exists():
                _write(dirs[0] / "memory.swap.max", "0")
        else:
            _write(dirs[1] / "memory.limit_in_bytes", memory)
            if (dirs[1] / "memory.memsw.limit_in_bytes").exists():
                _write(dirs[1] / "memory.memsw.limit_in_bytes", memory)
        _mkdir(dirs[0] / NODE_LEAF)
        out[node] = [str(dirs[0] / NODE_LEAF), *map(str, dirs[1:])]
    return out


def procs_file(cgroup: str | Path) -> str:
    """The file a process writes ``0`` into to join ``cgroup``."""
    return str(Path(cgroup) / "cgroup.procs")


def _subdirs(d: str | Path) -> list[str]:
    """Sub-cgroups of ``d``, deepest last (a walk by directory entry type: no stat per file)."""
    out, todo = [], [str(d)]
    while todo:
        try:
            with os.scandir(todo.pop()) as it:
                found = [e.path for e in it if e.is_dir(follow_symlinks=False)]
        except OSError:
            continue
        out += found
        todo += found
    return out


def members(cgroup: str | Path, recursive: bool = True) -> set[int]:
    """PIDs (host view) of the processes in ``cgroup`` (and, by default, its sub-cgroups)."""
    out: set[int] = set()
    for d in [str(cgroup), *(_subdirs(cgroup) if recursive else [])]:
        try:
            with open(os.path.join(d, "cgroup.procs")) as f:
                out.update(int(p) for p in f.read().split())
        except OSError:
            continue
    return out


def new_command_cgroup(node_cgroups: list[str], pids_max: int | None = None) -> list[str]:
    """A cgroup for one confined command beside its node's processes (a sibling of the tracking
    cgroup), with its own ``pids_max`` if given; the node's limits apply to it too. Returns the
    directories the command joins: the new one in place of the node's tracking cgroup, the node's
    others as they are.

    Raises:
        OSError: the node's cgroup is gone (the lab was destroyed).
    """
    d = Path(node_cgroups[0]).parent / f"{COMMAND_CGROUP_PREFIX}{uuid.uuid4().hex[:12]}"
    d.mkdir()
    if pids_max:
        _write(d / "pids.max", str(pids_max))
    return [str(d), *node_cgroups[1:]]


def end_command_cgroup(
    cmd_cgroup: str, node_cgroups: list[str], keep: Callable[[int], bool], timeout_s: float = 5.0
) -> list[str]:
    """Kill what a confined command left running and remove its cgroup.

    Every process still in ``cmd_cgroup`` is killed (SIGKILL, repeated until the cgroup is empty:
    a process forking meanwhile is caught on the next pass) except those ``keep`` accepts, which
    move to the node's cgroups (an FRR daemon the command restarted).

    Returns:
        The processes killed, as ``comm (pid N)`` (N in the node's PID namespace).
    """
    killed: dict[int, str] = {}
    deadline = time.monotonic() + timeout_s
    path = Path(cmd_cgroup)
    kept: set[int] = set()
    while True:
        pids = members(path, recursive=False) - kept
        if not pids:
            break
        for pid in sorted(pids):
            if pid not in killed and keep(pid):
                try:
                    for d in node_cgroups:
                        _write(Path(procs_file(d)), str(pid))
                    kept.add(pid)
                    continue
                except OSError:
                    pass  # it exited meanwhile, or cannot move: kill it
            if pid not in killed:
                killed[pid] = _comm(pid)
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if time.monotonic() > deadline:
            break
        time.sleep(0.005)  # poll: killed processes leave the cgroup within milliseconds
    _rmdir_retry(path, deadline)  # if it stays busy, lab destroy or cleanup removes it
    return list(killed.values())


def _comm(pid: int) -> str:
    """``name (pid N)`` of a process, N as its own PID namespace sees it (a node's view, not the
    host's)."""
    try:
        comm = Path(f"/proc/{pid}/comm").read_text().strip()
        status = Path(f"/proc/{pid}/status").read_text()
        own = next(ln.split()[-1] for ln in status.splitlines() if ln.startswith("NSpid:"))
        return f"{comm} (pid {own})"
    except (OSError, StopIteration):
        return "?"


def kill_cgroups(dirs: Iterable[str | Path], timeout_s: float = 5.0) -> int:
    """SIGKILL every process in ``dirs`` and their sub-cgroups until they are empty, then remove
    them all (deepest first). Returns the number of processes signalled. Missing directories are
    ignored."""
    dirs = [Path(d) for d in dirs]
    signalled: set[int] = set()
    deadline = time.monotonic() + timeout_s
    while True:
        pids = set().union(*(members(d) for d in dirs)) if dirs else set()
        if not pids or time.monotonic() > deadline:
            break
        for p in pids:
            try:
                os.kill(p, signal.SIGKILL)
            except ProcessLookupError:
                pass
        signalled |= pids
        time.sleep(0.005)  # poll: killed processes leave the cgroup within milliseconds
    for d in dirs:
        for s in [*sorted(_subdirs(d), key=lambda p: -p.count("/")), str(d)]:
            _rmdir_retry(Path(s), deadline)
    return len(signalled)


def _rmdir_retry(d: Path, deadline: float) -> None:
    while True:
        try:
            d.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:
            if time.monotonic() > deadline:
                return
            time.sleep(0.005)


def lab_cgroups() -> dict[str, list[Path]]:
    """Lab name -> its cgroup directories (one per hierarchy), for every lab that has one."""
    try:
        lay = cgroup_layout()
    except (EnvironmentProblem, OSError):
        return {}
    out: dict[str, list[Path]] = {}
    for root in lay.roots():
        base = root / CGROUP_ROOT_NAME
        if base.is_dir():
            for d in base.iterdir():
                if d.is_dir():
                    out.setdefault(d.name, []).append(d)
    return out
