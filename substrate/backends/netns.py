"""The ``netns`` backend: every node a set of Linux namespaces, every link a veth pair, FRR from
the distribution. Needs root; no Docker.

Bring-up (all steps batched or parallel; see ``bench/lab_up.py`` for the figures):

1. one ``ip -batch`` creates every node's network namespace;
2. each node's init (``node_init.py``) starts inside its network namespace under
   ``unshare --mount --pid --uts --ipc --fork``: sysctls first (DAD off before any link exists),
   then a minimal private root, then it waits as PID 1 of the node;
3. one ``ip -batch`` creates every veth pair with both ends directly inside their namespaces
   (no interface ever exists in the host namespace, so labs cannot clash on names);
4. one ``ip -n NS -batch`` per node brings links up and, on underlay routers, creates ``sr0`` and
   the SRv6 locator's ``seg6local End`` route (NEXT-C-SID flavor, with counters); on base hosts it
   sets addresses and the default route (a router with its own configuration gets neither);
5. FRR daemons (the node's daemon set) start in every router (``vtysh -b`` loads the integrated
   frr.conf).
"""

from __future__ import annotations

import os
import select
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

from substrate import addressing as addr
from substrate import frr
from substrate.backends import register
from substrate.errors import BringUpError, ExecError
from substrate.features import check_root_and_tools, require
from substrate.paths import netns_name
from substrate.process import ExecResult, run_bounded
from substrate.record import NodeState, pid_alive, pid_start
from substrate.topology import Role

if TYPE_CHECKING:
    from substrate.backends import LabHandle as Lab

#: Environment of every command run in a node (nothing of the caller's environment leaks in).
NODE_ENV = {
    "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "HOME": "/root",
    "LANG": "C.UTF-8",
    "TERM": "dumb",
}
#: Capabilities kept by confined commands (agent shells). Everything else is dropped from the
#: bounding set, notably CAP_SYS_ADMIN (mount, setns), CAP_SYS_MODULE, CAP_SYS_PTRACE,
#: CAP_SYS_RAWIO, CAP_MKNOD, CAP_DAC_READ_SEARCH (open_by_handle_at), CAP_SYS_BOOT, CAP_SYS_TIME,
#: CAP_BPF, CAP_PERFMON, CAP_SYSLOG. The node's network stays fully configurable (CAP_NET_ADMIN).
CONFINED_CAPS = (
    "chown", "dac_override", "fowner", "fsetid", "kill", "setgid", "setuid", "net_bind_service",
    "net_broadcast", "net_admin", "net_raw", "ipc_lock", "sys_resource", "audit_write",
)
#: Bounds of bring-up steps (seconds).
INIT_READY_TIMEOUT_S = 20.0
FRR_START_TIMEOUT_S = 60.0


def _tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise ExecError(f"{name} not found")
    return path


def _init_script() -> str:
    return str(resources.files("substrate").joinpath("node_init.py"))


