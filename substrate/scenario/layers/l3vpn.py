"""Layer ``l3vpn``: tenant L3VPNs over SRv6 (see substrate.scenario.model for the design).

Generation: ``tenants_per_density * density`` tenants; sites per tenant drawn from a Zipf law
over ``sites`` (most tenants small, a few large); sites placed on PEs with a Zipf load (a few
"hot" PEs carry most sites); every site gets a CE host cabled to a new PE port, an IPv6 /64 and,
with probability ``ipv4_share``, an IPv4 /24. With probability ``overlap_rate`` a site reuses a
prefix another tenant already uses on another PE (the tenants' tables keep them apart; a careless
summary route or a shared-table edit does not). ``spare_circuits`` CE hosts are cabled to PEs
and left unconfigured, for onboarding and move tasks.

Invariants per tenant (service ``l3vpn/<tenant>``): IPv6 (and IPv4 where both ends have it)
reachability between its sites with real pings -- every ordered pair for tenants of up to five
sites, else a ring in both directions plus as many random pairs as sites -- and isolation from
two other tenants' sites.
"""

from __future__ import annotations

import ipaddress
import random
from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import Field

from substrate import addressing as a
from substrate.scenario.layers.addressing import Ipam
from substrate.scenario.layers.base import (
    GenerationError,
    Intent,
    Layer,
    LayerParams,
    density_fits,
    node_cfg,
    register,
    registry,
    zipf_weights,
)
from substrate.scenario.layers.specs import AUTO, IfName, InstanceId, NodeName, Prefix4, Prefix6, Spec
from substrate.scenario.model import (
    RULE_PRIO_SIDS,
    RULE_PRIO_TENANT,
    SID_BLOCK,
    UNREACHABLE_METRIC,
    Invariant,
    NodeConfig,
    Scenario,
    Site,
    SpareCircuit,
    Tenant,
)
from substrate.topology import Endpoint, Link, Node, Role, Topology

CUSTOMERS = (
    "acme", "globex", "initech", "umbrella", "hooli", "stark", "wayne", "wonka", "tyrell", "cyberdyne",
    "soylent", "aperture", "oscorp", "vandelay", "gringotts", "monarch", "dunder", "pied", "massive", "nakatomi",
)
#: Tenants with at most this many sites get every ordered pair checked.
ALL_PAIRS_MAX = 5


class L3vpnParams(LayerParams):
    """Tenant VPNs: count per density, sites per tenant (min, max), Zipf skews of tenant sizes
    and PE load, share of sites with IPv4, rate of prefix reuse across tenants, spare circuits."""

    tenants_per_density: int = Field(default=3, ge=0, le=100)
    sites: tuple[Annotated[int, Field(ge=1, le=100)], Annotated[int, Field(ge=1, le=100)]] = (2, 7)
    size_skew: float = Field(default=1.1, ge=0)
    pe_skew: float = Field(default=0.8, ge=0)
    ipv4_share: float = Field(default=0.7, ge=0, le=1)
    overlap_rate: float = Field(default=0.25, ge=0, le=1)
    spare_circuits: int = Field(default=4, ge=0, le=200)
    #: Sites of the first tenant (0 = drawn like the others): a large live tenant, as in the
    #: draft's pilot (section 7.1: change set on a live 25-site tenant).
    anchor_sites: int = 0


def ce_addr(prefix: str, host: int) -> str:
    """Address ``host`` of a site prefix, without length (PE 1, CE 2)."""
    return str(ipaddress.ip_network(prefix).network_address + host)


def ce_iface(prefix: str, host: int) -> str:
    """Address ``host`` of a site prefix, with length (``fd10::2/64``)."""
    net = ipaddress.ip_network(prefix)
    return f"{net.network_address + host}/{net.prefixlen}"


def next_free_if(topo: Topology, node: str) -> str:
    """Lowest ``ethN`` not yet used on ``node``."""
    used = {lk.endpoint_of(node).interface for lk in topo.links_of(node)}
    k = 1
    while f"eth{k}" in used:
        k += 1
    return f"eth{k}"


def attach_host(topo: Topology, pe: str, host: str) -> tuple[Topology, str]:
    """Add host ``host`` cabled to a new port of ``pe``; return the topology and the PE port."""
    port = next_free_if(topo, pe)
    topo = topo.with_nodes(
        [Node(name=host, role=Role.HOST, managed=True)],
        [Link(a=Endpoint(node=pe, interface=port), b=Endpoint(node=host, interface="eth1"))],
    )
    return topo, port


def interface_block(ifname: str, addr6: str | None, addr4: str | None) -> str:
    """The FRR configuration stanza that addresses a PE port (a router's interface addresses
    belong to its configuration, as on any router: an operator sees and changes them there)."""
    lines = [f"interface {ifname}"]
    if addr6:
        lines.append(f" ipv6 address {addr6}")
    if addr4:
        lines.append(f" ip address {addr4}")
    return "\n".join(lines)


def segs(sc: Scenario, pe: str, function: int) -> str:
    """The one-container uSID segment list ``<pe uN><function>`` (H.Encaps.Red target)."""
    nid = sc.topology.node(pe).node_id
    assert nid is not None
    return str(a.usid_container([a.usid_value(nid), function]))


def sid_of(sc: Scenario, node: str, function: int) -> str:
    nid = sc.topology.node(node).node_id
    assert nid is not None
    return str(a.function_sid(nid, function))


