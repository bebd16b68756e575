"""Planning a change set (pure: no I/O): validate, allocate, render, diff, scope the validation.

:func:`plan` takes the current inventory (a :class:`~substrate.scenario.model.Scenario` whose
service records are the scenario's plus A3-T's committed changes), the parsed operations and
the resources found on the devices, and returns a :class:`Plan`:

1. each operation is applied to the inventory as the previous operations left it by its
   catalog class (:class:`substrate.scenario.layers.base.Intent`, owned by a service class
   module), which checks it (the instance exists or not, its references resolve, the attachment
   circuit is a free circuit of that PE, prefixes come from the pools, nothing the devices hold
   collides with it) -- every problem is collected with its field path
   (``ops[2].spec.pe_interface: ...``); classes then adjust instances bound to deleted sites;
2. every service class allocates what its operations left pending (``allocate``), in registry
   order, from the scenario's pools through
   :class:`~substrate.scenario.layers.addressing.Ipam` (lowest free first, as the generator and
   the task variants do), never picking one the records or the devices already use (l3vpn:
   tables of new tenants, ``auto`` prefixes, End.DX4 functions of moved then new IPv4 sites,
   End.DT6 functions of tenants on new PEs; steering: waypoint End functions; floating_ip:
   addresses and marks);
3. every service class checks the final inventory as a whole (``integrity``: references, one
   prefix per PE, no overlap within a tenant, its own constraints), each problem blamed on the
   last operation that touched one of the instances involved;
4. the old and new inventories are rendered by the layers' own ``render`` functions
   (:func:`substrate.scenario.generator.render_scenario`) and each node's difference is a
   :class:`~substrate.scenario.apply.ConfigDelta` -- exactly the commands that turn one
   rendering into the other;
5. the invariants to check after applying (active validation) are those of the new inventory
   (the layers' ``invariants`` functions) for every service instance that changed (each class's
   ``changed``) or that has state on, or is probed through, a touched device (``service_nodes``,
   ``address_owners``), plus pre-existing invariants of unchanged
   instances on those devices that the new inventory would sample differently.

Raises :class:`~servers.a3_intent.catalog.ChangeSetRejected` with every problem found.
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from servers.a3_intent.catalog import INTENTS, ChangeSetRejected, Problem, natural_key
from servers.a3_intent.inventory import Found, expected_found, expected_state
from substrate.devstate import FRR_NOISE, LINK_ATTRS, DeviceState, LinkState, link_attrs, neigh_key
from substrate.errors import SubstrateError
from substrate.journal import FrrView, ingress_qdisc, nexthop_key, nft_blocks, nft_tables, normalize_route, root_qdisc
from substrate.routes import route_key
from substrate.scenario.apply import ConfigDelta, config_delta, frr_lines
from substrate.scenario.generator import render_scenario, scenario_invariants
from substrate.scenario.layers.addressing import Ipam
from substrate.scenario.layers.base import GenerationError, intents, registry
from substrate.scenario.model import Invariant, NodeConfig, Scenario, Site, Tenant
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
    #: a drift repair: drives devices back to ``new``'s rendering, the records unchanged
    repair: bool = False

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
    return [x.id for it in intents() if not it.read_only for x in it.instances(sc)]


def record_fields(sc: Scenario) -> list[str]:
    """The Scenario fields holding the records change sets change: the ``records`` of every
    class the scenario has (a layer of its manifest)."""
    return [f for c in registry() if c.name in sc.layers for f in c.records]


def records_of(sc: Scenario) -> dict[str, Any]:
    """The service records that change sets change (derived ones, e.g. spare circuits, excluded)."""
    return {k: sc.model_dump(mode="json", include={k})[k] for k in record_fields(sc)}


def digest_of(ops: list[Any]) -> str:
    """SHA-256 of a change set's canonical JSON."""
    text = json.dumps([o.model_dump(mode="json") for o in ops], sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


class _Planner:
    """The planner context of the service classes' hooks (:class:`substrate.scenario.layers.base.PlanContext`)."""

    def __init__(self, old: Scenario, found: Found, deleted_by: dict[str, str]):
        self.old = old
        self.work = old.model_copy(deep=True)
        self.found = found
        self.unexplained = found.minus(expected_found(old))
        self.deleted_by = deleted_by
        self.problems: list[Problem] = []
        self.results: list[OpResult] = []
        self.touch: dict[str, tuple[int, str]] = {}  # instance id -> (op index, op)
        self.pes = [n.name for n in old.topology.routers if n.role is Role.PE]
        self.routers = [n.name for n in old.topology.routers]
        self.warnings: list[str] = []
        #: instances deleted earlier in this change set, by id: a create of the same id (with a
        #: compatible spec) takes their allocations back instead of allocating anew
        self.gone: dict[str, Any] = {}
        self.gone_sites: dict[str, tuple[Site, OpResult]] = {}
        #: the service classes' own bookkeeping (pending allocations, ...), by key
        self._pending: dict[str, Any] = {}
        self.circuits: dict[Any, Any] = {}

    # -- helpers --------------------------------------------------------------------------------

    def pending(self, key: str, factory: Callable[[], Any] = list) -> Any:
        """A class's scratch space in this plan (pending allocations, ...), made by ``factory`` on first use."""
        if key not in self._pending:
            self._pending[key] = factory()
        return self._pending[key]

    def bad(self, path: str, message: str) -> None:
        self.problems.append(Problem(path=path, message=message))

    def exhausted(self, i: int, fld: str, e: GenerationError) -> None:
        """A pool ran dry allocating for operation ``i``."""
        self.bad(f"ops[{i}].{fld}", f"pool exhausted: {e}")

    def tenants(self) -> dict[str, Tenant]:
        return {t.id: t for t in self.work.tenants}

    def sites(self) -> dict[str, Site]:
        return {s.id: s for t in self.work.tenants for s in t.sites}

    def ids(self) -> dict[str, str]:
        """Every instance id of the working inventory -> its catalog class."""
        return {x.id: it.name for it in intents() if not it.read_only for x in it.instances(self.work)}

    def known(self, what: str, items: list[str]) -> str:
        items = sorted(items, key=natural_key)
        shown = ", ".join(items[:20]) + (f", ... ({len(items)} in all)" if len(items) > 20 else "")
        return f"{what}: {shown}" if items else f"there are no {what}"

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
        for c in registry():
            c.prepare(self, ops)
        for i, op in enumerate(ops):
            INTENTS[op.service_class].apply(self, i, op)
        self._sites_gone()
        for c in registry():
            c.after_ops(self)

    def _sites_gone(self) -> None:
        """Instances bound to a site this change set deleted are adjusted by their classes
        (``site_gone``) -- unless the change set created the site again (delete-and-recreate
        keeps every reference)."""
        sites = self.sites()
        for sid, (_site, res) in self.gone_sites.items():
            if sid in sites:
                continue
            for c in registry():
                for iid, notes in c.site_gone(self.work, sid):
                    res.notes += notes
                    self.touch[iid] = (res.index, "delete")

    # -- allocation --------------------------------------------------------------------------

    def ipam(self) -> Ipam:
        ipam = Ipam.from_scenario(self.old)
        cur = Ipam.from_scenario(self.work)
        ipam.used6 |= cur.used6
        ipam.used4 |= cur.used4
        for pool in Ipam.NUMBERED:  # the pools whose resources the devices show too
            getattr(ipam, pool).update(getattr(cur, pool) | getattr(self.found, pool))
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
        """Every class allocates what its operations left pending, in registry order, from one
        :class:`Ipam` over the scenario's pools, the records and the devices."""
        ipam = self.ipam()
        for c in registry():
            c.allocate(self, ipam)

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

    def final(self, refs: list[tuple[str, str]], message: str) -> None:
        path = self.blame(refs)
        if path is not None:
            self.bad(path, message)

    def integrity(self) -> None:
        """Checks of the final inventory: each class's ``integrity`` in registry order, each
        problem blamed on the last operation involved."""
        for c in registry():
            c.integrity(self)


# -- validation scope ---------------------------------------------------------------------------------


def _service_nodes(sc: Scenario) -> dict[str, set[str]]:
    """Devices each service instance (invariant ``service``) has state on or is probed from."""
    out: dict[str, set[str]] = {}
    for c in registry():
        c.service_nodes(sc, out)
    return out


def _address_owners(sc: Scenario) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for c in registry():
        c.address_owners(sc, out)
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
    state is derived from, differ (each class's ``changed``). (Invariants of other instances may
    still be sampled differently by the new inventory -- e.g. isolation checks against another
    tenant's new site: those instances are unchanged.)"""
    out: set[str] = set()
    for c in registry():
        out |= c.changed(old, new)
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
            if not line.strip() or line.strip() in FRR_NOISE:
                continue
            if not line.startswith(" "):
                head = line.strip()
                out.setdefault(head, set())
            else:
                out.setdefault(head, set()).add(line.strip())
    return out


def nft_table_drift(want: str, got: str) -> list[str]:
    """How an nftables table on a device (``got``, ``nft list ruleset`` form) differs from the
    rendering's (``want``), block by block (:func:`substrate.journal.nft_blocks`): a block missing or extra, and
    within a block the body compared as a sequence (nft(8): rules are evaluated in order, first
    match wins), so an extra copy of a rule, a rule inserted ahead of another or a reordering is
    drift, not only a line of a new text. Blocks are matched by head: the order of chains in the
    listing (creation order) is not drift.

    Returns:
        Lines ``missing: <block head> / <line>`` and ``extra: <block head> / <line>`` (a missing
        or extra block: its head alone), in block order.
    """
    import difflib

    w, g = nft_blocks(want), nft_blocks(got)
    out: list[str] = []
    for head in list(w) + [h for h in g if h not in w]:
        a, b = w.get(head), g.get(head)
        if a is None:
            out.append(f"extra: {head}" if b else "")
            continue
        if b is None:
            out.append(f"missing: {head}" if head else "")
            b = []
        where = f"{head} / " if head else ""
        for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(a=a, b=b, autojunk=False).get_opcodes():
            if tag in ("delete", "replace"):
                out += [f"missing: {where}{ln}" for ln in a[i1:i2]]
            if tag in ("insert", "replace"):
                out += [f"extra: {where}{ln}" for ln in b[j1:j2]]
    return [x for x in out if x]


def underlay_frr(sc: Scenario, node: str) -> dict[str, set[str]]:
    """The FRR lines of ``node``'s underlay configuration (:func:`substrate.frr.render_router`),
    as stanzas: lines drift checks expect beside the services' own."""
    from substrate.frr import render_router

    try:
        return _frr_stanzas([render_router(sc.topology, node)])
    except (KeyError, ValueError):
        return {}


def underlay_as_shown(rendered: dict[str, set[str]], baseline: FrrView | None, services: dict[str, set[str]]) -> dict[str, set[str]]:
    """The underlay stanzas of a router as its FRR shows them: FRR does not print a default
    (``isis metric 10``, ``metric-style wide``) and merges some commands (``lsp-gen-interval 1``
    becomes ``lsp-timers gen-interval 1 ...``), so the rendering (:func:`underlay_frr`) cannot be
    compared line by line. Per stanza head of ``rendered``: the lines ``baseline`` (the device's
    configuration when the lab was put at its scenario baseline, every invariant verified) shows
    there, less those of the baseline's service rendering ``services`` (a service line of the
    baseline may since have been deleted by a record). A head the baseline lacks, or no
    baseline: the rendered lines."""
    out: dict[str, set[str]] = {}
    for head, lines in rendered.items():
        if baseline is not None and head in baseline.stanzas:
            out[head] = set(baseline.stanzas[head]) - services.get(head, set())
        else:
            out[head] = set(lines)
    return out


def underlay_ports(sc: Scenario, node: str) -> list[str]:
    """The ports of ``node``'s underlay the substrate brings up (:meth:`substrate.topology.Topology.links_of`):
    every link end of the node, core and access alike."""
    try:
        return [lk.endpoint_of(node).interface for lk in sc.topology.links_of(node)]
    except (KeyError, ValueError):
        return []


def drift(node: str, expected: NodeConfig, state: DeviceState, *, full: NodeConfig | None = None, frr: FrrView | None = None,
          underlay: dict[str, set[str]] | None = None, own_underlay: bool = False,
          underlay_links: list[str] | None = None) -> list[str]:  # fmt: skip
    """Differences between the records' rendering and a device, in both directions, compared in
    normalized form (:func:`substrate.journal.normalize_route`, ``normalize_nft_table``).

    Args:
        node: the device.
        expected: the part of the node's rendering to check (an instance's own items, or all).
        state: the device's kernel state.
        full: the node's whole rendering (default ``expected``): state it explains is not extra.
        frr: the device's FRR configuration, when read: FRR lines are checked too.
        underlay: the node's underlay FRR stanzas (:func:`underlay_frr`): not extra either.
        own_underlay: the underlay is checked too, as the reconciler owns it (issue 13: drift is
            everything the rendering owns): an underlay FRR line missing, a line of an underlay
            stanza that neither the underlay nor the services explain (extra), and a port of
            ``underlay_links`` found down.
        underlay_links: the node's underlay ports (:func:`underlay_ports`), with ``own_underlay``.

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
    # a port the rendering brings up, found down (``ip link set IF down`` out of band)
    out += [f"link down: {dev}" for dev in expected.links_up if dev in state.links and not state.links[dev].up]
    have_addr = set(state.addresses)
    out += [f"address missing: {x}" for x in exp.addresses if x not in have_addr]
    ports = {x.split(" dev ")[-1] for x in exp.addresses}
    out += [f"address extra: {x}" for x in sorted(have_addr - set(whole.addresses)) if x.split(" dev ")[-1] in ports]
    tables = nft_tables(state.nft)
    for table, text in sorted(expected.nft.items()):
        if table not in tables:
            out.append(f"nft table missing: {table}")
            continue
        out += [f"nft {table} {ln}" for ln in nft_table_drift(text, tables[table])]
    for dev, v in sorted(expected.qdiscs.items()):
        now = root_qdisc(state, dev)
        if now != v:
            out.append(f"qdisc {'differs' if now else 'missing'}: {dev} root {v}" + (f" (device: {now})" if now else ""))
    for key, v in sorted(expected.sysctls.items()):
        now = state.sysctls.get(key)  # None: not read by this capture
        if now is not None and now != v:
            out.append(f"sysctl differs: {key} = {v} (device: {now})")
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
        if own_underlay:
            for head, lines in sorted((underlay or {}).items()):
                out += [f"FRR line missing: {head} / {ln}" for ln in sorted(lines) if not frr.has(head, ln)]
                if head not in mine:
                    out += [f"FRR line extra: {head} / {ln}" for ln in sorted(frr.stanzas.get(head, set()) - allowed.get(head, set()))]
    if own_underlay:
        out += [f"link down: {dev}" for dev in underlay_links or [] if dev in state.links and not state.links[dev].up
                and dev not in expected.links_up]  # fmt: skip
    return out


@dataclass
class Underlay:
    """What a device holds that no service record renders: the part of its baseline (the state the
    lab was put in from its scenario, every invariant verified) outside the baseline's service
    rendering (:func:`underlay_of`). What :func:`foreign` accepts beside the records' rendering."""

    #: route keys (:func:`substrate.routes.route_key`) of every table (tenant tables' service routes left out), per family
    routes: dict[int, set[str]] = field(default_factory=dict)
    #: ``rule add`` arguments, per family
    rules: dict[int, set[str]] = field(default_factory=dict)
    #: global addresses (``ADDR/LEN dev IF ...``)
    addresses: set[str] = field(default_factory=set)
    #: nftables tables (``"FAMILY NAME"``)
    nft_tables: set[str] = field(default_factory=set)
    #: FRR top-level lines and stanza heads
    frr_heads: set[str] = field(default_factory=set)
    #: port -> MTU
    mtu: dict[str, int] = field(default_factory=dict)
    #: every device and its settable attributes, as the baseline had them
    links: dict[str, LinkState] = field(default_factory=dict)
    #: route key -> the route (normalized), per family, of every table: compared whole (issue 35: the
    #: locator's End SID replaced by a plain End, or deleted, was not drift; a blackhole in the
    #: local table was not seen)
    route_lines: dict[int, dict[str, str]] = field(default_factory=dict)
    #: sysctl path -> value (global and per-interface), the services' own left out (:func:`drift` has them)
    sysctls: dict[str, str] = field(default_factory=dict)
    #: the SRv6 encapsulation source (``ip sr tunsrc``), None: not read
    tunsrc: str | None = None
    #: the routes the kernel made from addresses and links (``-4|-6 ROUTE``, proto kernel), as the baseline had them
    kernel_routes: set[str] = field(default_factory=set)
    #: link-local and loopback addresses (``ADDR/LEN dev IF ...``), as the baseline had them
    host_addresses: set[str] = field(default_factory=set)
    #: static neighbour entries (permanent, no-ARP, proxy): key (:func:`substrate.devstate.neigh_key`) -> ``neigh replace`` arguments
    neighbors: dict[str, str] = field(default_factory=dict)
    #: nexthop objects not zebra's: ``id N`` -> ``nexthop add`` arguments
    nexthops: dict[str, str] = field(default_factory=dict)
    #: per device, its root qdisc (:func:`substrate.journal.root_qdisc`, None: the default) where
    #: no service of the baseline set one, and its ingress-side qdisc (None: none)
    root_qdiscs: dict[str, str | None] = field(default_factory=dict)
    ingress: dict[str, str | None] = field(default_factory=dict)
    #: state no repair sets, as the baseline had it: what -> its comparable text (see :data:`REPORTED_ONLY`)
    reported: dict[str, str] = field(default_factory=dict)


#: Device state :func:`foreign` reports when it differs from the baseline and no repair undoes (no
#: service renders any, no ANI writes it but a shell): ``DeviceState`` field -> what it is.
REPORTED_ONLY = {"hmac": "SRv6 HMAC keys", "net_objects": "address labels, static multicast addresses or MPTCP endpoints",
                 "xtables": "legacy iptables rules", "xfrm": "IPsec (XFRM) state"}  # fmt: skip


def _reported_text(state: DeviceState, what: str) -> str:
    v = getattr(state, what)
    return "\n".join(sorted(v)) if isinstance(v, list) else v


def _family(address: str) -> int:
    return 6 if ":" in address else 4


def underlay_of(baseline: DeviceState, services: NodeConfig | None, frr: FrrView | None) -> Underlay:
    """The :class:`Underlay` of a node from its baseline capture ``baseline`` (with ``frr``, its FRR
    configuration then) less what the baseline's service rendering ``services`` put there (a
    service object of the baseline may since have been deleted by a record)."""
    svc = expected_state(baseline.node, services or NodeConfig())
    out = Underlay()
    for fam in (6, 4):
        mine = {route_key(normalize_route(r)) for r in getattr(svc, f"routes{fam}")}
        out.route_lines[fam] = {k: n for r in getattr(baseline, f"routes{fam}")
                                if (k := route_key(n := normalize_route(r))) not in mine}  # fmt: skip
        out.routes[fam] = set(out.route_lines[fam])
        out.rules[fam] = set(getattr(baseline, f"rules{fam}")) - set(getattr(svc, f"rules{fam}"))
    out.addresses = set(baseline.addresses) - set(svc.addresses)
    out.nft_tables = set(nft_tables(baseline.nft)) - set((services or NodeConfig()).nft)
    if frr is not None:
        out.frr_heads = set(frr.stanzas) - set(_frr_stanzas((services or NodeConfig()).frr))
    out.mtu = {dev: ln.mtu for dev, ln in baseline.links.items()}
    out.links = dict(baseline.links)
    rendered = set((services or NodeConfig()).sysctls)
    out.sysctls = {k: v for k, v in {**baseline.sysctls, **baseline.iface_sysctls}.items() if k not in rendered}
    out.tunsrc = baseline.tunsrc
    out.kernel_routes = set(baseline.kernel_routes)
    out.host_addresses = set(baseline.host_addresses)
    out.neighbors = {neigh_key(n): n for n in baseline.neighbors}
    out.nexthops = {nexthop_key(n): n for n in baseline.nexthops}
    rendered_qdiscs = set((services or NodeConfig()).qdiscs)
    out.root_qdiscs = {dev: root_qdisc(baseline, dev) for dev in baseline.links if dev not in rendered_qdiscs}
    out.ingress = {dev: ingress_qdisc(baseline, dev) for dev in baseline.links}
    out.reported = {what: _reported_text(baseline, what) for what in REPORTED_ONLY}
    return out


def _derived_sysctl(path: str) -> bool:
    """A sysctl the kernel sets from other state, compared there: a port's IPv6 MTU follows its
    link MTU (``link differs``; writing the old value first would fail while the link MTU is lower)."""
    return path.startswith("net/ipv6/conf/") and path.endswith("/mtu")


def foreign(node: str, full: NodeConfig, state: DeviceState, under: Underlay, *, frr: FrrView | None = None,
            ports: list[str] | None = None, exempt_nft: Callable[[str, dict[str, list[str]]], str | None] | None = None,
            exempt_route: Callable[[str], bool] | None = None, underlay_heads: set[str] | None = None) -> list[str]:  # fmt: skip
    """What a device holds that neither its rendering ``full`` nor its :class:`Underlay` explains: the
    reconciler owns the whole device (issue 13), not only what the records render (:func:`drift`
    compares those). Found: an nftables table, a policy-routing rule, a route of the main table, a
    global address (on any port, lo included), an FRR top-level line or stanza, and an MTU of one of
    ``ports`` other than its baseline's.

    Args:
        exempt_nft: ``(table, blocks) -> owner or None``: a table put there on purpose below the
            ANI (the observer's probe table, a fault's), judged by its content (:func:`substrate.journal.nft_blocks`).
        exempt_route: a route (canonical form) put there on purpose (a fault's, by its protocol).
        underlay_heads: FRR heads of the underlay rendering (:func:`underlay_frr`), also not foreign.

    Returns:
        Lines ``nft table extra: T``, ``rule extra: ip -F rule R``, ``route extra: ip -F route R``,
        ``address extra: A``, ``FRR stanza extra: HEAD``, ``link differs: DEV mtu N (baseline M)``
        (a port's) and ``link differs: DEV ATTR V (baseline W)`` for any device's
        :data:`substrate.devstate.LINK_ATTRS` (``arp off``, a MAC, a master), ``link extra: DEV``
        (a device the baseline did not have: reported, not deleted);
        and, against the baseline's underlay (issue 35), ``route missing|differs: ip -F route R`` (R
        as the baseline had it: the locator's End SID), ``sysctl differs: PATH = V (baseline W)``
        (global or a port's) and ``tunsrc differs: A (baseline B)``; ``neighbor extra|missing|differs:
        ip -F neigh ARGS`` (a static entry), ``nexthop extra|missing|differs: ip nexthop ARGS``,
        ``root qdisc differs: DEV NOW (baseline B)`` (a device no service shapes) and ``ingress qdisc
        differs: DEV NOW (baseline B)`` (``default``/``none`` for no qdisc): :func:`repair_delta`
        undoes each. ``state differs from the baseline (no repair undoes it): WHAT`` for
        :data:`REPORTED_ONLY`: reported, left alone.
    """
    whole = expected_state(node, full)
    out: list[str] = []
    for table, text in sorted(nft_tables(state.nft).items()):
        if table in full.nft or table in under.nft_tables:
            continue
        if exempt_nft is not None and exempt_nft(table, nft_blocks(text)):
            continue
        out.append(f"nft table extra: {table}")
    for fam in (6, 4):
        known = set(getattr(whole, f"rules{fam}")) | under.rules.get(fam, set())
        out += [f"rule extra: ip -{fam} rule {r}" for r in getattr(state, f"rules{fam}") if r not in known]
        keys = {route_key(normalize_route(r)) for r in getattr(whole, f"routes{fam}")} | under.routes.get(fam, set())
        # the tables the records render routes in: drift() judges every route there
        tenant_tables = {t for r in getattr(whole, f"routes{fam}") if (t := _table_of(r))}
        now: dict[str, str] = {}
        for r in getattr(state, f"routes{fam}"):
            n = normalize_route(r)
            if _table_of(n) in tenant_tables:
                continue
            now[route_key(n)] = n
            if route_key(n) not in keys and not (exempt_route and exempt_route(n)):
                out.append(f"route extra: ip -{fam} route {n}")
        rendered = {route_key(normalize_route(r)) for r in getattr(whole, f"routes{fam}")}
        for k, want in sorted(under.route_lines.get(fam, {}).items()):
            if k in rendered or _table_of(want) in tenant_tables:  # a record renders it now: drift() compares it
                continue
            if k not in now:
                out.append(f"route missing: ip -{fam} route {want}")
            elif now[k] != want:
                out.append(f"route differs: ip -{fam} route {want}")
    out += [f"address extra: {a}" for a in sorted(set(state.addresses) - set(whole.addresses) - under.addresses)]
    # a link-local or loopback address of the baseline gone from a device that is up (IS-IS
    # speaks from the link-local one: its adjacency went down, issue 35)
    out += [f"address missing: {a}" for a in sorted(under.host_addresses - set(state.host_addresses))
            if (ln := state.links.get(a.split(" dev ")[-1].split()[0])) is not None and ln.up]  # fmt: skip
    if frr is not None:
        heads = set(_frr_stanzas(full.frr)) | under.frr_heads | (underlay_heads or set())
        for h in sorted(frr.stanzas):
            if h in heads:
                continue
            if h.startswith("interface "):  # FRR refuses to delete a live interface: its lines are negated
                out += [f"FRR line extra: {h} / {ln}" for ln in sorted(frr.stanzas[h])]
            else:
                out.append(f"FRR stanza extra: {h}")
    for dev in ports or []:
        ln, base = state.links.get(dev), under.mtu.get(dev)
        if ln is not None and base is not None and ln.mtu != base:
            out.append(f"link differs: {dev} mtu {ln.mtu} (baseline {base})")
    if under.links:  # an Underlay made from a baseline
        for dev, ln in sorted(state.links.items(), key=lambda x: natural_key(x[0])):
            base_ln = under.links.get(dev)
            if base_ln is None:
                out.append(f"link extra: {dev} (a {ln.kind or 'device'} the baseline did not have; no repair deletes a device)")
                continue
            have, want = link_attrs(ln), link_attrs(base_ln)
            out += [f"link differs: {dev} {a} {have.get(a) or 'none'} (baseline {want[a] or 'none'})"
                    for a in LINK_ATTRS if a in want and have.get(a) != want[a]]  # fmt: skip
    if under.sysctls:
        values = {**state.sysctls, **state.iface_sysctls}
        mine = set(full.sysctls)
        out += [f"sysctl differs: {k} = {values[k]} (baseline {v})" for k, v in sorted(under.sysctls.items())
                if k not in mine and k in values and values[k] != v and not _derived_sysctl(k)]  # fmt: skip
    if under.tunsrc is not None and (state.tunsrc or "::") != (under.tunsrc or "::"):
        out.append(f"tunsrc differs: {state.tunsrc or '::'} (baseline {under.tunsrc or '::'})")
    if under.reported:  # an Underlay made from a baseline (every field read)
        out += _objects_foreign(state, under, full)
        out += _kernel_routes_foreign(state, under)
    return out


def _host_form(dst: str) -> str:
    """A route destination as :func:`_kernel_routes_foreign` compares it: a host prefix (``/32``,
    ``/128``, as the capture writes a ``local`` or ``broadcast`` route) as its bare address, a
    network in its canonical text."""
    try:
        net = ipaddress.ip_network(dst, strict=False)
    except ValueError:
        return dst
    return str(net.network_address) if net.prefixlen == net.max_prefixlen else str(net)


def _kernel_routes_foreign(state: DeviceState, under: Underlay) -> list[str]:
    """Routes with the kernel's protocol (``proto kernel``) that neither the baseline had nor an
    address now on their device makes, and (``route missing``) those of the baseline that an
    address still there makes but that are gone (``ip route del local A table local``: the
    router stopped answering for its own address) (issue 35, the reconciler attack: ``ip route add blackhole
    P proto kernel`` hid a route as the kernel's own). An address ``A/L`` on ``D`` makes its
    prefix route ``P dev D`` (none for a /128 or /32, RFC 4291 and the kernel's addrconf), in
    table local ``local A``, ``anycast P`` (IPv6, the subnet-router anycast of RFC 4291
    section 2.6.1) and ``broadcast B`` (IPv4); every IPv6 device gets ``fe80::/64`` and
    ``multicast ff00::/8``. Lines ``route extra: ip -F route ROUTE``."""
    made: set[tuple[str, str, str]] = set()
    for a in [*state.addresses, *state.host_addresses]:
        w = a.split()
        if "dev" not in w:
            continue
        dev = w[w.index("dev") + 1]
        try:
            iface = ipaddress.ip_interface(w[0])
        except ValueError:
            continue
        net = iface.network
        made.add(("local", str(iface.ip), dev))
        if net.prefixlen < net.max_prefixlen:
            made.add(("unicast", str(net), dev))
            made.add(("anycast" if net.version == 6 else "broadcast", str(net.network_address if net.version == 6 else net.broadcast_address), dev))
        if net.version == 6:
            made |= {("unicast", "fe80::/64", dev), ("multicast", "ff00::/8", dev)}
    out = []
    # one the kernel made, gone while its address is still there (compared by type, destination and
    # device: put back by hand, an IPv6 local route gets metric 1024, the kernel's own has 0)
    have = {(r.split()[0], _kernel_route_id(r.split()[1:])) for r in state.kernel_routes}
    for r in sorted(under.kernel_routes):
        w = r.split()
        # not an anycast or multicast one: the kernel keeps an IPv6 subnet-router anycast only while
        # forwarding is on (a sysctl: drift of its own), and multicast routes with the device's IPv6
        if (w[0], ident := _kernel_route_id(w[1:])) not in have and ident in made and ident[0] not in ("anycast", "multicast"):
            out.append(f"route missing: ip {w[0]} route {' '.join(w[1:])}")
    for r in state.kernel_routes:
        if r in under.kernel_routes:
            continue
        w = r.split()
        fam, words = w[0], w[1:]
        if "via" in words or _kernel_route_id(words) not in made:
            out.append(f"route extra: ip {fam} route {' '.join(words)}")
    return sorted(out)


def _kernel_route_id(words: list[str]) -> tuple[str, str, str]:
    """(type, destination in :func:`_host_form`, device) of a route's words (without the family)."""
    kind = words[0] if words and words[0] in ("local", "anycast", "broadcast", "multicast", "blackhole", "unreachable",
                                              "prohibit", "throw", "unicast") else "unicast"  # fmt: skip
    dst = _host_form(words[1] if kind != "unicast" or words[0] == "unicast" else words[0])
    return kind, dst, words[words.index("dev") + 1] if "dev" in words else ""


def _objects_foreign(state: DeviceState, under: Underlay, full: NodeConfig) -> list[str]:
    """:func:`foreign`'s lines for the objects no service renders: static neighbours, nexthop
    objects, qdiscs outside the rendering's, and :data:`REPORTED_ONLY` (issue 35: a permanent
    neighbour entry or a clsact on a customer port was not drift)."""
    out: list[str] = []

    def compare(what: str, have: dict[str, str], want: dict[str, str], prefix: Callable[[str], str]) -> None:
        for k in sorted(set(have) | set(want), key=natural_key):
            h, w = have.get(k), want.get(k)
            if h != w:
                kind = "extra" if w is None else "missing" if h is None else "differs"
                out.append(f"{what} {kind}: {prefix(k)}{w if w is not None else h}" + (f" (device: {h})" if kind == "differs" else ""))

    compare("neighbor", {neigh_key(n): n for n in state.neighbors}, under.neighbors,
            lambda k: f"ip -{_family(k.split()[1] if k.startswith('proxy ') else k.split()[0])} neigh ")
    compare("nexthop", {nexthop_key(n): n for n in state.nexthops}, under.nexthops, lambda k: "ip nexthop ")
    devs = sorted(set(state.links) | set(under.root_qdiscs) | set(under.ingress), key=natural_key)
    for dev in devs:
        if dev not in full.qdiscs and dev in under.root_qdiscs and (now := root_qdisc(state, dev)) != under.root_qdiscs[dev]:
            out.append(f"root qdisc differs: {dev} {now or 'default'} (baseline {under.root_qdiscs[dev] or 'default'})")
        if (now := ingress_qdisc(state, dev)) != under.ingress.get(dev):
            out.append(f"ingress qdisc differs: {dev} {now or 'none'} (baseline {under.ingress.get(dev) or 'none'})")
    out += [f"state differs from the baseline (no repair undoes it): {REPORTED_ONLY[what]}"
            for what, was in under.reported.items() if _reported_text(state, what) != was]  # fmt: skip
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
        for c in registry():
            c.derive(new)
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


def repair_delta(node: str, cfg: NodeConfig, lines: list[str]) -> ConfigDelta:
    """The commands that drive ``node`` back to its rendering ``cfg`` from the drift ``lines``
    :func:`drift` found there (a reconciler's self-heal, issue 13): a missing or differing route,
    rule or address is (re)added, an extra one removed, a differing nftables table or root qdisc
    set to the rendering's, a port found down set up, a differing sysctl set to the rendering's value, a missing FRR
    line added and an extra one negated. Lines this does
    not know are left alone (reported by :func:`drift` still).
    """
    d = ConfigDelta(node=node)
    for line in lines:
        what, _, rest = line.partition(": ")
        if what in ("route missing", "route differs") and rest.startswith("ip -"):
            fam, route = rest[4], rest.split(" route ", 1)[1]
            d.additions.append(f"-{fam} route replace {route}")
        elif what == "route extra" and rest.startswith("ip -"):
            fam, route = rest[4], rest.split(" route ", 1)[1]
            d.removals.append(f"-{fam} route del {route_key(route)}")
        elif what in ("rule missing", "rule extra") and rest.startswith("ip -"):
            fam, rule = rest[4], rest.split(" rule ", 1)[1]
            (d.additions if what == "rule missing" else d.removals).append(f"-{fam} rule {'add' if what == 'rule missing' else 'del'} {rule}")
        elif what == "link down":
            d.additions.append(f"link set {rest} up")
        elif what == "link differs" and rest.endswith(")") and "(baseline " in rest and len(rest.split()) >= 4:
            dev, attr = rest.split()[:2]
            base = rest.rsplit("(baseline ", 1)[1][:-1]
            if attr == "master" and base == "none":
                d.additions.append(f"link set {dev} nomaster")
            elif attr == "mtu" or attr in LINK_ATTRS:
                d.additions.append(f"link set {dev} {attr} {base}")
        elif what == "nft table extra":
            d.nft[rest] = None
        elif what == "FRR stanza extra":
            d.frr_changes.append(("", rest, False))
        elif what == "address missing":
            d.additions.append(f"addr replace {rest}")
        elif what == "address extra":
            d.removals.append(f"addr del {rest}")
        elif what.startswith("nft "):
            table = rest if what == "nft table missing" else what[4:].rsplit(" ", 1)[0]
            if table in cfg.nft:
                d.nft[table] = cfg.nft[table]
        elif what.startswith("qdisc "):
            dev = rest.split(" root ", 1)[0]
            if dev in cfg.qdiscs:
                d.qdiscs[dev] = cfg.qdiscs[dev]
        elif what == "sysctl differs" and " = " in rest:
            key = rest.split(" = ", 1)[0]
            if key in cfg.sysctls:
                d.sysctls[key] = cfg.sysctls[key]
            elif rest.endswith(")") and " (baseline " in rest:  # outside the rendering (foreign): the baseline's
                d.sysctls[key] = rest.rsplit(" (baseline ", 1)[1][:-1]
        elif what in ("neighbor extra", "neighbor missing", "neighbor differs") and rest.startswith("ip -"):
            fam, args = rest[4], rest.split(" neigh ", 1)[1].split(" (device: ")[0]
            if what == "neighbor extra":
                d.removals.append(f"-{fam} neigh del {neigh_key(args)}")
            else:
                d.additions.append(f"-{fam} neigh replace {args}")
        elif what in ("nexthop extra", "nexthop missing", "nexthop differs") and rest.startswith("ip nexthop "):
            args = rest.split(" nexthop ", 1)[1].split(" (device: ")[0]
            if what == "nexthop extra":
                d.removals.append(f"nexthop del {nexthop_key(args)}")
            else:
                d.additions.append(f"nexthop replace {args}")
        elif what in ("root qdisc differs", "ingress qdisc differs") and rest.endswith(")") and " (baseline " in rest:
            dev, base = rest.split(" ", 1)[0], rest.rsplit(" (baseline ", 1)[1][:-1]
            if what == "root qdisc differs":
                d.qdiscs[dev] = None if base == "default" else base
            else:
                d.ingress[dev] = None if base == "none" else base
        elif what == "tunsrc differs" and rest.endswith(")") and " (baseline " in rest:
            d.additions.append(f"-6 sr tunsrc set {rest.rsplit(' (baseline ', 1)[1][:-1]}")
        elif what in ("FRR line missing", "FRR line extra") and " / " in rest:
            head, ln = rest.split(" / ", 1)
            d.frr_changes.append((head, ln, what == "FRR line missing"))
    d.additions = list(dict.fromkeys(d.additions))
    d.removals = list(dict.fromkeys(d.removals))
    d.frr = frr_lines(d.frr_changes)
    return d
