"""Substrate fault injection (draft section 6: faults at node and link level, identical for every
setting, never inside an ANI adapter).

Kinds, each with a duration:

- ``link_down``: a core link's interface administratively down on one end (carrier drops on both);
- ``loss``: random loss of a share of the packets leaving one end of a core link (nftables
  ``netdev`` egress hook with ``numgen random``: this kernel has no netem);
- ``freeze``: every process of a router stopped (SIGSTOP): its control plane goes silent and
  neighbours route around it after the IS-IS hold time, while the kernel still forwards;
- ``daemon_crash``: an FRR daemon (zebra, isisd or staticd) killed (SIGKILL); at the end it is
  restarted and reloads its part of frr.conf (the router's startup configuration), as watchfrr
  would -- after zebra, every other daemon of the router is restarted too, as watchfrr's phased
  zebra restart does (:func:`restart_daemons`);
- ``held_lock``: the device's configuration lock (:mod:`substrate.locks`) held by another
  session, so the ANI servers' mutation paths wait and then fail (A0's raw shell ignores it);
- ``concurrent_writer``: another operator adds an unrelated static route to the device's FRR
  configuration (drift the agent did not make), removed at the end;
- ``latency``: every IP packet leaving one end of a core link is held ``delay_ms`` (50, 100 or
  200 ms) by a user-space delay line (:mod:`substrate.delay`: ``NFQUEUE`` verdicts after the
  delay -- this kernel has no netem); IS-IS frames are not IP and are not delayed;
- ``pool_exhaustion``: another operator takes, on one PE, every free entry of a resource pool a
  change allocates from (draft section 6, "resource exhaustion"): the tenant routing-table ids
  (``pools.tables``: a route in each free table) or the PE's local SID functions
  (``pools.functions``: a seg6local ``End`` SID on each free function); released at the end.
  Allocation at A3-T/A4 reads the devices and fails cleanly naming the pool; A0/A1 agents meet
  the occupied ids on the device. The fault's routes carry a protocol number of their own per
  pool (:data:`FAULT_PROTOS`), so clearing one removes exactly its routes, even while the other
  pool of the same PE is taken too.

The rate lambda is in faults per agent step (tool call). Agents at different ANI levels and
models differ by orders of magnitude in wall-clock time per step, so a rate per second would
expose slower settings to more faults and confound the comparison; per step, the k-th action of
every setting meets the same fault (paired runs, draft section 4.5). A schedule is drawn from
the fault seed alone, so a task variant replays the same faults at the same steps in every
setting. Every injection and clearing is logged with its time; active faults are recorded in the
lab directory so that a crashed run's faults are cleared by ``reset`` and ``harness lab cleanup``.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import select
import signal
import subprocess
import sys
import threading
import time
import zlib
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, Field

from substrate.errors import SubstrateError
from substrate.topology import Role, Topology

if TYPE_CHECKING:
    from substrate.lab import Lab

FaultKind = Literal["link_down", "loss", "freeze", "daemon_crash", "held_lock", "concurrent_writer", "latency",
                    "pool_exhaustion"]
KINDS: tuple[str, ...] = ("link_down", "loss", "freeze", "daemon_crash", "held_lock", "concurrent_writer", "latency",
                          "pool_exhaustion")
FAULTS_FILE = "faults.json"
#: nftables table of the loss fault (one per faulted interface).
LOSS_TABLE = "anibench_fault_loss"
#: FRR daemons the daemon-crash fault draws from.
CRASH_DAEMONS = ("zebra", "isisd", "staticd")
#: Prefix of the concurrent writer's static routes (documentation range, RFC 3849).
WRITER_PREFIX = "2001:db8:ffff:{k:x}::/64"
#: Delays the latency fault draws from, in milliseconds.
LATENCY_MS = (50, 100, 200)
#: NFQUEUE number of fault ``fK``'s delay line: ``LATENCY_QUEUE_BASE + K`` (per network namespace).
LATENCY_QUEUE_BASE = 4200
#: Route protocol number of the pool-exhaustion fault's routes, per pool (not assigned in
#: iproute2's ``rt_protos``; 186-192 are FRR's), so that clearing removes exactly that fault's.
FAULT_PROTOS = {"tables": 250, "functions": 251}
#: Pools the pool-exhaustion fault takes (names of :class:`substrate.scenario.model.Pools` fields).
POOLS = ("tables", "functions")
#: Metric of the pool-exhaustion fault's table routes: above any route of the scenario, so a
#: tenant table that already has its ``unreachable default`` keeps using it.
FAULT_METRIC = 4242


class Fault(BaseModel):
    """One scheduled fault."""

    id: str
    kind: FaultKind
    step: int = Field(ge=1, description="Injected when the agent's step count reaches this (before that step runs).")
    duration_steps: int = Field(ge=1, description="Cleared when the step count reaches step + duration_steps.")
    target: dict[str, Any] = Field(description="Node, interface, daemon, ... depending on the kind.")


class FaultEvent(BaseModel):
    """A log line: a fault injected or cleared (or an error doing so)."""

    time: float
    step: int | None
    fault: str
    kind: str
    action: Literal["inject", "clear", "error"]
    detail: str = ""
    target: dict[str, Any] = Field(default_factory=dict, description="The fault's target (node, interface, daemon, ...).")


def draw_schedule(seed: int, lam: float, max_steps: int, topology: Topology,
                  kinds: tuple[str, ...] = KINDS, max_duration: int = 3) -> list[Fault]:
    """A fault schedule from ``seed`` alone: at each step 1..max_steps a fault starts with
    probability ``lam`` (a Bernoulli process of rate ``lam`` faults per step); kind, target and
    duration (1..max_duration steps) are drawn uniformly.

    Raises:
        ValueError: ``lam`` outside [0, 1] or unknown kind.
    """
    if not 0.0 <= lam <= 1.0:
        raise ValueError(f"fault rate lambda is faults per agent step, in [0, 1]; got {lam}")
    unknown = set(kinds) - set(KINDS)
    if unknown:
        raise ValueError(f"unknown fault kinds {sorted(unknown)}; known: {', '.join(KINDS)}")
    rng = random.Random(f"faults/{seed}")
    core = topology.core_links()
    routers = [n.name for n in topology.routers]
    pes = [n.name for n in topology.routers if n.role is Role.PE] or routers
    out: list[Fault] = []
    for step in range(1, max_steps + 1):
        if rng.random() >= lam:
            continue
        kind = rng.choice(kinds)
        if kind in ("link_down", "loss", "latency") and core:
            lk = rng.choice(core)
            ep = rng.choice([lk.a, lk.b])
            target: dict[str, Any] = {"node": ep.node, "interface": ep.interface, "peer": lk.peer_of(ep.node).node}
            if kind == "loss":
                target["percent"] = rng.choice([20, 50, 80])
            elif kind == "latency":
                target["delay_ms"] = rng.choice(LATENCY_MS)
        elif kind == "pool_exhaustion":
            target = {"node": rng.choice(pes), "pool": rng.choice(POOLS)}
        elif kind == "daemon_crash":
            target = {"node": rng.choice(routers), "daemon": rng.choice(CRASH_DAEMONS)}
            if topology.node(target["node"]).role is Role.EXTERNAL:  # another AS's router runs bgpd, no IGP
                target["daemon"] = "bgpd"
        elif kind in ("held_lock", "concurrent_writer"):
            target = {"node": rng.choice(pes)}
        else:
            target = {"node": rng.choice(routers)}
        out.append(Fault(id=f"f{len(out) + 1}", kind=kind, step=step,  # type: ignore[arg-type]
                         duration_steps=rng.randint(1, max_duration), target=target))
    return out


class FaultInjector:
    """Applies a schedule to a lab as the agent's step count advances.

    Call :meth:`on_step` with the number of the step about to run (1 for the first tool call):
    faults due are injected, faults whose duration is over are cleared. :meth:`clear` ends every
    active fault (always call it when a run ends). Thread-safe.
    """

    def __init__(self, lab: Lab, schedule: list[Fault]):
        self.lab = lab
        self.schedule = sorted(schedule, key=lambda f: (f.step, f.id))
        self.events: list[FaultEvent] = []
        self._active: dict[str, Fault] = {}
        self._locks: dict[str, threading.Event] = {}
        self._mutex = threading.Lock()
        self._step = 0

    def on_step(self, step: int) -> list[FaultEvent]:
        """Advance to ``step``; returns the events this caused."""
        with self._mutex:
            new: list[FaultEvent] = []
            self._step = step
            for f in list(self._active.values()):
                if step >= f.step + f.duration_steps:
                    new.append(self._clear(f))
            for f in self.schedule:
                if f.step <= step < f.step + f.duration_steps and f.id not in self._active and not self._done(f):
                    new.append(self._inject(f))
            self.events += new
            return new

    def _done(self, f: Fault) -> bool:
        return any(e.fault == f.id and e.action in ("clear", "error") for e in self.events)

    def clear(self) -> list[FaultEvent]:
        """Clear every active fault."""
        with self._mutex:
            new = [self._clear(f) for f in list(self._active.values())]
            self.events += new
            return new

    def active(self) -> list[Fault]:
        with self._mutex:
            return list(self._active.values())

    # -- per kind --------------------------------------------------------------------------------

    def _event(self, f: Fault, action: str, detail: str = "") -> FaultEvent:
        return FaultEvent(time=time.time(), step=self._step, fault=f.id, kind=f.kind, action=action, detail=detail,  # type: ignore[arg-type]
                          target=dict(f.target))

    def _inject(self, f: Fault) -> FaultEvent:
        try:
            detail = inject(self.lab, f, self._locks)
        except SubstrateError as e:
            return self._event(f, "error", f"inject failed: {e}")
        self._active[f.id] = f
        _record(self.lab, list(self._active.values()))
        return self._event(f, "inject", detail)

    def _clear(self, f: Fault) -> FaultEvent:
        try:
            detail = clear(self.lab, f, self._locks)
            ev = self._event(f, "clear", detail)
        except SubstrateError as e:
            ev = self._event(f, "error", f"clear failed: {e}")
        self._active.pop(f.id, None)
        _record(self.lab, list(self._active.values()))
        return ev


def _loss_rule(target: dict[str, Any]) -> str:
    return f"numgen random mod 100 < {target['percent']} drop"


def active_faults(lab: Lab) -> list[Fault]:
    """The faults recorded as active in the lab directory (none when the record is missing or unreadable)."""
    try:
        return [Fault.model_validate(x) for x in json.loads((lab.dir / FAULTS_FILE).read_text())]
    except (OSError, ValueError):
        return []


def nft_table_owner(active: list[Fault], node: str, table: str, blocks: dict[str, list[str]]) -> str | None:
    """The active fault that put nftables table ``table`` (``"FAMILY NAME"``) on ``node``, judged by
    its content, or None: a table that holds anything else is not a fault's, whatever its name.

    ``blocks`` is the table as the device lists it, normalized, block by block
    (``{"chain egress": [lines]}``: :func:`substrate.journal.nft_blocks`). A fault's
    tables: the loss fault's ``netdev anibench_fault_loss_IF`` (one egress chain holding exactly
    its ``numgen`` drop), and the latency fault's ``ip mangle`` / ``ip6 mangle`` of iptables-nft (a
    ``POSTROUTING`` chain of policy accept whose every rule hands the packets leaving a delayed
    interface to that fault's NFQUEUE; left empty once the fault is cleared)."""
    body = {h: ls for h, ls in blocks.items() if h or ls}
    for f in active:
        t = f.target
        if t.get("node") != node:
            continue
        if f.kind == "loss" and table == f"netdev {LOSS_TABLE}_{t.get('interface')}":
            want = [f'type filter hook egress device "{t["interface"]}" priority filter; policy accept;', _loss_rule(t)]
            if body == {"chain egress": want}:
                return f.id
    if table in ("ip mangle", "ip6 mangle") and set(body) == {"chain POSTROUTING"}:
        chain = body["chain POSTROUTING"]
        mine = {f'oifname "{f.target.get("interface")}" counter queue num {_queue_of(f)} bypass': f.id
                for f in active if f.kind == "latency" and f.target.get("node") == node}  # fmt: skip
        if chain[:1] == ["type filter hook postrouting priority mangle; policy accept;"] and all(r in mine for r in chain[1:]):
            return ", ".join(dict.fromkeys(mine[r] for r in chain[1:])) or "a latency fault (cleared)"
    return None


