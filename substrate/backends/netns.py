"""The ``netns`` backend: every node a set of Linux namespaces, every link a veth pair, FRR from
the distribution. Needs root; no Docker.

Bring-up (all steps batched or parallel; see ``bench/lab_up.py`` for the figures):

1. the lab's ``/etc`` for its nodes is staged from the host's allowlisted files, and every node
   gets a cgroup with the lab's limits (:mod:`substrate.confine`);
2. each node's init (``node_init.py``) starts in its cgroup and creates the node's namespaces:
   a user namespace of the node's own owning its network, UTS, IPC, PID and cgroup namespaces,
   and a mount namespace (owned by the host) with a minimal private root; sysctls are set
   before any link exists (DAD off); the init then waits as PID 1 of the node;
3. one ``ip -batch`` names every node's network namespace (``netns attach``), one more creates
   every veth pair with both ends directly inside their namespaces (no interface ever exists in
   the host namespace, so labs cannot clash on names);
4. one ``ip -n NS -batch`` per node brings links up and, on underlay routers, creates ``sr0`` and
   the SRv6 locator's ``seg6local End`` route (NEXT-C-SID flavor, with counters); on base hosts it
   sets addresses and the default route (a router with its own configuration gets neither);
5. each router's FRR files (:func:`substrate.frr.node_files`) are written into its ``/etc/frr``
   and its daemon set starts (``vtysh -b`` loads the integrated frr.conf, when there is one).

A command runs in a node through ``nsenter`` into all its namespaces, the user namespace last, so
it is root of the node's namespaces only; it first joins the node's cgroup, and a confined
command (an agent's) a cgroup of its own inside it, whose leftovers are killed when it returns.
"""

from __future__ import annotations

import ctypes
import json
import os
import select
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING

from substrate import addressing as addr
from substrate import confine, frr
from substrate.backends import register
from substrate.errors import BringUpError, ExecError
from substrate.features import check_root_and_tools, require
from substrate.paths import netns_name
from substrate.process import ExecResult, run_bounded
from substrate.record import NodeState, pid_alive, pid_start
from substrate.topology import Role

if TYPE_CHECKING:
    import threading

    from substrate.backends import LabHandle as Lab

#: Environment of every command run in a node (nothing of the caller's environment leaks in).
NODE_ENV = {
    "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "HOME": "/root",
    "LANG": "C.UTF-8",
    "TERM": "dumb",
}
#: Capabilities kept by confined commands (agent shells), in the node's own user namespace (they
#: act on the node's namespaces only). Everything else is dropped from the bounding set, notably
#: CAP_SYS_ADMIN (setns, unshare, namespaces' ids), CAP_SYS_RESOURCE (rlimits, reserved space),
#: CAP_SYS_PTRACE, CAP_MKNOD, CAP_SYS_CHROOT, CAP_SETFCAP, CAP_BPF, CAP_PERFMON, CAP_SYSLOG. The
#: node's network stays fully configurable (CAP_NET_ADMIN, CAP_NET_RAW).
CONFINED_CAPS = (
    "chown", "dac_override", "fowner", "fsetid", "kill", "setgid", "setuid", "net_bind_service",
    "net_broadcast", "net_admin", "net_raw", "ipc_lock", "audit_write",
)
#: Environment of the harness's own commands in a node: no HOME an agent can write to, no
#: Python user site (``~/.local/.../*.pth`` runs code at every interpreter start: frr-reload.py).
HARNESS_ENV = {**NODE_ENV, "HOME": "/", "PYTHONNOUSERSITE": "1"}
#: Directory of a lab holding its nodes' /etc (the host's allowlisted files, see confine.stage_etc).
ETC_DIR = "etc"
MNT_DETACH = 2
#: Size of the tmpfs holding a lab's /etc copy (about 1 MiB of files and symlinks).
ETC_TMPFS_SIZE = "8m"
_libc = ctypes.CDLL(None, use_errno=True)
_libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]
_libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
MS_NOSUID, MS_NODEV, MS_NOEXEC = 2, 4, 8
#: Bounds of bring-up steps (seconds).
INIT_READY_TIMEOUT_S = 60.0
FRR_START_TIMEOUT_S = 60.0
#: Bound on the wait for a destroyed lab's processes to leave its cgroups (killed processes
#: that were in uninterruptible sleep exit late on a loaded machine: 5 s was not always enough).
CGROUP_KILL_TIMEOUT_S = 30.0


