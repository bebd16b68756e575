"""A3-R's reconciler: a controller process per lab that drives the network to the source of
truth's HEAD (draft section 5.1, A3-R: "drift detection and reconciliation"; the self-heal of
GitOps controllers such as Argo CD and Flux).

One reconcile (:meth:`Reconciler.reconcile_once`):

1. reads HEAD's records (:class:`servers.a3_reconciled.source.Repo`) and, when they differ from
   the records A3-T last applied, turns the difference into an A3-T change set
   (:func:`servers.a3_reconciled.source.ops_toward`) and applies it with the A3-T engine
   (:meth:`servers.a3_intent.transaction.Engine.apply`: planning with allocation and integrity
   rules, journaled cross-device transaction, pre-check, active validation, rollback). A commit
   whose change is refused or rolled back leaves the network at the last good commit; it is
   retried only when the failure was transient, or on the next commit;
2. compares every device with the applied records' rendering (:func:`servers.a3_intent.planner.drift`):
   drift found is reverted (default; :func:`~servers.a3_intent.planner.repair_delta` through
   :meth:`~servers.a3_intent.transaction.Engine.repair`, the same transaction) or only reported
   (``mode="report"``);
3. appends a record to ``<lab dir>/a3r/reconciles.jsonl`` (commit, change id, devices touched,
   result, drift found, duration) and rewrites ``<lab dir>/a3r/status.json``.

The process (``python -m servers.a3_reconciled.reconciler LAB``) reconciles when HEAD moves (the
A3-R server also sends it SIGUSR1 after a commit) and every ``interval_s`` seconds; it exits when
its owner (the server that started it) dies, when the lab directory goes, or on SIGTERM. A held
configuration lock makes a reconcile wait (the engine's bounded wait) and then be retried after
``retry_s``. Killed with SIGKILL mid-apply, it leaves a journaled transaction that the next
reconciler (or A3-T server) finishes at start (:meth:`Engine.recover_at_start`), then converges.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from dataclasses import field as dc_field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, Field

from servers.a3_intent.catalog import ChangeSetRejected, parse_ops
from servers.a3_intent.inventory import scanned_nodes
from servers.a3_intent.planner import (
    Underlay, _frr_stanzas, drift, foreign, repair_delta, underlay_as_shown, underlay_frr, underlay_of, underlay_ports,
)
from servers.a3_intent.transaction import Engine, EngineOptions, TransactionError
from servers.a3_reconciled.source import STATE_DIR, CommitInvalid, Desired, FileLock, Repo, SourceError, desired_of, ops_toward
from substrate import controllers
from substrate.errors import SubstrateError
from substrate.journal import normalize_route
from substrate.locks import ConfigLockHeld
from substrate.scenario.model import NodeConfig

if TYPE_CHECKING:
    from substrate.lab import Lab
    from substrate.scenario.model import Scenario

log = logging.getLogger("anibench.servers.a3r")

CONTROLLER = "a3r-reconciler"
STATUS_FILE = "status.json"
LOG_FILE = "reconciles.jsonl"
#: Held through each reconcile, so that reconciles of one lab (the controller's, an A4 server's) never interleave.
RECONCILE_LOCK = "reconcile.lock"
#: Default reconcile period (seconds) and retry pause after a held lock or a transient failure.
DEFAULT_INTERVAL_S = 5.0
DEFAULT_RETRY_S = 1.0
#: Most drift lines kept per device in a record.
DRIFT_LINES = 12
#: Periods in a row a reconcile may be skipped because no change was seen (see :class:`ChangeWatch`):
#: every this-many-th period compares the devices regardless (what no announcement covers: sysctl
#: files outside netconf, a node whose watch could not be opened).
DEFAULT_FULL_EVERY = 12
#: Held (flock) by the running reconciler of a lab for its whole life: a second one exits at start.
SINGLETON_LOCK = "reconciler.lock"
#: Exit status of a reconciler that found another one running on its lab.
ALREADY_RUNNING = 3
#: Restarts of a dead reconciler its supervisor makes at most (per server).
MAX_RESTARTS = 5
SUPERVISOR_LOG = "supervisor.jsonl"
SUPERVISOR_FILE = "supervisor.json"
#: Bound on the wait for a started reconciler to register (seconds).
START_TIMEOUT_S = 30.0
#: Bound on one read of a router's FRR configuration by the reconciler (ChangeWatch; seconds).
FRR_READ_S = 2.0
#: Slack in :func:`reconcile_bound_s` for writing the reconcile's record and exiting (seconds).
STOP_MARGIN_S = 10.0

Mode = Literal["revert", "report"]


class ReconcileRecord(BaseModel):
    """One reconcile, as recorded in ``reconciles.jsonl``."""

    n: int = Field(description="Reconcile number since the reconciler's state was made (per baseline epoch).")
    started: float = Field(description="Unix time.")
    commit: str | None = Field(description="HEAD commit reconciled.")
    trigger: str = Field(description="commit | change (a device change was seen) | period (the full check due) | retry | start")
    result: str = Field(description="in_sync | applied | drift_reverted | drift_reported | failed | retry")
    change_id: str | None = Field(default=None, description="The A3-T change applying the commit (get it with reconcile_status).")
    repair_change_id: str | None = None
    devices: list[str] = Field(default_factory=list, description="Devices touched.")
    drift: dict[str, list[str]] = Field(default_factory=dict, description="Per device, how it differed from the desired state.")
    message: str = ""
    duration_s: float = 0.0


class ReconcileStatus(BaseModel):
    """``status.json``: where the reconciler stands."""

    epoch: str
    applied_commit: str | None = Field(default=None, description="Last commit whose records the network carries.")
    failed_commit: str | None = Field(default=None, description="A later commit whose change was refused or rolled back.")
    failed_message: str | None = None
    failed_transient: bool = False
    last: ReconcileRecord | None = None
    reconciles: int = 0
    drift_events: int = Field(default=0, description="Reconciles that found drift.")
    applies: int = Field(default=0, description="Reconciles that changed devices (commit applied or drift reverted).")
    mode: Mode = "revert"
    quiet_periods: int = Field(default=0, description="Periods skipped because no device change was seen (ChangeWatch).")


class ChangeWatch:
    """Whether a lab's devices may have changed since :meth:`arm`: per node, a netlink
    :class:`substrate.netlink.ChangeMonitor` (kernel: links, addresses, routes, rules, qdiscs,
    netconf, nftables) and, per router, a fingerprint of each FRR daemon's running configuration
    read from its vty socket (no process is started). What makes an idle reconciler cheap: a period
    in which nothing was seen skips the device scan. A node that cannot be watched, or a daemon that
    does not answer, always counts as changed."""

    def __init__(self, lab: Lab):
        self.lab = lab
        self.monitors: dict[str, Any] = {}
        self.frr: dict[str, tuple[tuple[str, str], ...] | None] = {}
        self.nodes: list[str] = []

    def _fingerprint(self, node: str) -> tuple[tuple[str, str], ...] | None:
        from substrate.vty import VtyError

        out = []
        try:
            for d in self.lab.state(node).daemons:
                text, status = self.lab.vty(node, d, "show running-config", timeout_s=FRR_READ_S)[0]
                out.append((d, f"{status}:{text}"))
        except (VtyError, SubstrateError):
            return None
        return tuple(out)

    def arm(self, nodes: list[str]) -> None:
        """Start watching ``nodes`` from now (pending announcements dropped, fingerprints taken)."""
        from substrate import netlink
        from substrate.topology import Role

        self.nodes = list(nodes)
        for n in list(self.monitors):
            if n not in nodes:
                self.monitors.pop(n).close()
        for n in nodes:
            m = self.monitors.get(n)
            if m is not None and m.changed():  # drained; re-opened when the namespace was re-created
                try:
                    same = os.stat(m.path).st_ino == m.inode
                except OSError:
                    same = False
                if not same:
                    self.monitors.pop(n).close()
            if n not in self.monitors:
                try:
                    self.monitors[n] = netlink.ChangeMonitor(f"/run/netns/{self.lab.state(n).netns}")
                except (SubstrateError, OSError) as e:
                    log.info("A3-R reconciler: %s not watched (%s); compared every period", n, e)
        routers = [n for n in nodes if self.lab.state(n).role is not Role.HOST]
        self.frr = dict(zip(routers, self.lab.map(self._fingerprint, routers), strict=True))

    def changed(self) -> str | None:
        """Why the devices may have changed since :meth:`arm` (first reason found), or None."""
        for n in self.nodes:
            m = self.monitors.get(n)
            if m is None:
                return f"{n} is not watched"
            if m.changed():
                return f"kernel change on {n}"
        routers = list(self.frr)
        for n, now in zip(routers, self.lab.map(self._fingerprint, routers), strict=True):
            if now is None or now != self.frr[n]:
                return f"FRR configuration of {n} changed or could not be read"
        return None

    def close(self) -> None:
        for m in self.monitors.values():
            m.close()
        self.monitors = {}


#: A3-T phrases that are false in an A3-R/A4 result, where "commit" is the source of truth's ->
#: what they mean there (:func:`as_reconciled`).
_A3T_WORDING = (
    ("Nothing was committed.", "No device change was kept (the transaction was undone on the devices)."),
    ("; nothing was committed", "; no device was changed"),
    ("finished by the next apply_change_set", "finished by the next reconcile"),
    ("the next apply_change_set", "the next reconcile"),
)


def as_reconciled(message: str) -> str:
    """An A3-T transaction message (:class:`~servers.a3_intent.transaction.ChangeResult`) worded for
    A3-R and A4, where "committed" means a commit of the source of truth: "Nothing was committed"
    says what happened on the devices instead (the commit that asked for the change exists)."""
    for a3t, here in _A3T_WORDING:
        message = message.replace(a3t, here)
    return message


def exempt_nft(active: list[Any], node: str, table: str, blocks: dict[str, list[str]]) -> str | None:
    """Who put nftables table ``table`` on ``node`` below the ANI on purpose, judged by its content,
    or None (:func:`substrate.scenario.observer.nft_table_below_ani`: the observer's probe table,
    an active fault's). A table of such a name holding anything else is drift."""
    from substrate.scenario.observer import nft_table_below_ani

    return nft_table_below_ani(active, node, table, blocks)


def fault_lines(active: list[Any], node: str, lines: list[str]) -> list[str]:
    """``lines`` (drift of ``node``) less what an active fault of ``active`` made on purpose below
    the ANI and clears itself: a port the link-down fault set down. (The concurrent writer's FRR
    route stays drift: issue 13 has it reverted.)"""
    down = {f"link down: {f.target.get('interface')}" for f in active if f.kind == "link_down" and f.target.get("node") == node}
    return [ln for ln in lines if ln not in down]


def fault_route(route: str) -> bool:
    """Whether a canonical route is the pool-exhaustion fault's (its own protocol numbers,
    :data:`substrate.faults.FAULT_PROTOS`): put there below the ANI on purpose, not drift."""
    from substrate.faults import FAULT_PROTOS

    w = route.split()
    return "proto" in w and w.index("proto") + 1 < len(w) and w[w.index("proto") + 1] in {str(p) for p in FAULT_PROTOS.values()}


def state_dir(lab: Lab) -> Path:
    return Path(lab.dir) / STATE_DIR


def read_status(lab: Lab, epoch: str) -> ReconcileStatus:
    """The reconciler's status of this epoch (a fresh one when there is none)."""
    try:
        st = ReconcileStatus.model_validate_json((state_dir(lab) / STATUS_FILE).read_text())
    except (OSError, ValueError):
        return ReconcileStatus(epoch=epoch)
    return st if st.epoch == epoch else ReconcileStatus(epoch=epoch)


def counts(lab: Lab) -> tuple[int, int]:
    """``(reconciles, drift events)`` since the lab was last put at its baseline (the current epoch)."""
    from substrate.scenario.deploy import baseline_epoch

    st = read_status(lab, baseline_epoch(lab))
    return st.reconciles, st.drift_events


def restarts_since(lab: Lab, since: float) -> int:
    """Restarts of a dead reconciler its supervisors made since Unix time ``since`` (the events
    ``restart`` and ``restart_failed`` of ``<lab dir>/a3r/supervisor.jsonl``; a run record's
    ``supervisor_restarts``); 0 when there is no log. The file outlives the server, unlike
    ``supervisor.json`` (:func:`read_supervisor` reads only a live supervisor's)."""
    try:
        lines = (state_dir(lab) / SUPERVISOR_LOG).read_text().splitlines()
    except OSError:
        return 0
    n = 0
    for ln in lines:
        with contextlib.suppress(ValueError, TypeError, AttributeError):
            d = json.loads(ln)
            n += d.get("event") in ("restart", "restart_failed") and float(d.get("time", 0)) >= since
    return n


def read_log(lab: Lab, epoch: str, limit: int = 20) -> list[ReconcileRecord]:
    """The last ``limit`` reconcile records of this epoch, newest first."""
    try:
        lines = (state_dir(lab) / LOG_FILE).read_text().splitlines()
    except OSError:
        return []
    out = []
    for ln in reversed(lines):
        with contextlib.suppress(ValueError):
            d = json.loads(ln)
            if d.pop("epoch", None) == epoch:
                out.append(ReconcileRecord.model_validate(d))
        if len(out) >= limit:
            break
    return out


class Reconciler:
    """Reconciles one lab (see module docstring)."""

    def __init__(self, lab: Lab, *, mode: Mode = "revert", devices: set[str] | None = None, options: EngineOptions | None = None):
        self.lab = lab
        self.mode = mode
        self.allowed = devices
        self.engine = Engine(lab, options or EngineOptions(holder=f"A3-R reconciler (pid {os.getpid()})"))
        self.repo = Repo(lab)
        #: held through each reconcile (re-entrant: an A4 server holds it from its commit to its reconcile)
        self.lock = FileLock(state_dir(lab) / RECONCILE_LOCK)
        #: set by :meth:`run`: armed at each reconcile, asked each period
        self.watch: ChangeWatch | None = None
        self._why = ""
        self._underlay: dict[str, dict[str, set[str]]] = {}
        self._owned: dict[str, Underlay | None] = {}
        self._loaded: tuple[dict[str, Any], dict[str, Any]] | None = None  # (baselines, deployed node configs)

    def ensure_repo(self) -> str:
        """The repository exists for the lab's current epoch (made from the inventory if not); returns the epoch."""
        epoch = self.engine.records.epoch()
        with self.repo.locked():
            sc, _ = self.engine.inventory()
            self.repo.ensure(sc, epoch)
        return epoch

    def _count_quiet(self) -> None:
        """A period skipped (nothing seen): counted in status.json (read-modify-write under the lock)."""
        with self.lock.held():
            d = state_dir(self.lab)
            st = read_status(self.lab, self.engine.records.epoch())
            st.quiet_periods += 1
            tmp = d / f".{STATUS_FILE}.tmp"
            tmp.write_text(st.model_dump_json())
            tmp.replace(d / STATUS_FILE)

    def _save(self, st: ReconcileStatus, rec: ReconcileRecord) -> None:
        d = state_dir(self.lab)
        d.mkdir(parents=True, exist_ok=True)
        with open(d / LOG_FILE, "a") as f:
            f.write(json.dumps({**rec.model_dump(mode="json"), "epoch": st.epoch}) + "\n")
        st.last = rec
        tmp = d / f".{STATUS_FILE}.tmp"
        tmp.write_text(st.model_dump_json())
        tmp.replace(d / STATUS_FILE)

    def nodes(self, sc: Scenario) -> list[str]:
        """The devices reconciled: every router (its underlay at least) and every node the
        rendering configures, within the allowed devices."""
        routers = {n.name for n in sc.topology.routers}
        return [n for n in scanned_nodes(sc) if (n in sc.node_config or n in routers) and (self.allowed is None or n in self.allowed)]

    def _baseline(self, node: str) -> tuple[Any, Any, Any]:
        """``(baseline capture, its FRR view, the baseline's service rendering)`` of ``node`` (Nones when unknown)."""
        from substrate.journal import FrrView
        from substrate.scenario.deploy import load_baseline, load_scenario

        if self._loaded is None:  # read once: the baseline and the deployed scenario never change in a lab's life
            try:
                self._loaded = (load_baseline(self.lab), load_scenario(self.lab).node_config)
            except SubstrateError:
                return None, None, None
        baselines, configs = self._loaded
        base = baselines.get(node)
        view = FrrView(base.frr_daemons) if base is not None and base.frr_daemons else None
        return base, view, configs.get(node)

    def underlay(self, sc: Scenario, node: str) -> dict[str, set[str]]:
        """``node``'s underlay FRR stanzas as its FRR shows them (:func:`underlay_as_shown`, from
        the lab's baseline; cached: the underlay never changes with the records)."""
        if node not in self._underlay:
            _base, view, deployed = self._baseline(node)
            self._underlay[node] = underlay_as_shown(underlay_frr(sc, node), view, _frr_stanzas(deployed.frr) if deployed else {})
        return self._underlay[node]

    def owned(self, node: str) -> Underlay | None:
        """What ``node`` holds outside the records by design (:func:`~servers.a3_intent.planner.underlay_of`
        of its baseline; cached), or None when the lab has no baseline of it."""
        if node not in self._owned:
            base, view, deployed = self._baseline(node)
            self._owned[node] = underlay_of(base, deployed, view) if base is not None else None
        return self._owned[node]

    def drift_of(self, sc: Scenario) -> dict[str, list[str]]:
        """Per device (of the desired rendering, within the allowed devices), how it differs from
        it: everything the rendering owns, the services' state and the underlay's (FRR lines,
        ports up; :func:`~servers.a3_intent.planner.drift` with ``own_underlay``), and everything
        else the device holds that neither the records nor the baseline's underlay explain
        (:func:`~servers.a3_intent.planner.foreign`: a table, rule, main-table route, address, FRR
        stanza, MTU). Exempt, by content: the observer's probe table and what an active fault put
        there below the ANI on purpose (:func:`exempt_nft`, :func:`fault_route`, :func:`fault_lines`); the
        concurrent-writer fault's FRR route is drift like any other (issue 13)."""
        from substrate.faults import active_faults

        nodes = self.nodes(sc)
        routers = {r.name for r in sc.topology.routers}
        states, _found, _errors = self.engine.scan(sc, nodes)
        views = self.engine.frr_views(nodes)
        active = active_faults(self.lab)
        out = {}
        for n in nodes:
            if n in states:
                cfg = sc.node_config.get(n) or NodeConfig()
                lines = drift(n, cfg, states[n], frr=views.get(n), underlay=self.underlay(sc, n),
                              own_underlay=True, underlay_links=underlay_ports(sc, n))
                under = self.owned(n)
                if under is not None:
                    lines += foreign(n, cfg, states[n], under, frr=views.get(n), ports=underlay_ports(sc, n),
                                     exempt_nft=lambda t, b, n=n: exempt_nft(active, n, t, b), exempt_route=fault_route,
                                     underlay_heads=set(self.underlay(sc, n)))  # fmt: skip
                if n in routers:
                    lines += self._not_zebras(n, states[n])
                lines = fault_lines(active, n, list(dict.fromkeys(lines)))
                if lines:
                    out[n] = lines
        return out

    def _not_zebras(self, node: str, state: Any) -> list[str]:
        """Kernel routes of ``node`` with an FRR protocol number that zebra did not install
        (:func:`substrate.devstate.fib_desync` ``unknown``; issue 35, the reconciler attack:
        ``ip route add blackhole P proto isis`` passed as FRR's, and FRR's routes are dynamic):
        ``route extra: ip -F route ROUTE`` for each one seen again on a second read, after
        :data:`substrate.devstate.ZEBRA_SETTLE_S` (zebra may be between its RIB and the kernel)."""
        from substrate.devstate import ZEBRA_SETTLE_S, capture, fib_desync

        first = fib_desync(self.lab, node, state).unknown
        if not first:
            return []
        time.sleep(ZEBRA_SETTLE_S)  # a second, later read: not a wait for an outcome
        try:
            again = fib_desync(self.lab, node, capture(self.lab, node, frr=False, sysctls="fast")).unknown
        except SubstrateError:
            return []
        return [f"route extra: ip {x.split(' ', 1)[0]} route {normalize_route(x.split(' ', 1)[1])}" for x in first if x in again]

    def reconcile_once(self, trigger: str = "period") -> ReconcileRecord:
        """One reconcile (see module docstring). Never raises for a device or lock problem: the
        record says it (result ``retry`` or ``failed``). Holds :attr:`lock` (waits for another reconcile of the lab)."""
        with self.lock.held():
            return self._reconcile_locked(trigger)

    def _reconcile_locked(self, trigger: str) -> ReconcileRecord:
        t0 = time.monotonic()
        epoch = self.ensure_repo()
        st = read_status(self.lab, epoch)
        st.mode = self.mode
        st.reconciles += 1
        head = self.repo.head()
        rec = ReconcileRecord(n=st.reconciles, started=time.time(), commit=head, trigger=trigger, result="in_sync",
                              message=f"({self._why})" if trigger == "change" and self._why else "")  # fmt: skip
        try:
            self._reconcile(st, rec, head)
        except ConfigLockHeld as e:
            rec.result, rec.message = "retry", f"a configuration lock is held: {e}; retried"
        except (TransactionError, SubstrateError, SourceError, OSError) as e:
            rec.result, rec.message = "retry", f"{type(e).__name__}: {e}; retried"
        except Exception as e:  # noqa: BLE001 - the controller must not die on one reconcile: recorded, retried
            log.error("reconcile failed", exc_info=True)
            rec.result, rec.message = "retry", f"internal error {type(e).__name__}: {e}; retried"
        rec.duration_s = round(time.monotonic() - t0, 3)
        if rec.drift:
            st.drift_events += 1
        if rec.devices:
            st.applies += 1
        self._save(st, rec)
        return rec

    def _reconcile(self, st: ReconcileStatus, rec: ReconcileRecord, head: str | None) -> None:
        sc, _ = self.engine.inventory()
        if self.watch is not None:
            # armed before the devices are read: a change made from now on (our own repair
            # included) makes the next period compare again
            self.watch.arm(self.nodes(sc))
        if head is not None and head != st.applied_commit and not (head == st.failed_commit and not st.failed_transient):
            try:
                desired: Desired = self.repo.desired_at(head)
            except CommitInvalid as e:
                st.failed_commit, st.failed_message, st.failed_transient = head, str(e), False
                rec.result = "failed"
                rec.message = f"{e}; the network stays at commit {(st.applied_commit or 'baseline')[:12]}"
                desired = {}
            raw, _where = ops_toward(desired, desired_of(sc)) if rec.result != "failed" else ([], [])
            if rec.result == "failed":
                pass
            elif not raw:
                st.applied_commit, st.failed_commit, st.failed_message = head, None, None
                rec.message = "the network already carries this commit's records"
            else:
                try:
                    res = self.engine.apply(parse_ops(raw), submitted=raw, allowed=self.allowed)
                except ChangeSetRejected as e:
                    st.failed_commit, st.failed_message, st.failed_transient = head, str(e), False
                    rec.result, rec.message = "failed", f"commit {head[:12]} refused by the planner, nothing changed: {e}"
                    return
                rec.change_id = res.change_id
                rec.devices = [d.device for d in res.devices]
                if res.status in ("applied", "no_change"):
                    st.applied_commit, st.failed_commit, st.failed_message = head, None, None
                    rec.result, rec.message = "applied", f"commit {head[:12]} applied as change {res.change_id}: {res.message}"
                else:
                    msg = as_reconciled(res.message)
                    st.failed_commit, st.failed_message, st.failed_transient = head, msg, res.transient
                    rec.result = "retry" if res.transient else "failed"
                    rec.message = (f"commit {head[:12]} not applied (change {res.change_id}, {res.status}); the network stays at "
                                   f"commit {(st.applied_commit or 'baseline')[:12]}: {msg}")  # fmt: skip
            sc, _ = self.engine.inventory()
        found = self.drift_of(sc)
        if not found:
            return
        rec.drift = {n: ls[:DRIFT_LINES] + ([f"... {len(ls) - DRIFT_LINES} more"] if len(ls) > DRIFT_LINES else []) for n, ls in found.items()}
        if self.mode == "report":
            if rec.result == "in_sync":
                rec.result = "drift_reported"
            rec.message += f" drift on {', '.join(found)} reported (report-only mode), not reverted"
            return

        if all(repair_delta(n, sc.node_config.get(n) or NodeConfig(), ls).empty() for n, ls in found.items()):
            rec.result = "failed"
            rec.message += f" drift on {', '.join(found)} that no device command of the rendering undoes; reported"
            return

        def deltas_of(inv: Scenario) -> dict[str, Any]:
            now = self.drift_of(inv)
            return {n: repair_delta(n, inv.node_config.get(n) or NodeConfig(), ls) for n, ls in now.items()}

        res = self.engine.repair(deltas_of, allowed=self.allowed)
        rec.repair_change_id = res.change_id
        rec.devices = sorted(set(rec.devices) | {d.device for d in res.devices})
        if res.status == "applied":
            if rec.result == "in_sync":
                rec.result = "drift_reverted"
            rec.message += f" drift on {', '.join(found)} reverted (change {res.change_id})"
        elif res.status != "no_change":
            rec.result = "retry" if res.transient else "failed"
            rec.message += (f" drift on {', '.join(found)} could not be reverted (change {res.change_id}, {res.status}): "
                            f"{as_reconciled(res.message)}")  # fmt: skip
        rec.message = rec.message.strip()

    # -- the loop ------------------------------------------------------------------------------------

    def run(self, interval_s: float, retry_s: float, stop: threading.Event, wake: threading.Event,
            alive: Any = lambda: True, full_every: int = DEFAULT_FULL_EVERY) -> None:  # fmt: skip
        """Reconcile at start, on every HEAD move or wake-up, every ``interval_s`` and ``retry_s``
        after a ``retry`` result, until ``stop`` is set or ``alive()`` is false.

        A period in which :class:`ChangeWatch` saw no device change (and HEAD did not move) is
        skipped, counted in ``quiet_periods``, unless ``full_every`` periods in a row were: drift
        the watch sees is reverted at the next period, any other within ``full_every`` periods."""
        for note in self.engine.recover_at_start():
            log.warning("A3-R reconciler on %s: %s", self.lab.name, note)
        self.watch = ChangeWatch(self.lab)
        trigger = "start"
        try:
            rec = self.reconcile_once(trigger)
            skipped = 0
            while not stop.is_set() and alive():
                seen = self.repo.head_fast()
                due = time.monotonic() + (retry_s if rec.result == "retry" else interval_s)
                trigger = "period"
                while not stop.is_set() and time.monotonic() < due:
                    if wake.wait(timeout=min(0.5, max(0.0, due - time.monotonic()))):
                        wake.clear()
                        trigger = "commit"
                        break
                    if self.repo.head_fast() != seen:
                        trigger = "commit"
                        break
                    if not alive():
                        return
                if stop.is_set():
                    return
                if rec.result == "retry" and trigger == "period":
                    trigger = "retry"
                if trigger == "period":
                    self._why = self.watch.changed() or ""
                    if self._why:
                        trigger = "change"
                    elif skipped + 1 < max(1, full_every):
                        skipped += 1
                        self._count_quiet()
                        continue
                skipped = 0
                rec = self.reconcile_once(trigger)
        finally:
            self.watch.close()


# -- the process ------------------------------------------------------------------------------------


def start(lab: Lab, *, owner_pid: int | None = None, interval_s: float = DEFAULT_INTERVAL_S, mode: Mode = "revert",
          devices: list[str] | None = None, options: dict[str, float] | None = None, full_every: int = DEFAULT_FULL_EVERY) -> int:  # fmt: skip
    """Start the lab's reconciler process unless one runs; returns its pid.

    Raises:
        SubstrateError: it did not register within START_TIMEOUT_S (its log is quoted).
    """
    running = controllers.info(lab.dir, CONTROLLER)
    if running is not None:
        return int(running["pid"])
    d = state_dir(lab)
    d.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "servers.a3_reconciled.reconciler", lab.name, "--owner", str(owner_pid or os.getpid()),
           "--interval", str(interval_s), "--mode", mode, "--full-every", str(full_every)]  # fmt: skip
    if devices is not None:
        cmd += ["--devices", ",".join(devices)]
    for k, v in (options or {}).items():
        cmd += ["--option", f"{k}={v}"]
    logf = open(d / "reconciler.log", "ab")  # noqa: SIM115 - handed to the child
    root = str(Path(__file__).resolve().parents[2])
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=logf, stderr=logf, start_new_session=True, cwd=root)
    logf.close()
    deadline = time.monotonic() + START_TIMEOUT_S
    while (running := controllers.info(lab.dir, CONTROLLER)) is None or int(running["pid"]) != proc.pid:
        if proc.poll() == ALREADY_RUNNING and running is not None:
            return int(running["pid"])  # another starter's reconciler holds the lab's singleton lock
        if proc.poll() is not None and proc.returncode != ALREADY_RUNNING:
            raise SubstrateError(f"the A3-R reconciler of lab {lab.name} exited ({proc.returncode}): {_tail(d / 'reconciler.log')}")
        if time.monotonic() > deadline:
            proc.kill()
            raise SubstrateError(f"the A3-R reconciler of lab {lab.name} did not start within {START_TIMEOUT_S:g} s")
        time.sleep(0.05)  # poll interval: returns as soon as it has registered
    _CHILDREN.append(proc)
    _CHILD_LAB[proc.pid] = str(lab.dir)
    return proc.pid


