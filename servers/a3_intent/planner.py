"""Planning a change set (pure: no I/O): validate, allocate, render, diff, scope the validation.

:func:`plan` takes the current inventory (a :class:`~substrate.scenario.model.Scenario` whose
service records are the scenario's plus A3-T's committed changes), the parsed operations and
the resources found on the devices, and returns a :class:`Plan`:

1. each operation is checked against the inventory as the previous operations left it (the
   instance exists or not, its references resolve, the attachment circuit is a free circuit
   of that PE, prefixes come from the pools, nothing the devices hold collides with it) --
   every problem is collected with its field path (``ops[2].spec.pe_interface: ...``);
2. resources are allocated in a fixed order, from the scenario's pools through
   :class:`~substrate.scenario.layers.addressing.Ipam` (lowest free first, as the generator and
   the task variants do), never picking one the records or the devices already use: tables of
   new tenants; ``auto`` prefixes; End.DX4 functions of moved, then new IPv4 sites; End.DT6
   functions of tenants on new PEs (sorted by PE); waypoint End functions; floating addresses
   and marks;
3. the final inventory is checked as a whole (references, one prefix per PE, no overlap within a
   tenant, steering and firewall constraints), each problem blamed on the last operation that
   touched one of the instances involved;
4. the old and new inventories are rendered by the layers' own ``render`` functions
   (:func:`substrate.scenario.generator.render_scenario`) and each node's difference is a
   :class:`~substrate.scenario.apply.ConfigDelta` -- exactly the commands that turn one
   rendering into the other;
5. the invariants to check after applying (active validation) are those of the new inventory
   (the layers' ``invariants`` functions) for every service instance that changed or that has
   state on, or is probed through, a touched device, plus pre-existing invariants of unchanged
   instances on those devices that the new inventory would sample differently.

Raises :class:`~servers.a3_intent.catalog.ChangeSetRejected` with every problem found.
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
from dataclasses import dataclass, field
from typing import Any

from servers.a3_intent.catalog import AUTO, ChangeSetRejected, Problem, natural_key
from servers.a3_intent.inventory import Found, circuits, expected_found, expected_state, spare_circuits
from substrate import addressing as a
from substrate.devstate import DeviceState
from substrate.errors import SubstrateError
from substrate.journal import FrrView, nft_tables, normalize_nft_table, normalize_route
from substrate.routes import route_key
from substrate.scenario.apply import ConfigDelta, config_delta
from substrate.scenario.generator import render_scenario, scenario_invariants
from substrate.scenario.layers.addressing import Ipam
from substrate.scenario.layers.base import GenerationError
from substrate.scenario.layers.firewall import OPEN_PORT
from substrate.scenario.layers.l3vpn import ce_addr
from substrate.scenario.model import FirewallPolicy, FloatingIP, Invariant, NodeConfig, Scenario, Site, SteeringPolicy, Tenant
from substrate.topology import Role

#: Most drift lines reported per device in a plan's warnings.
DRIFT_LINES = 8


@dataclass
class OpResult:
    """What one operation does."""

    index: int
    op: str
    service_class: str
    id: str
    effect: str  # created | modified | deleted | no change
    notes: list[str] = field(default_factory=list)
    allocated: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {"index": self.index, "op": self.op, "service_class": self.service_class, "id": self.id,
                "effect": self.effect, "notes": self.notes, "allocated": self.allocated}  # fmt: skip


@dataclass
class Plan:
    """The outcome of planning (see module docstring)."""

    old: Scenario
    new: Scenario
    ops: list[OpResult]
    deltas: dict[str, ConfigDelta]
    changed_services: list[str]
    invariants: list[Invariant]
    warnings: list[str]
    digest: str

    @property
    def records_changed(self) -> bool:
        return records_of(self.old) != records_of(self.new)

    @property
    def deleted_ids(self) -> list[str]:
        """Instances the change set deletes for good (not created again within it)."""
        alive = set(_ids(self.new))
        return [r.id for r in self.ops if r.effect == "deleted" and r.id not in alive]

    @property
    def devices(self) -> list[str]:
        """Touched devices in topology order (routers, then hosts)."""
        order = {n.name: i for i, n in enumerate(self.old.topology.nodes)}
        return sorted(self.deltas, key=lambda n: (order.get(n, len(order)), natural_key(n)))


def _ids(sc: Scenario) -> list[str]:
    return [t.id for t in sc.tenants] + [x.id for x in sc.all_sites()] + [x.id for x in (*sc.steering, *sc.firewalls, *sc.floating_ips)]


def records_of(sc: Scenario) -> dict[str, Any]:
    """The service records that change sets change (spares excluded: derived)."""
    return {k: [x.model_dump(mode="json") for x in getattr(sc, k)] for k in ("tenants", "steering", "firewalls", "floating_ips")}


def digest_of(ops: list[Any]) -> str:
    """SHA-256 of a change set's canonical JSON."""
    text = json.dumps([o.model_dump(mode="json") for o in ops], sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def _rule_text(r: Any) -> str:
    return f"{r.action} TCP {r.port} from {r.src_site or 'any'} to {r.dst_site}"


def _net(p: str | None) -> ipaddress.IPv4Network | ipaddress.IPv6Network | None:
    if not p or p == AUTO:
        return None
    try:
        return ipaddress.ip_network(p, strict=False)
    except ValueError:
        return None


def _overlaps(x: str | None, y: str | None) -> bool:
    nx, ny = _net(x), _net(y)
    return nx is not None and ny is not None and nx.version == ny.version and nx.overlaps(ny)  # type: ignore[arg-type]


class _Planner:
    def __init__(self, old: Scenario, found: Found, deleted_by: dict[str, str]):
        self.old = old
        self.work = old.model_copy(deep=True)
        self.found = found
        self.unexplained = found.minus(expected_found(old))
        self.deleted_by = deleted_by
        self.problems: list[Problem] = []
        self.results: list[OpResult] = []
        self.touch: dict[str, tuple[int, str]] = {}  # instance id -> (op index, op)
        self.circuits = circuits(old)
        self.pes = [n.name for n in old.topology.routers if n.role is Role.PE]
        self.routers = [n.name for n in old.topology.routers]
        # pending allocations, in op order
        self.new_tenants: list[tuple[int, str]] = []
        self.auto_prefix: list[tuple[int, str, str]] = []  # (op, site, "prefix6"|"prefix4")
        self.dx4_moved: list[tuple[int, str]] = []
        self.dx4_new: list[tuple[int, str]] = []
        self.waypoints: list[tuple[int, str]] = []
        self.fips: list[tuple[int, str, bool, bool]] = []  # (op, id, auto address, needs mark)
        self.moved: set[str] = set()  # sites moved to another circuit
        self.mentioned: set[str] = set()  # sites a modify/delete of this change set names
        self.warnings: list[str] = []
        #: instances deleted earlier in this change set, by id: a create of the same id (with a
        #: compatible spec) takes their allocations back instead of allocating anew
        self.gone: dict[str, Any] = {}
        self.gone_sites: dict[str, tuple[Site, OpResult]] = {}

    # -- helpers --------------------------------------------------------------------------------

    def bad(self, path: str, message: str) -> None:
        self.problems.append(Problem(path=path, message=message))

    def tenants(self) -> dict[str, Tenant]:
        return {t.id: t for t in self.work.tenants}

    def sites(self) -> dict[str, Site]:
        return {s.id: s for t in self.work.tenants for s in t.sites}

    def ids(self) -> dict[str, str]:
        out = {t.id: "tenant" for t in self.work.tenants}
        out.update({s.id: "tenant_site" for s in self.work.all_sites()})
        out.update({p.id: "steering_policy" for p in self.work.steering})
        out.update({f.id: "firewall_rule_set" for f in self.work.firewalls})
        out.update({f.id: "floating_ip" for f in self.work.floating_ips})
        return out

    def known(self, what: str, items: list[str]) -> str:
        items = sorted(items, key=natural_key)
        shown = ", ".join(items[:20]) + (f", ... ({len(items)} in all)" if len(items) > 20 else "")
        return f"{what}: {shown}" if items else f"there are no {what}"

    def circuit_list(self, pe: str) -> str:
        used = {(s.pe, s.pe_if): s.id for s in self.work.all_sites()}
        cs = [f"{c.pe_if} ({used.get((c.pe, c.pe_if), 'free')})" for c in self.circuits.values() if c.pe == pe]
        return ", ".join(cs) if cs else "none"

    def free_circuits(self) -> str:
        used = {(s.pe, s.pe_if) for s in self.work.all_sites()}
        free = [c.id for k, c in self.circuits.items() if k not in used]
        return ", ".join(free) if free else "none"

    def new_id(self, prefix: str, taken: set[str]) -> str:
        k = 1
        while f"{prefix}{k}" in taken:
            k += 1
        return f"{prefix}{k}"

    def result(self, i: int, op: Any, iid: str, effect: str, **kw: Any) -> OpResult:
        r = OpResult(index=i, op=op.op, service_class=op.service_class, id=iid, effect=effect, **kw)
        self.results.append(r)
        if effect != "no change":
            self.touch[iid] = (i, op.op)
        return r

    def in_use(self, i: int, iid: str) -> bool:
        """A create names an id another instance has: refuse it (field ``ops[i].id``)."""
        other = self.ids().get(iid)
        if other:
            self.bad(f"ops[{i}].id", f"{iid!r} is already in use by a {other}")
        return other is not None

    def missing(self, i: int, op: Any, cls: str) -> None:
        """A modify/delete of an id that does not exist (a delete repeated after it succeeded is no change)."""
        if op.op == "delete" and op.id in self.deleted_by and op.id not in self.ids():
            self.result(i, op, op.id, "no change", notes=[f"already deleted by change {self.deleted_by[op.id]}"])
            return
        other = self.ids().get(op.id)
        if other:
            self.bad(f"ops[{i}].id", f"{op.id!r} is a {other}, not a {cls}")
        else:
            names = [k for k, v in self.ids().items() if v == cls]
            self.bad(f"ops[{i}].id", f"no {cls} {op.id!r}; {self.known(cls + ' ids', names)}")

    # -- operations --------------------------------------------------------------------------

    def run(self, ops: list[Any]) -> None:
        self.mentioned = {op.id for op in ops if op.service_class == "tenant_site" and op.op != "create"}
        for i, op in enumerate(ops):
            getattr(self, f"op_{op.service_class}")(i, op)
        self._drop_rules_of_gone_sites()

    def _drop_rules_of_gone_sites(self) -> None:
        """Accept rules whose source site this change set deleted go with it -- unless the change
        set created the site again (delete-and-recreate keeps every reference)."""
        sites = self.sites()
        for sid, (_site, res) in self.gone_sites.items():
            if sid in sites:
                continue
            for pol in list(self.work.firewalls):
                gone = [r for r in pol.rules if r.src_site == sid]
                if gone:
                    pol.rules = [r for r in pol.rules if r.src_site != sid]
                    res.notes.append(f"{pol.id}: {len(gone)} accept rule(s) from {sid} removed with it")
                    self.touch[pol.id] = (res.index, "delete")
                    if not pol.rules:
                        self.work.firewalls.remove(pol)
                        res.notes.append(f"{pol.id} had no rule left and was removed")

    # tenant .......................................................................................

    def op_tenant(self, i: int, op: Any) -> None:
        tenants = self.tenants()
        if op.op == "create":
            same = [t for t in self.work.tenants if t.name == op.spec.name]
            if op.id is None and same:
                self.result(i, op, same[0].id, "no change", notes=[f"tenant {same[0].id} is already named {op.spec.name!r}"])
                return
            iid = op.id or self.new_id("t", set(self.ids()))
            if iid in tenants and tenants[iid].name == op.spec.name:
                self.result(i, op, iid, "no change", notes=["the tenant exists with this spec"])
                return
            if self.in_use(i, iid):
                return
            if same:
                self.bad(f"ops[{i}].spec.name", f"customer name {op.spec.name!r} is tenant {same[0].id}'s")
                return
            prev = self.gone.get(iid)
            self.work.tenants.append(Tenant(id=iid, name=op.spec.name, table=prev.table if isinstance(prev, Tenant) else 0))
            if not isinstance(prev, Tenant):
                self.new_tenants.append((i, iid))
            self.result(i, op, iid, "created", notes=[f"takes back table {prev.table}"] if isinstance(prev, Tenant) else [])
            return
        if op.id not in tenants:
            self.missing(i, op, "tenant")
            return
        t = tenants[op.id]
        if op.op == "modify":
            name = op.spec.name if op.spec.name is not None else t.name
            if name == t.name:
                self.result(i, op, t.id, "no change")
                return
            if any(x.name == name for x in self.work.tenants if x.id != t.id):
                self.bad(f"ops[{i}].spec.name", f"customer name {name!r} is already used by another tenant")
                return
            t.name = name
            self.result(i, op, t.id, "modified")
            return
        users = [s.id for s in t.sites] + [p.id for p in self.work.steering if p.tenant == t.id]
        users += [f.id for f in self.work.firewalls if f.tenant == t.id] + [f.id for f in self.work.floating_ips if f.tenant == t.id]
        if users:
            self.bad(f"ops[{i}].id", f"tenant {t.id} still has {', '.join(users)}; delete them first (in this change set or an earlier one)")
            return
        self.work.tenants.remove(t)
        self.gone[t.id] = t
        self.result(i, op, t.id, "deleted", notes=[f"table {t.table} freed"])

    # tenant_site ..................................................................................

    def _site_checks(self, i: int, s: Site, prev: Site | None) -> bool:
        """Checks of one site spec that do not depend on later operations; True when usable.

        Rules and their sources: the tenant exists; sites attach to PE routers, on an attachment
        circuit -- a PE port cabled to a CE host (``substrate.scenario.model``: Site, SpareCircuit)
        -- that no site outside this change set uses and whose PE port carries no address or
        tenant rule that the records do not explain (state made at another level); prefixes come
        from the tenant pools (``Pools.prefix6`` / ``prefix4``, layer ``addressing``); a CE the
        customer already configured (task setup: "the customer's CE is already configured") must
        carry addresses inside the site's prefixes.
        """
        ok = True
        p = f"ops[{i}].spec"
        if s.tenant not in self.tenants():
            self.bad(f"{p}.tenant", f"no tenant {s.tenant!r}; " + self.known("tenants", [f"{t.id} ({t.name})" for t in self.work.tenants]))
            ok = False
        if s.pe not in self.pes:
            role = "a P router" if s.pe in self.routers else "not a router of this network"
            self.bad(f"{p}.pe", f"{s.pe!r} is {role}; sites attach to PEs: {', '.join(sorted(self.pes, key=natural_key))}")
            return False
        c = self.circuits.get((s.pe, s.pe_if))
        if c is None:
            self.bad(f"{p}.pe_interface", f"{s.pe} has no attachment circuit {s.pe_if}; circuits of {s.pe}: {self.circuit_list(s.pe)}; "
                                          f"free circuits: {self.free_circuits()}")  # fmt: skip
            return False
        s.ce, s.ce_if = c.ce, c.ce_if
        own = prev is not None and (prev.pe, prev.pe_if) == (s.pe, s.pe_if)
        occupant = next((x for x in self.work.all_sites() if (x.pe, x.pe_if) == (s.pe, s.pe_if) and x.id != s.id), None)
        if occupant is not None and occupant.id not in self.mentioned:
            self.bad(f"{p}.pe_interface", f"{s.pe} {s.pe_if} is site {occupant.id}'s circuit ({occupant.tenant}); free circuits: "
                                          f"{self.free_circuits()}")  # fmt: skip
            return False
        if not own:
            port = (s.pe, s.pe_if)
            extra = sorted(self.unexplained.port_addrs.get(port, set())) + sorted(self.unexplained.port_rules.get(port, set()))
            if extra:
                self.bad(f"{p}.pe_interface", f"{s.pe} {s.pe_if} carries state no service explains ({'; '.join(extra[:4])}): "
                                              "the circuit is in use outside A3-T")  # fmt: skip
                ok = False
        pools = self.old.pools
        for fld, pool in (("prefix6", pools.prefix6), ("prefix4", pools.prefix4)):
            v = getattr(s, fld)
            if v and v != AUTO and not ipaddress.ip_network(v).subnet_of(ipaddress.ip_network(pool)):  # type: ignore[arg-type]
                self.bad(f"{p}.{fld}", f"{v} is outside the tenant pool {pool} (pools.{fld})")
                ok = False
        # the customer's CE may already be configured (onboarding, re-cabling): its addresses must fit the site
        if not own:
            ce_addrs = sorted(self.unexplained.port_addrs.get((c.ce, c.ce_if), set()))
            for addr in ce_addrs:
                ip = ipaddress.ip_interface(addr)
                fld = "prefix6" if ip.version == 6 else "prefix4"
                want = getattr(s, fld)
                if want in (None, AUTO) or ip.ip not in ipaddress.ip_network(want):
                    hint = f"give {fld} {ip.network}" if ip.network.prefixlen == (64 if ip.version == 6 else 24) else f"check {fld}"
                    self.bad(f"{p}.{fld}", f"the CE {c.ce} is already configured with {addr} on {c.ce_if}, which is not in "
                                           f"{fld} {want or 'none'}: {hint}")  # fmt: skip
                    ok = False
        return ok

    def op_tenant_site(self, i: int, op: Any) -> None:
        sites = self.sites()
        if op.op == "create":
            spec = op.spec
            s = Site(id=op.id or "", tenant=spec.tenant, pe=spec.pe, pe_if=spec.pe_interface, ce="", prefix6=spec.prefix6,
                     prefix4=spec.prefix4)  # fmt: skip
            same = [x for x in sites.values() if (x.tenant, x.pe, x.pe_if) == (s.tenant, s.pe, s.pe_if)
                    and (op.id is None or x.id == op.id) and self._same_prefixes(x, s)]  # fmt: skip
            if same:
                self.result(i, op, same[0].id, "no change", notes=[f"site {same[0].id} exists with this spec"])
                return
            if op.id is None:
                t = self.tenants().get(spec.tenant)
                nums = [int(x.id[len(spec.tenant) + 1:]) for x in (t.sites if t else []) if x.id[len(spec.tenant) + 1:].isdigit()
                        and x.id.startswith(spec.tenant + "s")]  # fmt: skip
                k = max(nums, default=0) + 1
                while f"{spec.tenant}s{k}" in self.ids():
                    k += 1
                s.id = f"{spec.tenant}s{k}"
            elif op.id in self.ids():
                cls = self.ids()[op.id]
                detail = f" (on {sites[op.id].pe} {sites[op.id].pe_if})" if op.id in sites else ""
                self.bad(f"ops[{i}].id", f"{op.id!r} is already in use by a {cls}{detail}")
                return
            if not self._site_checks(i, s, None):
                return
            t = self.tenants()[s.tenant]
            t.sites.append(s)
            notes = [f"CE {s.ce} ({s.ce_if}) on {s.pe} {s.pe_if}"]
            prev = self.gone_sites.get(s.id, (None, None))[0]
            if prev is not None and prev.tenant == s.tenant:
                # deleted earlier in this change set: the same site again keeps what it had
                for fld in ("prefix6", "prefix4"):
                    if getattr(s, fld) == AUTO and getattr(prev, fld):
                        setattr(s, fld, getattr(prev, fld))
                if s.prefix4 and prev.prefix4 and prev.pe == s.pe and prev.dx4_function is not None:
                    s.dx4_function = prev.dx4_function
                notes.append("deleted earlier in this change set: keeps its prefixes and SIDs where the spec allows")
            for fld in ("prefix6", "prefix4"):
                if getattr(s, fld) == AUTO:
                    self.auto_prefix.append((i, s.id, fld))
            if s.prefix4 and s.dx4_function is None:
                self.dx4_new.append((i, s.id))
            self.result(i, op, s.id, "created", notes=notes)
            return
        if op.id not in sites:
            self.missing(i, op, "tenant_site")
            return
        cur = sites[op.id]
        t = self.tenants()[cur.tenant]
        if op.op == "delete":
            t.sites = [x for x in t.sites if x.id != cur.id]
            res = self.result(i, op, cur.id, "deleted", notes=[f"circuit {cur.pe} {cur.pe_if} freed"])
            self.gone_sites[cur.id] = (cur, res)
            return
        given = set(op.spec.model_fields_set)
        patch = op.spec
        if "tenant" in given and patch.tenant is not None and patch.tenant != cur.tenant:
            self.bad(f"ops[{i}].spec.tenant", f"a site cannot change tenant ({cur.id} belongs to {cur.tenant}); delete it and "
                                              f"create a site in {patch.tenant}")  # fmt: skip
            return
        new = cur.model_copy()
        for fld, attr in (("pe", "pe"), ("pe_interface", "pe_if"), ("prefix6", "prefix6"), ("prefix4", "prefix4")):
            if fld in given:
                v = getattr(patch, fld)
                if v is None and fld != "prefix4":
                    self.bad(f"ops[{i}].spec.{fld}", f"{fld} cannot be null (leave it out to keep {getattr(cur, attr)})")
                    return
                setattr(new, attr, v)
        if "pe" in given and "pe_interface" not in given and new.pe != cur.pe:
            self.bad(f"ops[{i}].spec.pe_interface", f"moving {cur.id} to {new.pe} needs the circuit's port too; circuits of "
                                                    f"{new.pe}: {self.circuit_list(new.pe)}")  # fmt: skip
            return
        if self._same_site(cur, new):
            self.result(i, op, cur.id, "no change")
            return
        if not self._site_checks(i, new, cur):
            return
        moved = (new.pe, new.pe_if) != (cur.pe, cur.pe_if)
        if new.pe != cur.pe or (new.prefix4 and not cur.prefix4):
            new.dx4_function = None
            if new.prefix4:
                self.dx4_moved.append((i, new.id))
        if not new.prefix4:
            new.dx4_function = None
        for fld in ("prefix6", "prefix4"):
            if getattr(new, fld) == AUTO:
                self.auto_prefix.append((i, new.id, fld))
        t.sites[t.sites.index(cur)] = new
        if moved:
            self.moved.add(cur.id)
        notes = [f"moved from {cur.pe} {cur.pe_if} (CE {cur.ce}) to {new.pe} {new.pe_if} (CE {new.ce})"] if moved else []
        self.result(i, op, cur.id, "modified", notes=notes)
        self.touch[cur.id] = (i, "modify")

    @staticmethod
    def _same_prefixes(x: Site, s: Site) -> bool:
        p6 = s.prefix6 in (AUTO, x.prefix6)
        p4 = (s.prefix4 == x.prefix4) or (s.prefix4 == AUTO and x.prefix4 is not None)
        return p6 and p4

    @staticmethod
    def _same_site(cur: Site, new: Site) -> bool:
        return (cur.pe, cur.pe_if) == (new.pe, new.pe_if) and _Planner._same_prefixes(cur, new)

    # steering_policy ..............................................................................

    def op_steering_policy(self, i: int, op: Any) -> None:
        pols = {p.id: p for p in self.work.steering}
        if op.op == "create":
            sp = op.spec
            same = [p for p in self.work.steering if (p.tenant, p.ingress_pe, p.dst_site, p.waypoint) ==
                    (sp.tenant, sp.ingress_pe, sp.dst_site, sp.waypoint) and (op.id is None or p.id == op.id)]  # fmt: skip
            if same:
                self.result(i, op, same[0].id, "no change", notes=[f"policy {same[0].id} exists with this spec"])
                return
            iid = op.id or self.new_id("sp", set(self.ids()))
            if self.in_use(i, iid):
                return
            prev = self.gone.get(iid)
            keep = isinstance(prev, SteeringPolicy) and prev.waypoint == sp.waypoint
            p = SteeringPolicy(id=iid, tenant=sp.tenant, ingress_pe=sp.ingress_pe, dst_site=sp.dst_site, waypoint=sp.waypoint,
                               waypoint_function=prev.waypoint_function if keep else 0)  # fmt: skip
            self.work.steering.append(p)
            if not keep:
                self.waypoints.append((i, iid))
            self.result(i, op, iid, "created", notes=["takes back its waypoint SID"] if keep else [])
            return
        if op.id not in pols:
            self.missing(i, op, "steering_policy")
            return
        cur = pols[op.id]
        if op.op == "delete":
            self.work.steering.remove(cur)
            self.gone[cur.id] = cur
            self.result(i, op, cur.id, "deleted", notes=[f"End SID function {cur.waypoint_function:#x} on {cur.waypoint} freed"])
            return
        given = op.spec.model_fields_set
        if "tenant" in given and op.spec.tenant not in (None, cur.tenant):
            self.bad(f"ops[{i}].spec.tenant", f"a policy cannot change tenant ({cur.id} belongs to {cur.tenant})")
            return
        new = cur.model_copy(update={k: getattr(op.spec, k) for k in ("ingress_pe", "dst_site", "waypoint")
                                     if k in given and getattr(op.spec, k) is not None})  # fmt: skip
        if new == cur:
            self.result(i, op, cur.id, "no change")
            return
        if new.waypoint != cur.waypoint:
            self.waypoints.append((i, new.id))
        self.work.steering[self.work.steering.index(cur)] = new
        self.result(i, op, cur.id, "modified")

    # firewall_rule_set ............................................................................

    def op_firewall_rule_set(self, i: int, op: Any) -> None:
        sets = {f.id: f for f in self.work.firewalls}
        if op.op == "create":
            sp = op.spec
            same = [f for f in self.work.firewalls if f.tenant == sp.tenant and f.rules == sp.rules and (op.id is None or f.id == op.id)]
            if same:
                self.result(i, op, same[0].id, "no change", notes=[f"rule set {same[0].id} exists with these rules"])
                return
            iid = op.id or f"fw-{sp.tenant}"
            if self.in_use(i, iid):
                return
            self.work.firewalls.append(FirewallPolicy(id=iid, tenant=sp.tenant, rules=list(sp.rules)))
            self.result(i, op, iid, "created")
            return
        if op.id not in sets:
            self.missing(i, op, "firewall_rule_set")
            return
        cur = sets[op.id]
        if op.op == "delete":
            self.work.firewalls.remove(cur)
            self.result(i, op, cur.id, "deleted")
            return
        given = op.spec.model_fields_set
        if "tenant" in given and op.spec.tenant not in (None, cur.tenant):
            self.bad(f"ops[{i}].spec.tenant", f"a rule set cannot change tenant ({cur.id} belongs to {cur.tenant})")
            return
        if "rules" not in given or op.spec.rules is None or op.spec.rules == cur.rules:
            self.result(i, op, cur.id, "no change")
            return
        self.work.firewalls[self.work.firewalls.index(cur)] = cur.model_copy(update={"rules": list(op.spec.rules)})
        self.result(i, op, cur.id, "modified")

    # floating_ip ..................................................................................

    def op_floating_ip(self, i: int, op: Any) -> None:
        fips = {f.id: f for f in self.work.floating_ips}
        if self.work.external is None:
            self.bad(f"ops[{i}].service_class", "this network has no external segment (no floating_ip layer): floating IPs cannot be used")
            return
        if op.op == "create":
            sp = op.spec
            same = [f for f in self.work.floating_ips if f.site == sp.site and sp.address in (AUTO, f.address)
                    and (op.id is None or f.id == op.id)]  # fmt: skip
            if same:
                self.result(i, op, same[0].id, "no change", notes=[f"{same[0].id} already maps {same[0].address} to {sp.site}"])
                return
            iid = op.id or self.new_id("fip", set(self.ids()))
            if self.in_use(i, iid):
                return
            site = self.sites().get(sp.site)
            if site is None:
                self.bad(f"ops[{i}].spec.site", f"no site {sp.site!r}")
                return
            prev = self.gone.get(iid)
            if isinstance(prev, FloatingIP) and prev.site == sp.site and sp.address in (AUTO, prev.address):
                self.work.floating_ips.append(prev.model_copy())
                self.result(i, op, iid, "created", notes=[f"takes back {prev.address} and mark {prev.mark:#x}"])
                return
            self.work.floating_ips.append(FloatingIP(id=iid, tenant=site.tenant, site=sp.site, address=sp.address, mark=0))
            self.fips.append((i, iid, sp.address == AUTO, True))
            self.result(i, op, iid, "created")
            return
        if op.id not in fips:
            self.missing(i, op, "floating_ip")
            return
        cur = fips[op.id]
        if op.op == "delete":
            self.work.floating_ips.remove(cur)
            self.gone[cur.id] = cur
            self.result(i, op, cur.id, "deleted", notes=[f"{cur.address} and mark {cur.mark:#x} freed"])
            return
        given = op.spec.model_fields_set
        new = cur.model_copy()
        if "site" in given and op.spec.site is not None:
            site = self.sites().get(op.spec.site)
            if site is None:
                self.bad(f"ops[{i}].spec.site", f"no site {op.spec.site!r}")
                return
            new.site, new.tenant = site.id, site.tenant
        auto = False
        if "address" in given and op.spec.address is not None and op.spec.address != cur.address:
            auto = op.spec.address == AUTO
            new.address = op.spec.address
        if new == cur:
            self.result(i, op, cur.id, "no change")
            return
        self.work.floating_ips[self.work.floating_ips.index(cur)] = new
        if auto:
            self.fips.append((i, new.id, True, False))
        self.result(i, op, cur.id, "modified")

    # -- allocation --------------------------------------------------------------------------

    def ipam(self) -> Ipam:
        ipam = Ipam.from_scenario(self.old)
        cur = Ipam.from_scenario(self.work)
        ipam.tables |= cur.tables | self.found.tables
        ipam.used6 |= cur.used6
        ipam.used4 |= cur.used4
        ipam.marks |= cur.marks | self.found.marks
        ipam.floating |= cur.floating | self.found.floating
        for src in (cur.functions, self.found.functions):
            for n, fs in src.items():
                ipam.functions.setdefault(n, set()).update(fs)
        for ps in self.found.table_prefixes.values():
            for p in ps:
                (ipam.used6 if ":" in p else ipam.used4).add(p)
        for addrs in self.found.port_addrs.values():
            for x in addrs:
                n = ipaddress.ip_interface(x).network
                (ipam.used6 if n.version == 6 else ipam.used4).add(str(n))
        return ipam

    def allocate(self) -> None:
        ipam = self.ipam()
        tenants, sites = self.tenants(), self.sites()
        res = {r.id: r for r in self.results}

        def exhausted(i: int, fld: str, e: GenerationError) -> None:
            self.bad(f"ops[{i}].{fld}", f"pool exhausted: {e}")

        for i, tid in self.new_tenants:
            try:
                tenants[tid].table = ipam.table()
                res[tid].allocated["table"] = tenants[tid].table
            except GenerationError as e:
                exhausted(i, "spec", e)
        taken_nets = [ipaddress.ip_network(p) for p in ipam.used6 | ipam.used4 if _net(p) is not None]
        for i, sid, fld in self.auto_prefix:
            s = sites.get(sid)
            if s is None:
                continue
            try:
                while True:  # lowest free, skipping any that overlaps a larger prefix in use
                    p = ipam.prefix6() if fld == "prefix6" else ipam.prefix4()
                    pn = ipaddress.ip_network(p)
                    if not any(n.version == pn.version and n.overlaps(pn) for n in taken_nets):  # type: ignore[arg-type]
                        break
                setattr(s, fld, p)
                res[sid].allocated[fld] = p
            except GenerationError as e:
                exhausted(i, f"spec.{fld}", e)
        for i, sid in [*self.dx4_moved, *self.dx4_new]:
            s = sites.get(sid)
            if s is None or not s.prefix4:
                continue
            try:
                s.dx4_function = ipam.function(s.pe)
                res[sid].allocated["dx4_sid"] = self.sid(s.pe, s.dx4_function)
            except GenerationError as e:
                exhausted(i, "spec.pe", e)
        for t in self.work.tenants:
            pes = {s.pe for s in t.sites}
            dropped = sorted(set(t.dt6_functions) - pes, key=natural_key)
            t.dt6_functions = {pe: fn for pe, fn in t.dt6_functions.items() if pe in pes}
            for pe in sorted(pes - set(t.dt6_functions), key=natural_key):
                blame = max((r for r in self.results if r.id in {s.id for s in t.sites if s.pe == pe} and r.effect != "no change"),
                            key=lambda r: r.index, default=None)  # fmt: skip
                try:
                    t.dt6_functions[pe] = ipam.function(pe)
                    if blame:
                        blame.allocated[f"dt6_sid@{pe}"] = self.sid(pe, t.dt6_functions[pe])
                except GenerationError as e:
                    exhausted(blame.index if blame else 0, "spec.pe", e)
            for pe in dropped:
                left = {s.id for s in self.old.all_sites() if s.tenant == t.id and s.pe == pe}
                gone = max((r for r in self.results if r.id in left and r.effect != "no change"), key=lambda r: r.index, default=None)
                if gone:
                    gone.notes.append(f"{t.id} has no site left on {pe}: its End.DT6 SID there is removed")
            t.dt6_functions = dict(sorted(t.dt6_functions.items(), key=lambda kv: natural_key(kv[0])))
        pols = {p.id: p for p in self.work.steering}
        for i, pid in self.waypoints:
            p = pols.get(pid)
            if p is None or p.waypoint not in self.routers:
                continue
            try:
                p.waypoint_function = ipam.function(p.waypoint)
                res[pid].allocated["waypoint_sid"] = self.sid(p.waypoint, p.waypoint_function)
            except GenerationError as e:
                exhausted(i, "spec.waypoint", e)
        fips = {f.id: f for f in self.work.floating_ips}
        for i, fid, auto, mark in self.fips:
            f = fips.get(fid)
            if f is None:
                continue
            try:
                if auto:
                    f.address = ipam.floating4()
                    res[fid].allocated["address"] = f.address
                if mark:
                    f.mark = ipam.mark()
                    res[fid].allocated["mark"] = f"{f.mark:#x}"
            except GenerationError as e:
                exhausted(i, "spec.address" if auto else "spec", e)

    def sid(self, node: str, fn: int) -> str:
        nid = self.old.topology.node(node).node_id
        assert nid is not None
        return str(a.function_sid(nid, fn))

    # -- final-state integrity -------------------------------------------------------------------

    def blame(self, refs: list[tuple[str, str]]) -> str | None:
        """Path of the last operation that touched one of ``refs`` ((id, field) pairs), or None
        when none did (a pre-existing condition is not this change set's fault)."""
        best: tuple[int, str, str] | None = None
        for iid, fld in refs:
            if iid in self.touch:
                i, opname = self.touch[iid]
                if best is None or i > best[0]:
                    best = (i, opname, fld)
        if best is None:
            return None
        i, opname, fld = best
        return f"ops[{i}].id" if opname == "delete" else f"ops[{i}].{fld}"

    def field(self, site_id: str, fld: str) -> str:
        """The spec field to blame for a site's ``fld`` problem: the circuit when the op moved it."""
        return "spec.pe_interface" if site_id in self.moved else f"spec.{fld}"

    def final(self, refs: list[tuple[str, str]], message: str) -> None:
        path = self.blame(refs)
        if path is not None:
            self.bad(path, message)

    def integrity(self) -> None:  # noqa: C901 - one check per rule, in one place
        """Checks of the final inventory, each blamed on the last operation involved. Rules and sources:

        - one site per attachment circuit;
        - no overlapping prefixes within a tenant (one routing table per tenant; layer ``l3vpn``),
          also against routes found in the tenant's table on the devices but in no record;
        - a prefix is attached at most once per PE, whatever the tenant: the connected route of
          the PE port lives in the shared main table, where End.DX4 resolves its next hop
          (``substrate.scenario.model`` docstring; shared/notes/substrate.md, "End.DX4/DX6
          resolve the next hop in the main table");
        - steering (layer ``steering``, RFC 9800 uSID): the destination is a site of the
          policy's tenant on another PE, the waypoint a router other than the ingress and egress
          PEs, one policy per (tenant, ingress PE, destination); a policy the change set states
          needs a tenant site on its ingress PE (a policy merely left without one stays, with a
          warning: the layer keeps it and has no traffic to check);
        - firewall (layer ``firewall``): one rule set per tenant, whose rules name sites of the
          tenant; a drop applies to every source, an accept names its source and needs the drop
          it makes an exception to; port 8443 is the layer's open-port control; the tenant keeps
          at least two sites (the layer's checks send traffic between them);
        - floating IPs (layer ``floating_ip``, RFC 5737 TEST-NET-2): the site has IPv4; the
          address is in ``Pools.floating4`` and unique; the border PE holds no other site with
          the same IPv4 prefix (the NATed traffic could not tell them apart);
        - customer names are unique.
        """
        sites = self.sites()
        tenants = self.tenants()
        ext = self.work.external
        # sites: circuits, prefixes within the tenant and per PE
        by_circuit: dict[tuple[str, str], list[Site]] = {}
        for s in self.work.all_sites():
            by_circuit.setdefault((s.pe, s.pe_if), []).append(s)
        for (pe, port), ss in by_circuit.items():
            if len(ss) > 1:
                self.final([(x.id, "spec.pe_interface") for x in ss],
                           f"circuit {pe} {port} would carry {len(ss)} sites ({', '.join(x.id for x in ss)}); free circuits: {self.free_circuits()}")
        for t in self.work.tenants:
            for x in t.sites:
                for y in t.sites:
                    if x.id < y.id:
                        for fld in ("prefix6", "prefix4"):
                            if _overlaps(getattr(x, fld), getattr(y, fld)):
                                self.final([(x.id, self.field(x.id, fld)), (y.id, self.field(y.id, fld))],
                                           f"{getattr(x, fld)} ({x.id}) overlaps {getattr(y, fld)} ({y.id}) within tenant {t.id}")
                extra = self.unexplained.table_prefixes.get(t.table, {})
                for fld in ("prefix6", "prefix4"):
                    for p, nodes in extra.items():
                        if x.id in self.touch and _overlaps(getattr(x, fld), p):
                            self.final([(x.id, f"spec.{fld}")], f"{getattr(x, fld)} overlaps {p}, found in table {t.table} (tenant {t.id}) "
                                                                f"on {', '.join(sorted(nodes))} but not in any service record")  # fmt: skip
        by_pe: dict[str, list[Site]] = {}
        for s in self.work.all_sites():
            by_pe.setdefault(s.pe, []).append(s)
        for pe, ss in by_pe.items():
            for x in ss:
                for y in ss:
                    if x.id < y.id:
                        for fld in ("prefix6", "prefix4"):
                            if _overlaps(getattr(x, fld), getattr(y, fld)):
                                new, other = (y, x) if self.touch.get(y.id, (-1,))[0] > self.touch.get(x.id, (-1,))[0] else (x, y)
                                self.final([(new.id, self.field(new.id, fld)), (other.id, self.field(other.id, fld))],
                                           f"{new.id} ({new.tenant}) would attach {getattr(new, fld)} on {pe}, where {other.id} "
                                           f"({other.tenant}) attaches {getattr(other, fld)}: a prefix can be attached once per PE "
                                           "(its connected route lives in the shared main table); choose another prefix or another PE")  # fmt: skip
                if x.id in self.touch:
                    for (node, port), addrs in self.unexplained.port_addrs.items():
                        if node == pe and port != x.pe_if:
                            for addr in addrs:
                                for fld in ("prefix6", "prefix4"):
                                    if _overlaps(getattr(x, fld), str(ipaddress.ip_interface(addr).network)):
                                        self.final([(x.id, f"spec.{fld}")], f"{getattr(x, fld)} overlaps {addr} found on {pe} {port} "
                                                                             "(not from any service record)")  # fmt: skip
        # steering policies
        flows: dict[tuple[str, str, str], str] = {}
        for p in self.work.steering:
            refs = [(p.id, "spec.tenant"), (p.dst_site, "spec.pe")]
            t = tenants.get(p.tenant)
            dst = sites.get(p.dst_site)
            if t is None:
                self.final(refs + [(p.tenant, "id")], f"steering_policy {p.id}: no tenant {p.tenant!r}")
                continue
            if dst is None or dst.tenant != p.tenant:
                what = "does not exist" if dst is None else f"belongs to {dst.tenant}"
                self.final([(p.id, "spec.dst_site"), (p.dst_site, "id")],
                           f"steering_policy {p.id} steers {p.tenant} traffic to site {p.dst_site}, which {what}; delete or change "
                           f"{p.id} in the same change set")  # fmt: skip
                continue
            if p.ingress_pe not in self.pes:
                self.final([(p.id, "spec.ingress_pe")], f"ingress_pe {p.ingress_pe!r} is not a PE")
            elif not any(s.pe == p.ingress_pe for s in t.sites):
                if p.id in self.touch:
                    self.final([(p.id, "spec.ingress_pe")], f"steering_policy {p.id} needs a site of {p.tenant} on its ingress PE "
                                                            f"{p.ingress_pe} (the steered traffic enters there); {p.tenant} has none")  # fmt: skip
                elif any(s.pe == p.ingress_pe for s in self.old.all_sites() if s.tenant == p.tenant):
                    # the layer keeps such a policy (it renders, and has no traffic to check): say so, do not refuse
                    self.warnings.append(f"steering_policy {p.id} steers {p.tenant} traffic entering at {p.ingress_pe}, where "
                                         f"{p.tenant} has no site left: it stays in place but carries no traffic (delete it, "
                                         f"or give {p.tenant} a site on {p.ingress_pe} again)")  # fmt: skip
            if dst.pe == p.ingress_pe:
                self.final([(p.id, "spec.ingress_pe"), (dst.id, "spec.pe")],
                           f"steering_policy {p.id}: destination {dst.id} would be on the ingress PE {p.ingress_pe} itself")
            if p.waypoint not in self.routers:
                self.final([(p.id, "spec.waypoint")], f"waypoint {p.waypoint!r} is not a router; routers: {', '.join(self.routers)}")
            elif p.waypoint in (p.ingress_pe, dst.pe):
                self.final([(p.id, "spec.waypoint"), (dst.id, "spec.pe")],
                           f"steering_policy {p.id}: the waypoint {p.waypoint} must differ from the ingress PE and from the "
                           f"destination's PE ({dst.pe})")  # fmt: skip
            key = (p.tenant, p.ingress_pe, p.dst_site)
            if key in flows:
                self.final([(p.id, "spec.dst_site")], f"{flows[key]} already steers {p.tenant} traffic from {p.ingress_pe} to {p.dst_site}")
            flows[key] = p.id
        # firewall rule sets
        per_tenant: dict[str, str] = {}
        for f in self.work.firewalls:
            t = tenants.get(f.tenant)
            if t is None:
                self.final([(f.id, "spec.tenant")], f"{f.id}: no tenant {f.tenant!r}")
                continue
            if f.tenant in per_tenant:
                self.final([(f.id, "spec.tenant")], f"tenant {f.tenant} already has rule set {per_tenant[f.tenant]} (one per tenant)")
            per_tenant[f.tenant] = f.id
            tsites = {s.id for s in t.sites}
            if len(t.sites) < 2:
                self.final([(f.id, "spec.rules"), *[(s.id, "spec.pe") for s in self.old.all_sites() if s.tenant == f.tenant]],
                           f"{f.id} needs tenant {f.tenant} to keep at least 2 sites (a rule filters traffic between its sites); "
                           f"delete or change {f.id} in the same change set")  # fmt: skip
            seen: set[tuple[Any, ...]] = set()
            drops = {(r.dst_site, r.port) for r in f.rules if r.action == "drop"}
            for k, r in enumerate(f.rules):
                rp = f"spec.rules[{k}]"
                rt = _rule_text(r)
                for fld in ("dst_site", "src_site"):
                    v = getattr(r, fld)
                    if v is not None and v not in tsites:
                        what = "does not exist" if v not in sites else f"belongs to {sites[v].tenant}"
                        self.final([(f.id, f"{rp}.{fld}"), (v, "id")], f"{f.id} rule '{rt}': site {v} {what}; rules name sites of "
                                                                        f"{f.tenant}; delete or change {f.id} in the same change set")  # fmt: skip
                if r.src_site is not None and r.src_site == r.dst_site:
                    self.final([(f.id, f"{rp}.src_site")], f"{f.id} rule '{rt}': source and destination are the same site")
                if r.action == "drop" and r.src_site is not None:
                    self.final([(f.id, f"{rp}.src_site")], f"{f.id} rule '{rt}': a drop rule applies to every source (src_site null); "
                                                           "to let one source through, add an accept rule for it")  # fmt: skip
                if r.action == "accept" and r.src_site is None:
                    self.final([(f.id, f"{rp}.src_site")], f"{f.id} rule '{rt}': an accept rule names its source site")
                if r.action == "accept" and (r.dst_site, r.port) not in drops:
                    self.final([(f.id, f"{rp}")], f"{f.id} rule '{rt}': an accept without a drop "
                                                  f"rule for {r.dst_site}:{r.port} filters nothing (other ports stay open)")  # fmt: skip
                if r.port == OPEN_PORT:
                    self.final([(f.id, f"{rp}.port")], f"port {OPEN_PORT} is the rule set's open-port control and cannot be filtered")
                key2 = (r.src_site, r.dst_site, r.port, r.action)
                if key2 in seen:
                    self.final([(f.id, f"{rp}")], f"{f.id} rule '{rt}' is given twice")
                seen.add(key2)
        # floating IPs
        addrs: dict[str, str] = {}
        pool = ipaddress.ip_network(self.old.pools.floating4)
        for f in self.work.floating_ips:
            s = sites.get(f.site)
            if s is None:
                self.final([(f.id, "spec.site"), (f.site, "id")], f"floating_ip {f.id} maps {f.address} to site {f.site}, which would not "
                                                                  f"exist; delete or change {f.id} in the same change set")  # fmt: skip
                continue
            if not s.prefix4:
                self.final([(f.id, "spec.site"), (s.id, "spec.prefix4")], f"floating_ip {f.id}: site {s.id} has no IPv4 prefix to NAT to")
            if f.address != AUTO:
                ip = ipaddress.ip_address(f.address)
                if ip not in pool or ip in (pool.network_address, pool.broadcast_address):
                    self.final([(f.id, "spec.address")], f"{f.address} is outside the floating pool {pool} (pools.floating4)")
                if f.address in addrs:
                    self.final([(f.id, "spec.address")], f"{f.address} is already {addrs[f.address]}'s")
                elif f.address in self.unexplained.floating:
                    self.final([(f.id, "spec.address")], f"{f.address} is NATed on the border PE by state no service record explains")
                addrs[f.address] = f.id
            if ext is not None and s.prefix4:
                clash = [o for o in self.work.all_sites() if o.pe == ext.border_pe and o.prefix4 == s.prefix4 and o.id != s.id]
                if clash:
                    self.final([(f.id, "spec.site"), (s.id, "spec.prefix4"), *[(o.id, "spec.pe") for o in clash]],
                               f"floating_ip {f.id}: the border PE {ext.border_pe} has site {clash[0].id} with the same IPv4 prefix "
                               f"{s.prefix4} as {s.id}; the NATed traffic could not tell them apart")  # fmt: skip
        # tenants
        names: dict[str, str] = {}
        for t in self.work.tenants:
            if t.name in names:
                self.final([(t.id, "spec.name")], f"customer name {t.name!r} is already {names[t.name]}'s")
            names[t.name] = t.id


# -- validation scope ---------------------------------------------------------------------------------


def _service_nodes(sc: Scenario) -> dict[str, set[str]]:
    """Devices each service instance (invariant ``service``) has state on or is probed from."""
    out: dict[str, set[str]] = {}
    sites = {s.id: s for s in sc.all_sites()}
    for t in sc.tenants:
        nodes = set(t.dt6_functions) | {s.ce for s in t.sites} | {s.pe for s in t.sites}
        out[f"l3vpn/{t.id}"] = nodes
        out[f"firewall/{t.id}"] = set(nodes)
    for p in sc.steering:
        dst = sites.get(p.dst_site)
        out[f"steering/{p.id}"] = {p.ingress_pe, p.waypoint} | ({dst.pe, dst.ce} if dst else set()) | {
            s.ce for t in sc.tenants if t.id == p.tenant for s in t.sites if s.pe == p.ingress_pe}
    for f in sc.floating_ips:
        s = sites.get(f.site)
        out[f"floating_ip/{f.id}"] = ({s.pe, s.ce} if s else set()) | ({sc.external.border_pe, sc.external.host} if sc.external else set())
    return out


def _address_owners(sc: Scenario) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for s in sc.all_sites():
        for p in (s.prefix6, s.prefix4):
            if p and p != AUTO:
                out.setdefault(ce_addr(p, 2), set()).update({s.ce, s.pe})
    sites = {s.id: s for s in sc.all_sites()}
    for f in sc.floating_ips:
        s = sites.get(f.site)
        if s and sc.external:
            out.setdefault(f.address, set()).update({s.ce, s.pe, sc.external.border_pe})
    for r in sc.topology.routers:
        if r.node_id is not None:
            out.setdefault(str(a.loopback(r.node_id).ip), set()).add(r.name)
    return out


def footprint(inv: Invariant, service_nodes: dict[str, set[str]], owners: dict[str, set[str]]) -> set[str]:
    """Devices an invariant depends on: its service instance's devices, the node it reads, the
    node it probes from and the owners of the address it probes."""
    p = inv.params
    nodes = set(service_nodes.get(inv.service, set()))
    for k in ("node", "src"):
        if isinstance(p.get(k), str):
            nodes.add(p[k])
    if isinstance(p.get("dst"), str):
        nodes |= owners.get(p["dst"], set())
    return nodes


def changed_services(old: Scenario, new: Scenario) -> set[str]:
    """Service instances (invariant ``service`` names) whose records, or the records their device
    state is derived from, differ. (Invariants of other instances may still be sampled
    differently by the new inventory -- e.g. isolation checks against another tenant's new site:
    those instances are unchanged.)"""
    out: set[str] = set()

    def dump(x: Any) -> Any:
        return None if x is None else x.model_dump(mode="json")

    ot, nt = {t.id: t for t in old.tenants}, {t.id: t for t in new.tenants}
    out |= {f"l3vpn/{k}" for k in set(ot) | set(nt) if dump(ot.get(k)) != dump(nt.get(k))}
    osites = {s.id: s for s in old.all_sites()}
    nsites = {s.id: s for s in new.all_sites()}

    def site_changed(sid: str | None) -> bool:
        return sid is not None and dump(osites.get(sid)) != dump(nsites.get(sid))

    def dt6(sc_t: dict[str, Tenant], tid: str, pe: str | None) -> int | None:
        t = sc_t.get(tid)
        return t.dt6_functions.get(pe) if t and pe else None

    op_, np_ = {p.id: p for p in old.steering}, {p.id: p for p in new.steering}
    for k in set(op_) | set(np_):
        p = np_.get(k) or op_[k]
        dpe = (nsites.get(p.dst_site) or osites.get(p.dst_site))
        ingress = lambda sites, p=p: sorted(x.id for x in sites.values() if x.tenant == p.tenant and x.pe == p.ingress_pe)  # noqa: E731
        if (dump(op_.get(k)) != dump(np_.get(k)) or site_changed(p.dst_site) or ingress(osites) != ingress(nsites)
                or dt6(ot, p.tenant, dpe.pe if dpe else None) != dt6(nt, p.tenant, dpe.pe if dpe else None)):  # fmt: skip
            out.add(f"steering/{k}")
    of, nf = {f.id: f for f in old.floating_ips}, {f.id: f for f in new.floating_ips}
    out |= {f"floating_ip/{k}" for k in set(of) | set(nf)
            if dump(of.get(k)) != dump(nf.get(k)) or site_changed((nf.get(k) or of[k]).site)}  # fmt: skip
    ofw, nfw = {f.tenant: f for f in old.firewalls}, {f.tenant: f for f in new.firewalls}
    for t in set(ofw) | set(nfw):
        f = nfw.get(t) or ofw[t]
        if dump(ofw.get(t)) != dump(nfw.get(t)) or any(site_changed(r.dst_site) or site_changed(r.src_site) for r in f.rules):
            out.add(f"firewall/{t}")
    return out


def validation_scope(old: Scenario, new: Scenario, touched: set[str], changed: set[str]) -> list[Invariant]:
    """The invariants active validation checks (see module docstring, step 5)."""
    if not touched:
        return []
    new_nodes, old_nodes = _service_nodes(new), _service_nodes(old)
    new_owners, old_owners = _address_owners(new), _address_owners(old)
    out = [i for i in new.invariants if i.service in changed or footprint(i, new_nodes, new_owners) & touched]
    new_ids = {i.id for i in new.invariants}
    # an old invariant the new inventory no longer has is still a fact to keep only when its
    # instance is unchanged and merely sampled differently now (e.g. an isolation check against
    # another tenant's sites); an addressing invariant that disappears is a SID the change frees
    live = set(new_nodes)
    # ... but not one that speaks of a site the change removed or moved (its CE or addresses):
    # e.g. a firewall's open-port check sourced at a deleted site
    new_sites = {s.id: s for s in new.all_sites()}
    marks: set[str] = set()
    for s in old.all_sites():
        if new_sites.get(s.id) != s:
            marks.add(f'"{s.ce}"')
            marks |= {f'"{_host(p)}"' for p in (s.prefix6, s.prefix4) if p}
    out += [i for i in old.invariants
            if i.id not in new_ids and i.service not in changed and i.service in live
            and footprint(i, old_nodes, old_owners) & touched
            and not any(m in json.dumps(i.params) for m in marks)]  # fmt: skip
    return out


def _host(prefix: str) -> str:
    """The CE address of a site prefix (host 2, design of substrate.scenario.model)."""
    return str(ipaddress.ip_network(prefix).network_address + 2)


# -- drift (records vs devices) -----------------------------------------------------------------------


def _table_of(route: str) -> str | None:
    """The non-main table a canonical route lives in (``DST table N ...``), if any."""
    w = route_key(route).split()
    return w[w.index("table") + 1] if "table" in w and w.index("table") + 1 < len(w) else None


def _frr_stanzas(blocks: list[str]) -> dict[str, set[str]]:
    """FRR blocks (or a whole configuration) as ``{stanza head: {lines}}``; a top-level line
    without sub-lines is a head with no lines."""
    out: dict[str, set[str]] = {}
    head = ""
    for block in blocks:
        for raw in block.splitlines():
            line = raw.rstrip()
            if not line.strip() or line.strip() in ("!", "exit", "end"):
                continue
            if not line.startswith(" "):
                head = line.strip()
                out.setdefault(head, set())
            else:
                out.setdefault(head, set()).add(line.strip())
    return out


def underlay_frr(sc: Scenario, node: str) -> dict[str, set[str]]:
    """The FRR lines of ``node``'s underlay configuration (:func:`substrate.frr.render_router`),
    as stanzas: lines drift checks expect beside the services' own."""
    from substrate.frr import render_router

    try:
        return _frr_stanzas([render_router(sc.topology, node)])
    except (KeyError, ValueError):
        return {}


def drift(node: str, expected: NodeConfig, state: DeviceState, *, full: NodeConfig | None = None, frr: FrrView | None = None,
          underlay: dict[str, set[str]] | None = None) -> list[str]:  # fmt: skip
    """Differences between the records' rendering and a device, in both directions, compared in
    normalized form (:func:`substrate.journal.normalize_route`, ``normalize_nft_table``).

    Args:
        node: the device.
        expected: the part of the node's rendering to check (an instance's own items, or all).
        state: the device's kernel state.
        full: the node's whole rendering (default ``expected``): state it explains is not extra.
        frr: the device's FRR configuration, when read: FRR lines are checked too.
        underlay: the node's underlay FRR stanzas (:func:`underlay_frr`): not extra either.

    Returns:
        Lines ``<what> missing|differs: ...`` (the records have it, the device does not, or not
        so) and ``<what> extra: ...`` (the device has it where the records own the state -- a
        tenant table, a circuit port, a firewall table, an FRR stanza of theirs -- but no record
        explains it).
    """
    full = full or expected
    exp, whole = expected_state(node, expected), expected_state(node, full)
    out: list[str] = []
    for fam in (6, 4):
        cur = getattr(state, f"routes{fam}")
        have = {normalize_route(r) for r in cur}
        have_keys = {route_key(normalize_route(r)) for r in cur}
        for r in getattr(exp, f"routes{fam}"):
            if normalize_route(r) not in have:
                what = "differs" if route_key(r) in have_keys else "missing"
                out.append(f"route {what}: ip -{fam} route {r}")
        tables = {t for r in getattr(exp, f"routes{fam}") if (t := _table_of(r))}
        known = {normalize_route(r) for r in getattr(whole, f"routes{fam}")}
        known_keys = {route_key(normalize_route(r)) for r in getattr(whole, f"routes{fam}")}
        out += [f"route extra: ip -{fam} route {normalize_route(r)}" for r in cur
                if _table_of(r) in tables and normalize_route(r) not in known and route_key(normalize_route(r)) not in known_keys]  # fmt: skip
        have_rules = set(getattr(state, f"rules{fam}"))
        want_rules = getattr(exp, f"rules{fam}")
        out += [f"rule missing: ip -{fam} rule {r}" for r in want_rules if r not in have_rules]
        ports = {w[w.index("iif") + 1] for r in want_rules if "iif" in (w := r.split())}
        lookups = {w[w.index("lookup") + 1] for r in want_rules if "lookup" in (w := r.split())} - {"main", "local", "default"}
        all_rules = set(getattr(whole, f"rules{fam}"))
        for r in sorted(have_rules - all_rules):
            w = r.split()
            if ("iif" in w and w[w.index("iif") + 1] in ports) or ("lookup" in w and w[w.index("lookup") + 1] in lookups):
                out.append(f"rule extra: ip -{fam} rule {r}")
    have_addr = set(state.addresses)
    out += [f"address missing: {x}" for x in exp.addresses if x not in have_addr]
    ports = {x.split(" dev ")[-1] for x in exp.addresses}
    out += [f"address extra: {x}" for x in sorted(have_addr - set(whole.addresses)) if x.split(" dev ")[-1] in ports]
    tables = nft_tables(state.nft)
    for table, text in sorted(expected.nft.items()):
        if table not in tables:
            out.append(f"nft table missing: {table}")
            continue
        want, got = normalize_nft_table(text).splitlines(), normalize_nft_table(tables[table]).splitlines()
        out += [f"nft {table} missing: {ln}" for ln in want if ln not in got]
        out += [f"nft {table} extra: {ln}" for ln in got if ln not in want]
    if frr is not None:
        mine = _frr_stanzas(expected.frr)
        allowed = _frr_stanzas(full.frr)
        for head, lines in (underlay or {}).items():
            allowed.setdefault(head, set()).update(lines)
        for head, lines in sorted(mine.items()):
            for ln in sorted(lines):
                if not frr.has(head, ln):
                    out.append(f"FRR line missing: {head} / {ln}")
            out += [f"FRR line extra: {head} / {ln}" for ln in sorted(frr.stanzas.get(head, set()) - allowed.get(head, set()))]
    return out


# -- the plan -----------------------------------------------------------------------------------------


def plan(old: Scenario, ops: list[Any], found: Found, *, deleted_by: dict[str, str] | None = None) -> Plan:
    """Plan ``ops`` (parsed by :func:`servers.a3_intent.catalog.parse_ops`) against ``old``.

    Args:
        old: the current inventory, rendered (``node_config``) and with its invariants.
        ops: the operations.
        found: resources found on the devices (:func:`servers.a3_intent.inventory.scan`).
        deleted_by: instance id -> change that deleted it (a repeated delete is no change).

    Raises:
        ChangeSetRejected: every problem, with field paths.
    """
    pl = _Planner(old, found, deleted_by or {})
    pl.run(ops)
    if not pl.problems:
        pl.allocate()
    if not pl.problems:
        pl.integrity()
    if pl.problems:
        seen: set[tuple[str, str]] = set()
        raise ChangeSetRejected([x for x in pl.problems if not ((x.path, x.message) in seen or seen.add((x.path, x.message)))])  # type: ignore[func-returns-value]
    new = pl.work
    if records_of(new) != records_of(old):
        new.spares = spare_circuits(new)
    try:
        new.node_config = render_scenario(new)
        new_invs = scenario_invariants(new)
    except (GenerationError, KeyError, AssertionError, ValueError, IndexError) as e:
        raise ChangeSetRejected([Problem(path="ops", message=f"the change set leaves an inventory the service layers cannot render: "
                                                              f"{type(e).__name__}: {e}")]) from None  # fmt: skip
    new.invariants = new_invs
    deltas: dict[str, ConfigDelta] = {}
    try:
        for node in sorted(set(old.node_config) | set(new.node_config), key=natural_key):
            d = config_delta(node, old.node_config.get(node), new.node_config.get(node))
            if not d.empty():
                deltas[node] = d
    except SubstrateError as e:
        raise ChangeSetRejected([Problem(path="ops", message=f"cannot express the change as device commands: {e}")]) from None
    changed = changed_services(old, new)
    scope = validation_scope(old, new, set(deltas), changed)
    return Plan(old=old, new=new, ops=pl.results, deltas=deltas, changed_services=sorted(changed, key=natural_key),
                invariants=scope, warnings=list(pl.warnings), digest=digest_of(ops))  # fmt: skip


def drift_warnings(sc: Scenario, nodes: list[str], states: dict[str, DeviceState], frr: dict[str, FrrView]) -> list[str]:
    """One warning per node of ``nodes`` whose device differs from the records' rendering
    (:func:`drift`, both directions; FRR lines where ``frr`` has the node's configuration)."""
    out = []
    for node in nodes:
        if node not in states:
            continue
        lines = drift(node, sc.node_config.get(node) or NodeConfig(), states[node], frr=frr.get(node), underlay=underlay_frr(sc, node))
        if lines:
            more = f" (and {len(lines) - DRIFT_LINES} more)" if len(lines) > DRIFT_LINES else ""
            out.append(f"{node} differs from the service records (changed outside A3-T?): " + "; ".join(lines[:DRIFT_LINES]) + more)
    return out




