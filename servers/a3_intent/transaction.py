"""A3-T change sets as cross-device transactions (draft section 5.1, Table 1, A3-T: "cross-device
workflow transaction, active validation, rollback"), journaled so that they survive the death of
the server running them.

The device-level machinery -- journal, before-state of exactly the items a change sets, undo,
recovery of a dead process's transaction, startup configuration -- is generic
(:mod:`substrate.journal`); this module is the A3-T transaction built on it, and knows service
classes only through the plan (:mod:`servers.a3_intent.planner`) and the records
(:mod:`servers.a3_intent.inventory`).

:meth:`Engine.apply`:

1. takes the lab's A3-T transaction lock (bounded wait: change sets from this or another server
   process are serialized; the lock dies with its holder) and finishes any transaction whose
   server died (:meth:`Engine.recover`);
2. reads the inventory and scans the devices, then plans: a rejected change set touches
   nothing; a change set that changes nothing (applied before) says so and touches nothing;
3. takes the configuration locks of every touched device (:mod:`substrate.locks`, the analogue
   of a NETCONF ``<lock>``, RFC 6241 section 7.5; bounded wait, then an error naming the holder);
4. reads, on each touched device, the items the change sets (routes, rules, addresses, links,
   nftables tables, sysctls, FRR lines: :func:`substrate.journal.snapshot`) and, meanwhile,
   checks the pre-existing invariants in the validation scope of the instances the change set
   does not change (the *pre-check*);
5. journals the transaction (phase ``applying``, fsync'd) -- nothing is touched before that;
6. applies each device's :class:`~substrate.scenario.apply.ConfigDelta` (one tagged script per
   device, in parallel); journal phase ``validating``;
7. active validation: the observer (:func:`substrate.scenario.observer.observe`, out of band)
   checks the invariants of the changed instances and of every instance sharing a device with
   the change (:func:`servers.a3_intent.planner.validation_scope`). It judges *regressions*, as
   change-management pre/post checks do: an invariant of a new or changed instance that fails,
   or a pre-existing invariant that held at the pre-check and fails now. Pre-existing
   invariants that were already failing are reported as warnings, not judged;
8. commits (the commit point: the records, ``<lab dir>/a3t/state.json``, written durably with the
   change in them), then writes the change's FRR lines into each touched router's startup
   configuration (as an operator saves the configuration), journal phase ``committed``;
9. or, on a regression, a refused device, an error or a cancellation before the commit point,
   undoes the change (:func:`substrate.journal.undo`): only the items the change set still holds
   go back to their value before it -- a fault or another operator's change made meanwhile is
   left alone; an item someone else changed after us is reported, not overwritten. Each judged
   failure is checked again after the undo, to tell damage this change set caused from a
   fault. Devices that did not answer keep their part pending: the journal entry stays
   ``rolling_back`` and the next apply (or server start) finishes it.

Cancellation: the MCP server sets a flag when the client cancels the call; the transaction
stops at its next step and is undone unless it already passed the commit point, in which case
it is committed. Either way the outcome is in the change record (``get_change``).

Recovery: a transaction whose server died is found in the journal by the next apply or server
start, under the transaction lock (so its server is not running it): its device scripts still
running are killed, then it is completed if its records were committed (startup configuration
written) and undone otherwise; its change record says which and when.

Timings are kept per stage (device time: snapshot, apply, rollback; validation time: observer,
pre-check included).
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, Field

from servers.a3_intent.catalog import ChangeSetRejected, Problem, natural_key
from servers.a3_intent.inventory import A3State, AppliedChange, Found, Records, scan, scanned_nodes
from servers.a3_intent.planner import Plan, drift_warnings, plan, validation_scope
from substrate import journal as jr
from substrate.devstate import DeviceState, capture
from substrate.errors import SubstrateError
from substrate.scenario.apply import ConfigDelta
from substrate.scenario.model import Invariant, Scenario
from substrate.scenario.observer import Evidence, Verdict, observe

if TYPE_CHECKING:
    from substrate.lab import Lab

log = logging.getLogger("anibench.servers.a3t")

#: Most failed checks reported in full (with evidence) per result.
MAX_FAILURES = 20
#: Most change lines reported per device.
MAX_LINES = 200
#: Check kinds whose state follows a change with a delay (IGP adjacency, routes the IGP installs):
#: re-checked until they hold or :attr:`EngineOptions.settle_s` has passed before a verdict.
CONVERGING_KINDS = frozenset({"isis_adjacency", "fib_has"})
#: Journal owner name of A3-T transactions.
JOURNAL_OWNER = "a3t"


# -- results ---------------------------------------------------------------------------------------


class OpOutcome(BaseModel):
    index: int = Field(description="Position in ops.")
    op: str
    service_class: str
    id: str = Field(description="Instance id (allocated when the create left it out).")
    effect: str = Field(description="created | modified | deleted | no change.")
    notes: list[str] = Field(default_factory=list)
    allocated: dict[str, Any] = Field(default_factory=dict, description="Resources allocated from the pools (SIDs, prefixes, ...).")


class DeviceChange(BaseModel):
    device: str
    changes: list[str] = Field(description="'- ' removed, '+ ' added, '~ ' replaced (nftables table, sysctl, FRR line).")
    applied: bool | None = Field(default=None, description="None in a plan; whether the device accepted the change in an apply.")
    error: str | None = None


class CheckFailure(BaseModel):
    id: str = Field(description="Invariant id.")
    service: str = Field(description="Service instance the invariant belongs to.")
    kind: str
    detail: str
    evidence: list[Evidence] = Field(default_factory=list)
    after_rollback: Literal["passes", "still fails", "not rechecked"] = Field(
        default="not rechecked",
        description="'passes': this change set broke it (rolled back); 'still fails': it fails without this change "
        "set too (a fault began meanwhile) -- not caused by this change set.",
    )


class ValidationReport(BaseModel):
    checked: int = Field(description="Invariants checked by the observer after applying.")
    passed: int
    failed: list[CheckFailure] = Field(default_factory=list, description="Regressions: the change set's own invariants that "
                                       "fail, and pre-existing invariants that held just before the apply and fail after it.")  # fmt: skip
    already_failing: list[CheckFailure] = Field(
        default_factory=list, description="Pre-existing invariants that failed at the pre-check already and still fail: "
        "a fault or a problem this change set did not cause; reported, not judged.")
    pre_checked: int = Field(default=0, description="Pre-existing invariants checked just before applying.")
    services: list[str] = Field(default_factory=list, description="Service instances whose invariants were checked.")


class RollbackReport(BaseModel):
    devices: list[str]
    complete: bool = Field(description="Every item this change set set is back to its value before it, on every device.")
    residual: dict[str, list[str]] = Field(default_factory=dict, description="Per device, what is not back, and what differs.")
    pending: list[str] = Field(default_factory=list, description="Devices that did not answer: their part is finished by the next "
                                                                 "apply_change_set (or server start).")  # fmt: skip


class Timings(BaseModel):
    scan_s: float = 0.0
    plan_s: float = 0.0
    lock_wait_s: float = 0.0
    snapshot_s: float = Field(default=0.0, description="Reading the items the change sets on each device.")
    precheck_s: float = Field(default=0.0, description="Pre-check of the invariants in scope (overlaps the snapshot).")
    journal_s: float = Field(default=0.0, description="Writing the journal (fsync'd per phase).")
    apply_s: float = 0.0
    validation_s: float = Field(default=0.0, description="Active validation after applying (and the recheck after a rollback).")
    rollback_s: float = 0.0
    total_s: float = 0.0

    @property
    def device_s(self) -> float:
        """Time spent on devices: snapshot, apply, rollback."""
        return self.snapshot_s + self.apply_s + self.rollback_s


class ValidationPlan(BaseModel):
    invariants: int = Field(description="Invariants active validation would check.")
    services: list[str] = Field(description="Service instances they belong to.")
    ids: list[str] = Field(description="Their ids (first 100).")


class PlanResult(BaseModel):
    """A dry run: what apply_change_set would do now."""

    no_change: bool = Field(description="Nothing would change (the change set is already in effect).")
    already_applied_as: str | None = Field(default=None, description="The change id that applied this exact change set, if any.")
    message: str
    ops: list[OpOutcome]
    devices: list[DeviceChange]
    changed_services: list[str]
    validation: ValidationPlan
    warnings: list[str] = Field(default_factory=list)
    inventory_version: int
    timings: Timings


Status = Literal["applied", "no_change", "rolled_back", "rollback_incomplete", "cancelled"]


class ChangeResult(BaseModel):
    """The outcome of apply_change_set (also what get_change returns)."""

    change_id: str
    status: Status = Field(
        description="applied: committed; no_change: nothing to do, no device touched; rolled_back: a device refused the "
        "change or validation found a regression, and everything it changed was undone; rollback_incomplete: as "
        "rolled_back but something could not be put back (see rollback.residual, rollback.pending); cancelled: the call "
        "was cancelled before the commit point and everything it changed was undone."
    )
    message: str
    transient: bool = Field(default=False, description="Nothing shows that this change set caused the failure (a device did "
                                                       "not answer, or what failed also fails without it): retrying later may succeed.")  # fmt: skip
    already_applied_as: str | None = None
    inventory_version: int = Field(description="Inventory version after this call.")
    ops: list[OpOutcome]
    devices: list[DeviceChange] = Field(default_factory=list)
    changed_services: list[str] = Field(default_factory=list)
    validation: ValidationReport | None = None
    rollback: RollbackReport | None = None
    recovery: str | None = Field(default=None, description="Set when this change was finished after the server that started "
                                                           "it died (or after its rollback had to wait): what was done and when.")  # fmt: skip
    warnings: list[str] = Field(default_factory=list)
    timings: Timings
    submitted_ops: list[dict[str, Any]] = Field(default_factory=list, description="The change set as received.")


class TransactionError(Exception):
    """A change set could not start (lock held, device unreachable, an earlier rollback still
    pending on its devices); nothing was changed."""


# -- engine ----------------------------------------------------------------------------------------


def _judged(pre_verdicts: list[Verdict], pre_ids: set[str]) -> Callable[[Verdict], bool]:
    """Whether a failing verdict of active validation is held against the change set (step 7
    of the module docstring): an invariant new to it, or one that held at the pre-check. One
    that already failed there is not -- except a device's whole-state check (``device/...``,
    whose :attr:`Verdict.diff` lists what is missing and unexpected), which is judged on what
    it lacks or has beyond what it already lacked or had before (issue 36: a SID another level
    bound on the PE no longer makes every later change set on that PE roll back, and a change
    set adding a stray rule there is still judged)."""
    from collections import Counter

    held = {v.id for v in pre_verdicts if v.ok}
    before = {v.id: v.diff for v in pre_verdicts if not v.ok}

    def items(diff: dict[str, list[str]]) -> Counter[tuple[str, str]]:
        return Counter((k, x) for k, xs in diff.items() for x in xs)  # a second backdoor of one shape counts

    def judged(v: Verdict) -> bool:
        if v.id not in pre_ids or v.id in held:
            return True
        if v.id.startswith("device/"):
            if v.diff is None or before.get(v.id) is None:
                return True  # what it lacked or held is unknown on one side: judged
            return bool(items(v.diff) - items(before[v.id]))
        return False

    return judged


@dataclass
class EngineOptions:
    lock_timeout_s: float = 5.0
    capture_timeout_s: float = 8.0
    device_timeout_s: float = 20.0
    holder: str = "A3-T server"
    #: Bound on the wait for control-plane checks (:data:`CONVERGING_KINDS`) that fail right
    #: after an apply to hold, before they count as regressions (seconds). An IS-IS adjacency a
    #: change brings back (a port's MTU restored) comes up within a few hellos (FRR isisd default
    #: hello-interval 3 s), not at once: judged at once, a correct repair was rolled back (issue 13).
    settle_s: float = 15.0

    def transaction_bound_s(self) -> float:
        """An upper bound on the duration of one transaction (:meth:`Engine.apply` or
        :meth:`Engine.repair`), in seconds, from these options: what a stop must wait for before
        a kill would cut a transaction half-way (the A3-R reconciler's stop, issue 13).

        Summed, each step at its own bound: the transaction lock, the recovery of a dead
        process's transaction first (its devices' locks, two reads and an undo script), the
        scan, the devices' configuration locks, the snapshot, the pre-check, the apply, active
        validation with its settling, then either the startup configuration or the rollback (two
        reads, the undo script) and its recheck. Locks: 3 x ``lock_timeout_s``; reads: 6 x
        ``capture_timeout_s``; device scripts: 3 x ``device_timeout_s``; observations (pre-check,
        validation, recheck): 3 x :data:`OBSERVE_BOUND_S`; plus ``settle_s``. Default options:
        15 + 48 + 60 + 90 + 15 = 228 s (a transaction takes a few seconds when nothing is stuck).
        """
        return (3 * self.lock_timeout_s + 6 * self.capture_timeout_s + 3 * self.device_timeout_s
                + 3 * OBSERVE_BOUND_S + self.settle_s)  # fmt: skip


#: Bound on one observation of the invariants in scope (seconds): the observer runs the checks
#: in parallel (:data:`substrate.scenario.observer.WORKERS` at a time), each bounded by its own
#: command timeouts (about 10 s: a ping's count x interval + wait + 5, a TCP probe's timeout + 5),
#: so a scope of a few hundred checks on a loaded machine ends well within this.
OBSERVE_BOUND_S = 30.0


class Engine:
    """Plans and applies change sets on one lab (thread-safe: every call reads state from disk)."""

    def _settled(self, verdicts: list[Verdict], invariants: list[Invariant]) -> list[Verdict]:
        """``verdicts`` with each failed check of a kind in :data:`CONVERGING_KINDS` checked again,
        every 0.5 s, until it holds or ``settle_s`` has passed (the last verdict stands)."""
        by_id = {i.id: i for i in invariants}
        out = {v.id: v for v in verdicts}
        deadline = time.monotonic() + self.opts.settle_s
        while (waiting := [by_id[v.id] for v in out.values() if not v.ok and v.kind in CONVERGING_KINDS and v.id in by_id]) \
                and time.monotonic() < deadline:
            time.sleep(0.5)
            out.update({v.id: v for v in observe(self.lab, waiting)})
        return [out[v.id] for v in verdicts]

    def __init__(self, lab: Lab, options: EngineOptions | None = None):
        self.lab = lab
        self.opts = options or EngineOptions()
        self.records = Records(lab)
        self.journal = jr.Journal(lab, JOURNAL_OWNER)
        #: what recovery at start-up did, told in the next apply's warnings
        self._notes: list[str] = []

    # -- reading -----------------------------------------------------------------------------------

    def inventory(self) -> tuple[Scenario, A3State]:
        return self.records.inventory()

    def scan(self, sc: Scenario, nodes: list[str] | None = None) -> tuple[dict[str, DeviceState], Found, list[str]]:
        """Kernel state of the scanned nodes, the resources found there, and nodes that could not be read."""
        names = nodes if nodes is not None else scanned_nodes(sc)

        def one(n: str) -> DeviceState | str:
            try:
                return capture(self.lab, n, frr=False, timeout_s=self.opts.capture_timeout_s)
            except SubstrateError as e:
                return str(e)

        got = dict(zip(names, self.lab.map(one, names), strict=True))
        states = {n: v for n, v in got.items() if isinstance(v, DeviceState)}
        errors = [f"{n}: {v}" for n, v in got.items() if isinstance(v, str)]
        return states, scan(sc, states), errors

    def frr_views(self, nodes: list[str]) -> dict[str, jr.FrrView]:
        """FRR configuration of the routers among ``nodes`` that answer (for drift checks)."""
        routers = set(self.lab.routers())

        def one(n: str) -> jr.FrrView | None:
            try:
                return jr.read_frr(self.lab, n, timeout_s=min(2.0, self.opts.capture_timeout_s))
            except SubstrateError:
                return None

        names = [n for n in nodes if n in routers]
        return {n: v for n, v in zip(names, self.lab.map(one, names), strict=True) if v is not None}

    def _plan(self, ops: list[Any], t: Timings, allowed: set[str] | None) -> tuple[Plan, A3State, list[str]]:
        t0 = time.monotonic()
        sc, st = self.inventory()
        states, found, errors = self.scan(sc)
        t.scan_s = time.monotonic() - t0
        t1 = time.monotonic()
        deleted = {d: ch.change_id for ch in st.applied for d in ch.deleted}
        p = plan(sc, ops, found, deleted_by=deleted)
        p.warnings += drift_warnings(sc, p.devices, states, self.frr_views(p.devices))
        t.plan_s = time.monotonic() - t1
        outside = [d for d in p.devices if allowed is not None and d not in allowed]
        # customer equipment (CE hosts) outside the episode is the customer's to configure (the
        # ticket says it is done): leave its part of the rendering out rather than refuse
        hosts = {n.name for n in sc.topology.hosts}
        customer = [d for d in outside if d in hosts]
        for d in customer:
            del p.deltas[d]
        outside = [d for d in outside if d not in customer]
        if outside:
            raise ChangeSetRejected([Problem(path="ops", message=f"the change would touch {', '.join(outside)}, outside this "
                                                                  f"episode's devices ({', '.join(sorted(allowed or (), key=natural_key))})")])  # fmt: skip
        warnings = [f"could not read {e}; resources in use there are unknown" for e in errors]
        return p, st, warnings + p.warnings

    @staticmethod
    def _devices(p: Plan) -> list[DeviceChange]:
        out = []
        for n in p.devices:
            lines = p.deltas[n].describe()
            if len(lines) > MAX_LINES:
                lines = lines[:MAX_LINES] + [f"... {len(lines) - MAX_LINES} more"]
            out.append(DeviceChange(device=n, changes=lines))
        return out

    @staticmethod
    def _ops(p: Plan) -> list[OpOutcome]:
        return [OpOutcome(**r.as_dict()) for r in p.ops]

    def _already(self, st: A3State, digest: str) -> str | None:
        return next((ch.change_id for ch in reversed(st.applied) if ch.digest == digest), None)

    def planned(self, ops: list[Any], allowed: set[str] | None = None) -> Plan:
        """The plan of ``ops`` against the live inventory (``Plan.new`` is the inventory it would
        make); nothing is changed.

        Raises:
            ChangeSetRejected: the change set is invalid (every problem with its field path).
        """
        return self._plan(ops, Timings(), allowed)[0]

    def plan(self, ops: list[Any], allowed: set[str] | None = None) -> PlanResult:
        """Dry run (no lock, nothing changed).

        Raises:
            ChangeSetRejected: the change set is invalid (every problem with its field path).
        """
        t0 = time.monotonic()
        t = Timings()
        p, st, warnings = self._plan(ops, t, allowed)
        t.total_s = time.monotonic() - t0
        no_change = not p.records_changed
        already = self._already(st, p.digest)
        if no_change:
            msg = "nothing would change: the inventory already has this" + (f" (applied as {already})" if already else "")
        else:
            msg = (f"would change {len(p.deltas)} device(s) and then check {len(p.invariants)} invariant(s) of "
                   f"{len({i.service for i in p.invariants})} service instance(s); apply_change_set with the same ops to do it")  # fmt: skip
        unfinished = [e for e in self.journal.unfinished() if {d.node for d in e.devices} & set(p.devices)]
        if unfinished:
            warnings = [f"change {e.txn} is not finished on {', '.join(d.node for d in e.devices)} (phase {e.phase}); "
                        "apply_change_set finishes it first" for e in unfinished] + warnings  # fmt: skip
        warnings = self.unreadable() + warnings
        return PlanResult(
            no_change=no_change, already_applied_as=already, message=msg, ops=self._ops(p), devices=self._devices(p),
            changed_services=p.changed_services,
            validation=ValidationPlan(invariants=len(p.invariants), services=sorted({i.service for i in p.invariants}, key=natural_key),
                                      ids=[i.id for i in p.invariants[:100]]),
            warnings=warnings, inventory_version=st.version, timings=t,
        )  # fmt: skip

    # -- recovery ----------------------------------------------------------------------------------

    def unreadable(self) -> list[str]:
        """What to say of journal entries that cannot be read (:meth:`substrate.journal.Journal.unreadable`)."""
        out = []
        for name, why in self.journal.unreadable().items():
            txn = name.removeprefix(f"{JOURNAL_OWNER}-").removesuffix(".json")
            out.append(f"the journal entry of change {txn} ({name}) cannot be read ({why}): that change may be half-done on "
                       "devices that cannot be named now, and cannot be finished or undone automatically; a lab reset puts "
                       "every device back to its baseline")  # fmt: skip
        return out

    def recover(self) -> list[str]:
        """Finish the transactions left unfinished by a server that died, or whose rollback had to
        wait for a device (call under the transaction lock: no live transaction is running). Each
        is completed when its records were committed, else undone; its change record is updated.
        Returns notes for the next result (what was finished, what is still pending)."""
        from substrate.locks import ConfigLockHeld

        notes = self.unreadable()
        for e in self.journal.unfinished():
            try:
                with self.lab.config_lock([d.node for d in e.devices], holder=self.opts.holder, timeout_s=self.opts.lock_timeout_s):
                    now = self.journal.get(e.txn)  # a lab reset may have closed it (under these locks) meanwhile
                    if now is not None and not now.finished:
                        notes.append(self._recover_one(now))
            except ConfigLockHeld as err:
                notes.append(f"change {e.txn} is not finished yet ({err})")
            except (SubstrateError, OSError) as err:
                log.error("change %s: recovery failed", e.txn, exc_info=True)
                notes.append(f"change {e.txn} could not be finished now ({err}); retried later")
        return notes

    def recover_at_start(self) -> list[str]:
        """:meth:`recover` if the transaction lock is free now (a server starting up); else nothing
        (a live transaction runs: the next apply recovers what its server may leave)."""
        from substrate.locks import ConfigLockHeld

        try:
            with self.records.transaction_lock(self.opts.holder, 0.0):
                self.records.drop_stale()
                self.journal.prune()
                notes = self.recover()
        except ConfigLockHeld as e:
            if self.journal.unfinished():
                log.warning("unfinished transactions left for the next apply_change_set: %s", e)
            return []
        self._notes += notes
        return notes

    def _recover_one(self, e: jr.Entry) -> str:
        dead = e.holder
        killed = jr.kill_scripts(self.lab, e)
        st = self.records.state()
        committed = any(a.change_id == e.txn for a in st.applied)
        when = time.strftime("%H:%M:%S")
        was = e.phase
        if committed:
            errors = jr.persist_frr(self.lab, e, timeout_s=self.opts.device_timeout_s)
            self.journal.mark(e, "committed", f"completed by recovery ({self.opts.holder})")
            note = (f"completed at {when} by {self.opts.holder}: {dead} had committed it (phase {was}) and stopped before "
                    "finishing" + (f"; its device commands still running were killed ({'; '.join(killed)})" if killed else "")
                    + "; the startup configuration was written" + (f" except: {'; '.join(errors)}" if errors else ""))  # fmt: skip
            self._finish_record(e, status="applied", recovery=note)
            return f"change {e.txn}: {note}"
        # why the rollback began, when a dead process had begun it (its reason, or the recovery that began it)
        began = next((m.note for m in reversed(e.history) if m.phase == "rolling_back" and m.note), "") if was == "rolling_back" else ""
        started_by = e.payload.get("rollback_started_by")
        if dead != self.opts.holder or was != "rolling_back":
            # this process takes the transaction over: should it die too, the next recovery names it
            e.holder = e.payload["rollback_started_by"] = self.opts.holder
            self.journal.mark(e, "rolling_back", f"recovery by {self.opts.holder}: {dead} stopped in phase {was}")
        t0 = time.monotonic()
        rep = jr.undo(self.lab, e, capture_timeout_s=self.opts.capture_timeout_s, device_timeout_s=self.opts.device_timeout_s)
        e.undo = rep
        rb = _rollback_report(e, rep)
        if rep.pending:
            self.journal.write(e)
            note = f"the rollback of change {e.txn} is still pending on {', '.join(rep.pending)} (did not answer)"
            self._finish_record(e, status="rollback_incomplete", recovery=note, rollback=rb, rollback_s=time.monotonic() - t0)
            return note
        self.journal.mark(e, "rolled_back", f"by {self.opts.holder}")
        if was == "rolling_back" and started_by == dead == self.opts.holder:  # this process, after a device that did not answer
            note = f"completed the rollback of change {e.txn} at {when}" + ("" if rb.complete else f"; still differs: {rb.residual}")
        elif was == "rolling_back" and started_by == dead:
            note = (f"completed the rollback of change {e.txn} at {when} by {self.opts.holder}: {dead} had begun it"
                    + (f" ({began})" if began else "") + " and stopped before finishing"
                    + (f"; its device scripts still running were killed ({'; '.join(killed)})" if killed else "")
                    + ("" if rb.complete else f"; still differs: {rb.residual}"))  # fmt: skip
        else:
            note = (f"rolled back at {when} by {self.opts.holder}: {dead} stopped in phase {was} before the commit point"
                    + (f"; its device scripts still running were killed ({'; '.join(killed)})" if killed else "")
                    + ("" if rb.complete else f"; still differs: {rb.residual}"))  # fmt: skip
        self._finish_record(e, status="rolled_back" if rb.complete else "rollback_incomplete", recovery=note, rollback=rb,
                            rollback_s=time.monotonic() - t0)  # fmt: skip
        return note if note.startswith("completed") else f"change {e.txn}: {note}"

    def _finish_record(self, e: jr.Entry, *, status: Status, recovery: str, rollback: RollbackReport | None = None,
                       rollback_s: float = 0.0) -> None:  # fmt: skip
        """Rewrite the change record of a recovered transaction (from its stored record, else from
        the draft kept in the journal)."""
        rec = self.records.change(e.txn) or dict(e.payload.get("draft", {}))
        rec.pop("epoch", None)
        rec.update(change_id=e.txn, status=status, recovery=recovery)
        if status == "applied":
            rec["message"] = f"applied: {len(e.devices)} device(s) changed and committed; {recovery}"
        else:
            rec["message"] = f"rolled back: {recovery}. Nothing was committed."
            rec["transient"] = True
        if rollback is not None:
            rec["rollback"] = rollback.model_dump(mode="json")
        timings = dict(rec.get("timings") or {})
        timings["rollback_s"] = timings.get("rollback_s", 0.0) + rollback_s
        rec["timings"] = timings
        res = ChangeResult.model_validate(rec)
        self.records.save_change(e.txn, res.model_dump(mode="json"))

    # -- applying ----------------------------------------------------------------------------------

    def apply(self, ops: list[Any], submitted: list[dict[str, Any]] | None = None, allowed: set[str] | None = None,
              cancel: threading.Event | None = None) -> ChangeResult:  # fmt: skip
        """Apply ``ops`` as one transaction (see module docstring). ``cancel``, when set by the
        caller, stops the transaction at its next step (undone unless past the commit point).

        Raises:
            ChangeSetRejected: the change set is invalid; nothing was changed.
            ConfigLockHeld: another change set or session held a lock past the bound; nothing was changed.
            TransactionError: a touched device could not be read, or an earlier rollback is still
                pending on it; nothing was changed.
        """
        return self._run(lambda t: self._plan(ops, t, allowed), submitted or [], cancel)

    def repair(self, deltas_of: Callable[[Scenario], dict[str, ConfigDelta]], *, allowed: set[str] | None = None,
               cancel: threading.Event | None = None) -> ChangeResult:  # fmt: skip
        """Drive devices back to the records' rendering as one transaction, the records unchanged
        (the drift repair of a reconciler, issue 13): ``deltas_of(inventory)`` gives, under the
        transaction lock, each drifted device's commands (:func:`servers.a3_intent.planner.repair_deltas`).
        Snapshot, pre-check, journal, active validation of every invariant on the touched devices,
        and undo on a regression are those of :meth:`apply`; status ``no_change`` when nothing drifted.

        Raises:
            ConfigLockHeld, TransactionError: as :meth:`apply`; nothing was changed.
        """

        def make(t: Timings) -> tuple[Plan, A3State, list[str]]:
            t0 = time.monotonic()
            sc, st = self.inventory()
            deltas = {n: d for n, d in deltas_of(sc).items() if not d.empty() and (allowed is None or n in allowed)}
            t.scan_s = time.monotonic() - t0
            scope = validation_scope(sc, sc, set(deltas), set())
            return Plan(old=sc, new=sc, ops=[], deltas=deltas, changed_services=[], invariants=scope, warnings=[],
                        digest="", repair=True), st, []  # fmt: skip

        return self._run(make, [], cancel)

    def _run(self, make: Callable[[Timings], tuple[Plan, A3State, list[str]]], submitted: list[dict[str, Any]],
             cancel: threading.Event | None) -> ChangeResult:  # fmt: skip
        """The transaction of a plan made by ``make`` under the transaction lock (see :meth:`apply`)."""
        cancel = cancel or threading.Event()
        t0 = time.monotonic()
        t = Timings()
        with self.records.transaction_lock(self.opts.holder, self.opts.lock_timeout_s):
            t.lock_wait_s = time.monotonic() - t0
            self.records.drop_stale()
            self.journal.prune()
            recovered, self._notes = list(dict.fromkeys(self._notes + self.recover())), []
            p, st, warnings = make(t)
            warnings = recovered + warnings
            already = self._already(st, p.digest) if not p.repair else None
            base = dict(ops=self._ops(p), changed_services=p.changed_services, warnings=warnings, submitted_ops=submitted)
            if not p.records_changed and not (p.repair and p.deltas):
                cid = self._next_id(st)
                msg = "no change: the inventory already has this" + (f" (applied as {already})" if already else "") + \
                      "; no device was touched"  # fmt: skip
                t.total_s = time.monotonic() - t0
                res = ChangeResult(change_id=cid, status="no_change", message=msg, already_applied_as=already,
                                   inventory_version=st.version, timings=t, **base)  # fmt: skip
                self._save(res)
                return res
            touched = p.devices
            devices = {d.device: d for d in self._devices(p)}
            if cancel.is_set():
                cid = self._next_id(st)
                t.total_s = time.monotonic() - t0
                res = ChangeResult(change_id=cid, status="cancelled", message="cancelled by the client before any device was "
                                   "touched; nothing was committed", inventory_version=st.version, timings=t, **base)  # fmt: skip
                self._save(res)
                return res
            if not touched:  # records only (e.g. a tenant renamed, a tenant without sites)
                cid = self._next_id(st)
                self.records.commit(st, p.new, AppliedChange(change_id=cid, digest=p.digest, version=st.version + 1,
                                                             deleted=p.deleted_ids))  # fmt: skip
                t.total_s = time.monotonic() - t0
                res = ChangeResult(change_id=cid, status="applied", message="applied: service records changed; no device needed a change",
                                   inventory_version=st.version, timings=t, **base)  # fmt: skip
                self._save(res)
                return res
            waiting = [e for e in self.journal.unfinished() if {d.node for d in e.devices} & set(touched)]
            if waiting:
                e = waiting[0]
                raise TransactionError(
                    f"the rollback of change {e.txn} is not finished on "
                    f"{', '.join((e.undo.pending if e.undo else None) or [d.node for d in e.devices])} (a device did not "
                    "answer); this change set touches the same devices, so nothing was changed. Retry later")  # fmt: skip
            t2 = time.monotonic()
            with self.lab.config_lock(touched, holder=self.opts.holder, timeout_s=self.opts.lock_timeout_s):
                t.lock_wait_s += time.monotonic() - t2
                if self.records.epoch() != st.epoch:  # a lab reset ran since the records were read (it takes these locks)
                    raise TransactionError("the lab was reset to its baseline while this change set was being planned; nothing "
                                           "was changed. Plan and apply it again")  # fmt: skip
                cid = self._next_id(st)
                res = self._transact(cid, p, st, t, devices, base, already, cancel)
            t.total_s = time.monotonic() - t0
            res.timings = t
            self._save(res)
            return res

    def _next_id(self, st: A3State) -> str:
        """Reserve the next change id.

        Raises:
            TransactionError: the records cannot be written (a full disk); nothing was changed.
        """
        try:
            return self.records.next_change_id(st)
        except OSError as e:
            raise TransactionError(f"cannot write A3-T's records ({e}); nothing was changed") from None

    def _save(self, res: ChangeResult) -> None:
        """Store ``res`` as its change record; a record that cannot be written (a full disk) is
        said in the result itself, which is the caller's only account then."""
        try:
            self.records.save_change(res.change_id, res.model_dump(mode="json"))
        except OSError as e:
            log.error("change %s: record not saved: %s", res.change_id, e)
            res.warnings.append(f"this result could not be stored ({e}): get_change({res.change_id!r}) will not find it")

    def _snapshot(self, p: Plan, t: Timings) -> tuple[list[jr.DeviceRecord], list[Verdict], list[Invariant]]:
        """The device records (items with their values now) and, meanwhile, the pre-check: the
        invariants in scope that exist before the change, unchanged, of service instances the
        change set does not change, observed now. (A changed instance's checks are the change's
        own: they must pass after it, whatever they said before -- a moved site's reachability
        fails before the move when the customer already re-cabled its CE.)

        Raises:
            TransactionError: a device did not answer (nothing was changed).
        """
        old = {i.id: i for i in p.old.invariants}
        changed = set(p.changed_services)
        pre = [i for i in p.invariants if old.get(i.id) == i and i.service not in changed]
        # a device's whole-state checks (``device/<node>/...``: exactly the rules, SIDs, tables
        # rendered there) are re-rendered by the change set; their old form is pre-checked too,
        # so that drift already on the device (another level's SID) is told from what the
        # change set adds (see _judged)
        seen = {i.id for i in pre}
        pre += [old[i.id] for i in p.invariants if i.id.startswith("device/") and i.id in old and i.id not in seen]
        t0 = time.monotonic()

        def snap(n: str) -> jr.DeviceRecord | str:
            try:
                return jr.snapshot(self.lab, n, p.deltas[n], capture_timeout_s=self.opts.capture_timeout_s)
            except (SubstrateError, ValueError) as e:
                return f"{n}: {e}"

        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="a3t-precheck") as pool:
            fut = pool.submit(observe, self.lab, pre)
            got = self.lab.map(snap, p.devices)
            t.snapshot_s = time.monotonic() - t0
            try:
                verdicts = fut.result()
                t.precheck_s = time.monotonic() - t0
            except Exception as e:  # noqa: BLE001 - nothing was touched yet: refuse, say why
                log.error("pre-check failed", exc_info=True)
                raise TransactionError(f"cannot check the invariants before changing the devices ({type(e).__name__}: {e}); "
                                       "nothing was changed. Retry later") from None
        bad = [s for s in got if isinstance(s, str)]
        if bad:
            raise TransactionError(f"cannot read the devices before changing them ({'; '.join(bad)}); nothing was changed. "
                                   "Retry later (a frozen or unreachable device?)")  # fmt: skip
        return [g for g in got if isinstance(g, jr.DeviceRecord)], verdicts, pre

    def _transact(self, cid: str, p: Plan, st: A3State, t: Timings, devices: dict[str, DeviceChange],
                  base: dict[str, Any], already: str | None, cancel: threading.Event) -> ChangeResult:  # fmt: skip
        touched = p.devices
        recs, pre_verdicts, pre = self._snapshot(p, t)
        draft = ChangeResult(change_id=cid, status="rolled_back", message="", already_applied_as=already,
                             inventory_version=st.version, devices=[devices[n] for n in touched], timings=t, **base)  # fmt: skip
        if cancel.is_set():
            draft.status, draft.message = "cancelled", "cancelled by the client before any device was touched; nothing was committed"
            return draft
        try:
            entry = _timed(t, self.journal.begin, cid, recs, holder=self.opts.holder, payload={"draft": draft.model_dump(mode="json")})
        except jr.JournalError as e:
            raise TransactionError(f"{e}; nothing was changed (no device is touched before its transaction is journaled)") from None
        # apply
        t4 = time.monotonic()
        errors = dict(zip(touched, self.lab.map(lambda n: jr.run_script(self.lab, entry, n, entry.device(n).script,
                                                                         self.opts.device_timeout_s), touched), strict=True))  # fmt: skip
        t.apply_s = time.monotonic() - t4
        for n, e in errors.items():
            devices[n].applied = e is None
            devices[n].error = e
        report: ValidationReport | None = None
        failed: list[Verdict] = []
        crash: str | None = None
        why_cancel = False
        if not any(errors.values()):
            try:
                _timed(t, self.journal.mark, entry, "validating")
                t5 = time.monotonic()
                verdicts = self._settled(observe(self.lab, p.invariants), p.invariants)
                t.validation_s += time.monotonic() - t5
                pre_ids = {i.id for i in pre}
                judged = _judged(pre_verdicts, pre_ids)
                failed = [v for v in verdicts if not v.ok and judged(v)]
                already_failing = [v for v in verdicts if not v.ok and not judged(v)]
                report = ValidationReport(
                    checked=len(verdicts), passed=sum(v.ok for v in verdicts), failed=[_failure(v) for v in failed[:MAX_FAILURES]],
                    already_failing=[_failure(v) for v in already_failing[:MAX_FAILURES]], pre_checked=len(pre),
                    services=sorted({i.service for i in p.invariants}, key=natural_key),
                )  # fmt: skip
                if already_failing:
                    base["warnings"] = [*base["warnings"],
                                        f"{len(already_failing)} invariant(s) in scope failed before this change set already and still "
                                        f"fail (not judged: a fault or a pre-existing problem), e.g. {already_failing[0].id}: "
                                        f"{already_failing[0].detail}"]  # fmt: skip
                if not failed and not cancel.is_set():
                    # the commit point: the records, durably (a repair changes no record)
                    if not p.repair:
                        self.records.commit(st, p.new, AppliedChange(change_id=cid, digest=p.digest, version=st.version + 1,
                                                                     deleted=p.deleted_ids))  # fmt: skip
                    return self._committed(entry, cid, p, st, t, devices, base, already, report, cancel)
                why_cancel = not failed
            except Exception as e:  # noqa: BLE001 - devices were changed: whatever failed, they are rolled back
                if cid in {a.change_id for a in self.records.state().applied}:
                    raise  # committed: the journal entry stays unfinished and recovery completes it
                log.error("change %s: validation or commit failed; rolling back", cid, exc_info=True)
                crash = f"{type(e).__name__}: {e}"
                failed = []
        # roll back
        reason = ("cancelled by the client" if why_cancel else "a device refused the change" if any(errors.values())
                  else f"error: {crash}" if crash else "validation found regressions")  # fmt: skip
        entry.payload["rollback_started_by"] = self.opts.holder
        # the undo does not depend on the journal: one that cannot be written (a full disk) still
        # holds the entry's last phase, which recovery also undoes
        unjournaled = _journaled(t, self.journal.mark, entry, "rolling_back", reason)
        t6 = time.monotonic()
        rep = jr.undo(self.lab, entry, capture_timeout_s=self.opts.capture_timeout_s, device_timeout_s=self.opts.device_timeout_s)
        entry.undo = rep
        if rep.pending:
            unjournaled += _journaled(t, self.journal.write, entry)  # stays rolling_back: the next apply or server start finishes it
        else:
            unjournaled += _journaled(t, self.journal.mark, entry, "rolled_back")
        if unjournaled:
            base["warnings"] = [*base["warnings"], _unjournaled(unjournaled[0], committed=False)]
        t.rollback_s = time.monotonic() - t6
        rb = _rollback_report(entry, rep)
        if failed and report is not None:
            t7 = time.monotonic()
            again = {v.id: v.ok for v in observe(self.lab, [i for i in p.invariants if i.id in {f.id for f in report.failed}])}
            t.validation_s += time.monotonic() - t7
            for f in report.failed:
                f.after_rollback = "passes" if again.get(f.id) else "still fails"
        status: Status = "cancelled" if why_cancel else ("rolled_back" if rb.complete else "rollback_incomplete")
        transient = False
        if any(errors.values()):
            why = "; ".join(f"{n} refused the change: {e}" for n, e in errors.items() if e)
            transient = all(any(m in e for m in ("no answer within", "not running", "locked")) for e in errors.values() if e)
        elif why_cancel:
            why = "the client cancelled the call before the commit point"
        elif crash is not None or report is None or not report.failed:
            why = f"validation or commit could not complete ({crash})"
        else:
            first = report.failed[0]
            pre_ids = {i.id for i in pre}
            caused = [f for f in report.failed if f.after_rollback == "passes"]
            fault = [f for f in report.failed if f.id in pre_ids and f.after_rollback == "still fails"]
            own = [f for f in report.failed if f.id not in pre_ids]
            # evidence of a fault: checks that held before the change fail with and without it
            transient = not caused and bool(fault or not own)
            why = f"{len(failed)} regression(s) after applying, e.g. {first.id} ({first.service}): {first.detail}"
            if caused:
                why += f"; {len(caused)} of them pass again after the rollback (this change set broke them)"
            elif fault:
                why += (f"; {len(fault)} check(s) that held just before still fail without this change set (e.g. {fault[0].id}): "
                        "a fault began meanwhile, not caused by this change set; retry later")  # fmt: skip
            else:
                why += "; the change set's own services failed their checks (see the evidence)"
        back = ("everything this change set changed was undone" if rb.complete else
                f"some state could not be put back: {rb.residual}" + (f" (pending on {', '.join(rb.pending)}: finished by the next "
                                                                       "apply_change_set)" if rb.pending else ""))  # fmt: skip
        verb = "cancelled" if why_cancel else "rolled back"
        return ChangeResult(change_id=cid, status=status, message=f"{verb}: {why}; {back}. Nothing was committed.", transient=transient,
                            already_applied_as=already, inventory_version=st.version, devices=[devices[n] for n in touched],
                            validation=report, rollback=rb, timings=t, **base)  # fmt: skip

    def _committed(self, entry: jr.Entry, cid: str, p: Plan, st: A3State, t: Timings, devices: dict[str, DeviceChange],
                   base: dict[str, Any], already: str | None, report: ValidationReport, cancel: threading.Event) -> ChangeResult:  # fmt: skip
        """After the commit point: the startup configuration, then the journal."""
        t0 = time.monotonic()
        errors = jr.persist_frr(self.lab, entry, timeout_s=self.opts.device_timeout_s)
        t.apply_s += time.monotonic() - t0
        warnings = list(base["warnings"])
        if errors:
            warnings.append(f"committed, but the startup configuration could not be written on: {'; '.join(errors)} "
                            "(the change is in the running configuration; a daemon restart there would lose it)")  # fmt: skip
        unjournaled = _journaled(t, self.journal.mark, entry, "committed")
        if unjournaled:
            warnings.append(_unjournaled(unjournaled[0], committed=True))
        msg = (f"applied: {len(p.devices)} device(s) changed; {report.checked} invariant(s) of {len(report.services)} service "
               "instance(s) checked, no regression")  # fmt: skip
        if report.already_failing:
            msg += f" ({len(report.already_failing)} already failing before it: see validation.already_failing)"
        if cancel.is_set():
            msg += "; the client cancelled the call after the commit point: the change stays committed"
        return ChangeResult(change_id=cid, status="applied", message=msg, already_applied_as=already,
                            inventory_version=st.version, devices=[devices[n] for n in p.devices], validation=report,
                            timings=t, **{**base, "warnings": warnings})  # fmt: skip