def _record(lab: Lab, active: list[Fault]) -> None:
    (lab.dir / FAULTS_FILE).write_text(json.dumps([f.model_dump() for f in active]))


def _checked(r: Any, what: str) -> None:
    if not r.ok:
        raise SubstrateError(f"{what}: {r.summary()}")


def inject(lab: Lab, f: Fault, locks: dict[str, threading.Event] | None = None) -> str:
    """Start fault ``f`` on ``lab``; returns a one-line description. Raises SubstrateError."""
    t = f.target
    node = t["node"]
    if f.kind == "link_down":
        _checked(lab.exec(node, ["ip", "link", "set", t["interface"], "down"]), "link down")
        return f"{node} {t['interface']} (to {t.get('peer')}) down"
    if f.kind == "loss":
        table = "\n".join([
            f"table netdev {LOSS_TABLE}_{t['interface']} {{",
            "  chain egress {",
            f"    type filter hook egress device \"{t['interface']}\" priority 0; policy accept;",
            f"    {_loss_rule(t)}",
            "  }",
            "}",
        ])
        _checked(lab.exec(node, ["nft", "-f", "-"], input=table + "\n"), "loss")
        return f"{node} {t['interface']}: {t['percent']}% egress loss"
    if f.kind == "freeze":
        # `kill -1` signals every process of the node's PID namespace but its init (and exits 1
        # because init refuses the signal): check the daemons instead of the exit status
        lab.exec(node, ["kill", "-STOP", "-1"])
        states = lab.exec(node, ["ps", "-o", "stat=", "-C", "zebra,isisd,staticd,bgpd"]).stdout.split()
        if not states or any(not s.startswith("T") for s in states):
            raise SubstrateError(f"{node}: could not stop its processes ({' '.join(states)})")
        return f"{node}: every process stopped"
    if f.kind == "daemon_crash":
        if not lab.kill_daemon(node, t["daemon"]):
            raise SubstrateError(f"{node}: {t['daemon']} was not running")
        return f"{node}: {t['daemon']} killed"
    if f.kind == "held_lock":
        if locks is None:
            raise SubstrateError("held_lock needs an injector (the lock lives as long as it)")
        ready, release = threading.Event(), threading.Event()
        errors: list[str] = []

        def hold() -> None:
            try:
                with lab.config_lock([node], holder=f"another session (fault {f.id})", timeout_s=30):
                    ready.set()
                    release.wait()
            except SubstrateError as e:
                errors.append(str(e))
                ready.set()

        threading.Thread(target=hold, name=f"fault-{f.id}", daemon=True).start()
        ready.wait(35)
        if errors:
            raise SubstrateError(errors[0])
        locks[f.id] = release
        return f"{node}: configuration lock held"
    if f.kind == "concurrent_writer":
        prefix = WRITER_PREFIX.format(k=int(f.id.lstrip("f") or 0))
        _checked(lab.vtysh(node, "configure terminal", f"ipv6 route {prefix} blackhole"), "concurrent writer")
        return f"{node}: another operator added 'ipv6 route {prefix} blackhole'"
    if f.kind == "latency":
        return _start_delay(lab, f)
    if f.kind == "pool_exhaustion":
        return _take_pool(lab, f)
    raise SubstrateError(f"unknown fault kind {f.kind}")


