"""The lab handle: a deployed topology that any process can attach to by name.

A :class:`Lab` is created once (``Lab.create``) and attached from other processes
(``Lab.attach(name)``): the MCP servers, the observer and the CLI all run in their own processes.
Its record (``/run/anibench/labs/<name>/lab.json``) holds the topology and, per node, the
namespace and the host PID of the node's init, which is all that is needed to run commands in a
node.

Lifecycle: a lab made with ``with Lab.create(...) as lab:`` is destroyed when the block ends,
whether normally, by an exception, by Ctrl-C or by SIGTERM (see :mod:`substrate.signals`). A
failed bring-up destroys what it had created before raising. ``Lab.create(..., detached=True)``
(what ``harness lab up`` does) leaves the lab running after the creating process exits, until
``Lab.attach(name).destroy()`` (``harness lab down``). :func:`substrate.cleanup.cleanup` removes what crashed
processes left behind, and only that: anibench's namespaces (prefix ``anibench-``), the processes
inside them, and lab records whose owner is gone.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeVar


from substrate import addressing as addr
from substrate.errors import (
    BringUpError,
    ConvergenceTimeout,
    EnvironmentProblem,
    ExecError,
    LabExistsError,
    LabNotFoundError,
    NodeNotFoundError,
    SubstrateError,
)
from substrate.paths import LABS_DIR, lab_dir
from substrate.process import DEFAULT_MAX_OUTPUT, ExecResult
from substrate.record import LabRecord, NodeState, pid_alive, pid_start
from substrate.signals import cleanup_shield, terminate_gracefully
from substrate.startup import needs_startup, run_startup
from substrate.topology import Role, Topology

T = TypeVar("T")
R = TypeVar("R")

#: Lab names: used in namespace names and paths.
LAB_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9-]{0,23}$")
#: Parallelism for per-node operations (exec fan-out). Commands are mostly waiting on the kernel
#: or on FRR, so more threads than cores pays off.
DEFAULT_WORKERS = 16

#: Kept importable from here (they moved to substrate.record with the lab record).
__all__ = ["Lab", "LabRecord", "NodeInfo", "NodeState", "pid_alive", "require_up", "validate_lab_name"]
_pid_start = pid_start
#: Default bounds on the wait for convergence (seconds): the substrate's underlay; a lab whose
#: routers run their own configuration (OSPF on broadcast links waits 40 s: substrate.igp).
UNDERLAY_CONVERGE_S = 60.0
OWN_CONFIG_CONVERGE_S = 120.0


@dataclass
class NodeInfo:
    """A node as seen by users of a lab: name, role, and its router number when it is a router."""

    name: str
    role: Role
    node_id: int | None = None
    interfaces: list[str] = field(default_factory=list)


#: A lab's directory is staged as NAME + this + the creating PID, then renamed to NAME.
STAGING_SUFFIX = ".staging-"


def validate_lab_name(name: str) -> str:
    """Return ``name`` if it is a valid lab name, else raise SubstrateError saying the rule."""
    if not LAB_NAME_RE.fullmatch(name):
        raise SubstrateError(
            f"invalid lab name {name!r}: use 1-24 characters, lowercase letters, digits and '-', starting with a letter or digit"
        )
    return name


class Lab:
    """Handle to a deployed lab. Thread-safe for exec; one instance per process is enough."""

    def __init__(self, record: LabRecord):
        from substrate.backends import get_backend

        self.record = record
        self._backend = get_backend(record.backend)
        self._pool: ThreadPoolExecutor | None = None
        self._pool_lock = threading.Lock()

    # -- creation, attachment, listing ---------------------------------------------------------

    @classmethod
    def create(
        cls,
        topology: Topology,
        name: str,
        *,
        backend: str = "netns",
        detached: bool = False,
        converge_timeout_s: float | None = None,
        frr_extra: dict[str, list[str]] | None = None,
        progress: Callable[[str], None] | None = None,
    ) -> Lab:
        """Deploy ``topology`` as lab ``name`` and wait until the underlay has converged.

        Args:
            topology: what to deploy.
            name: lab name (see :data:`LAB_NAME_RE`); unique on the machine.
            backend: registered backend name (``netns``).
            detached: keep the lab after this process exits (else a context manager or
                :func:`substrate.cleanup.cleanup` destroys it). Takes effect once the lab has converged (see
                :meth:`detach`): a bring-up whose process dies is a leftover for :func:`substrate.cleanup.cleanup`.
            converge_timeout_s: bound on the wait for convergence (default: 60 s; 120 s when a
                router runs its own configuration, whose OSPF may wait 40 s before electing a
                designated router: substrate.igp).
            frr_extra: per router, extra configuration blocks appended to its frr.conf.
            progress: called with a short message at each bring-up stage.

        Returns:
            The lab, converged: every underlay router has every other underlay router's loopback,
            locator and base-host prefixes in its kernel routing table; every router with its own
            configuration has the IGP adjacencies it asks for (substrate.igp). The nodes' start-up
            steps (hostname, sysctls, exec commands: substrate.startup) have run.

        Raises:
            SubstrateError: bad name. EnvironmentProblem: not root, FRR or a kernel feature missing.
            LabExistsError: the name is taken. BringUpError / ConvergenceTimeout: deployment failed
            (everything created was destroyed first). KeyboardInterrupt / Terminated: same cleanup.
        """
        validate_lab_name(name)
        from substrate.backends import get_backend

        be = get_backend(backend)
        be.check_environment()
        LABS_DIR.mkdir(parents=True, exist_ok=True)
        d = lab_dir(name)
        record = LabRecord(
            name=name, backend=backend, owner_pid=os.getpid(), owner_start=_pid_start(os.getpid()), created_at=time.time(),
            topology=topology,
        )
        # the directory appears with its record in it (a rename), never empty: a cleanup running
        # beside this (another lab slot starting) would take an empty directory for a leftover
        staging = LABS_DIR / f"{name}{STAGING_SUFFIX}{os.getpid()}"
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir()
        (staging / "lab.json").write_text(record.model_dump_json(indent=1))
        try:
            if d.exists():
                raise FileExistsError(d)
            os.rename(staging, d)  # fails (ENOTEMPTY) if another process created the lab meanwhile
        except OSError:
            shutil.rmtree(staging, ignore_errors=True)
            raise LabExistsError(
                f"lab {name!r} already exists (harness lab down {name}; or harness lab cleanup if it is a leftover)"
            ) from None
        lab = cls(record)
        say = progress or (lambda _m: None)
        with terminate_gracefully():
            try:
                be.deploy(lab, frr_extra or {}, say)
                record.status = "up"
                lab._save()
                if any(needs_startup(n) for n in topology.nodes):
                    say("running the nodes' start-up commands")
                    run_startup(lab, say)
                own = any(n.self_configured for n in topology.routers)
                say("waiting for the IGP to converge" if own else "waiting for IS-IS convergence")
                if converge_timeout_s is None:
                    converge_timeout_s = OWN_CONFIG_CONVERGE_S if own else UNDERLAY_CONVERGE_S
                lab.wait_converged(timeout_s=converge_timeout_s)
                if detached:
                    lab.detach()
            except BaseException as exc:
                with cleanup_shield():
                    try:
                        lab.destroy()
                    except Exception:  # noqa: BLE001 - the original error matters more
                        pass
                if "KeyboardInterrupt" in str(exc):  # an interrupt that surfaced inside a library call
                    raise KeyboardInterrupt from exc
                if isinstance(exc, (SubstrateError, KeyboardInterrupt)) or not isinstance(exc, Exception):
                    raise
                raise BringUpError(f"bring-up of lab {name!r} failed: {exc}") from exc
        return lab

    def detach(self) -> None:
        """Keep this lab after its creating process exits (until ``harness lab down``).

        Called when the bring-up is complete (by :meth:`create`, or by a caller that deploys more
        on the lab first, e.g. a scenario): until then the lab belongs to its creating process,
        and :func:`substrate.cleanup.cleanup` removes it if that process dies.
        """
        self.record.detached = True
        self._save()

    @classmethod
    def attach(cls, name: str) -> Lab:
        """Attach to a deployed lab by name.

        Raises:
            LabNotFoundError: no such lab (the message lists the labs that exist).
        """
        path = lab_dir(name) / "lab.json"
        try:
            record = LabRecord.model_validate_json(path.read_text())
        except FileNotFoundError:
            names = [r.name for r in cls.list()]
            known = f"; labs here: {', '.join(names)}" if names else "; no labs are deployed"
            raise LabNotFoundError(f"no lab named {name!r}{known}") from None
        except ValueError as e:
            raise LabNotFoundError(f"lab {name!r} has an unreadable record ({e}); run harness lab cleanup") from None
        return cls(record)

    @staticmethod
    def list() -> list[LabRecord]:
        """Records of every lab on this machine (including half-created and dead ones)."""
        out = []
        if LABS_DIR.is_dir():
            for d in sorted(LABS_DIR.iterdir()):
                if STAGING_SUFFIX in d.name:  # listed once renamed (Lab.create)
                    continue
                try:
                    out.append(LabRecord.model_validate_json((d / "lab.json").read_text()))
                except (OSError, ValueError):
                    continue
        return out

    def _save(self) -> None:
        d = lab_dir(self.name)
        tmp = d / "lab.json.tmp"
        tmp.write_text(self.record.model_dump_json(indent=1))
        os.replace(tmp, d / "lab.json")

    def save_meta(self, **meta: Any) -> None:
        """Persist upper-layer data in the lab record (e.g. the deployed scenario's path)."""
        self.record.meta.update(meta)
        self._save()

    # -- properties ----------------------------------------------------------------------------

    @property
    def name(self) -> str:
        return self.record.name

    @property
    def topology(self) -> Topology:
        return self.record.topology

    @property
    def dir(self) -> Path:
        """The lab's runtime directory on the host (never visible inside nodes)."""
        return lab_dir(self.name)

    def nodes(self) -> list[NodeInfo]:
        """Every node with its role, router number and interfaces (topology order)."""
        topo = self.topology
        return [
            NodeInfo(n.name, n.role, n.node_id, [lk.endpoint_of(n.name).interface for lk in topo.links_of(n.name)])
            for n in topo.nodes
        ]

    def node_names(self, role: Role | None = None) -> list[str]:
        """Node names, optionally only those of one role."""
        return [n.name for n in self.topology.nodes if role is None or n.role is role]

    def routers(self) -> list[str]:
        """Names of P and PE routers."""
        return [n.name for n in self.topology.routers]

    def state(self, node: str) -> NodeState:
        """Runtime state of a node (by its name, or for an imported node its name in the file).

        Raises:
            NodeNotFoundError: unknown node (the message lists the nodes).
        """
        try:
            return self.record.nodes[node]
        except KeyError:
            for n in self.topology.nodes:  # an imported node by its name in the source file (PC1 for pc1)
                if n.source is not None and n.source.name == node and n.name in self.record.nodes:
                    return self.record.nodes[n.name]
            raise NodeNotFoundError(
                f"lab {self.name!r} has no node {node!r}; nodes: {', '.join(self.node_names())}"
            ) from None

    def alive(self) -> bool:
        """True when the lab is up and every node's init is running."""
        return self.record.status == "up" and bool(self.record.nodes) and all(
            pid_alive(s.init_pid, s.init_start) for s in self.record.nodes.values()
        )

    def owner_alive(self) -> bool:
        """True while the process that created the lab runs (the same process: PIDs are reused)."""
        return pid_alive(self.record.owner_pid, self.record.owner_start)

    def condition(self) -> Literal["up", "creating", "orphaned", "dead"]:
        """What the lab is, as :func:`cleanup` judges it: ``creating`` (its owner is still bringing
        it up), ``up`` (running, and detached or owned by a live process), ``orphaned`` (running,
        but its owner died without removing it: a crashed campaign; cleanup removes it) or
        ``dead`` (a node or the bring-up died)."""
        owner = self.owner_alive()
        if self.record.status == "creating":
            return "creating" if owner else "dead"
        if not self.alive():
            return "dead"
        return "up" if self.record.detached or owner else "orphaned"

    def condition_text(self) -> str:
        """:meth:`condition` with what to do about it, for listings."""
        c = self.condition()
        if c == "orphaned":
            return f"orphaned: owner PID {self.record.owner_pid} is gone (harness lab cleanup)"
        if c == "dead":
            return "dead (harness lab down NAME)" if self.record.detached else "dead (harness lab cleanup)"
        return c

    # -- running commands ----------------------------------------------------------------------

    def exec(
        self,
        node: str,
        argv: Sequence[str],
        *,
        timeout_s: float = 10.0,
        input: str | bytes | None = None,
        confined: bool = False,
        max_output: int = DEFAULT_MAX_OUTPUT,
        cancel: threading.Event | None = None,
    ) -> ExecResult:
        """Run ``argv`` inside ``node`` (its network, mount, PID, UTS and IPC namespaces).

        Args:
            node: node name.
            argv: program and arguments (no shell; use :meth:`sh` for a script).
            timeout_s: deadline; on expiry the command's process group is killed, returncode 124.
            input: bytes or text fed to stdin (else stdin is /dev/null).
            confined: an agent-supplied command (A0): drop the capabilities an agent does not
                need (namespace and system administration, ptrace, resource overrides, ...) and
                kill whatever it leaves running when it returns (listed in
                ``result.extra["leftovers_killed"]``).
            max_output: cap per stream, in bytes.
            cancel: when set while the command runs, its process group is killed at once
                (result ``cancelled``); used for calls an MCP client cancels.

        Raises:
            NodeNotFoundError: unknown node. ExecError: the node is not running.
        """
        st = self.state(node)
        if not argv:
            raise ExecError("empty command")
        return self._backend.exec(
            self, st, list(argv), confined=confined, timeout_s=timeout_s, input=input, max_output=max_output,
            cancel=cancel,
        )

    def sh(self, node: str, script: str, **kw: Any) -> ExecResult:
        """Run a bash script inside ``node`` (same options as :meth:`exec`)."""
        return self.exec(node, ["bash", "-c", script], **kw)

    def vtysh(self, node: str, *commands: str, timeout_s: float = 15.0) -> ExecResult:
        """Run FRR ``vtysh -c`` commands in ``node`` (in order, one vtysh session).

        Raises:
            NodeNotFoundError: unknown node. ExecError: the node is a host (no FRR).
        """
        st = self.state(node)
        if st.role is Role.HOST:
            raise ExecError(f"{node} is a host: it runs no FRR")
        argv = ["vtysh"]
        for c in commands:
            argv += ["-c", c]
        return self.exec(node, argv, timeout_s=timeout_s)

    def host_exec(self, argv: Sequence[str], *, timeout_s: float = 10.0, input: str | None = None) -> ExecResult:
        """Run a command on the host (for iproute2 ``-n`` / ``-batch`` and the like)."""
        from substrate.process import run_bounded

        return run_bounded(list(argv), timeout_s=timeout_s, input=input)

    def map(self, fn: Callable[[T], R], items: Iterable[T], workers: int = DEFAULT_WORKERS) -> list[R]:
        """Apply ``fn`` to ``items`` in parallel threads; results in input order."""
        items = list(items)
        if len(items) <= 1:
            return [fn(i) for i in items]
        with self._pool_lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix=f"lab-{self.name}")
            pool = self._pool
        if threading.current_thread().name.startswith(f"lab-{self.name}"):
            return [fn(i) for i in items]  # already on a pool thread: do not wait on our own pool
        return list(pool.map(fn, items))

    def check(self, results: Iterable[ExecResult]) -> None:
        """Raise ExecError with the first failing command's summary if any result failed."""
        for r in results:
            if not r.ok:
                raise ExecError(r.summary())

    def config_lock(self, nodes: Iterable[str], *, holder: str, timeout_s: float = 5.0):  # noqa: ANN201
        """Context manager holding the configuration locks of ``nodes`` (see :mod:`substrate.locks`).

        Raises:
            ConfigLockHeld: a lock stayed held by someone else for ``timeout_s``.
        """
        from substrate.locks import config_lock

        return config_lock(self.dir, nodes, holder=holder, timeout_s=timeout_s)

    def vty(self, node: str, daemon: str, *commands: str, timeout_s: float = 5.0) -> list[tuple[str, int]]:
        """Run CLI commands on one FRR daemon of ``node`` through its vty socket (no vtysh
        process; see :mod:`substrate.vty`). Returns (output, status) per command.

        Raises:
            NodeNotFoundError. substrate.vty.VtyError: the daemon is down, absent or frozen.
        """
        from substrate.vty import vty_command

        st = self.state(node)
        return vty_command(self._backend.vty_path(self, st, daemon), list(commands), timeout_s=timeout_s)

    def frr_daemon_configs(self, node: str, *, timeout_s: float = 5.0) -> dict[str, str]:
        """Each running FRR daemon's own part of the running configuration (``show running-config``
        on its vty socket); a daemon that does not answer is left out."""
        from substrate.vty import VtyError

        out = {}
        for d in self.state(node).daemons:
            try:
                text, status = self.vty(node, d, "show running-config", timeout_s=timeout_s)[0]
            except VtyError:
                continue
            if status == 0:
                out[d] = text
        return out

    # -- FRR daemons ---------------------------------------------------------------------------

    def daemon_pid(self, node: str, daemon: str) -> int | None:
        """Host-visible PID of an FRR daemon in ``node``, or None when it is not running."""
        r = self.exec(node, ["cat", f"/run/frr/{daemon}.pid"], timeout_s=5)
        if not r.ok:
            return None
        pid = r.stdout.strip()
        alive = self.exec(node, ["kill", "-0", pid], timeout_s=5)
        return int(pid) if pid.isdigit() and alive.ok else None

    def start_daemon(self, node: str, daemon: str, *, load_config: bool = True, config: str | None = None) -> None:
        """Start an FRR daemon in ``node`` and, by default, load its part of ``/etc/frr/frr.conf``
        (``vtysh -b -d DAEMON``, as watchfrr does after a restart), or of ``config`` (an
        integrated configuration's text, e.g. the node's baseline) when given. Adds it to the
        node's daemons.

        Only the daemon's own copy counts: vtysh's ``show running-config`` merges every daemon's,
        so a route-map or prefix-list that zebra still holds hides that a restarted bgpd lacks it.

        Raises:
            ExecError: the daemon did not start or its configuration was refused.
        """
        from substrate.frr import daemon_argv

        self.check([self.exec(node, daemon_argv(daemon), timeout_s=15)])
        if config is not None:
            self.check([self.exec(node, ["vtysh", "-d", daemon, "-f", "/dev/stdin"], timeout_s=30, input=config)])
        elif load_config:
            self.check([self.exec(node, ["vtysh", "-b", "-d", daemon], timeout_s=30)])
        st = self.state(node)
        if daemon not in st.daemons:
            st.daemons.append(daemon)
            self._save()

    def kill_daemon(self, node: str, daemon: str) -> bool:
        """SIGKILL an FRR daemon in ``node`` (a crash). Returns False if it was not running."""
        r = self.sh(node, f'p=$(cat /run/frr/{daemon}.pid 2>/dev/null) && kill -9 "$p" && rm -f /run/frr/{daemon}.pid')
        return r.ok

    # -- state checks --------------------------------------------------------------------------

    def expected_underlay_prefixes(self, router: str) -> set[str]:
        """Prefixes ``router`` must have learnt through IS-IS: every other underlay router's
        loopback and locator, and every other PE's base-host links (none for a router that runs
        its own configuration)."""
        out: set[str] = set()
        if self.topology.node(router).self_configured:
            return out
        for n in self.topology.routers:
            if n.name == router or n.node_id is None or n.self_configured:
                continue
            out.add(str(addr.loopback(n.node_id).network))
            out.add(str(addr.locator(n.node_id)))
            for k, _host in enumerate(self.topology.base_hosts_of(n.name)):
                out.add(str(addr.base_host_prefix(n.node_id, k)))
        return out

    def missing_underlay_prefixes(self, router: str) -> set[str]:
        """Expected IS-IS prefixes absent from ``router``'s kernel main table (empty when converged)."""
        r = self.host_exec(["ip", "-n", self.state(router).netns, "-6", "-j", "route", "show", "table", "main"])
        if not r.ok:
            return {"<cannot read routing table>"}
        have = set()
        for route in json.loads(r.stdout or "[]"):
            dst = route.get("dst", "")
            have.add(dst if "/" in dst else f"{dst}/128")
        return self.expected_underlay_prefixes(router) - have

    def missing_adjacencies(self, router: str) -> set[str]:
        """Core interfaces of ``router`` towards other underlay routers without an IS-IS adjacency
        in state Up (a router with its own configuration: see substrate.igp)."""
        from substrate.frr import ISIS_NEIGHBOR_JSON, parse_isis_neighbors
        from substrate.vty import VtyError

        topo = self.topology
        if topo.node(router).self_configured:
            return set()
        want = {
            lk.endpoint_of(router).interface for lk in topo.core_links()
            if router in (lk.a.node, lk.b.node) and not topo.node(lk.peer_of(router).node).self_configured
        }  # fmt: skip
        if not want:
            return set()
        try:
            up = {a.interface for a in parse_isis_neighbors(self.vty(router, "isisd", ISIS_NEIGHBOR_JSON, timeout_s=5)[0][0])
                  if a.state == "Up"}
        except (VtyError, ValueError):
            return want
        return want - up

    def wait_converged(self, timeout_s: float = 60.0, routers: Iterable[str] | None = None,
                       prefixes_read: Iterable[str] = ()) -> float:
        """Poll until every underlay router has all its IS-IS adjacencies Up and every expected
        underlay prefix in its kernel FIB, and every router with its own configuration has the
        IGP adjacencies it asks for (:func:`substrate.igp.missing_adjacencies`).

        Args:
            prefixes_read: routers whose routing tables the caller has just read and found
                complete (a reset's capture equal to the converged baseline): their FIB is not
                read again in the first poll, only their adjacencies are asked for.

        Returns:
            Seconds waited.

        Raises:
            ConvergenceTimeout: after ``timeout_s``, naming a router and what it still misses.
        """
        from substrate.igp import missing_adjacencies

        t0 = time.monotonic()
        pending = set(routers if routers is not None else self.routers())
        own = sorted(r for r in pending if self.topology.node(r).self_configured)
        pending -= set(own)
        missing: dict[str, set[str]] = {}

        known = set(prefixes_read)

        def still_missing(rt: str) -> tuple[str, set[str]]:
            gaps = set() if rt in known else self.missing_underlay_prefixes(rt)
            return rt, gaps or {f"adjacency on {i}" for i in self.missing_adjacencies(rt)}

        own_pending = bool(own)
        while pending or own_pending:
            results = self.map(still_missing, sorted(pending))
            known = set()  # read them from the next poll on
            missing = {rt: m for rt, m in results if m}
            pending = set(missing)
            if own_pending:  # adjacencies are judged from both ends: ask every such router each time
                gaps = missing_adjacencies(self, own)
                missing.update(gaps)
                own_pending = bool(gaps)
            if not missing:
                break
            if time.monotonic() - t0 > timeout_s:
                rt = sorted(missing)[0]
                what = "the routers' own IGP" if own_pending and not pending else "IS-IS" if not own_pending else "the IGP"
                raise ConvergenceTimeout(
                    f"lab {self.name}: {what} not converged after {timeout_s:.0f} s; {len(missing)} router(s) incomplete, "
                    f"e.g. {rt} lacks {', '.join(sorted(missing[rt])[:4])}"
                )
            time.sleep(0.1)  # poll interval, not a settle delay: the loop exits as soon as state holds
        return time.monotonic() - t0

    # -- teardown ------------------------------------------------------------------------------

    def destroy(self) -> None:
        """Stop every process of the lab, delete its namespaces and its record. Idempotent."""
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
        from substrate.netconf import stop_server  # the lab's NETCONF server (if one was started)

        stop_server(self)
        from substrate.controllers import stop_all  # the lab's controllers (A3-R's reconciler)

        # graceful (each controller's step in progress is waited for, bounded); no recovery after a
        # kill: the lab and its devices go right after, nothing is left half-applied
        stop_all(self.dir, recover=False)
        self._backend.destroy(self)
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> Lab:
        return self

    def __exit__(self, *exc: object) -> None:
        with cleanup_shield():
            self.destroy()


def require_up(lab: Lab) -> Lab:
    """Return ``lab`` if it is up, else raise EnvironmentProblem naming a dead node."""
    if lab.alive():
        return lab
    dead = [n for n, s in lab.record.nodes.items() if not pid_alive(s.init_pid, s.init_start)]
    raise EnvironmentProblem(f"lab {lab.name} is not running (dead nodes: {', '.join(dead) or 'all'}); run harness lab cleanup")