def _timed(t: Timings, fn: Any, *a: Any, **kw: Any) -> Any:
    """``fn(*a, **kw)``, its time added to ``t.journal_s``."""
    t0 = time.monotonic()
    try:
        return fn(*a, **kw)
    finally:
        t.journal_s += time.monotonic() - t0


def _journaled(t: Timings, fn: Any, *a: Any) -> list[str]:
    """``fn(*a)`` (a journal write, timed): ``[]``, or ``[why]`` when the journal could not be
    written -- for the steps that must go on regardless (undo, the steps after the commit point)."""
    try:
        _timed(t, fn, *a)
    except jr.JournalError as e:
        log.error("%s", e)
        return [str(e)]
    return []


def _unjournaled(why: str, *, committed: bool) -> str:
    return (f"{why}: the journal still shows an earlier phase of this change, so the next A3-T server start (or apply) "
            + ("completes it again (the records say committed; nothing more changes)" if committed else
               "undoes it again (nothing more changes where it is undone)"))  # fmt: skip


def _failure(v: Verdict) -> CheckFailure:
    return CheckFailure(id=v.id, service=v.service, kind=v.kind, detail=v.detail, evidence=v.evidence)


def _rollback_report(e: jr.Entry, rep: jr.UndoReport) -> RollbackReport:
    return RollbackReport(devices=[d.node for d in e.devices], complete=rep.complete, residual=rep.residual(), pending=rep.pending)


__all__ = ["ChangeResult", "ChangeSetRejected", "Engine", "EngineOptions", "PlanResult", "TransactionError"]