def _tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise ExecError(f"{name} not found")
    return path


def _init_script() -> str:
    return str(resources.files("substrate").joinpath("node_init.py"))


def ip_batch(lines: list[str], netns: str | None = None, timeout_s: float = 30.0,
             env: dict[str, str] | None = None) -> ExecResult:  # fmt: skip
    """Run iproute2 commands in one ``ip -batch -`` process (optionally ``-n NETNS``; ``env``: the
    eBPF data plane's, :func:`substrate.dataplane.ebpf.front.host_env`, for a node of such a lab).

    ``-force`` keeps going after an error; the result's returncode is non-zero if any line failed
    and stderr says which.
    """
    argv = ["ip", "-force"]
    if netns:
        argv += ["-n", netns]
    argv += ["-batch", "-"]
    return run_bounded(argv, timeout_s=timeout_s, input="\n".join(lines) + "\n", node=netns or "", env=env)


def ip_env(lab: Lab, node: str) -> dict[str, str] | None:
    """The environment of a host-side ``ip -n`` acting on ``node``: None on the kernel data
    plane; on the eBPF one, the node's netlink shim and socket (one path with the node's own ip)."""
    if lab.record.dataplane != "ebpf":
        return None
    from substrate.dataplane.ebpf import front

    return front.host_env(lab.dir, node)