#: Bound on reaping a stopped reconciler (seconds; it has had SIGKILL after controllers.stop's bound).
REAP_TIMEOUT_S = 10.0
#: Reconcilers started by this process (reaped by stop).
_CHILDREN: list[subprocess.Popen[bytes]] = []
#: pid of each of them -> its lab directory.
_CHILD_LAB: dict[int, str] = {}


def reconcile_bound_s(opts: EngineOptions) -> float:
    """How long a reconciler running with engine options ``opts`` may take, once asked to stop
    (SIGTERM), to finish its reconcile in progress and exit (seconds): what a stop waits before a
    kill (:func:`stop`, and :func:`substrate.controllers.stop_all`, which reads it from the
    controller's record).

    The process checks for the stop between reconciles only, so the reconcile in progress ends
    as it would have (what the network carries at evaluation does not depend on when the stop
    came): at most two transactions (the commit's apply, then the drift repair),
    :meth:`EngineOptions.transaction_bound_s` each, plus the device reads outside them (the
    drift scan, ``capture_timeout_s``; the FRR fingerprints and views, :data:`FRR_READ_S` each)
    and :data:`STOP_MARGIN_S` for the record and the exit. Default options:
    2 x 228 + 8 + 2 x 2 + 10 = 478 s. A bound, not a wait: a reconcile takes a few seconds when
    nothing is stuck, and an idle reconciler exits within its 0.5 s wake-up poll."""
    return 2 * opts.transaction_bound_s() + opts.capture_timeout_s + 2 * FRR_READ_S + STOP_MARGIN_S