def render_tenant(sc: Scenario, t: Tenant, out: dict[str, NodeConfig]) -> None:
    """Device state of one tenant VPN on its PEs and CEs."""
    has4 = any(s.prefix4 for s in t.sites)
    for pe, fn in sorted(t.dt6_functions.items()):
        cfg = node_cfg(out, pe)
        cfg.rules6.append(f"priority {RULE_PRIO_SIDS} to {SID_BLOCK} lookup main")
        cfg.routes6.append(f"unreachable ::/0 table {t.table} metric {UNREACHABLE_METRIC}")
        if has4:
            cfg.routes4.append(f"unreachable 0.0.0.0/0 table {t.table} metric {UNREACHABLE_METRIC}")
        cfg.routes6.append(f"{sid_of(sc, pe, fn)} metric 1024 encap seg6local action End.DT6 table {t.table} count dev sr0")
        for s in t.sites:
            if s.pe == pe:
                cfg.links_up.append(s.pe_if)
                cfg.frr.append(interface_block(s.pe_if, ce_iface(s.prefix6, 1), ce_iface(s.prefix4, 1) if s.prefix4 else None))
                cfg.rules6.append(f"priority {RULE_PRIO_TENANT} iif {s.pe_if} lookup {t.table}")
                cfg.routes6.append(f"{s.prefix6} table {t.table} metric 1024 dev {s.pe_if}")
                if s.prefix4:
                    cfg.rules4.append(f"priority {RULE_PRIO_TENANT} iif {s.pe_if} lookup {t.table}")
                    cfg.routes4.append(f"{s.prefix4} table {t.table} dev {s.pe_if}")
                    if s.dx4_function is not None:
                        cfg.routes6.append(
                            f"{sid_of(sc, pe, s.dx4_function)} metric 1024 encap seg6local action End.DX4 "
                            f"nh4 {ce_addr(s.prefix4, 2)} count dev sr0"
                        )
            else:
                cfg.routes6.append(
                    f"{s.prefix6} table {t.table} metric 1024 encap seg6 mode encap.red "
                    f"segs {segs(sc, s.pe, t.dt6_functions[s.pe])} dev sr0"
                )
                if s.prefix4 and s.dx4_function is not None:
                    cfg.routes4.append(
                        f"{s.prefix4} table {t.table} encap seg6 mode encap.red segs {segs(sc, s.pe, s.dx4_function)} dev sr0"
                    )
    for s in t.sites:
        ce = node_cfg(out, s.ce)
        ce.links_up.append(s.ce_if)
        ce.addresses.append(f"{ce_iface(s.prefix6, 2)} dev {s.ce_if}")
        ce.routes6.append(f"::/0 metric 1024 via {ce_addr(s.prefix6, 1)} dev {s.ce_if}")
        if s.prefix4:
            ce.addresses.append(f"{ce_iface(s.prefix4, 2)} dev {s.ce_if}")
            ce.routes4.append(f"0.0.0.0/0 via {ce_addr(s.prefix4, 1)} dev {s.ce_if}")


def site_pairs(sc: Scenario, t: Tenant) -> list[tuple[Site, Site]]:
    """The ordered site pairs whose reachability is checked (see module docstring)."""
    sites = t.sites
    n = len(sites)
    if n < 2:
        return []
    if n <= ALL_PAIRS_MAX:
        return [(x, y) for x in sites for y in sites if x.id != y.id]
    pairs = {(sites[i].id, sites[(i + 1) % n].id) for i in range(n)}
    pairs |= {(y, x) for x, y in pairs}
    rng = random.Random(f"{sc.seed}/pairs/{t.id}")
    all_pairs = [(x.id, y.id) for x in sites for y in sites if x.id != y.id and (x.id, y.id) not in pairs]
    pairs |= set(rng.sample(all_pairs, min(n, len(all_pairs))))
    by_id = {s.id: s for s in sites}
    return [(by_id[x], by_id[y]) for x, y in sorted(pairs)]


def reach_invariants(sc: Scenario, t: Tenant, pairs: list[tuple[Site, Site]]) -> list[Invariant]:
    out = []
    for x, y in pairs:
        out.append(Invariant(
            id=f"l3vpn/{t.id}/reach/{x.id}->{y.id}/6", kind="reach", service=f"l3vpn/{t.id}",
            params={"src": x.ce, "dst": ce_addr(y.prefix6, 2), "family": 6, "dst_node": y.ce},
            description=f"{t.name}: site {x.id} ({x.ce}) reaches site {y.id} over IPv6",
        ))
        if x.prefix4 and y.prefix4:
            out.append(Invariant(
                id=f"l3vpn/{t.id}/reach/{x.id}->{y.id}/4", kind="reach", service=f"l3vpn/{t.id}",
                params={"src": x.ce, "dst": ce_addr(y.prefix4, 2), "family": 4, "dst_node": y.ce},
                description=f"{t.name}: site {x.id} ({x.ce}) reaches site {y.id} over IPv4",
            ))
    return out


def circuit_invariants(t: Tenant) -> list[Invariant]:
    """Per site: the PE's end of the attachment circuit holds the site's PE addresses (``::1``,
    ``.1``). A CE's neighbour cache can hide their loss from probes for a while (issue 19), so
    they are checked on the PE itself. ``ce`` names the site (task checks find changed sites by
    their CE)."""
    out = []
    for s in t.sites:
        addrs = [ce_iface(s.prefix6, 1)] + ([ce_iface(s.prefix4, 1)] if s.prefix4 else [])
        out.append(Invariant(
            id=f"l3vpn/{t.id}/pe_address/{s.id}", kind="address_bound", service=f"l3vpn/{t.id}",
            params={"node": s.pe, "interface": s.pe_if, "addresses": addrs, "ce": s.ce},
            description=f"{t.name}: {s.pe} {s.pe_if} holds site {s.id}'s PE address(es) {', '.join(addrs)}",
        ))
    return out


def table_invariants(sc: Scenario, t: Tenant) -> list[Invariant]:
    """Per PE of the tenant and family: its table holds exactly what the scenario renders there
    -- every service's lines, so that steering, floating IPs or leaked shared services count --:
    each site prefix routed to its own PE's SID (or out of its port) and nothing else, the
    unreachable default present, no route for a prefix no site uses (issue 19: a typo'd
    encap route, a remote PE still pointing at a moved site's old PE, an extra route and a
    removed default were never caught by sampled probes). ``ces`` names the tenant's sites (task
    checks find changed sites by their CE)."""
    out = []
    ces = sorted({s.ce for s in t.sites})
    for pe in sorted(t.dt6_functions, key=natural_key):
        cfg = sc.node_config.get(pe)
        if cfg is None:
            continue
        for fam in (6, 4):
            routes = [x for x in getattr(cfg, f"routes{fam}") if f" table {t.table} " in f" {x} " and "seg6local" not in x]
            if not routes:
                continue
            out.append(Invariant(
                id=f"l3vpn/{t.id}/table/{pe}/{fam}", kind="table_routes", service=f"l3vpn/{t.id}",
                params={"node": pe, "table": t.table, "family": fam, "routes": routes, "ces": ces},
                description=f"{t.name}: table {t.table} on {pe} holds exactly its {len(routes)} IPv{fam} routes",
            ))
    return out