def kill_netns_processes(namespaces: list[str]) -> int:
    """SIGKILL every process inside the given network namespaces; wait (bounded) until gone.

    Killing a node's init kills its whole PID namespace; anything that merely entered the network
    namespace (``ip netns exec``) is found by ``ip netns pids``. Returns the number of PIDs signalled.
    """
    pids: set[int] = set()
    for ns in namespaces:
        r = run_bounded(["ip", "netns", "pids", ns], timeout_s=5)
        pids.update(int(p) for p in r.stdout.split() if p.isdigit())
    for p in pids:
        try:
            os.kill(p, signal.SIGKILL)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + 5.0
    while any(_running(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.01)  # poll: processes die within milliseconds of SIGKILL
    return len(pids)


def _running(pid: int) -> bool:
    """True if ``pid`` exists and is not a zombie (zombies hold no namespace; their parent -- the
    host's init for a node's ``unshare`` -- reaps them in its own time)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def delete_netns(namespaces: list[str]) -> None:
    """Delete network namespaces (missing ones are ignored)."""
    if namespaces:
        ip_batch([f"netns del {ns}" for ns in namespaces])


@register("netns")
class NetnsBackend:
    """Linux namespaces + veth + FRR (see module docstring)."""

    name = "netns"

    def check_environment(self) -> None:
        check_root_and_tools(need_frr=True)
        confine.cgroup_layout()
        confine.node_limits()
        require()  # last: the kernel probe and the data plane's line name what the machine lacks

    # -- deploy --------------------------------------------------------------------------------

    def deploy(self, lab: Lab, frr_extra: dict[str, list[str]], say: Callable[[str], None]) -> None:
        from substrate.features import probe

        from substrate.dataplane import select

        rec, topo = lab.record, lab.topology
        choice = select()
        rec.features = f"{probe().line(choice.dataplane)}; {choice.line()}"
        rec.dataplane = choice.dataplane or "kernel"
        limits = confine.node_limits()
        rec.node_limits = limits.model_dump()
        timings: dict[str, float] = {}
        t = time.monotonic()
        for n in topo.nodes:
            daemons = list(n.frr_daemons)
            rec.nodes[n.name] = NodeState(name=n.name, role=n.role, netns=netns_name(lab.name, n.name), daemons=daemons)
        lab._save()  # nodes are recorded before they exist, so a crash leaves a findable trail
        etc = lab.dir / ETC_DIR  # a tmpfs: hundreds of small files and symlinks, written in memory
        etc.mkdir()
        if _libc.mount(b"anibench-etc", str(etc).encode(), b"tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC,
                       f"size={ETC_TMPFS_SIZE},mode=755".encode()) != 0:  # fmt: skip
            raise BringUpError(f"cannot mount the lab's /etc copy: {os.strerror(ctypes.get_errno())}")
        confine.stage_etc(etc)
        for n in topo.nodes:
            (lab.dir / "nodes" / n.name / "etc-frr").mkdir(parents=True, exist_ok=True)
        try:
            cgroups = confine.create_lab_cgroups(lab.name, [n.name for n in topo.nodes], limits)
        except OSError as e:
            raise BringUpError(f"cannot create the nodes' cgroups: {e}") from None
        for name, dirs in cgroups.items():
            rec.nodes[name].cgroups = dirs
        lab._save()
        timings["prepare"] = time.monotonic() - t

        if rec.dataplane == "ebpf":
            t = time.monotonic()
            say("starting the eBPF SRv6 data plane")
            self._start_dataplane(lab)
            timings["dataplane"] = time.monotonic() - t
        say(f"starting {len(topo.nodes)} nodes")
        t = time.monotonic()
        self._start_inits(lab, limits)
        lab._save()
        r = ip_batch([f"netns attach {s.netns} {s.init_pid}" for s in rec.nodes.values()])
        if not r.ok:
            raise BringUpError(f"cannot name the nodes' network namespaces: {r.stderr.strip()[:300]}")
        for n in topo.nodes:
            if n.is_router:
                nd = lab.dir / "nodes" / n.name / "etc-frr"  # a tmpfs now (the init mounted it)
                for fname, text in frr.node_files(topo, n.name, frr_extra.get(n.name)).items():
                    try:
                        (nd / fname).write_text(text)
                    except OSError as e:  # an imported router's own files may not fit the node's /etc/frr
                        raise BringUpError(f"{n.name}: cannot write /etc/frr/{fname} ({len(text.encode())} bytes): "
                                           f"{e.strerror}; the node's /etc/frr holds {limits.etc_frr} MiB "
                                           "(ANIBENCH_NODE_LIMITS=etc_frr=...)") from None
                for f in nd.iterdir():
                    shutil.chown(f, "frr", "frr")
        timings["init"] = time.monotonic() - t

        say(f"creating {len(topo.links)} links")
        t = time.monotonic()
        lines = []
        for lk in topo.links:
            a, b = rec.nodes[lk.a.node].netns, rec.nodes[lk.b.node].netns
            lines.append(f"link add name {lk.a.interface} netns {a} type veth peer name {lk.b.interface} netns {b}")
        r = ip_batch(lines)
        if not r.ok:
            raise BringUpError(f"cannot create links: {r.stderr.strip()[:300]}")
        results = lab.map(lambda n: ip_batch(self._node_lines(lab, n), netns=rec.nodes[n].netns, env=ip_env(lab, n)),
                          lab.node_names())  # fmt: skip
        for res in results:
            if not res.ok:
                raise BringUpError(f"{res.node}: link setup failed: {res.stderr.strip()[:300]}")
        timings["links"] = time.monotonic() - t

        say("starting FRR")
        t = time.monotonic()
        results = lab.map(
            lambda n: lab.sh(n, frr.start_script(rec.nodes[n].daemons), timeout_s=FRR_START_TIMEOUT_S), lab.routers()
        )
        for res in results:
            if not res.ok:
                raise BringUpError(frr.start_failure(topo.node(res.node), res))
        timings["frr"] = time.monotonic() - t
        rec.meta["bringup_s"] = timings

    def _node_lines(self, lab: Lab, name: str) -> list[str]:
        topo = lab.topology
        node = topo.node(name)
        lines = ["link set lo up"] + [f"link set {lk.endpoint_of(name).interface} up" for lk in topo.links_of(name)]
        if node.is_router and node.node_id is not None and not node.self_configured:
            loc = addr.locator(node.node_id)
            lines += [
                "link add sr0 type bridge",
                # SID routes use sr0: on the eBPF data plane they are forwarding routes, whose
                # device MTU ip6_forward checks before the behaviour runs (both planes alike)
                "link set sr0 mtu 65535 up",
                f"route add {loc} encap seg6local action End flavors next-csid lblen {addr.BLOCK_LEN} "
                f"nflen {addr.CSID_LEN} count dev sr0 metric 1",
            ]
        elif node.role is Role.HOST:
            for i, (ifname, address, gw) in enumerate(frr.host_link_addresses(topo, name)):
                lines.append(f"addr add {address} dev {ifname}")
                if i == 0:
                    lines.append(f"route add ::/0 via {gw} dev {ifname}")
        return lines

    def _start_dataplane(self, lab: Lab) -> None:
        """Start the lab's eBPF data-plane service (its sockets must exist before the nodes bind
        them) and write the files every node's ``ip`` front uses (substrate.dataplane.ebpf)."""
        from substrate.dataplane.ebpf import front

        front.prepare_lab(lab.dir)
        # setsid --fork: the service is no child of this process (which may exit long before the lab)
        argv = [_tool("setsid"), "--fork", sys.executable, "-m", "substrate.dataplane.ebpf.service", str(lab.dir),
                *[f"{n}=/run/netns/{s.netns}" for n, s in lab.record.nodes.items()]]  # fmt: skip
        log = lab.dir / "dataplane" / "service.log"
        with open(log, "ab") as err:
            p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=err,
                                 cwd=str(Path(__file__).resolve().parents[2]))  # fmt: skip
        p.wait()  # setsid returns at once
        assert p.stdout is not None
        ready, _, _ = select.select([p.stdout], [], [], INIT_READY_TIMEOUT_S)
        line = p.stdout.readline() if ready else b""
        p.stdout.close()
        if line.strip() != b"ready":
            from substrate.dataplane.ebpf.service import stop as stop_dataplane

            stop_dataplane(lab.dir)
            raise BringUpError(f"the eBPF data-plane service did not start: {log.read_text(errors='replace').strip()[-500:] or 'no answer'}")

    def _init_config(self, lab: Lab, st: NodeState, limits: confine.NodeLimits) -> str:
        """The JSON argument of a node's init (see ``node_init.py``)."""
        nd = lab.dir / "nodes" / st.name
        dp = None
        if lab.record.dataplane == "ebpf":
            from substrate.dataplane.ebpf import front

            dp = front.node_config(lab.dir, st.name)
        return json.dumps({
            "node_dir": str(nd), "hostname": st.name, "role": st.role.value,
            "etc": str(lab.dir / ETC_DIR), "etc_frr": str(nd / "etc-frr"), "etc_frr_size": f"{limits.etc_frr}m",
            "tmpfs": limits.tmpfs(), "cgroup_procs": [confine.procs_file(d) for d in st.cgroups],
            "proc_masked": confine.PROC_MASKED, "proc_readonly": confine.PROC_READONLY,
            "sys_masked": confine.sys_masked(), "dataplane": dp,
        })  # fmt: skip

    def _start_inits(self, lab: Lab, limits: confine.NodeLimits) -> None:
        """Start every node's init in parallel and wait for each to report ready."""
        setsid = _tool("setsid")
        script = _init_script()
        procs: dict[str, subprocess.Popen[bytes]] = {}
        for name, st in lab.record.nodes.items():
            argv = [setsid, "--fork", sys.executable, "-S", "-I", script, self._init_config(lab, st, limits)]
            procs[name] = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=NODE_ENV
            )
        deadline = time.monotonic() + INIT_READY_TIMEOUT_S
        errors: list[str] = []
        for name, p in procs.items():
            p.wait()  # setsid --fork returns at once; the init lives on in its own session
            assert p.stdout is not None and p.stderr is not None
            line = b""
            while not line.endswith(b"\n"):
                left = deadline - time.monotonic()
                ready, _, _ = select.select([p.stdout], [], [], max(0.0, left))
                if not ready:
                    break
                chunk = os.read(p.stdout.fileno(), 256)
                if not chunk:
                    break
                line += chunk
            words = line.decode(errors="replace").split()
            if len(words) == 2 and words[0] == "ready" and words[1].isdigit():
                st = lab.record.nodes[name]
                st.init_pid = int(words[1])
                st.init_start = pid_start(st.init_pid)
            else:
                err = b""
                if select.select([p.stderr], [], [], 0.2)[0]:
                    err = os.read(p.stderr.fileno(), 4096)
                errors.append(f"{name}: {err.decode(errors='replace').strip() or 'init did not report ready'}")
            p.stdout.close()
            p.stderr.close()
        if errors:
            raise BringUpError(f"node init failed: {'; '.join(errors[:3])}")

    # -- exec ------------------------------------------------------------------------------------

    def exec(
        self, lab: Lab, node: NodeState, argv: list[str], *, confined: bool, timeout_s: float,
        input: str | bytes | None, max_output: int, cancel: threading.Event | None = None,
    ) -> ExecResult:  # fmt: skip
        """Run ``argv`` in ``node``: enter its namespaces (an agent's command and FRR daemons the
        node's user namespace too, last; see the comment on it below).

        A confined command first joins a cgroup of its own inside the node's and runs without the
        capabilities outside :data:`CONFINED_CAPS`; when it returns, every process it left running
        is killed (an FRR daemon of the node it restarted excepted) and listed in
        ``result.extra["leftovers_killed"]``. A command that starts FRR daemons (it names a
        program of /usr/lib/frr) joins the node's own cgroup, so the daemons count against the
        node's limits. Other harness commands stay out of the node's cgroups: they leave nothing
        running, and moving a process between cgroups takes the kernel's global cgroup lock and
        an RCU grace period (up to seconds on a loaded machine, for every probe of a reset or an
        observation).

        Raises:
            ExecError: the node is not running, or its cgroup is gone.
        """
        if not pid_alive(node.init_pid, node.init_start):
            raise ExecError(f"node {node.name} of lab {lab.name} is not running (harness lab cleanup; then redeploy)")
        join = list(node.cgroups) if any(frr.DAEMON_DIR in a for a in argv) else []
        cmd_cgroup = None
        if confined and node.cgroups:
            try:
                join = confine.new_command_cgroup(node.cgroups, lab.record.node_limits.get("command_pids"))
            except OSError as e:
                raise ExecError(f"node {node.name} of lab {lab.name}: cannot create the command's cgroup: {e}") from None
            cmd_cgroup = join[0]
        prefix: list[str] = []
        if join:  # the shell joins the cgroups, then becomes nsenter: nothing runs outside them
            writes = " && ".join(f"echo 0 >{shlex.quote(confine.procs_file(d))}" for d in join)
            prefix = [_tool("sh"), "-c", f'{writes} && exec "$@"', "anibench-join"]
        prefix += [_tool("nsenter"), "-t", str(node.init_pid), "-m", "-u", "-i", "-n", "-p"]
        if node.cgroups and join:
            # an agent's command, or FRR daemons: inside the node's user namespace. The harness's
            # other commands (capture, restore, probes, faults) stay in the host's: some kernel
            # state of the node's network is not delegated to a user namespace (seg6 genetlink --
            # the SRv6 encapsulation source, HMAC keys -- wants CAP_NET_ADMIN in the initial one,
            # GENL_ADMIN_PERM), and the harness must read and restore all of it.
            prefix += ["-C", "-U"]
        prefix.append("--")
        harness = not confined and not join  # the harness's own command, in the host's user namespace
        if confined:
            keep = ",".join(f"+{c}" for c in CONFINED_CAPS)
            prefix += [_tool("setpriv"), f"--bounding-set=-all,{keep}", "--inh-caps=-all", "--"]
        killed: list[str] = []
        try:
            result = run_bounded([*prefix, *argv], env=HARNESS_ENV if harness else NODE_ENV, node=node.name, shown_argv=argv,
                                 timeout_s=timeout_s, input=input, max_output=max_output, cancel=cancel)  # fmt: skip
        finally:
            if cmd_cgroup is not None:
                killed = confine.end_command_cgroup(cmd_cgroup, node.cgroups, lambda pid: _is_frr_daemon(node, pid))
        if cmd_cgroup is not None:
            result.extra["leftovers_killed"] = killed
        return result

    def vty_path(self, lab: Lab, node: NodeState, daemon: str) -> Path:
        """A daemon's vty socket seen from the host: the node's /run through its init's root."""
        if not pid_alive(node.init_pid, node.init_start):
            raise ExecError(f"node {node.name} of lab {lab.name} is not running")
        return Path(f"/proc/{node.init_pid}/root/run/frr/{daemon}.vty")

    # -- destroy ---------------------------------------------------------------------------------

    def destroy(self, lab: Lab) -> None:
        rec = lab.record
        if rec.dataplane == "ebpf":
            from substrate.dataplane.ebpf.service import stop as stop_dataplane

            stop_dataplane(lab.dir)
        for st in rec.nodes.values():
            if st.init_pid and pid_alive(st.init_pid, st.init_start):
                try:
                    os.kill(st.init_pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        confine.kill_cgroups([str(d) for d in confine.lab_cgroups().get(lab.name, [])], timeout_s=CGROUP_KILL_TIMEOUT_S)
        names = [s.netns for s in rec.nodes.values()] or [netns_name(lab.name, n.name) for n in rec.topology.nodes]
        existing = set(os.listdir("/run/netns")) if os.path.isdir("/run/netns") else set()
        names = [n for n in names if n in existing]
        kill_netns_processes(names)
        delete_netns(names)
        unmount_under(lab.dir)


#: How long a daemon a confined command started may take to write its PID file.
DAEMON_PIDFILE_WAIT_S = 2.0


def _is_frr_daemon(node: NodeState, pid: int) -> bool:
    """``pid`` (host view) is one of ``node``'s FRR daemons: its program is /usr/lib/frr/NAME for a
    daemon NAME of the node, running only installed code (:func:`substrate.frr.runs_only_installed_code`:
    no injected library), and the node's /run/frr/NAME.pid names it (by its PID in the node;
    a daemon just started gets :data:`DAEMON_PIDFILE_WAIT_S` to write it)."""
    deadline = time.monotonic() + DAEMON_PIDFILE_WAIT_S
    try:
        comm = Path(f"/proc/{pid}/comm").read_text().strip()
        if comm not in node.daemons or os.readlink(f"/proc/{pid}/exe") != f"{frr.DAEMON_DIR}/{comm}":
            return False
        if not frr.runs_only_installed_code(Path(f"/proc/{pid}/maps").read_text(), Path(f"/proc/{pid}/environ").read_bytes()):
            return False  # the daemon's program with an agent's code in it
        status = Path(f"/proc/{pid}/status").read_text()
        nspid = next(ln.split()[-1] for ln in status.splitlines() if ln.startswith("NSpid:"))
        pidfile = f"/proc/{node.init_pid}/root/run/frr/{comm}.pid"  # the node's: resolved inside it
        while True:
            try:
                if confine.read_node_file(pidfile, 64).strip() == nspid:
                    return True
            except OSError:
                pass
            if time.monotonic() > deadline or not Path(f"/proc/{pid}").exists():
                return False
            time.sleep(0.02)  # poll: the daemon writes its PID file right after it detaches
    except (OSError, StopIteration):
        return False


def unmount_under(path: Path) -> list[str]:
    """Unmount (lazily, deepest first) every mount of the host at or below ``path`` -- a lab's
    size-limited ``etc-frr`` directories -- so that the directory can be removed. Returns the mount
    points unmounted."""
    prefix = str(path).rstrip("/") + "/"
    points = []
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return []
    for line in lines:
        fields = line.split()
        if len(fields) > 4:
            point = fields[4].encode().decode("unicode_escape")  # mountinfo escapes space as \040
            if point == prefix.rstrip("/") or point.startswith(prefix):
                points.append(point)
    done = []
    for point in sorted(set(points), key=lambda p: -p.count("/")):
        if _libc.umount2(point.encode(), MNT_DETACH) == 0:
            done.append(point)
    return done