#: Bound on the wait for a stopped reconciler to finish its in-flight reconcile (seconds), with
#: the engine's default options (:func:`reconcile_bound_s`; a reconciler records its own bound,
#: from the options it runs with, in its controller record).
STOP_TIMEOUT_S = reconcile_bound_s(EngineOptions())


@dataclass
class StopReport:
    """What stopping a lab's reconciler did (:func:`stop`)."""

    #: a reconciler ran
    ran: bool = False
    #: it exited by itself within the bound, its in-flight reconcile (if any) finished
    finished: bool = True
    #: seconds waited for it
    waited_s: float = 0.0
    #: the bound (seconds)
    timeout_s: float = STOP_TIMEOUT_S
    #: what recovery did after it was killed (its transaction finished or undone), and what is left
    recovery: list[str] = dc_field(default_factory=list)
    #: journaled transactions still unfinished afterwards (change ids)
    unfinished: list[str] = dc_field(default_factory=list)

    def describe(self) -> str:
        """One sentence for a tool result or a log."""
        if not self.ran:
            return "no reconciler was running"
        if self.finished:
            return f"the reconciler finished its in-flight reconcile and stopped ({self.waited_s:.1f} s)"
        out = (f"the reconciler did not finish its in-flight reconcile within {self.timeout_s:g} s and was killed; "
               + ("its transaction was recovered: " + "; ".join(self.recovery) if self.recovery else "no transaction was left open"))
        if self.unfinished:
            out += (f"; still unfinished: change {', '.join(self.unfinished)} (half-applied until a reconciler or A3-T "
                    "server starts and finishes it, or a lab reset)")
        return out