def isolation_invariants(sc: Scenario, t: Tenant) -> list[Invariant]:
    """Isolation of the tenant from other tenants' sites, in both directions and counted where
    the probe would arrive (``dst_node``: a one-way leak fails): two other tenants' sites drawn
    from the seed, plus, for every other tenant sharing a PE with it, a site of each on that PE
    (where a leak between their tables is likeliest). A pair is left out in a family where one
    tenant reuses the other's prefix (the address is then its own site, reachable by design)."""
    if not t.sites:
        return []
    own6 = {s.prefix6 for s in t.sites}
    others = [s for o in sc.tenants if o.id != t.id for s in o.sites if s.prefix6 not in own6]
    rng = random.Random(f"{sc.seed}/isolation/{t.id}")
    pairs: list[tuple[Site, Site]] = []
    for other in rng.sample(others, min(2, len(others))):
        pairs.append((rng.choice(t.sites), other))
    for o in sc.tenants:
        if o.id == t.id or o.id < t.id:  # one tenant of each pair adds the shared-PE pair (both ways)
            continue
        shared = sorted({s.pe for s in t.sites} & {s.pe for s in o.sites}, key=natural_key)
        for pe in shared[:1]:
            a_site = next(s for s in t.sites if s.pe == pe)
            b_site = next((s for s in o.sites if s.pe == pe and s.prefix6 not in own6), None)
            if b_site is not None and all(x[1].id != b_site.id for x in pairs):
                pairs.append((a_site, b_site))
    tenants = {x.id: x for x in sc.tenants}
    out: list[Invariant] = []
    seen: set[str] = set()
    for src, other in pairs:
        for x, y in ((src, other), (other, src)):
            tx = tenants[x.tenant]
            if y.prefix6 in {s.prefix6 for s in tx.sites}:
                continue
            own4 = [ipaddress.ip_network(s.prefix4) for s in tx.sites if s.prefix4]
            fams = [(6, y.prefix6, "")]
            if x.prefix4 and y.prefix4 and not any(ipaddress.ip_network(y.prefix4).overlaps(n) for n in own4):
                fams.append((4, y.prefix4, "/4"))
            for fam, prefix, suffix in fams:
                iid = f"l3vpn/{t.id}/isolated/{x.id}-x-{y.id}{suffix}"
                if iid in seen:
                    continue
                seen.add(iid)
                out.append(Invariant(
                    id=iid, kind="isolated", service=f"l3vpn/{t.id}",
                    params={"src": x.ce, "dst": ce_addr(prefix, 2), "family": fam, "dst_node": y.ce},
                    description=f"{tx.name}: site {x.id} cannot reach {y.tenant}'s site {y.id}"
                                + (" over IPv4" if fam == 4 else "") + " (nothing arrives there)",
                ))  # fmt: skip
    return out



# -- attachment circuits ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Circuit:
    """A PE port cabled to a CE host (where sites attach)."""

    pe: str
    pe_if: str
    ce: str
    ce_if: str

    @property
    def id(self) -> str:
        return f"{self.pe}:{self.pe_if}"


def circuits(sc: Scenario) -> dict[tuple[str, str], Circuit]:
    """Every attachment circuit of the topology: links from a PE to a scenario-managed host other
    than those service classes cabled for their own use (``ServiceClass.hosts``: the external
    peer, ...), keyed by (pe, pe_if), in topology order."""
    topo = sc.topology
    own = {h for c in registry() for h in c.hosts(sc)}
    out: dict[tuple[str, str], Circuit] = {}
    for lk in topo.links:
        for pe_ep, h_ep in ((lk.a, lk.b), (lk.b, lk.a)):
            pe, h = topo.node(pe_ep.node), topo.node(h_ep.node)
            if pe.role is Role.PE and h.role is Role.HOST and h.managed and h.name not in own:
                out[(pe.name, pe_ep.interface)] = Circuit(pe.name, pe_ep.interface, h.name, h_ep.interface)
    return out


def spare_circuits(sc: Scenario) -> list[SpareCircuit]:
    """Circuits no site of ``sc`` uses, in topology order."""
    used = {(s.pe, s.pe_if) for s in sc.all_sites()}
    return [SpareCircuit(pe=c.pe, pe_if=c.pe_if, ce=c.ce, ce_if=c.ce_if) for k, c in circuits(sc).items() if k not in used]


# -- helpers shared by the tenant services' planner hooks ------------------------------------------------


def natural_key(s: str) -> list[Any]:
    """Sort key that orders ``t2s10`` after ``t2s9``."""
    import re

    return [int(x) if x.isdigit() else x for x in re.split(r"(\d+)", s)]


def dump(x: Any) -> Any:
    """A record as JSON data (None stays None), for comparing records."""
    return None if x is None else x.model_dump(mode="json")


def site_changed(old: Scenario, new: Scenario, sid: str | None) -> bool:
    """Whether site ``sid`` differs between two inventories (created, deleted or changed)."""
    if sid is None:
        return False
    osites = {s.id: s for s in old.all_sites()}
    nsites = {s.id: s for s in new.all_sites()}
    return dump(osites.get(sid)) != dump(nsites.get(sid))


def tenant_nodes(t: Tenant) -> set[str]:
    """Devices a tenant's VPN has state on or is probed from: its PEs and CEs."""
    return set(t.dt6_functions) | {s.ce for s in t.sites} | {s.pe for s in t.sites}


def net_of(p: str | None) -> ipaddress.IPv4Network | ipaddress.IPv6Network | None:
    """The network of a prefix, None for none, ``auto`` or garbage."""
    if not p or p == AUTO:
        return None
    try:
        return ipaddress.ip_network(p, strict=False)
    except ValueError:
        return None


def overlaps(x: str | None, y: str | None) -> bool:
    """Whether two prefixes of the same family overlap."""
    nx, ny = net_of(x), net_of(y)
    return nx is not None and ny is not None and nx.version == ny.version and nx.overlaps(ny)  # type: ignore[arg-type]


def _circuit_list(ctx: Any, pe: str) -> str:
    used = {(s.pe, s.pe_if): s.id for s in ctx.work.all_sites()}
    cs = [f"{c.pe_if} ({used.get((c.pe, c.pe_if), 'free')})" for c in ctx.circuits.values() if c.pe == pe]
    return ", ".join(cs) if cs else "none"


def free_circuits(ctx: Any) -> str:
    """The free attachment circuits of the planner's working inventory (for messages)."""
    used = {(s.pe, s.pe_if) for s in ctx.work.all_sites()}
    free = [c.id for k, c in ctx.circuits.items() if k not in used]
    return ", ".join(free) if free else "none"


def _field(ctx: Any, site_id: str, fld: str) -> str:
    """The spec field to blame for a site's ``fld`` problem: the circuit when the op moved it."""
    return "spec.pe_interface" if site_id in ctx.pending("l3vpn.moved", set) else f"spec.{fld}"


# -- typed specs (the A3-T catalog) ---------------------------------------------------------------------


class TenantSpec(Spec):
    """A tenant (customer) L3VPN. Its routing table id is allocated from the table pool; its
    per-PE End.DT6 SIDs are allocated when its first site on a PE is created."""

    name: str = Field(pattern=r"^[a-z][a-z0-9_]{0,31}$", description="Customer name, unique, e.g. 'vandelay'.")


class TenantPatch(Spec):
    """Fields of a tenant to change (left out = unchanged)."""

    name: str | None = Field(default=None, pattern=r"^[a-z][a-z0-9_]{0,31}$", description="New customer name.")