def clear(lab: Lab, f: Fault, locks: dict[str, threading.Event] | None = None) -> str:
    """End fault ``f``; returns a one-line description. Raises SubstrateError."""
    t = f.target
    node = t["node"]
    if f.kind == "link_down":
        _checked(lab.exec(node, ["ip", "link", "set", t["interface"], "up"]), "link up")
        return f"{node} {t['interface']} up"
    if f.kind == "loss":
        lab.exec(node, ["nft", "delete", "table", "netdev", f"{LOSS_TABLE}_{t['interface']}"])
        return f"{node} {t['interface']}: loss removed"
    if f.kind == "freeze":
        lab.exec(node, ["kill", "-CONT", "-1"])  # exit status: see inject
        return f"{node}: processes resumed"
    if f.kind == "daemon_crash":
        if lab.daemon_pid(node, t["daemon"]) is None:
            done = restart_daemons(lab, node, [t["daemon"]])
            return f"{node}: {', '.join(done)} restarted"
        return f"{node}: {t['daemon']} was running again"
    if f.kind == "held_lock":
        ev = (locks or {}).pop(f.id, None)
        if ev is not None:
            ev.set()
        return f"{node}: configuration lock released"
    if f.kind == "concurrent_writer":
        prefix = WRITER_PREFIX.format(k=int(f.id.lstrip("f") or 0))
        lab.vtysh(node, "configure terminal", f"no ipv6 route {prefix} blackhole")
        return f"{node}: the other operator's route removed"
    if f.kind == "latency":
        return _stop_delay(lab, f)
    if f.kind == "pool_exhaustion":
        return _release_pool(lab, f)
    raise SubstrateError(f"unknown fault kind {f.kind}")