def stop(lab: Lab, *, timeout_s: float = STOP_TIMEOUT_S, options: EngineOptions | None = None) -> StopReport:
    """Stop the lab's reconciler: SIGTERM, then a wait of up to ``timeout_s`` for it to finish its
    in-flight reconcile (the process checks for the stop between reconciles, never inside one) and
    exit. Past the bound it is killed and its journaled transaction, if any, is finished or undone
    here (:meth:`Engine.recover_at_start`), so that no transaction is left half-applied unless a
    device does not answer (the report names what is left)."""
    ran, finished, waited = controllers.stop_waiting(lab.dir, CONTROLLER, timeout_s=timeout_s)
    for p in list(_CHILDREN):
        if _CHILD_LAB.get(p.pid) == str(lab.dir) and p.poll() is None:
            # stopped above (SIGKILL after the bound): reaped here, bounded, else a zombie is left
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=REAP_TIMEOUT_S)
        if p.poll() is not None:
            _CHILDREN.remove(p)
            _CHILD_LAB.pop(p.pid, None)
    rep = StopReport(ran=ran, finished=finished, waited_s=waited, timeout_s=timeout_s)
    if ran and not finished:
        eng = Engine(lab, options or EngineOptions(holder=f"A3-R reconciler stop (pid {os.getpid()})"))
        try:
            rep.recovery = eng.recover_at_start()
            rep.unfinished = [e.txn for e in eng.journal.unfinished()]
        except (SubstrateError, OSError) as e:
            rep.recovery = [f"recovery failed: {e}"]
        log.warning("A3-R reconciler of %s: %s", lab.name, rep.describe())
    return rep