class TenantSiteSpec(Spec):
    """A tenant site: the CE host cabled to (pe, pe_interface) -- a spare attachment circuit
    (list_services attachment_circuit) -- gets the site's prefixes (PE ::1/.1, CE ::2/.2)."""

    tenant: InstanceId = Field(description="Tenant id, e.g. 't3'.")
    pe: NodeName = Field(description="PE router the site attaches to.")
    pe_interface: IfName = Field(description="PE port of the attachment circuit (cabled to the site's CE host).")
    prefix6: Prefix6 = AUTO
    prefix4: Prefix4 | None = Field(default=None, description="IPv4 /24, 'auto' to allocate one, or null for an IPv6-only site.")


class TenantSitePatch(Spec):
    """Fields of a site to change. A new pe/pe_interface moves the site to that circuit (the CE
    changes with it); prefix4 null removes the site's IPv4 service. The tenant cannot change."""

    tenant: InstanceId | None = Field(default=None, description="Must equal the site's tenant if given.")
    pe: NodeName | None = None
    pe_interface: IfName | None = None
    prefix6: Prefix6 | None = None
    prefix4: Prefix4 | None = None


# -- intents ----------------------------------------------------------------------------------------------


class TenantIntent(Intent):
    """Catalog class ``tenant``."""

    name = "tenant"
    Spec = TenantSpec
    Patch = TenantPatch
    id_type = InstanceId
    id_doc = "New tenant id (e.g. 't7'); left out = next free 't<N>'."
    info = {
        "description": "A tenant's L3VPN over SRv6: one routing table (same id on every PE of the tenant, selected by "
                       "policy rules on its CE ports) and one End.DT6 SID per PE with sites. Delete needs the tenant "
                       "to have no sites, policies, rule set or floating IPs left.",
        "id_format": "t<N>, e.g. 't4'",
        "allocated": ["table (from pools.tables)", "End.DT6 SID function per PE (from pools.functions)"],
        "layer": "l3vpn",
    }  # fmt: skip
    examples = [{"op": "create", "service_class": "tenant", "id": "t4", "spec": {"name": "vandelay"}}]

    def instances(self, sc: Scenario) -> list[Any]:
        return list(sc.tenants)

    def spec_of(self, x: Any) -> dict[str, Any]:
        return {"name": x.name}

    def summary(self, x: Any) -> dict[str, Any]:
        return {"id": x.id, "name": x.name, "table": x.table, "sites": len(x.sites), "pes": sorted(x.dt6_functions, key=natural_key)}

    def allocated(self, sc: Scenario, x: Any) -> dict[str, Any]:
        return {"table": x.table, "dt6_sids": {pe: sid_of(sc, pe, fn) for pe, fn in x.dt6_functions.items()},
                "sites": [s.id for s in x.sites]}  # fmt: skip

    def service(self, x: Any) -> str:
        return f"l3vpn/{x.id}"

    def apply(self, ctx: Any, i: int, op: Any) -> None:
        tenants = ctx.tenants()
        if op.op == "create":
            same = [t for t in ctx.work.tenants if t.name == op.spec.name]
            if op.id is None and same:
                ctx.result(i, op, same[0].id, "no change", notes=[f"tenant {same[0].id} is already named {op.spec.name!r}"])
                return
            iid = op.id or ctx.new_id("t", set(ctx.ids()))
            if iid in tenants and tenants[iid].name == op.spec.name:
                ctx.result(i, op, iid, "no change", notes=["the tenant exists with this spec"])
                return
            if ctx.in_use(i, iid):
                return
            if same:
                ctx.bad(f"ops[{i}].spec.name", f"customer name {op.spec.name!r} is tenant {same[0].id}'s")
                return
            prev = ctx.gone.get(iid)
            ctx.work.tenants.append(Tenant(id=iid, name=op.spec.name, table=prev.table if isinstance(prev, Tenant) else 0))
            if not isinstance(prev, Tenant):
                ctx.pending("l3vpn.new_tenants").append((i, iid))
            ctx.result(i, op, iid, "created", notes=[f"takes back table {prev.table}"] if isinstance(prev, Tenant) else [])
            return
        if op.id not in tenants:
            ctx.missing(i, op, "tenant")
            return
        t = tenants[op.id]
        if op.op == "modify":
            name = op.spec.name if op.spec.name is not None else t.name
            if name == t.name:
                ctx.result(i, op, t.id, "no change")
                return
            if any(x.name == name for x in ctx.work.tenants if x.id != t.id):
                ctx.bad(f"ops[{i}].spec.name", f"customer name {name!r} is already used by another tenant")
                return
            t.name = name
            ctx.result(i, op, t.id, "modified")
            return
        users = [s.id for s in t.sites] + [r for c in registry() for r in c.references(ctx.work, "tenant", t.id)]
        if users:
            ctx.bad(f"ops[{i}].id", f"tenant {t.id} still has {', '.join(users)}; delete them first (in this change set or an earlier one)")
            return
        ctx.work.tenants.remove(t)
        ctx.gone[t.id] = t
        ctx.result(i, op, t.id, "deleted", notes=[f"table {t.table} freed"])