def restart_daemons(lab: Lab, node: str, dead: list[str], *, load_config: bool = True) -> list[str]:
    """Start the FRR daemons ``dead`` of ``node`` again, each loading its part of the startup
    configuration unless ``load_config`` is False. When zebra is among them, every other daemon
    of the node is stopped first and started after it: their sessions with the old zebra are
    gone and they do not give the new one their routes back (an IS-IS router keeps its
    adjacencies but installs no route), which is why watchfrr restarts them all after zebra
    (watchquagga(8) mode 3, "phased zebra restart"; watchfrr(8)). Returns the daemons started,
    in start order.

    Raises:
        ExecError: a daemon did not start or its configuration was refused.
    """
    from substrate.frr import KNOWN_DAEMONS

    running = lab.state(node).daemons
    todo = set(dead)
    if "zebra" in todo:
        for d in running:
            if d != "zebra" and d not in todo:
                lab.kill_daemon(node, d)
                todo.add(d)
    order = [d for d in KNOWN_DAEMONS if d in todo] + sorted(todo - set(KNOWN_DAEMONS))
    for d in order:
        lab.start_daemon(node, d, load_config=load_config)
    return order


def clear_all(lab: Lab) -> list[str]:
    """Clear the faults recorded as active in the lab directory (after a crash). Returns what was done."""
    path = lab.dir / FAULTS_FILE
    active = active_faults(lab)
    if not active:
        return []
    done = []
    for f in active:
        if f.kind == "held_lock":
            continue  # the lock died with the process that held it
        try:
            done.append(clear(lab, f))
        except SubstrateError as e:
            done.append(f"{f.id}: {e}")
    path.unlink(missing_ok=True)
    return done