class SupervisorState(BaseModel):
    """``supervisor.json``: the reconciler's supervisor (the server that started it)."""

    restarts: int = Field(default=0, description="Restarts of a dead reconciler so far (this server).")
    max_restarts: int = MAX_RESTARTS
    down: bool = Field(default=False, description="The reconciler died and is not restarted any more (the bound is spent).")
    message: str = ""
    owner_pid: int = Field(default_factory=os.getpid, description="The supervising server's pid.")
    owner_start: int = 0
    dead_since: float | None = Field(default=None, description="Unix time the supervisor saw the reconciler dead; None "
                                     "while it runs (cleared by a restart that started one).")
    why: str = Field(default="", description="How the last dead reconciler ended, e.g. 'killed by signal 9 (pid 123)'.")
    closed: bool = Field(default=False, description="The supervisor was closed (submit, server close): a stop, not a death.")


#: Most characters of a "reconciler down" notice's message.
DOWN_NOTICE_CHARS = 400


class ReconcilerDown(BaseModel):
    """The notice that the lab's supervised reconciler is down (:func:`down_notice`), carried by every
    tool result of A3-R and A4 while it is (the structured result's ``reconciler_down`` and its text)."""

    since: float | None = Field(description="Unix time its supervisor saw it dead (None: just died, not seen yet).")
    since_utc: str | None = Field(default=None, description="The same, ISO 8601 UTC.")
    why: str = Field(default="", description="How it ended, e.g. 'killed by signal 9 (pid 123)'.")
    restarts: int = Field(description="Restarts its supervisor made so far (this server).")
    max_restarts: int = Field(description="The supervisor's bound on restarts.")
    will_restart: bool = Field(description="Whether the supervisor restarts it (false: the bound is spent).")
    message: str = Field(description=f"In words, at most {DOWN_NOTICE_CHARS} characters: what it means and what to do.")