def ip_batch(lines: list[str], netns: str | None = None, timeout_s: float = 30.0) -> ExecResult:
    """Run iproute2 commands in one ``ip -batch -`` process (optionally ``-n NETNS``).

    ``-force`` keeps going after an error; the result's returncode is non-zero if any line failed
    and stderr says which.
    """
    argv = ["ip", "-force"]
    if netns:
        argv += ["-n", netns]
    argv += ["-batch", "-"]
    return run_bounded(argv, timeout_s=timeout_s, input="\n".join(lines) + "\n", node=netns or "")


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
        require()

    # -- deploy --------------------------------------------------------------------------------

    def deploy(self, lab: Lab, frr_extra: dict[str, list[str]], say: Callable[[str], None]) -> None:
        from substrate.features import probe

        rec, topo = lab.record, lab.topology
        rec.features = probe().line()
        timings: dict[str, float] = {}
        t = time.monotonic()
        for n in topo.nodes:
            daemons = list(n.frr_daemons)
            rec.nodes[n.name] = NodeState(name=n.name, role=n.role, netns=netns_name(lab.name, n.name), daemons=daemons)
        lab._save()  # namespaces are recorded before they exist, so a crash leaves a findable trail

        say(f"creating {len(topo.nodes)} namespaces")
        r = ip_batch([f"netns add {s.netns}" for s in rec.nodes.values()])
        if not r.ok:
            raise BringUpError(f"cannot create namespaces: {r.stderr.strip()[:300]}")
        for n in topo.nodes:
            nd = lab.dir / "nodes" / n.name
            (nd / "etc-frr").mkdir(parents=True, exist_ok=True)
            if n.is_router:
                for fname, text in frr.node_files(topo, n.name, frr_extra.get(n.name)).items():
                    (nd / "etc-frr" / fname).write_text(text)
            shutil.chown(nd / "etc-frr", "frr", "frr")
            for f in (nd / "etc-frr").iterdir():
                shutil.chown(f, "frr", "frr")
        timings["netns"] = time.monotonic() - t

        say("starting node inits")
        t = time.monotonic()
        self._start_inits(lab)
        lab._save()
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
        results = lab.map(lambda n: ip_batch(self._node_lines(lab, n), netns=rec.nodes[n].netns), lab.node_names())
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
                "link set sr0 up",
                f"route add {loc} encap seg6local action End flavors next-csid lblen {addr.BLOCK_LEN} "
                f"nflen {addr.CSID_LEN} count dev sr0 metric 1",
            ]
        elif node.role is Role.HOST:
            for i, (ifname, address, gw) in enumerate(frr.host_link_addresses(topo, name)):
                lines.append(f"addr add {address} dev {ifname}")
                if i == 0:
                    lines.append(f"route add ::/0 via {gw} dev {ifname}")
        return lines

    def _start_inits(self, lab: Lab) -> None:
        """Start every node's init in parallel and wait for each to report ready."""
        nsenter, unshare, setsid = _tool("nsenter"), _tool("unshare"), _tool("setsid")
        script = _init_script()
        procs: dict[str, subprocess.Popen[bytes]] = {}
        for name, st in lab.record.nodes.items():
            nd = lab.dir / "nodes" / name
            argv = [
                setsid, "--fork", nsenter, f"--net=/run/netns/{st.netns}",
                unshare, "--mount", "--pid", "--uts", "--ipc", "--fork", "--propagation", "private",
                sys.executable, "-S", "-I", script, str(nd), name, st.role.value,
            ]  # fmt: skip
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

    # -- exec ----------------------------------------------------------------------------------

    def exec_prefix(self, lab: Lab, node: NodeState, *, confined: bool) -> list[str]:
        if not pid_alive(node.init_pid, node.init_start):
            raise ExecError(f"node {node.name} of lab {lab.name} is not running (harness lab cleanup; then redeploy)")
        prefix = [_tool("nsenter"), "-t", str(node.init_pid), "-m", "-u", "-i", "-n", "-p", "--"]
        if confined:
            keep = ",".join(f"+{c}" for c in CONFINED_CAPS)
            prefix += [_tool("setpriv"), f"--bounding-set=-all,{keep}", "--inh-caps=-all", "--"]
        return prefix

    def vty_path(self, lab: Lab, node: NodeState, daemon: str) -> Path:
        """A daemon's vty socket seen from the host: the node's /run through its init's root."""
        if not pid_alive(node.init_pid, node.init_start):
            raise ExecError(f"node {node.name} of lab {lab.name} is not running")
        return Path(f"/proc/{node.init_pid}/root/run/frr/{daemon}.vty")

    def run(self, lab: Lab, node: str, full_argv: list[str], **kw: Any) -> ExecResult:
        argv = kw.pop("argv")
        return run_bounded(full_argv, env=NODE_ENV, node=node, shown_argv=argv, **kw)

    # -- destroy -------------------------------------------------------------------------------

    def destroy(self, lab: Lab) -> None:
        rec = lab.record
        for st in rec.nodes.values():
            if st.init_pid and pid_alive(st.init_pid, st.init_start):
                try:
                    os.kill(st.init_pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        names = [s.netns for s in rec.nodes.values()] or [netns_name(lab.name, n.name) for n in rec.topology.nodes]
        existing = set(os.listdir("/run/netns")) if os.path.isdir("/run/netns") else set()
        names = [n for n in names if n in existing]
        kill_netns_processes(names)
        delete_netns(names)
