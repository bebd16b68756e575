"""A3-T change sets as cross-device transactions (draft section 5.1, Table 1, A3-T: "cross-device
workflow transaction, active validation, rollback").

:meth:`Engine.apply`:

1. takes the lab's A3-T transaction lock (bounded wait: concurrent change sets, from this or
   another server process, are serialized), reads the inventory (records, from disk) and scans
   the devices (:mod:`servers.a3_intent.inventory`);
2. plans (:func:`servers.a3_intent.planner.plan`): a rejected change set touches nothing; a
   change set that changes nothing (applied before) says so and touches nothing;
3. takes the configuration locks of every touched device (:mod:`substrate.locks`, the analogue
   of a NETCONF ``<lock>``, RFC 6241 section 7.5; bounded wait, then an error naming the holder --
   the *held lock* fault);
4. snapshots each touched device (:func:`substrate.devstate.capture`; with FRR's running
   configuration where the change has FRR lines);
5. applies each device's :class:`~substrate.scenario.apply.ConfigDelta` (one script per device,
   in parallel);
6. active validation: the observer (:func:`substrate.scenario.observer.observe`, out of band)
   checks the invariants of the changed instances and of every instance that shares a device
   with the change (:func:`servers.a3_intent.planner.validation_scope`);
7. on any failure rolls every touched device back: the FRR stanzas the change touched are put
   back with the inverse delta (FRR CLI negation), the kernel state is restored exactly to the
   snapshot (:func:`substrate.devstate.restore`), and the result is verified by capturing again;
   each failed invariant is checked once more after the rollback, to tell damage the change
   caused from a problem that was already there (or a fault);
8. on success commits the new records (``<lab dir>/a3t/state.json``).

FRR state the change never touched (e.g. a crashed daemon's configuration) is left alone by the
rollback: A3-T puts back what it changed, and reports anything it could not.

Timings are kept per stage (device time: snapshot, apply, rollback; validation time: observer).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, Field

from servers.a3_intent.catalog import ChangeSetRejected, Problem, natural_key
from servers.a3_intent.inventory import A3State, AppliedChange, Found, PendingRepair, Records, scan, scanned_nodes
from servers.a3_intent.planner import Plan, plan
from substrate.devstate import DeviceState, capture, restore
from substrate.errors import SubstrateError
from substrate.scenario.apply import config_delta
from substrate.scenario.model import NodeConfig, Scenario
from substrate.scenario.observer import Evidence, Verdict, observe

if TYPE_CHECKING:
    from substrate.lab import Lab

log = logging.getLogger("anibench.servers.a3t")

#: Most failed checks reported in full (with evidence) per result.
MAX_FAILURES = 20
#: Most change lines reported per device.
MAX_LINES = 200


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
        description="'passes': this change set broke it (rolled back); 'still fails': it was failing "
        "before or a fault is active -- not caused by this change set.",
    )


class ValidationReport(BaseModel):
    checked: int = Field(description="Invariants checked by the observer.")
    passed: int
    failed: list[CheckFailure] = Field(default_factory=list)
    services: list[str] = Field(default_factory=list, description="Service instances whose invariants were checked.")


class RollbackReport(BaseModel):
    devices: list[str]
    complete: bool = Field(description="Every touched device is back to its snapshot.")
    residual: dict[str, list[str]] = Field(default_factory=dict, description="Per device, what could not be put back.")
    pending: list[str] = Field(default_factory=list, description="Devices whose FRR part is retried by the next apply_change_set.")


class Timings(BaseModel):
    scan_s: float = 0.0
    plan_s: float = 0.0
    lock_wait_s: float = 0.0
    snapshot_s: float = 0.0
    apply_s: float = 0.0
    validation_s: float = 0.0
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


class ChangeResult(BaseModel):
    """The outcome of apply_change_set (also what get_change returns)."""

    change_id: str
    status: Literal["applied", "no_change", "rolled_back", "rollback_incomplete"] = Field(
        description="applied: committed; no_change: nothing to do, no device touched; rolled_back: a device refused "
        "the change or validation failed, every device is back to its prior state; rollback_incomplete: as rolled_back "
        "but some state could not be put back (see rollback.residual)."
    )
    message: str
    already_applied_as: str | None = None
    inventory_version: int = Field(description="Inventory version after this call.")
    ops: list[OpOutcome]
    devices: list[DeviceChange] = Field(default_factory=list)
    changed_services: list[str] = Field(default_factory=list)
    validation: ValidationReport | None = None
    rollback: RollbackReport | None = None
    warnings: list[str] = Field(default_factory=list)
    timings: Timings
    submitted_ops: list[dict[str, Any]] = Field(default_factory=list, description="The change set as received.")


class TransactionError(Exception):
    """A change set could not start (lock held, device unreachable); nothing was changed."""


# -- engine ----------------------------------------------------------------------------------------


@dataclass
class EngineOptions:
    lock_timeout_s: float = 5.0
    capture_timeout_s: float = 8.0
    device_timeout_s: float = 20.0
    holder: str = "A3-T server"


def _stanzas(text: str) -> dict[str, list[str]]:
    """FRR configuration text (running config, or blocks) as {stanza head: [indented lines]}."""
    out: dict[str, list[str]] = {}
    head: str | None = None
    for line in text.splitlines():
        if not line.strip() or line.strip() in ("!", "end"):
            continue
        if line.strip() == "exit":
            head = None
        elif line.startswith(" ") and head is not None:
            out[head].append(line.strip())
        else:
            head = line.strip()
            out.setdefault(head, [])
    return out


def _touched_heads(before: NodeConfig | None, after: NodeConfig | None) -> set[str]:
    b = _stanzas("\n".join((before or NodeConfig()).frr))
    a = _stanzas("\n".join((after or NodeConfig()).frr))
    return {h for h in set(a) | set(b) if sorted(a.get(h, [])) != sorted(b.get(h, []))}


class Engine:
    """Plans and applies change sets on one lab (thread-safe: every call reads state from disk)."""

    def __init__(self, lab: Lab, options: EngineOptions | None = None):
        self.lab = lab
        self.opts = options or EngineOptions()
        self.records = Records(lab)

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

    def _plan(self, ops: list[Any], t: Timings, allowed: set[str] | None) -> tuple[Plan, A3State, list[str]]:
        t0 = time.monotonic()
        sc, st = self.inventory()
        states, found, errors = self.scan(sc)
        t.scan_s = time.monotonic() - t0
        t1 = time.monotonic()
        deleted = {d: ch.change_id for ch in st.applied for d in ch.deleted}
        p = plan(sc, ops, found, deleted_by=deleted, states=states)
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
        return PlanResult(
            no_change=no_change, already_applied_as=already, message=msg, ops=self._ops(p), devices=self._devices(p),
            changed_services=p.changed_services,
            validation=ValidationPlan(invariants=len(p.invariants), services=sorted({i.service for i in p.invariants}, key=natural_key),
                                      ids=[i.id for i in p.invariants[:100]]),
            warnings=warnings, inventory_version=st.version, timings=t,
        )  # fmt: skip

    # -- applying ----------------------------------------------------------------------------------

    def apply(self, ops: list[Any], submitted: list[dict[str, Any]] | None = None, allowed: set[str] | None = None) -> ChangeResult:
        """Apply ``ops`` as one transaction (see module docstring).

        Raises:
            ChangeSetRejected: the change set is invalid; nothing was changed.
            ConfigLockHeld: another change set or session held a lock past the bound; nothing was changed.
            TransactionError: a touched device could not be snapshotted; nothing was changed.
        """
        t0 = time.monotonic()
        t = Timings()
        with self.records.transaction_lock(self.opts.holder, self.opts.lock_timeout_s):
            t.lock_wait_s = time.monotonic() - t0
            self.records.drop_stale()
            repaired = self.repair_pending(self.records.state())
            p, st, warnings = self._plan(ops, t, allowed)
            warnings = repaired + warnings
            already = self._already(st, p.digest)
            base = dict(ops=self._ops(p), changed_services=p.changed_services, warnings=warnings, submitted_ops=submitted or [])
            if not p.records_changed:
                cid = self.records.next_change_id(st)
                msg = "no change: the inventory already has this" + (f" (applied as {already})" if already else "") + \
                      "; no device was touched"  # fmt: skip
                t.total_s = time.monotonic() - t0
                res = ChangeResult(change_id=cid, status="no_change", message=msg, already_applied_as=already,
                                   inventory_version=st.version, timings=t, **base)  # fmt: skip
                self.records.save_change(cid, res.model_dump(mode="json"))
                return res
            touched = p.devices
            devices = {d.device: d for d in self._devices(p)}
            if not touched:  # records only (e.g. a tenant renamed, a tenant without sites)
                cid = self.records.next_change_id(st)
                self.records.commit(st, p.new, AppliedChange(change_id=cid, digest=p.digest, version=st.version + 1,
                                                             deleted=[r.id for r in p.ops if r.effect == "deleted"]))  # fmt: skip
                t.total_s = time.monotonic() - t0
                res = ChangeResult(change_id=cid, status="applied", message="applied: service records changed; no device needed a change",
                                   inventory_version=st.version, timings=t, **base)  # fmt: skip
                self.records.save_change(cid, res.model_dump(mode="json"))
                return res
            t2 = time.monotonic()
            with self.lab.config_lock(touched, holder=self.opts.holder, timeout_s=self.opts.lock_timeout_s):
                t.lock_wait_s += time.monotonic() - t2
                cid = self.records.next_change_id(st)
                res = self._transact(cid, p, st, t, devices, base, already)
            t.total_s = time.monotonic() - t0
            res.timings = t
            self.records.save_change(cid, res.model_dump(mode="json"))
            return res

    def _transact(self, cid: str, p: Plan, st: A3State, t: Timings, devices: dict[str, DeviceChange],
                  base: dict[str, Any], already: str | None) -> ChangeResult:  # fmt: skip
        touched = p.devices
        frr_nodes = {n for n in touched if p.deltas[n].frr}
        # 4. snapshot
        t3 = time.monotonic()

        def snap(n: str) -> DeviceState | str:
            try:
                return capture(self.lab, n, frr=n in frr_nodes, timeout_s=self.opts.capture_timeout_s)
            except SubstrateError as e:
                return str(e)

        snaps_l = self.lab.map(snap, touched)
        t.snapshot_s = time.monotonic() - t3
        bad = [s for s in snaps_l if isinstance(s, str)]
        if bad:
            raise TransactionError(f"cannot snapshot the devices before changing them ({'; '.join(bad)}); nothing was changed. "
                                   "Retry later (a frozen or unreachable device?)")  # fmt: skip
        snaps: dict[str, DeviceState] = dict(zip(touched, snaps_l, strict=True))  # type: ignore[arg-type]
        # 5. apply
        t4 = time.monotonic()

        def push(n: str) -> str | None:
            try:
                r = self.lab.sh(n, p.deltas[n].script(), timeout_s=self.opts.device_timeout_s)
            except SubstrateError as e:
                return str(e)
            if r.timed_out:
                return f"no answer within {self.opts.device_timeout_s:g} s (frozen device or daemon?)"
            if not r.ok:
                return (r.stderr or r.stdout).strip()[-600:] or f"exit status {r.returncode}"
            return None

        errors = dict(zip(touched, self.lab.map(push, touched), strict=True))
        t.apply_s = time.monotonic() - t4
        for n, e in errors.items():
            devices[n].applied = e is None
            devices[n].error = e
        report: ValidationReport | None = None
        failed: list[Verdict] = []
        crash: str | None = None
        if not any(errors.values()):
            try:
                # 6. active validation
                t5 = time.monotonic()
                verdicts = observe(self.lab, p.invariants)
                t.validation_s = time.monotonic() - t5
                failed = [v for v in verdicts if not v.ok]
                report = ValidationReport(
                    checked=len(verdicts), passed=len(verdicts) - len(failed),
                    failed=[CheckFailure(id=v.id, service=v.service, kind=v.kind, detail=v.detail, evidence=v.evidence)
                            for v in failed[:MAX_FAILURES]],
                    services=sorted({i.service for i in p.invariants}, key=natural_key),
                )  # fmt: skip
                if not failed:
                    # 8. commit
                    self.records.commit(st, p.new, AppliedChange(change_id=cid, digest=p.digest, version=st.version + 1,
                                                                 deleted=[r.id for r in p.ops if r.effect == "deleted"]))  # fmt: skip
                    msg = (f"applied: {len(touched)} device(s) changed; {report.checked} invariant(s) of "
                           f"{len(report.services)} service instance(s) pass")  # fmt: skip
                    return ChangeResult(change_id=cid, status="applied", message=msg, already_applied_as=already,
                                        inventory_version=st.version, devices=[devices[n] for n in touched], validation=report,
                                        timings=t, **base)  # fmt: skip
            except Exception as e:  # noqa: BLE001 - devices were changed: whatever failed, they are rolled back
                log.error("change %s: validation or commit failed; rolling back", cid, exc_info=True)
                crash = f"{type(e).__name__}: {e}"
                failed = []
        # 7. rollback
        t6 = time.monotonic()
        pending: list[PendingRepair] = []
        rb = self.rollback(p, snaps, cid, pending)
        if pending:
            st.pending += pending
            self.records.save_state(st)
        t.rollback_s = time.monotonic() - t6
        if failed and report is not None:
            t7 = time.monotonic()
            again = {v.id: v.ok for v in observe(self.lab, [i for i in p.invariants if i.id in {f.id for f in report.failed}])}
            t.validation_s += time.monotonic() - t7
            for f in report.failed:
                f.after_rollback = "passes" if again.get(f.id) else "still fails"
        status = "rolled_back" if rb.complete else "rollback_incomplete"
        if any(errors.values()):
            why = "; ".join(f"{n} refused the change: {e}" for n, e in errors.items() if e)
        elif crash is not None or report is None or not report.failed:
            why = f"validation or commit could not complete ({crash})"
        else:
            assert report is not None
            first = report.failed[0]
            caused = [f for f in report.failed if f.after_rollback == "passes"]
            why = (f"{len(failed)} invariant(s) failed after applying, e.g. {first.id} ({first.service}): {first.detail}"
                   + (f"; {len(caused)} of them pass again after the rollback (this change set broke them)" if caused else
                      "; they still fail after the rollback (not caused by this change set: a fault or a pre-existing problem)"))  # fmt: skip
        back = "every touched device is back to its prior state" if rb.complete else \
            f"some state could not be put back: {rb.residual}"  # fmt: skip
        return ChangeResult(change_id=cid, status=status, message=f"rolled back: {why}; {back}. Nothing was committed.",
                            already_applied_as=already, inventory_version=st.version, devices=[devices[n] for n in touched],
                            validation=report, rollback=rb, timings=t, **base)  # fmt: skip

    def _vtysh(self, node: str, lines: list[str], timeout_s: float | None = None) -> bool:
        """Run FRR configuration lines in one vtysh session; False when FRR did not answer."""
        r = self.lab.exec(node, ["vtysh"], input="\n".join(["configure terminal", *lines, "end"]) + "\n",
                          timeout_s=timeout_s or self.opts.device_timeout_s)  # fmt: skip
        return not r.timed_out

    def rollback(self, p: Plan, snaps: dict[str, DeviceState], cid: str = "", pending: list[PendingRepair] | None = None) -> RollbackReport:
        """Put every touched device back to its snapshot (see module docstring, step 7). FRR lines
        that could not run (FRR frozen) are appended to ``pending``."""
        pending = pending if pending is not None else []

        def one(n: str) -> list[str]:
            residual: list[str] = []
            snap = snaps[n]
            heads = _touched_heads(p.old.node_config.get(n), p.new.node_config.get(n))
            frr_ok = True
            if p.deltas[n].frr:
                inverse = config_delta(n, p.new.node_config.get(n), p.old.node_config.get(n)).frr
                try:
                    answered = not inverse or self._vtysh(n, inverse)
                except SubstrateError as e:
                    answered = False
                    residual.append(f"FRR: {e}")
                if not answered:
                    frr_ok = False
                    was = _stanzas(snap.frr_config or "")
                    pending.append(PendingRepair(change_id=cid, node=n, lines=inverse, expected={h: was.get(h, []) for h in heads}))
                    residual.append(f"FRR did not answer within {self.opts.device_timeout_s:g} s (frozen node?): its part of the "
                                    "rollback is retried by the next apply_change_set")  # fmt: skip
            target = snap.model_copy(update={"frr_config": None, "frr_daemons": None})
            try:
                cur = capture(self.lab, n, frr=False, timeout_s=self.opts.capture_timeout_s)
                rep = restore(self.lab, target, current=cur, verify=False)
                residual += rep.residual
                after = capture(self.lab, n, frr=bool(heads) and frr_ok, timeout_s=self.opts.capture_timeout_s)
            except Exception as e:  # noqa: BLE001 - one device's failure must not stop the others' rollback
                return [*residual, f"cannot restore or check the kernel state: {type(e).__name__}: {e}"]
            residual += after.model_copy(update={"frr_config": None, "frr_daemons": None}).diff(target)
            if heads and frr_ok and snap.frr_config is not None:
                now = _stanzas(after.frr_config or "")
                was = _stanzas(snap.frr_config)
                for h in sorted(heads):
                    if sorted(now.get(h, [])) != sorted(was.get(h, [])):
                        residual.append(f"FRR '{h}': {now.get(h, [])} (was {was.get(h, [])})")
            return residual

        results = dict(zip(p.devices, self.lab.map(one, p.devices), strict=True))
        residual = {n: r for n, r in results.items() if r}
        return RollbackReport(devices=p.devices, complete=not residual, residual=residual, pending=sorted({x.node for x in pending}))

    def repair_pending(self, st: A3State) -> list[str]:
        """Retry FRR rollback lines left pending by earlier change sets (call under the transaction
        lock). Returns notes for the result; repairs that still cannot run stay pending."""
        notes: list[str] = []
        keep: list[PendingRepair] = []
        for rep in st.pending:
            try:
                with self.lab.config_lock([rep.node], holder=self.opts.holder, timeout_s=self.opts.lock_timeout_s):
                    if not self._vtysh(rep.node, rep.lines, timeout_s=self.opts.capture_timeout_s):
                        raise SubstrateError(f"{rep.node}: FRR did not answer")
                    now = _stanzas(capture(self.lab, rep.node, timeout_s=self.opts.capture_timeout_s).frr_config or "")
            except SubstrateError as e:
                keep.append(rep)
                notes.append(f"the rollback of {rep.change_id} on {rep.node} is still pending ({e})")
                continue
            bad = [h for h, lines in rep.expected.items() if sorted(now.get(h, [])) != sorted(lines)]
            notes.append(f"completed the rollback of {rep.change_id} on {rep.node}" + (f", but {bad} still differ" if bad else ""))
        if keep != st.pending:
            st.pending = keep
            self.records.save_state(st)
        return notes


__all__ = ["ChangeResult", "ChangeSetRejected", "Engine", "EngineOptions", "PlanResult", "TransactionError"]