def down_notice(lab: Lab, sup: SupervisorState | None, *, running: bool | None = None,
                now: float | None = None) -> ReconcilerDown | None:  # fmt: skip
    """Whether the lab's supervised reconciler is down, as the notice every A3-R and A4 tool result
    carries then (:class:`ReconcilerDown`); None when it runs, when no supervisor watches one (a
    server with ``reconciler=False``: nothing to be down), or when the supervisor was closed (a stop
    at submit or close is not a death).

    Args:
        lab: the lab (``lab.dir`` is read: the controller record).
        sup: the supervisor's state (the server's own, or :func:`read_supervisor`).
        running: whether a reconciler runs (default: its controller record names a live process).
        now: Unix time for the "down for N s" wording (default: now).
    """
    if sup is None or sup.closed:
        return None
    if running is None:
        running = controllers.info(lab.dir, CONTROLLER) is not None
    if running:
        return None
    since = sup.dead_since
    will = not sup.down and sup.restarts < sup.max_restarts
    when = (time.strftime("%H:%M:%S UTC", time.gmtime(since)) + f" ({max(0.0, (now or time.time()) - since):.0f} s ago)"
            if since is not None else "a moment ago (its supervisor has not seen it yet)")  # fmt: skip
    what = (f"the supervisor restarts it (restart {sup.restarts + 1} of at most {sup.max_restarts})" if will and
            sup.restarts < sup.max_restarts else "the supervisor will not restart it (its bound of "
            f"{sup.max_restarts} restarts is spent): restart the server; a3r/reconciler.log in the lab directory says why it died")  # fmt: skip
    msg = (f"The reconciler is down since {when}{': ' + sup.why if sup.why else ''}; {sup.restarts} restart(s) so far; "
           f"{what}. Until one runs nothing applies commits to the devices or reverts drift.")  # fmt: skip
    return ReconcilerDown(since=since, since_utc=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(since)) if since else None,
                          why=sup.why[:200], restarts=sup.restarts, max_restarts=sup.max_restarts,
                          will_restart=will, message=msg[:DOWN_NOTICE_CHARS])  # fmt: skip