class TenantSiteIntent(Intent):
    """Catalog class ``tenant_site``."""

    name = "tenant_site"
    Spec = TenantSiteSpec
    Patch = TenantSitePatch
    id_type = InstanceId
    id_doc = "New site id (e.g. 't3s4'); left out = next free '<tenant>s<N>'."
    info = {
        "description": "A tenant site: the CE host on an attachment circuit (PE port) with an IPv6 /64 and optionally an "
                       "IPv4 /24; PE ::1/.1, CE ::2/.2. Remote PEs reach it with H.Encaps.Red to the site PE's uDT6 "
                       "(IPv6) or the site's own End.DX4 SID (IPv4). Move = modify with a new pe/pe_interface. "
                       "Prefixes must not overlap another site of the same tenant, and a prefix can be attached only "
                       "once per PE (any tenant).",
        "id_format": "<tenant>s<N>, e.g. 't3s4'",
        "allocated": ["prefix6/prefix4 when 'auto' (lowest free in pools.prefix6 / pools.prefix4)",
                      "End.DX4 SID function on the PE for IPv4 sites", "the tenant's End.DT6 SID on a new PE"],
        "layer": "l3vpn",
    }  # fmt: skip
    examples = [
        {"op": "create", "service_class": "tenant_site", "id": "t3s4",
         "spec": {"tenant": "t3", "pe": "r2", "pe_interface": "eth5", "prefix6": "auto", "prefix4": "auto"}},
        {"op": "modify", "service_class": "tenant_site", "id": "t3s2", "spec": {"pe": "r6", "pe_interface": "eth4"}},
        {"op": "delete", "service_class": "tenant_site", "id": "t3s1"},
    ]  # fmt: skip

    def instances(self, sc: Scenario) -> list[Any]:
        return sc.all_sites()

    def spec_of(self, x: Any) -> dict[str, Any]:
        return {"tenant": x.tenant, "pe": x.pe, "pe_interface": x.pe_if, "prefix6": x.prefix6, "prefix4": x.prefix4}

    def summary(self, x: Any) -> dict[str, Any]:
        return {"id": x.id, "tenant": x.tenant, "pe": x.pe, "pe_interface": x.pe_if, "ce": x.ce, "prefix6": x.prefix6,
                "prefix4": x.prefix4}  # fmt: skip

    def allocated(self, sc: Scenario, x: Any) -> dict[str, Any]:
        t = sc.tenant(x.tenant)
        out = {"ce": x.ce, "ce_interface": x.ce_if, "table": t.table, "pe_address6": f"{ce_addr(x.prefix6, 1)}",
               "ce_address6": ce_addr(x.prefix6, 2), "dt6_sid": sid_of(sc, x.pe, t.dt6_functions[x.pe])}  # fmt: skip
        if x.prefix4:
            out.update(pe_address4=ce_addr(x.prefix4, 1), ce_address4=ce_addr(x.prefix4, 2))
        if x.dx4_function is not None:
            out["dx4_sid"] = sid_of(sc, x.pe, x.dx4_function)
        return out

    def service(self, x: Any) -> str:
        return f"l3vpn/{x.tenant}"

    def invariant_ids(self, sc: Scenario, x: Any) -> list[str]:
        iid = x.id
        return [i.id for i in sc.invariants if i.service == f"l3vpn/{x.tenant}" and (f"/{iid}->" in i.id or f"->{iid}/" in i.id
                                                                                      or f"/{iid}-x-" in i.id
                                                                                      or i.id.endswith(f"/pe_address/{iid}"))]  # fmt: skip

    def _checks(self, ctx: Any, i: int, s: Site, prev: Site | None) -> bool:
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
        if s.tenant not in ctx.tenants():
            ctx.bad(f"{p}.tenant", f"no tenant {s.tenant!r}; " + ctx.known("tenants", [f"{t.id} ({t.name})" for t in ctx.work.tenants]))
            ok = False
        if s.pe not in ctx.pes:
            role = "a P router" if s.pe in ctx.routers else "not a router of this network"
            ctx.bad(f"{p}.pe", f"{s.pe!r} is {role}; sites attach to PEs: {', '.join(sorted(ctx.pes, key=natural_key))}")
            return False
        c = ctx.circuits.get((s.pe, s.pe_if))
        if c is None:
            ctx.bad(f"{p}.pe_interface", f"{s.pe} has no attachment circuit {s.pe_if}; circuits of {s.pe}: {_circuit_list(ctx, s.pe)}; "
                                         f"free circuits: {free_circuits(ctx)}")  # fmt: skip
            return False
        s.ce, s.ce_if = c.ce, c.ce_if
        own = prev is not None and (prev.pe, prev.pe_if) == (s.pe, s.pe_if)
        occupant = next((x for x in ctx.work.all_sites() if (x.pe, x.pe_if) == (s.pe, s.pe_if) and x.id != s.id), None)
        if occupant is not None and occupant.id not in ctx.pending("l3vpn.mentioned", set):
            ctx.bad(f"{p}.pe_interface", f"{s.pe} {s.pe_if} is site {occupant.id}'s circuit ({occupant.tenant}); free circuits: "
                                         f"{free_circuits(ctx)}")  # fmt: skip
            return False
        if not own:
            port = (s.pe, s.pe_if)
            extra = sorted(ctx.unexplained.port_addrs.get(port, set())) + sorted(ctx.unexplained.port_rules.get(port, set()))
            if extra:
                ctx.bad(f"{p}.pe_interface", f"{s.pe} {s.pe_if} carries state no service explains ({'; '.join(extra[:4])}): "
                                             "the circuit is in use outside A3-T")  # fmt: skip
                ok = False
        pools = ctx.old.pools
        for fld, pool in (("prefix6", pools.prefix6), ("prefix4", pools.prefix4)):
            v = getattr(s, fld)
            if v and v != AUTO and not ipaddress.ip_network(v).subnet_of(ipaddress.ip_network(pool)):  # type: ignore[arg-type]
                ctx.bad(f"{p}.{fld}", f"{v} is outside the tenant pool {pool} (pools.{fld})")
                ok = False
        # the customer's CE may already be configured (onboarding, re-cabling): its addresses must fit the site
        if not own:
            ce_addrs = sorted(ctx.unexplained.port_addrs.get((c.ce, c.ce_if), set()))
            for addr in ce_addrs:
                ip = ipaddress.ip_interface(addr)
                fld = "prefix6" if ip.version == 6 else "prefix4"
                want = getattr(s, fld)
                if want in (None, AUTO) or ip.ip not in ipaddress.ip_network(want):
                    hint = f"give {fld} {ip.network}" if ip.network.prefixlen == (64 if ip.version == 6 else 24) else f"check {fld}"
                    ctx.bad(f"{p}.{fld}", f"the CE {c.ce} is already configured with {addr} on {c.ce_if}, which is not in "
                                          f"{fld} {want or 'none'}: {hint}")  # fmt: skip
                    ok = False
        return ok

    def apply(self, ctx: Any, i: int, op: Any) -> None:  # noqa: C901 - one operation's rules in one place
        sites = ctx.sites()
        if op.op == "create":
            spec = op.spec
            s = Site(id=op.id or "", tenant=spec.tenant, pe=spec.pe, pe_if=spec.pe_interface, ce="", prefix6=spec.prefix6,
                     prefix4=spec.prefix4)  # fmt: skip
            same = [x for x in sites.values() if (x.tenant, x.pe, x.pe_if) == (s.tenant, s.pe, s.pe_if)
                    and (op.id is None or x.id == op.id) and _same_prefixes(x, s)]  # fmt: skip
            if same:
                ctx.result(i, op, same[0].id, "no change", notes=[f"site {same[0].id} exists with this spec"])
                return
            if op.id is None:
                t = ctx.tenants().get(spec.tenant)
                nums = [int(x.id[len(spec.tenant) + 1:]) for x in (t.sites if t else []) if x.id[len(spec.tenant) + 1:].isdigit()
                        and x.id.startswith(spec.tenant + "s")]  # fmt: skip
                k = max(nums, default=0) + 1
                while f"{spec.tenant}s{k}" in ctx.ids():
                    k += 1
                s.id = f"{spec.tenant}s{k}"
            elif op.id in ctx.ids():
                cls = ctx.ids()[op.id]
                detail = f" (on {sites[op.id].pe} {sites[op.id].pe_if})" if op.id in sites else ""
                ctx.bad(f"ops[{i}].id", f"{op.id!r} is already in use by a {cls}{detail}")
                return
            if not self._checks(ctx, i, s, None):
                return
            t = ctx.tenants()[s.tenant]
            t.sites.append(s)
            notes = [f"CE {s.ce} ({s.ce_if}) on {s.pe} {s.pe_if}"]
            prev = ctx.gone_sites.get(s.id, (None, None))[0]
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
                    ctx.pending("l3vpn.auto_prefix").append((i, s.id, fld))
            if s.prefix4 and s.dx4_function is None:
                ctx.pending("l3vpn.dx4_new").append((i, s.id))
            ctx.result(i, op, s.id, "created", notes=notes)
            return
        if op.id not in sites:
            ctx.missing(i, op, "tenant_site")
            return
        cur = sites[op.id]
        t = ctx.tenants()[cur.tenant]
        if op.op == "delete":
            t.sites = [x for x in t.sites if x.id != cur.id]
            res = ctx.result(i, op, cur.id, "deleted", notes=[f"circuit {cur.pe} {cur.pe_if} freed"])
            ctx.gone_sites[cur.id] = (cur, res)
            return
        given = set(op.spec.model_fields_set)
        patch = op.spec
        if "tenant" in given and patch.tenant is not None and patch.tenant != cur.tenant:
            ctx.bad(f"ops[{i}].spec.tenant", f"a site cannot change tenant ({cur.id} belongs to {cur.tenant}); delete it and "
                                             f"create a site in {patch.tenant}")  # fmt: skip
            return
        new = cur.model_copy()
        for fld, attr in (("pe", "pe"), ("pe_interface", "pe_if"), ("prefix6", "prefix6"), ("prefix4", "prefix4")):
            if fld in given:
                v = getattr(patch, fld)
                if v is None and fld != "prefix4":
                    ctx.bad(f"ops[{i}].spec.{fld}", f"{fld} cannot be null (leave it out to keep {getattr(cur, attr)})")
                    return
                setattr(new, attr, v)
        if "pe" in given and "pe_interface" not in given and new.pe != cur.pe:
            ctx.bad(f"ops[{i}].spec.pe_interface", f"moving {cur.id} to {new.pe} needs the circuit's port too; circuits of "
                                                   f"{new.pe}: {_circuit_list(ctx, new.pe)}")  # fmt: skip
            return
        if _same_site(cur, new):
            ctx.result(i, op, cur.id, "no change")
            return
        if not self._checks(ctx, i, new, cur):
            return
        moved = (new.pe, new.pe_if) != (cur.pe, cur.pe_if)
        if new.pe != cur.pe or (new.prefix4 and not cur.prefix4):
            new.dx4_function = None
            if new.prefix4:
                ctx.pending("l3vpn.dx4_moved").append((i, new.id))
        if not new.prefix4:
            new.dx4_function = None
        for fld in ("prefix6", "prefix4"):
            if getattr(new, fld) == AUTO:
                ctx.pending("l3vpn.auto_prefix").append((i, new.id, fld))
        t.sites[t.sites.index(cur)] = new
        if moved:
            ctx.pending("l3vpn.moved", set).add(cur.id)
        notes = [f"moved from {cur.pe} {cur.pe_if} (CE {cur.ce}) to {new.pe} {new.pe_if} (CE {new.ce})"] if moved else []
        ctx.result(i, op, cur.id, "modified", notes=notes)
        ctx.touch[cur.id] = (i, "modify")