# -- latency: a user-space delay line on one end of a link -------------------------------------

#: Running delay lines of this process, by (lab name, fault id): stopped by :func:`clear`; a
#: delay line left by a crashed process is found in its node's namespace instead (:func:`_delay_pids`).
_DELAY_LINES: dict[tuple[str, str], subprocess.Popen[bytes]] = {}


def _queue_of(f: Fault) -> int:
    """NFQUEUE number of fault ``f`` (:data:`LATENCY_QUEUE_BASE` + the number in its id ``fK``)."""
    k = f.id.lstrip("f")
    return LATENCY_QUEUE_BASE + (int(k) if k.isdigit() else zlib.crc32(f.id.encode()) % 1000)


def _delay_rules(f: Fault, op: str) -> list[list[str]]:
    """The ip6tables and iptables commands that add (``-A``) or delete (``-D``) the rule handing
    the packets leaving ``f``'s interface to its delay line; the comment names the fault."""
    return [[tool, "-t", "mangle", op, "POSTROUTING", "-o", f.target["interface"], "-m", "comment", "--comment",
             f"anibench-fault-{f.id}", "-j", "NFQUEUE", "--queue-num", str(_queue_of(f)), "--queue-bypass"]
            for tool in ("ip6tables", "iptables")]


def _start_delay(lab: Lab, f: Fault) -> str:
    t = f.target
    node, q = t["node"], _queue_of(f)
    ns = lab.state(node).netns
    log = lab.dir / f"fault-{f.id}-delay.log"
    with open(log, "wb") as err:
        proc = subprocess.Popen(
            ["ip", "netns", "exec", ns, sys.executable, "-m", "substrate.delay", "--queue", str(q),
             "--delay-ms", str(t["delay_ms"])],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=err, start_new_session=True)
    assert proc.stdout is not None
    ready = b""
    deadline = time.monotonic() + 15.0
    while b"ready\n" not in ready and proc.poll() is None and time.monotonic() < deadline:
        if select.select([proc.stdout], [], [], max(0.0, deadline - time.monotonic()))[0]:
            ready += os.read(proc.stdout.fileno(), 64) or b""
    proc.stdout.close()
    if b"ready\n" not in ready:
        _terminate(proc)
        why = log.read_text(errors="replace").strip().splitlines()
        raise SubstrateError(f"{node}: the delay line did not start ({why[-1] if why else 'no message'})")
    _DELAY_LINES[(lab.name, f.id)] = proc
    for argv in _delay_rules(f, "-A"):
        r = lab.exec(node, argv)
        if not r.ok:
            _stop_delay(lab, f)
            raise SubstrateError(f"{node}: latency rule refused: {r.summary()}")
    return f"{node} {t['interface']}: {t['delay_ms']} ms added to every IP packet leaving it"