def read_supervisor(lab: Lab) -> SupervisorState | None:
    """The state of the lab's live supervisor, or None when none runs (none started, or its server is gone)."""
    from substrate.record import pid_alive

    try:
        st = SupervisorState.model_validate_json((state_dir(lab) / SUPERVISOR_FILE).read_text())
    except (OSError, ValueError):
        return None
    return st if pid_alive(st.owner_pid, st.owner_start or None) else None


class Supervisor:
    """Restarts the lab's reconciler when it dies (at most ``max_restarts`` times): a thread of the
    server that started it. Each restart is a line of ``<lab dir>/a3r/supervisor.jsonl`` (time, why
    it died, the new pid) and counted in ``supervisor.json`` (:func:`read_supervisor`, shown by
    reconcile_status); past the bound the reconciler stays down and the state says so and how to
    recover. A stop (:meth:`close`, :func:`stop`) is not a death.

    ``start`` starts a reconciler and returns its pid (:func:`start` with the server's options);
    ``exit_status(pid)`` is its exit status once it ended (None while it runs)."""

    def __init__(self, lab: Lab, start_fn: Any, *, max_restarts: int = MAX_RESTARTS, exit_status: Any = None,
                 poll_s: float = 0.5):  # fmt: skip
        self.lab = lab
        self.start_fn = start_fn
        self.max_restarts = max_restarts
        self.exit_status = exit_status or _exit_status
        self.poll_s = poll_s
        from substrate.record import pid_start

        self.state = SupervisorState(max_restarts=max_restarts, owner_start=pid_start(os.getpid()))
        self.pid: int | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _write(self) -> None:
        d = state_dir(self.lab)
        d.mkdir(parents=True, exist_ok=True)
        tmp = d / f".{SUPERVISOR_FILE}.tmp"
        tmp.write_text(self.state.model_dump_json())
        tmp.replace(d / SUPERVISOR_FILE)

    def _log(self, **rec: Any) -> None:
        with open(state_dir(self.lab) / SUPERVISOR_LOG, "a") as f:
            f.write(json.dumps({"time": time.time(), **rec}) + "\n")

    def begin(self) -> int:
        """Start the reconciler and the watching thread; returns the pid.

        Raises:
            SubstrateError: the first start failed (nothing is watched then)."""
        self.pid = self.start_fn()
        self._write()
        self._thread = threading.Thread(target=self._watch, name="a3r-supervisor", daemon=True)
        self._thread.start()
        return self.pid

    def check(self) -> None:
        """One look: restart the reconciler if it died (bounded); what the thread does every ``poll_s``."""
        if self.pid is None or self.state.down or self._stop.is_set():
            return
        status = self.exit_status(self.pid)
        if status is None:
            return
        why = ("ended (how cannot be known: this process did not start it)" if status == STATUS_UNKNOWN
               else f"killed by signal {-status}" if status < 0 else f"exited with status {status}")
        if self.state.dead_since is None:
            self.state.dead_since = time.time()
        self.state.why = f"{why} (pid {self.pid})"
        for p in [p for p in _CHILDREN if p.pid == self.pid]:  # reaped: forgotten
            _CHILDREN.remove(p)
            _CHILD_LAB.pop(p.pid, None)
        if self.state.restarts >= self.max_restarts:
            self.state.down = True
            self.state.message = (f"the reconciler {why} (pid {self.pid}) and was not restarted: it died {self.state.restarts + 1} "
                                  f"times, past the bound of {self.max_restarts} restarts. Nothing applies commits or reverts "
                                  "drift now; to recover, read a3r/reconciler.log in the lab directory for why it died, then "
                                  "restart the server (a new server starts a new reconciler)")  # fmt: skip
            self._log(event="down", pid=self.pid, why=why, restarts=self.state.restarts)
            log.error("A3-R supervisor of %s: %s", self.lab.name, self.state.message)
            self._write()
            return
        self.state.restarts += 1
        old = self.pid
        try:
            self.pid = self.start_fn()
            self.state.dead_since = None
            self.state.message = f"restart {self.state.restarts} of {self.max_restarts}: the reconciler {why} (pid {old})"
            self._log(event="restart", n=self.state.restarts, pid=old, why=why, new_pid=self.pid)
        except SubstrateError as e:
            self.state.message = f"restart {self.state.restarts} of {self.max_restarts} failed: {e}"
            self._log(event="restart_failed", n=self.state.restarts, pid=old, why=why, error=str(e))
        log.warning("A3-R supervisor of %s: %s", self.lab.name, self.state.message)
        self._write()

    def _watch(self) -> None:
        while not self._stop.wait(self.poll_s):
            try:
                self.check()
            except Exception:  # noqa: BLE001 - the watch must go on
                log.error("A3-R supervisor check failed", exc_info=True)

    def close(self) -> None:
        """Stop watching (before the reconciler is stopped: a stop is not a death)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        self.state.closed = True
        with contextlib.suppress(OSError):
            self._write()

    def notice(self) -> ReconcilerDown | None:
        """:func:`down_notice` of this supervisor's reconciler (from its state in memory)."""
        return down_notice(self.lab, self.state)