def _same_prefixes(x: Site, s: Site) -> bool:
    p6 = s.prefix6 in (AUTO, x.prefix6)
    p4 = (s.prefix4 == x.prefix4) or (s.prefix4 == AUTO and x.prefix4 is not None)
    return p6 and p4


def _same_site(cur: Site, new: Site) -> bool:
    return (cur.pe, cur.pe_if) == (new.pe, new.pe_if) and _same_prefixes(cur, new)


class AttachmentCircuitIntent(Intent):
    """Catalog class ``attachment_circuit`` (read-only)."""

    name = "attachment_circuit"
    read_only = True
    info = {
        "description": "Read-only: each PE port cabled to a CE host, with the site using it or 'free'. New sites and "
                       "moved sites go on free circuits. A circuit whose devices carry addresses or rules that no "
                       "service explains is shown as 'in use outside A3-T'.",
        "id_format": "<pe>:<pe_interface>, e.g. 'r2:eth5'",
        "allocated": [],
        "layer": "l3vpn",
    }  # fmt: skip

    def items(self, sc: Scenario, extra: Any) -> list[dict[str, Any]]:
        used = {(s.pe, s.pe_if): s for s in sc.all_sites()}
        items = []
        for c in circuits(sc).values():
            s = used.get((c.pe, c.pe_if))
            ev = sorted(extra.port_addrs.get((c.pe, c.pe_if), set()) | extra.port_rules.get((c.pe, c.pe_if), set()))
            status = f"site {s.id}" if s else (f"in use outside A3-T ({'; '.join(ev[:3])})" if ev else "free")
            items.append({"id": c.id, "pe": c.pe, "pe_interface": c.pe_if, "ce": c.ce, "ce_interface": c.ce_if,
                          "status": "free" if status == "free" else ("site" if s else "in use outside A3-T"),
                          "site": s.id if s else None, "tenant": s.tenant if s else None,
                          "detail": status})  # fmt: skip
        return items


# -- allocation and integrity (planner hooks) -----------------------------------------------------------------


