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
from typing import Annotated

from pydantic import Field

from substrate import addressing as a
from substrate.scenario.layers.addressing import Ipam
from substrate.scenario.layers.base import GenerationError, Layer, LayerParams, density_fits, node_cfg, register, zipf_weights
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
            params={"src": x.ce, "dst": ce_addr(y.prefix6, 2), "family": 6},
            description=f"{t.name}: site {x.id} ({x.ce}) reaches site {y.id} over IPv6",
        ))
        if x.prefix4 and y.prefix4:
            out.append(Invariant(
                id=f"l3vpn/{t.id}/reach/{x.id}->{y.id}/4", kind="reach", service=f"l3vpn/{t.id}",
                params={"src": x.ce, "dst": ce_addr(y.prefix4, 2), "family": 4},
                description=f"{t.name}: site {x.id} ({x.ce}) reaches site {y.id} over IPv4",
            ))
    return out


def isolation_invariants(sc: Scenario, t: Tenant) -> list[Invariant]:
    if not t.sites:
        return []
    own6 = {s.prefix6 for s in t.sites}
    others = [s for o in sc.tenants if o.id != t.id for s in o.sites if s.prefix6 not in own6]
    rng = random.Random(f"{sc.seed}/isolation/{t.id}")
    out = []
    own4 = [ipaddress.ip_network(s.prefix4) for s in t.sites if s.prefix4]
    for other in rng.sample(others, min(2, len(others))):
        src = rng.choice(t.sites)
        out.append(Invariant(
            id=f"l3vpn/{t.id}/isolated/{src.id}-x-{other.id}", kind="isolated", service=f"l3vpn/{t.id}",
            params={"src": src.ce, "dst": ce_addr(other.prefix6, 2), "family": 6},
            description=f"{t.name}: site {src.id} cannot reach {other.tenant}'s site {other.id}",
        ))
        # the same pair over IPv4, unless the other tenant reuses the tenant's own IPv4 space
        # there (then the address is the tenant's own site, reachable by design)
        if src.prefix4 and other.prefix4 and not any(ipaddress.ip_network(other.prefix4).overlaps(n) for n in own4):
            out.append(Invariant(
                id=f"l3vpn/{t.id}/isolated/{src.id}-x-{other.id}/4", kind="isolated", service=f"l3vpn/{t.id}",
                params={"src": src.ce, "dst": ce_addr(other.prefix4, 2), "family": 4},
                description=f"{t.name}: site {src.id} cannot reach {other.tenant}'s site {other.id} over IPv4",
            ))  # fmt: skip
    return out


@register
class L3vpn(Layer):
    name = "l3vpn"
    requires = ("underlay", "addressing")
    Params = L3vpnParams

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
        return out