#: :func:`_exit_status` of a gone reconciler this process did not start (its status cannot be known).
STATUS_UNKNOWN = 1 << 16


def _exit_status(pid: int) -> int | None:
    """Exit status of a reconciler this process started (negative: the signal), None while it runs;
    one it did not start: :data:`STATUS_UNKNOWN` once gone (its status cannot be known)."""
    from substrate.record import pid_alive

    for p in _CHILDREN:
        if p.pid == pid:
            return p.poll()
    return None if pid_alive(pid) else STATUS_UNKNOWN


def wake(lab: Lab) -> bool:
    """Tell the running reconciler to reconcile now (after a commit)."""
    return controllers.signal_controller(lab.dir, CONTROLLER, signal.SIGUSR1)


def _tail(p: Path) -> str:
    try:
        return p.read_text(errors="replace")[-600:].strip() or "(no output)"
    except OSError:
        return "(no log)"


def recover_killed(lab: Lab, options: EngineOptions | None = None) -> tuple[list[str], list[str]]:
    """Finish or undo the journaled transaction a killed reconciler left on ``lab``
    (:meth:`Engine.recover_at_start`: completed if its records were committed, else undone);
    what :func:`substrate.controllers.stop_all` runs (``--recover``) after it had to kill one.
    Returns ``(what was done, change ids still unfinished)``."""
    eng = Engine(lab, options or EngineOptions(holder=f"A3-R reconciler recovery (pid {os.getpid()})"))
    notes = eng.recover_at_start()
    return notes, [e.txn for e in eng.journal.unfinished()]


def main(argv: list[str] | None = None) -> int:
    """``python -m servers.a3_reconciled.reconciler LAB --owner PID [--interval S] [--mode revert|report]``;
    ``python -m servers.a3_reconciled.reconciler LAB --recover``: :func:`recover_killed` (exit status 1
    when a transaction is still unfinished)."""
    from substrate.lab import Lab
    from substrate.record import pid_alive, pid_start

    ap = argparse.ArgumentParser(prog="a3r-reconciler")
    ap.add_argument("lab")
    ap.add_argument("--owner", type=int)
    ap.add_argument("--recover", action="store_true", help="finish or undo what a killed reconciler left, then exit")
    ap.add_argument("--interval", type=float, default=DEFAULT_INTERVAL_S)
    ap.add_argument("--retry", type=float, default=DEFAULT_RETRY_S)
    ap.add_argument("--mode", choices=["revert", "report"], default="revert")
    ap.add_argument("--full-every", type=int, default=DEFAULT_FULL_EVERY)
    ap.add_argument("--devices", default=None)
    ap.add_argument("--option", action="append", default=[])
    a = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    lab = Lab.attach(a.lab)
    opts = EngineOptions(holder=f"A3-R reconciler{' recovery' if a.recover else ''} (pid {os.getpid()})")
    for kv in a.option:
        k, _, v = kv.partition("=")
        if hasattr(opts, k):
            setattr(opts, k, float(v))
    if a.recover:
        notes, left = recover_killed(lab, opts)
        print("; ".join(notes) or "nothing to recover")
        if left:
            print(f"still unfinished: change {', '.join(left)}", file=sys.stderr)
        return 1 if left else 0
    if a.owner is None:
        ap.error("--owner is required (unless --recover)")
    owner_start = pid_start(a.owner)
    rc = Reconciler(lab, mode=a.mode, devices=set(a.devices.split(",")) if a.devices else None, options=opts)
    stop_ev, wake_ev = threading.Event(), threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop_ev.set())
    signal.signal(signal.SIGINT, lambda *_: stop_ev.set())
    signal.signal(signal.SIGUSR1, lambda *_: wake_ev.set())
    lab_dir = Path(lab.dir)
    # one reconciler per lab, whoever starts it and however they race: the lock is held for the
    # process's life and released by the kernel when it dies (kill -9 included)
    state_dir(lab).mkdir(parents=True, exist_ok=True)
    single = open(state_dir(lab) / SINGLETON_LOCK, "w")  # noqa: SIM115 - held until exit
    try:
        fcntl.flock(single, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        other = controllers.info(lab_dir, CONTROLLER)
        log.warning("another A3-R reconciler runs on lab %s (pid %s): this one exits", lab.name, other and other.get("pid"))
        return ALREADY_RUNNING
    root = str(Path(__file__).resolve().parents[2])
    # a stop waits for the reconcile in progress (its bound from these options); a kill past it is
    # followed by the recovery of the transaction it cut (substrate.controllers.stop_all)
    controllers.register(lab_dir, CONTROLLER, a.owner, stop_timeout_s=reconcile_bound_s(opts),
                         recover=[sys.executable, "-m", "servers.a3_reconciled.reconciler", lab.name, "--recover",
                                  *[f"--option={kv}" for kv in a.option]],
                         recover_cwd=root, recover_timeout_s=opts.transaction_bound_s())  # fmt: skip

    def alive() -> bool:
        return (lab_dir / "lab.json").exists() and pid_alive(a.owner, owner_start)

    try:
        rc.run(a.interval, a.retry, stop_ev, wake_ev, alive, full_every=a.full_every)
    finally:
        with contextlib.suppress(OSError):
            data = json.loads((lab_dir / controllers.DIR / f"{CONTROLLER}.json").read_text())
            if data.get("pid") == os.getpid():
                (lab_dir / controllers.DIR / f"{CONTROLLER}.json").unlink()
    return 0


if __name__ == "__main__":
    sys.exit(main())