def _terminate(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM (the delay line releases what it holds), SIGKILL after 5 s; reaps the process."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


def _delay_pids(lab: Lab, f: Fault) -> list[int]:
    """Host PIDs of ``f``'s delay line found in its node's network namespace (``ip netns pids``)."""
    r = lab.host_exec(["ip", "netns", "pids", lab.state(f.target["node"]).netns], timeout_s=5)
    want = f"substrate.delay\0--queue\0{_queue_of(f)}\0"
    pids = []
    for p in r.stdout.split():
        try:
            if want in Path(f"/proc/{p}/cmdline").read_text(errors="replace"):
                pids.append(int(p))
        except OSError:
            continue
    return pids


def _stop_delay(lab: Lab, f: Fault) -> str:
    node = f.target["node"]
    for argv in _delay_rules(f, "-D"):
        lab.exec(node, argv)  # gone already after a reset: nothing to delete
    proc = _DELAY_LINES.pop((lab.name, f.id), None)
    if proc is not None:
        _terminate(proc)
    for pid in _delay_pids(lab, f):  # one a crashed process left
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return f"{node} {f.target['interface']}: delay removed"


# -- pool exhaustion: another operator takes every free id of a pool on one PE ----------------


def _pools(lab: Lab) -> Any:
    """The deployed scenario's pools (the model's defaults for a lab deployed without one)."""
    from substrate.scenario.deploy import load_scenario
    from substrate.scenario.model import Pools

    try:
        return load_scenario(lab).pools
    except SubstrateError:
        return Pools()


def _taken(lab: Lab, node: str, pool: str) -> int:
    r = lab.exec(node, ["ip", "-6", "route", "show", "table", "all", "proto", str(FAULT_PROTOS[pool])], timeout_s=30)
    return len(r.stdout.splitlines())


def _take_pool(lab: Lab, f: Fault) -> str:
    from substrate.addressing import function_sid

    node, pool = f.target["node"], f.target["pool"]
    lo, hi = getattr(_pools(lab), pool)
    if pool == "tables":
        lines = [f"route add unreachable default table {t} proto {FAULT_PROTOS[pool]} metric {FAULT_METRIC}"
                 for t in range(lo, hi + 1)]
    elif pool == "functions":
        nid = lab.topology.node(node).node_id
        if nid is None:
            raise SubstrateError(f"{node} has no SRv6 locator: no SID function pool to take")
        lines = [f"route add {function_sid(nid, fn)} proto {FAULT_PROTOS[pool]} encap seg6local action End dev lo"
                 for fn in range(lo, hi + 1)]
    else:
        raise SubstrateError(f"unknown pool {pool!r}; known: {', '.join(POOLS)}")
    # -force: an id the device already uses fails ("File exists") and the batch goes on
    lab.exec(node, ["ip", "-6", "-force", "-batch", "-"], input="\n".join(lines) + "\n", timeout_s=60)
    n = _taken(lab, node, pool)
    if n == 0:
        raise SubstrateError(f"{node}: no free entry of pools.{pool} could be taken")
    shown = f"{lo}-{hi}" if pool == "tables" else f"0x{lo:x}-0x{hi:x}"
    return f"{node}: another operator took {n} free entries of pools.{pool} ({shown}); none is left"


def _release_pool(lab: Lab, f: Fault) -> str:
    node, pool = f.target["node"], f.target["pool"]
    if pool not in FAULT_PROTOS:
        raise SubstrateError(f"unknown pool {pool!r}; known: {', '.join(POOLS)}")
    lab.exec(node, ["ip", "-6", "route", "flush", "table", "all", "proto", str(FAULT_PROTOS[pool])], timeout_s=60)
    left = _taken(lab, node, pool)
    if left:
        raise SubstrateError(f"{node}: {left} routes of the pool-exhaustion fault are still there")
    return f"{node}: pools.{f.target['pool']} released"