def _allocate(ctx: Any, ipam: Any) -> None:
    """Tables of new tenants; ``auto`` prefixes; End.DX4 functions of moved, then new IPv4 sites;
    End.DT6 functions of tenants on new PEs (sorted by PE)."""
    tenants, sites = ctx.tenants(), ctx.sites()
    res = {r.id: r for r in ctx.results}
    for i, tid in ctx.pending("l3vpn.new_tenants"):
        try:
            tenants[tid].table = ipam.table()
            res[tid].allocated["table"] = tenants[tid].table
        except GenerationError as e:
            ctx.exhausted(i, "spec", e)
    taken_nets = [ipaddress.ip_network(p) for p in ipam.used6 | ipam.used4 if net_of(p) is not None]
    for i, sid, fld in ctx.pending("l3vpn.auto_prefix"):
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
            ctx.exhausted(i, f"spec.{fld}", e)
    for i, sid in [*ctx.pending("l3vpn.dx4_moved"), *ctx.pending("l3vpn.dx4_new")]:
        s = sites.get(sid)
        if s is None or not s.prefix4:
            continue
        try:
            s.dx4_function = ipam.function(s.pe)
            res[sid].allocated["dx4_sid"] = sid_of(ctx.old, s.pe, s.dx4_function)
        except GenerationError as e:
            ctx.exhausted(i, "spec.pe", e)
    for t in ctx.work.tenants:
        pes = {s.pe for s in t.sites}
        dropped = sorted(set(t.dt6_functions) - pes, key=natural_key)
        t.dt6_functions = {pe: fn for pe, fn in t.dt6_functions.items() if pe in pes}
        for pe in sorted(pes - set(t.dt6_functions), key=natural_key):
            blame = max((r for r in ctx.results if r.id in {s.id for s in t.sites if s.pe == pe} and r.effect != "no change"),
                        key=lambda r: r.index, default=None)  # fmt: skip
            try:
                t.dt6_functions[pe] = ipam.function(pe)
                if blame:
                    blame.allocated[f"dt6_sid@{pe}"] = sid_of(ctx.old, pe, t.dt6_functions[pe])
            except GenerationError as e:
                ctx.exhausted(blame.index if blame else 0, "spec.pe", e)
        for pe in dropped:
            left = {s.id for s in ctx.old.all_sites() if s.tenant == t.id and s.pe == pe}
            gone = max((r for r in ctx.results if r.id in left and r.effect != "no change"), key=lambda r: r.index, default=None)
            if gone:
                gone.notes.append(f"{t.id} has no site left on {pe}: its End.DT6 SID there is removed")
        t.dt6_functions = dict(sorted(t.dt6_functions.items(), key=lambda kv: natural_key(kv[0])))


def _integrity(ctx: Any) -> None:  # noqa: C901 - one check per rule, in one place
    """Checks of the final inventory's sites and tenants, each blamed on the last operation involved:

    - one site per attachment circuit;
    - no overlapping prefixes within a tenant (one routing table per tenant), also against routes
      found in the tenant's table on the devices but in no record;
    - a prefix is attached at most once per PE, whatever the tenant: the connected route of the PE
      port lives in the shared main table, where End.DX4 resolves its next hop
      (``substrate.scenario.model`` docstring; shared/notes/substrate.md, "End.DX4/DX6 resolve
      the next hop in the main table");
    - customer names are unique.
    """
    by_circuit: dict[tuple[str, str], list[Site]] = {}
    for s in ctx.work.all_sites():
        by_circuit.setdefault((s.pe, s.pe_if), []).append(s)
    for (pe, port), ss in by_circuit.items():
        if len(ss) > 1:
            ctx.final([(x.id, "spec.pe_interface") for x in ss],
                      f"circuit {pe} {port} would carry {len(ss)} sites ({', '.join(x.id for x in ss)}); free circuits: {free_circuits(ctx)}")
    for t in ctx.work.tenants:
        for x in t.sites:
            for y in t.sites:
                if x.id < y.id:
                    for fld in ("prefix6", "prefix4"):
                        if overlaps(getattr(x, fld), getattr(y, fld)):
                            ctx.final([(x.id, _field(ctx, x.id, fld)), (y.id, _field(ctx, y.id, fld))],
                                      f"{getattr(x, fld)} ({x.id}) overlaps {getattr(y, fld)} ({y.id}) within tenant {t.id}")
            extra = ctx.unexplained.table_prefixes.get(t.table, {})
            for fld in ("prefix6", "prefix4"):
                for p, nodes in extra.items():
                    if x.id in ctx.touch and overlaps(getattr(x, fld), p):
                        ctx.final([(x.id, f"spec.{fld}")], f"{getattr(x, fld)} overlaps {p}, found in table {t.table} (tenant {t.id}) "
                                                           f"on {', '.join(sorted(nodes))} but not in any service record")  # fmt: skip
    by_pe: dict[str, list[Site]] = {}
    for s in ctx.work.all_sites():
        by_pe.setdefault(s.pe, []).append(s)
    for pe, ss in by_pe.items():
        for x in ss:
            for y in ss:
                if x.id < y.id:
                    for fld in ("prefix6", "prefix4"):
                        if overlaps(getattr(x, fld), getattr(y, fld)):
                            new, other = (y, x) if ctx.touch.get(y.id, (-1,))[0] > ctx.touch.get(x.id, (-1,))[0] else (x, y)
                            ctx.final([(new.id, _field(ctx, new.id, fld)), (other.id, _field(ctx, other.id, fld))],
                                      f"{new.id} ({new.tenant}) would attach {getattr(new, fld)} on {pe}, where {other.id} "
                                      f"({other.tenant}) attaches {getattr(other, fld)}: a prefix can be attached once per PE "
                                      "(its connected route lives in the shared main table); choose another prefix or another PE")  # fmt: skip
            if x.id in ctx.touch:
                for (node, port), addrs in ctx.unexplained.port_addrs.items():
                    if node == pe and port != x.pe_if:
                        for addr in addrs:
                            for fld in ("prefix6", "prefix4"):
                                if overlaps(getattr(x, fld), str(ipaddress.ip_interface(addr).network)):
                                    ctx.final([(x.id, f"spec.{fld}")], f"{getattr(x, fld)} overlaps {addr} found on {pe} {port} "
                                                                        "(not from any service record)")  # fmt: skip
    names: dict[str, str] = {}
    for t in ctx.work.tenants:
        if t.name in names:
            ctx.final([(t.id, "spec.name")], f"customer name {t.name!r} is already {names[t.name]}'s")
        names[t.name] = t.id

@register
class L3vpn(Layer):
    name = "l3vpn"
    requires = ("underlay", "addressing")
    Params = L3vpnParams
    records = ("tenants",)
    derived = ("spares",)
    intents = (TenantIntent(), TenantSiteIntent(), AttachmentCircuitIntent())

    def generate(self, sc: Scenario, params: LayerParams, rng: random.Random, density: int) -> Scenario:
        assert isinstance(params, L3vpnParams)
        lo, hi = params.sites
        if not 1 <= lo <= hi:
            raise GenerationError("layers.l3vpn.sites", f"need 1 <= min <= max, got {list(params.sites)}")
        for field in ("ipv4_share", "overlap_rate"):
            v = getattr(params, field)
            if not 0.0 <= v <= 1.0:
                raise GenerationError(f"layers.l3vpn.{field}", f"must be a probability in [0, 1], got {v}")
        pes = [n.name for n in sc.topology.routers if n.role is Role.PE]
        if not pes:
            raise GenerationError("topology", "the l3vpn layer needs PE routers")
        n_tenants = params.tenants_per_density * density
        if n_tenants > len(CUSTOMERS) * 5:
            raise GenerationError("layers.l3vpn.tenants_per_density", f"{n_tenants} tenants is more than supported (100)")
        ipam = Ipam.from_scenario(sc)
        hot = list(pes)
        rng.shuffle(hot)
        pe_w = zipf_weights(len(hot), params.pe_skew)
        sizes = list(range(lo, hi + 1))
        size_w = zipf_weights(len(sizes), params.size_skew)
        topo = sc.topology
        tenants: list[Tenant] = list(sc.tenants)
        ce_count = sum(1 for n in topo.hosts if n.name.startswith("c"))
        v4_on_pe: dict[str, set[str]] = {}
        v6_on_pe: dict[str, set[str]] = {}
        for i in range(n_tenants):
            tid = f"t{len(tenants) + 1}"
            name = CUSTOMERS[i % len(CUSTOMERS)] + ("" if i < len(CUSTOMERS) else str(i // len(CUSTOMERS)))
            try:
                tenant = Tenant(id=tid, name=name, table=ipam.table())
            except GenerationError as e:
                raise GenerationError("layers.l3vpn.tenants_per_density", f"density {density} needs {n_tenants} tables: {e}") from None
            n_sites = rng.choices(sizes, weights=size_w)[0]
            if i == 0 and params.anchor_sites:
                n_sites = params.anchor_sites
            for k in range(n_sites):
                pe = rng.choices(hot, weights=pe_w)[0]
                ce_count += 1
                ce = f"c{ce_count}"
                topo, port = attach_host(topo, pe, ce)
                prefix6 = prefix4 = None
                mine6 = {s.prefix6 for s in tenant.sites}
                mine4 = {s.prefix4 for s in tenant.sites if s.prefix4}
                if rng.random() < params.overlap_rate:
                    cands = [s for t in tenants for s in t.sites
                             if s.pe != pe and s.prefix6 not in mine6 and s.prefix6 not in v6_on_pe.get(pe, set())]
                    if cands:
                        donor = rng.choice(cands)
                        prefix6 = donor.prefix6
                        if donor.prefix4 and donor.prefix4 not in mine4 and donor.prefix4 not in v4_on_pe.get(pe, set()):
                            prefix4 = donor.prefix4
                want4 = rng.random() < params.ipv4_share
                with density_fits(density):
                    prefix6 = prefix6 or ipam.prefix6()
                    if want4 and prefix4 is None:
                        prefix4 = ipam.prefix4()
                    if not want4:
                        prefix4 = None
                    if pe not in tenant.dt6_functions:
                        tenant.dt6_functions[pe] = ipam.function(pe)
                    dx4 = ipam.function(pe) if prefix4 else None
                v6_on_pe.setdefault(pe, set()).add(prefix6)
                if prefix4:
                    v4_on_pe.setdefault(pe, set()).add(prefix4)
                tenant.sites.append(Site(id=f"{tid}s{k + 1}", tenant=tid, pe=pe, pe_if=port, ce=ce,
                                         prefix6=prefix6, prefix4=prefix4, dx4_function=dx4))
            tenants.append(tenant)
        spares = list(sc.spares)
        for _ in range(params.spare_circuits):
            pe = rng.choices(hot, weights=pe_w)[0]
            ce_count += 1
            ce = f"c{ce_count}"
            topo, port = attach_host(topo, pe, ce)
            spares.append(SpareCircuit(pe=pe, pe_if=port, ce=ce))
        return sc.model_copy(update={"topology": topo, "tenants": tenants, "spares": spares})

    def render(self, sc: Scenario, out: dict[str, NodeConfig]) -> None:
        for t in sc.tenants:
            render_tenant(sc, t, out)

    def invariants(self, sc: Scenario) -> list[Invariant]:
        out: list[Invariant] = []
        for t in sc.tenants:
            out += reach_invariants(sc, t, site_pairs(sc, t))
            out += isolation_invariants(sc, t)
            out += circuit_invariants(t)
            out += table_invariants(sc, t)
        return out

    # -- inventory and pools ----------------------------------------------------------------------

    def derive(self, sc: Scenario) -> None:
        sc.spares = spare_circuits(sc)

    def claim(self, sc: Scenario, ipam: Any) -> None:
        for t in sc.tenants:
            ipam.tables.add(t.table)
            for pe, fn in t.dt6_functions.items():
                ipam.functions.setdefault(pe, set()).add(fn)
            for s in t.sites:
                ipam.used6.add(s.prefix6)
                if s.prefix4:
                    ipam.used4.add(s.prefix4)
                if s.dx4_function is not None:
                    ipam.functions.setdefault(s.pe, set()).add(s.dx4_function)

    def sids(self, sc: Scenario) -> list[tuple[str, int, str, str, dict[str, Any]]]:
        out: list[tuple[str, int, str, str, dict[str, Any]]] = []
        for t in sc.tenants:
            for pe, fn in sorted(t.dt6_functions.items()):
                out.append((pe, fn, "End.DT6", f"tenant {t.id}", {"table": str(t.table)}))
            for s in t.sites:
                if s.dx4_function is not None and s.prefix4:
                    out.append((s.pe, s.dx4_function, "End.DX4", f"site {s.id}",
                                {"nh4": str(ipaddress.IPv4Network(s.prefix4).network_address + 2)}))
        return out

    # -- planner hooks -------------------------------------------------------------------------------

    def prepare(self, ctx: Any, ops: list[Any]) -> None:
        ctx.circuits = circuits(ctx.old)
        # sites a modify/delete of this change set names (their circuits may be reused within it)
        ctx.pending("l3vpn.mentioned", set).update(op.id for op in ops if op.service_class == "tenant_site" and op.op != "create")

    def allocate(self, ctx: Any, ipam: Any) -> None:
        _allocate(ctx, ipam)

    def integrity(self, ctx: Any) -> None:
        _integrity(ctx)

    # -- validation scope ----------------------------------------------------------------------------

    def service_nodes(self, sc: Scenario, out: dict[str, set[str]]) -> None:
        for t in sc.tenants:
            out[f"l3vpn/{t.id}"] = tenant_nodes(t)

    def address_owners(self, sc: Scenario, out: dict[str, set[str]]) -> None:
        for s in sc.all_sites():
            for p in (s.prefix6, s.prefix4):
                if p and p != AUTO:
                    out.setdefault(ce_addr(p, 2), set()).update({s.ce, s.pe})

    def changed(self, old: Scenario, new: Scenario) -> set[str]:
        ot, nt = {t.id: t for t in old.tenants}, {t.id: t for t in new.tenants}
        return {f"l3vpn/{k}" for k in set(ot) | set(nt) if dump(ot.get(k)) != dump(nt.get(k))}

    def drop_dependents(self, sc: Scenario, cls: str, iid: str) -> None:
        if cls == "tenant":
            sc.tenants = [t for t in sc.tenants if t.id != iid]
        elif cls == "tenant_site":
            for t in sc.tenants:
                t.sites = [x for x in t.sites if x.id != iid]
