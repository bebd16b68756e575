"""Service class ``ebgp_peering``: external eBGP peering on a border PE.

The router of an external AS (``xr1``, a node of role ``external``: it runs FRR zebra, staticd
and bgpd from its own configuration, outside the underlay) is cabled to a new port of a border
PE on a /64 of documentation space (default ``2001:db8:fe00::/64``, RFC 3849: PE ``::1``,
external router ``::2``). The PE (AS 64500) and the external AS (64501; documentation ASNs, RFC
5398) run an eBGP session over it (IPv6 unicast; fast timers: keepalive 3 s, hold 9 s, connect
retry 1 s), and each side's routes are filtered by prefix-lists matched in route-maps:

- the external AS announces, by redistributing its static routes, its own prefixes
  (``2001:db8:1000::/48`` onwards) and bogons: a default route and the provider's own tenant
  pool (a hijack). The PE's inbound route-map ``<ID>-IN`` permits only the prefix-list
  ``<ID>-IN``: the prefixes agreed with the peer (``accept``); anything else is dropped;
- the PE redistributes its static routes: blackhole routes for the prefixes it advertises
  (``2001:db8:2000::/48`` onwards; ``advertise``) and for its infrastructure prefix
  (``2001:db8:2fff::/48``; ``internal``), which the outbound route-map ``<ID>-OUT`` (prefix-list
  ``<ID>-OUT``) never lets out.

FRR 8.4's default ``bgp ebgp-requires-policy`` stays on at the PE (without the route-maps
nothing is exchanged), off at the external router (it sends everything). The route-maps are
re-applied 1 s after a prefix-list changes (``bgp route-map delay-timer 1``).

Invariants (service ``ebgp_peering/<id>``): the PE's session with the external router is
Established; the PE holds from the peer exactly the accepted prefixes it announces (agreed routes
received, bogons and unagreed prefixes not); the external router holds from the PE exactly the
advertised prefixes (nothing else leaked out). The BGP checks poll for a few seconds (a session
or a policy change settles within the timers above).

A3-T modifies a peering's ``accept`` and ``advertise`` lists (the reference change: accept the
prefix the peer announces that is not yet agreed, and advertise one more prefix); peerings are
cabled by the provider, so create and delete are refused. Each list holds global unicast prefixes
(no zone index, no link-local, multicast, loopback or IPv4-mapped space), each once, and no
default route. Accepted prefixes must not overlap the provider's own space (tenant pool, SID
block, loopback and base-host nets, internal prefixes, any address of the provider's nodes), and
advertised ones must not overlap that space, the peer's prefixes or the accepted ones.
"""

from __future__ import annotations

import ipaddress
import json
import random
import time
from typing import TYPE_CHECKING, Annotated, Any

from pydantic import AfterValidator, Field, field_validator

from substrate import frr_daemons
from substrate.scenario.layers.base import GenerationError, Layer, LayerParams, RecordIntent, address_plan_clash, node_cfg, register, registry
from substrate.scenario.layers.l3vpn import attach_host, ce_addr, dump, interface_block, next_free_if, overlaps
from substrate.scenario.layers.specs import InstanceId, Spec, distinct, link_slash64, no_zone
from substrate.scenario.model import SID_BLOCK, EbgpPeering, Invariant, NodeConfig, Scenario, SpareCircuit
from substrate.topology import Endpoint, Link, Node, Role, Topology

if TYPE_CHECKING:
    from substrate.scenario.observer import Evidence, ObserveContext

LOCAL_AS = 64500
PEER_AS_BASE = 64501
#: The external AS's own prefixes (/48s from here on) and the provider's advertised ones.
PEER_SPACE = "2001:db8:1000::/40"
PROVIDER_SPACE = "2001:db8:2000::/40"
#: The provider's infrastructure prefix, redistributed on the PE but never advertised.
INTERNAL = "2001:db8:2fff::/48"
#: How long a BGP check waits for the state it expects (seconds): a session comes up within the
#: connect-retry timer (1 s), a policy change within the route-map delay timer (1 s).
SETTLE_S = 8.0
#: Most prefixes in a peering's accept or advertise list (A3-T's spec; the generator stays within it).
MAX_PREFIXES = 100


class EbgpPeeringParams(LayerParams):
    """The border PE (default: drawn from the seed), the peering link, and prefixes per unit of density."""

    pe: str | None = None
    link6: str = "2001:db8:fe00::/64"
    peer_prefixes_per_density: int = Field(default=2, ge=1, le=50)
    advertise_per_density: int = Field(default=1, ge=1, le=50)

    @field_validator("link6")
    @classmethod
    def _slash64(cls, v: str) -> str:
        return link_slash64(v, "the peering link is a /64 (PE ::1, external router ::2)")


def nth48(space: str, k: int) -> str:
    """The ``k``-th /48 of ``space`` (a /40: 256 of them)."""
    net = ipaddress.IPv6Network(space)
    return str(ipaddress.IPv6Network((int(net.network_address) + (k << 80), 48)))


def pe_addr(x: EbgpPeering) -> str:
    return ce_addr(x.link6, 1)


def router_addr(x: EbgpPeering) -> str:
    return ce_addr(x.link6, 2)


def received(x: EbgpPeering) -> list[str]:
    """What the PE holds from the peer: the accepted prefixes the peer announces."""
    return sorted(set(x.accept) & set(x.announced))


def policy_name(x: EbgpPeering) -> str:
    return x.id.upper()


def _prefix_list(name: str, prefixes: list[str]) -> list[str]:
    return [f"ipv6 prefix-list {name} seq {5 * (k + 1)} permit {p}" for k, p in enumerate(prefixes)]


def render_peerings(sc: Scenario, out: dict[str, NodeConfig]) -> None:
    """Device state of every peering: both routers' port addresses, static routes, BGP and policy."""
    by_pe: dict[str, list[EbgpPeering]] = {}
    for x in sc.ebgp_peerings:
        by_pe.setdefault(x.pe, []).append(x)
    for pe, xs in sorted(by_pe.items()):
        cfg = node_cfg(out, pe)
        top: list[str] = ["bgp route-map delay-timer 1"]
        bgp = [f"router bgp {xs[0].local_as}", " bgp router-id 192.0.2.1", " no bgp default ipv4-unicast"]
        af = [" address-family ipv6 unicast", "  redistribute static"]
        for x in xs:
            cfg.links_up.append(x.pe_if)
            cfg.frr.append(interface_block(x.pe_if, f"{pe_addr(x)}/64", None))
            n, nbr = policy_name(x), router_addr(x)
            top += [f"ipv6 route {p} blackhole" for p in sorted({*x.advertise, *x.internal})]
            top += _prefix_list(f"{n}-IN", x.accept) + _prefix_list(f"{n}-OUT", x.advertise)
            bgp += [f" neighbor {nbr} remote-as {x.peer_as}", f" neighbor {nbr} description {x.id} (AS{x.peer_as}, {x.router})",
                    f" neighbor {nbr} timers 3 9", f" neighbor {nbr} timers connect 1"]  # fmt: skip
            af += [f"  neighbor {nbr} activate", f"  neighbor {nbr} route-map {n}-IN in", f"  neighbor {nbr} route-map {n}-OUT out"]
            cfg.frr += [f"route-map {n}-IN permit 10\n match ipv6 address prefix-list {n}-IN",
                        f"route-map {n}-OUT permit 10\n match ipv6 address prefix-list {n}-OUT"]  # fmt: skip
        cfg.frr += top  # one block per top-level line (a block with indented lines is a stanza)
        cfg.frr.append("\n".join([*bgp, *af, " exit-address-family"]))
    for x in sc.ebgp_peerings:
        ext = node_cfg(out, x.router)
        ext.links_up.append(x.router_if)
        ext.frr.append(interface_block(x.router_if, f"{router_addr(x)}/64", None))
        ext.frr += [f"ipv6 route {p} blackhole" for p in x.announced]
        ext.frr.append("\n".join([
            f"router bgp {x.peer_as}", " bgp router-id 192.0.2.2", " no bgp ebgp-requires-policy", " no bgp default ipv4-unicast",
            f" neighbor {pe_addr(x)} remote-as {x.local_as}", f" neighbor {pe_addr(x)} timers 3 9",
            f" neighbor {pe_addr(x)} timers connect 1", " address-family ipv6 unicast", "  redistribute static",
            f"  neighbor {pe_addr(x)} activate", " exit-address-family"]))  # fmt: skip


# -- observer checks ----------------------------------------------------------------------------------


def _poll(ctx: ObserveContext, node: str, command: str, judge: Any) -> tuple[bool, str, list[Evidence]]:
    """Run ``command`` (a bgpd show command, JSON) on ``node`` until ``judge(parsed)`` says ok, or
    :data:`SETTLE_S` passed; returns the last verdict with its evidence."""
    from substrate.scenario.observer import Evidence
    from substrate.vty import VtyError

    deadline = time.monotonic() + SETTLE_S
    while True:
        try:  # bgpd's vty socket: what vtysh would ask, without starting vtysh
            text, status = ctx.lab.vty(node, "bgpd", command, timeout_s=5)[0]
        except VtyError as e:
            text, status = f"bgpd did not answer: {e}", 1
        try:
            data = json.loads(text or "{}") if status == 0 else None
        except ValueError:
            data = None
        ok, detail, shown = (False, f"{node}: bgpd did not answer {command!r} with JSON", text.strip()[:300]) \
            if data is None else judge(data)
        ev = [Evidence(node=node, command=command, exit_code=status, output=shown[:1000])]
        if ok or time.monotonic() >= deadline:
            return ok, detail, ev
        time.sleep(0.5)  # poll interval, not a settle delay


def check_bgp_session(ctx: ObserveContext, inv: Invariant) -> tuple[bool, str, list[Evidence]]:
    """``bgp_session`` {node, neighbor}: ``node``'s BGP session with ``neighbor`` is Established."""
    p = inv.params

    def judge(data: dict[str, Any]) -> tuple[bool, str, str]:
        st = (data.get(p["neighbor"]) or {}).get("bgpState")
        if st is None:
            return False, f"{p['node']} has no BGP neighbor {p['neighbor']}", json.dumps(data)[:300]
        return st == "Established", f"{p['node']}: BGP session with {p['neighbor']} is {st}", f"{p['neighbor']}: {st}"

    return _poll(ctx, p["node"], f"show bgp neighbors {p['neighbor']} json", judge)


def check_bgp_routes(ctx: ObserveContext, inv: Invariant) -> tuple[bool, str, list[Evidence]]:
    """``bgp_routes`` {node, neighbor, prefixes}: the IPv6 unicast routes ``node`` holds from
    ``neighbor`` (after its inbound policy) are exactly ``prefixes``: each expected one present,
    none other."""
    p = inv.params
    want = set(p["prefixes"])

    def judge(data: dict[str, Any]) -> tuple[bool, str, str]:
        if "routes" not in data:
            return False, f"{p['node']}: no routes from BGP neighbor {p['neighbor']} ({json.dumps(data)[:200]})", json.dumps(data)[:300]
        have = set(data.get("routes") or {})
        missing, extra = sorted(want - have), sorted(have - want)
        detail = f"{p['node']} holds from {p['neighbor']}: {', '.join(sorted(have)) or 'nothing'}"
        if missing:
            detail += f"; missing {', '.join(missing)}"
        if extra:
            detail += f"; unexpected {', '.join(extra)}"
        return not missing and not extra, detail, ", ".join(sorted(have)) or "no routes"

    return _poll(ctx, p["node"], f"show bgp ipv6 unicast neighbors {p['neighbor']} routes json", judge)


def _default_or_overlap(p: str, space: list[str]) -> str:
    """What is wrong with exchanging prefix ``p`` given the ``space`` it must stay out of
    (prefixes or addresses): "a default route", "<q>" for the first ``q`` it overlaps, or ""."""
    if ipaddress.IPv6Network(p).prefixlen == 0:
        return "a default route"
    return next((q for q in space if overlaps(p, q if "/" in q else f"{q}/128")), "")


# -- typed specs (the A3-T catalog) ---------------------------------------------------------------------


#: Space that is not global unicast (RFC 4291 section 2.4, RFC 3879 for site-local): a peering
#: never exchanges a prefix that overlaps it (the default route ``::/0`` is judged by the planner).
NOT_GLOBAL = {"::/128": "the unspecified address", "::1/128": "the loopback address", "::ffff:0:0/96": "IPv4-mapped space",
              "fe80::/10": "link-local space", "fec0::/10": "site-local space", "ff00::/8": "multicast space"}  # fmt: skip


def _prefix6(v: str) -> str:
    no_zone(v)
    try:
        net = ipaddress.IPv6Network(v, strict=False)
    except ValueError:
        raise ValueError(f"{v!r} is not an IPv6 prefix (e.g. 2001:db8:1000::/48)") from None
    try:
        ipaddress.IPv6Network(v)
    except ValueError:
        raise ValueError(f"{v!r} has host bits set; did you mean {net}?") from None
    special = next((f"{what} {q}" for q, what in NOT_GLOBAL.items() if net.prefixlen and net.overlaps(ipaddress.IPv6Network(q))), "")
    if special:
        raise ValueError(f"{v!r} overlaps {special}: a peering exchanges global unicast prefixes only")
    return str(net)


Prefix6Any = Annotated[str, AfterValidator(_prefix6), Field(description="IPv6 prefix, e.g. '2001:db8:1000::/48'.")]


class EbgpPeeringSpec(Spec):
    """The policy of an eBGP peering with an external AS: which of its prefixes the PE accepts, which the PE advertises."""

    accept: Annotated[list[Prefix6Any], AfterValidator(distinct)] = Field(
        description="Prefixes accepted from the peer (the PE's inbound prefix-list), each once; the rest of what it announces "
                    "is dropped.", max_length=MAX_PREFIXES)  # fmt: skip
    advertise: Annotated[list[Prefix6Any], AfterValidator(distinct)] = Field(
        description="Prefixes the PE advertises to the peer (its outbound prefix-list; a blackhole static route originates "
                    "each), each once.", max_length=MAX_PREFIXES)  # fmt: skip


class EbgpPeeringPatch(Spec):
    """Fields of a peering to change (each list replaces the old one)."""

    accept: Annotated[list[Prefix6Any] | None, AfterValidator(distinct)] = Field(
        default=None, max_length=MAX_PREFIXES, description="Prefixes accepted from the peer, each once.")
    advertise: Annotated[list[Prefix6Any] | None, AfterValidator(distinct)] = Field(
        default=None, max_length=MAX_PREFIXES, description="Prefixes advertised to the peer, each once.")


class EbgpPeeringIntent(RecordIntent):
    """Catalog class ``ebgp_peering``."""

    name = "ebgp_peering"
    field = "ebgp_peerings"
    id_prefix = "peer"
    Record = EbgpPeering
    Spec = EbgpPeeringSpec
    Patch = EbgpPeeringPatch
    id_type = InstanceId
    id_doc = "Peering id, e.g. 'peer1' (peerings are cabled by the provider: only modify applies)."
    info = {
        "description": "External eBGP peering: the border PE's IPv6 unicast session with the router of an external AS, "
                       "with an inbound route-map (prefix-list <ID>-IN: the accepted prefixes; the peer also announces "
                       "bogons and prefixes not agreed) and an outbound one (prefix-list <ID>-OUT: the advertised prefixes, "
                       "each originated by a blackhole static route redistributed into BGP; the provider's internal "
                       "prefix is redistributed too and never advertised). Only modify applies (accept, advertise). "
                       "Both lists: global unicast prefixes, each once, no default route. Accepted prefixes must not "
                       "overlap the provider's space (tenant pool, SID block, infrastructure, internal prefix); advertised "
                       "ones must not overlap it or the peer's prefixes.",
        "id_format": "peer<N>, e.g. 'peer1'",
        "allocated": ["pe", "router", "peer_as", "pe_address", "neighbor", "announced_by_peer"],
        "layer": "ebgp_peering",
    }  # fmt: skip
    examples = [{"op": "modify", "service_class": "ebgp_peering", "id": "peer1",
                 "spec": {"accept": ["2001:db8:1000::/48", "2001:db8:1001::/48"], "advertise": ["2001:db8:2000::/48"]}}]

    def spec_of(self, x: Any) -> dict[str, Any]:
        return {"accept": list(x.accept), "advertise": list(x.advertise)}

    def allocated(self, sc: Scenario, x: Any) -> dict[str, Any]:
        return {"pe": x.pe, "pe_interface": x.pe_if, "router": x.router, "local_as": x.local_as, "peer_as": x.peer_as,
                "pe_address": pe_addr(x), "neighbor": router_addr(x), "announced_by_peer": list(x.announced),
                "internal": list(x.internal), "route_maps": [f"{policy_name(x)}-IN", f"{policy_name(x)}-OUT"]}  # fmt: skip

    def service(self, x: Any) -> str:
        return f"ebgp_peering/{x.id}"

    def refuse(self, ctx: Any, i: int, op: Any) -> bool:
        if op.op in ("create", "delete"):
            ctx.bad(f"ops[{i}].op", f"ebgp_peering cannot be {op.op}d: peerings with external ASes are cabled by the provider; "
                                    "modify an existing peering's accept or advertise lists instead")  # fmt: skip
            return True
        return False


def spare_for_pe(sc: Scenario, topo: Topology, pe: str) -> tuple[Topology, list[SpareCircuit]]:
    """The border PE's spare attachment circuit, for tasks that add a customer-edge session
    next to the peering (template ``bgp-ce-session``): when the l3vpn layer ran before this one
    and left no spare circuit on ``pe``, one more CE host (``c<N+1>``, after the highest CE
    number) is cabled to ``pe``'s next free port, after the peering's own; otherwise nothing
    changes. Draws nothing from the seed, so the other layers' choices stay as they were.
    Returns the topology and the scenario's spare circuits."""
    spares = list(sc.spares)
    before = sc.layers[: sc.layers.index("ebgp_peering")] if "ebgp_peering" in sc.layers else sc.layers
    if "l3vpn" not in before or any(sp.pe == pe for sp in spares):
        return topo, spares
    n = max((int(h.name[1:]) for h in topo.hosts if h.name[:1] == "c" and h.name[1:].isdigit()), default=0)
    topo, port = attach_host(topo, pe, f"c{n + 1}")
    return topo, [*spares, SpareCircuit(pe=pe, pe_if=port, ce=f"c{n + 1}")]


@register
class EbgpPeeringClass(Layer):
    """External eBGP peering (see module docstring)."""

    name = "ebgp_peering"
    requires = ("underlay", "addressing")
    Params = EbgpPeeringParams
    records = ("ebgp_peerings",)
    intents = (EbgpPeeringIntent(),)
    checks = {"bgp_session": check_bgp_session, "bgp_routes": check_bgp_routes}

    def generate(self, sc: Scenario, params: LayerParams, rng: random.Random, density: int) -> Scenario:
        assert isinstance(params, EbgpPeeringParams)
        if sc.ebgp_peerings:
            return sc
        pes = [n.name for n in sc.topology.routers if n.role is Role.PE]
        pe = params.pe or rng.choice(pes)
        if pe not in pes:
            raise GenerationError("layers.ebgp_peering.pe", f"{pe!r} is not a PE; PEs: {', '.join(pes)}")
        clash = address_plan_clash(sc, params.link6) or next(
            (q for q in (PEER_SPACE, PROVIDER_SPACE) if overlaps(params.link6, q)), "")
        if clash:
            raise GenerationError("layers.ebgp_peering.link6", f"{params.link6} overlaps {clash}")
        router = "xr1"
        port = next_free_if(sc.topology, pe)
        nodes = [n.model_copy(update={"daemons": frr_daemons.ordered([*n.frr_daemons, "bgpd"])}) if n.name == pe else n
                 for n in sc.topology.nodes]  # fmt: skip
        base = f"frr defaults traditional\nhostname {router}\nlog file /var/log/frr/frr.log informational\nservice integrated-vtysh-config\n!\n"
        topo = sc.topology.model_copy(update={"nodes": nodes}).with_nodes(
            [Node(name=router, role=Role.EXTERNAL, daemons=("zebra", "staticd", "bgpd"), frr_files={"frr.conf": base})],
            [Link(a=Endpoint(node=pe, interface=port), b=Endpoint(node=router, interface="eth1"))],
        )
        own = [nth48(PEER_SPACE, k) for k in range(params.peer_prefixes_per_density * density)]
        for field, n in (("peer_prefixes_per_density", len(own)), ("advertise_per_density", params.advertise_per_density * density + 1)):
            if n > MAX_PREFIXES:  # the reference change lists every agreed prefix and one more
                raise GenerationError(f"layers.ebgp_peering.{field}", f"density {density} does not fit: {n} prefixes in a list, "
                                                                    f"A3-T's lists hold at most {MAX_PREFIXES}")  # fmt: skip
        accept = sorted(rng.sample(own, len(own) - 1))  # one announced prefix is not (yet) agreed
        x = EbgpPeering(
            id="peer1", pe=pe, pe_if=port, router=router, link6=params.link6, local_as=LOCAL_AS, peer_as=PEER_AS_BASE,
            announced=[*own, "::/0", sc.pools.prefix6], accept=accept,
            advertise=[nth48(PROVIDER_SPACE, k) for k in range(params.advertise_per_density * density)], internal=[INTERNAL],
        )  # fmt: skip
        topo, spares = spare_for_pe(sc, topo, pe)
        return sc.model_copy(update={"topology": topo, "ebgp_peerings": [x], "spares": spares})

    def render(self, sc: Scenario, out: dict[str, NodeConfig]) -> None:
        render_peerings(sc, out)

    def invariants(self, sc: Scenario) -> list[Invariant]:
        out: list[Invariant] = []
        for x in sc.ebgp_peerings:
            svc = f"ebgp_peering/{x.id}"
            out.append(Invariant(
                id=f"{svc}/session", kind="bgp_session", service=svc, params={"node": x.pe, "neighbor": router_addr(x)},
                description=f"{x.pe}'s eBGP session with AS{x.peer_as} ({x.router}, {router_addr(x)}) is Established",
            ))
            out.append(Invariant(
                id=f"{svc}/received", kind="bgp_routes", service=svc,
                params={"node": x.pe, "neighbor": router_addr(x), "prefixes": received(x)},
                description=f"{x.pe} holds from AS{x.peer_as} exactly the accepted prefixes it announces (no bogon, no unagreed prefix)",
            ))
            out.append(Invariant(
                id=f"{svc}/advertised", kind="bgp_routes", service=svc,
                params={"node": x.router, "neighbor": pe_addr(x), "prefixes": sorted(x.advertise)},
                description=f"AS{x.peer_as} ({x.router}) receives from {x.pe} exactly the advertised prefixes (nothing internal leaked)",
            ))  # fmt: skip
        return out

    # -- planner hooks -------------------------------------------------------------------------------

    def integrity(self, ctx: Any) -> None:
        """Peering rules. Neither list holds a default route. Accepted prefixes stay out of the
        provider's space (a peer's route there is a hijack): the tenant pool, the SID block, the
        loopback and base-host nets, the internal prefixes and every address of the provider's
        nodes (peering links, shared services). Advertised prefixes stay out of the same space
        (the internal prefix and the infrastructure are never advertised) and out of the peer's
        own prefixes and the accepted ones (re-advertising them would make the provider transit
        for the peer)."""
        pool = ctx.work.pools.prefix6
        for x in ctx.work.ebgp_peerings:
            if x.id not in ctx.touch:
                continue
            for p in x.accept:
                bad = _default_or_overlap(p, x.internal)
                bad = (f"the provider's internal prefix {bad}" if bad not in ("", "a default route") else bad) \
                    or address_plan_clash(ctx.work, p)
                if bad:
                    ctx.final([(x.id, "spec.accept")], f"ebgp_peering {x.id}: accepting {p} from AS{x.peer_as} would let it announce "
                                                       f"{bad}; accept only the peer's own prefixes")  # fmt: skip
            # the peer's prefixes and the accepted ones (a default route accepted is reported above)
            theirs = [q for q in [*x.announced, *x.accept] if ipaddress.IPv6Network(q).prefixlen > 0 and q != pool]
            for p in x.advertise:
                bad = _default_or_overlap(p, x.internal)
                bad = (f"the provider's internal prefix {bad}" if bad not in ("", "a default route") else bad) \
                    or _default_or_overlap(p, theirs) or address_plan_clash(ctx.work, p)
                if bad:
                    ctx.final([(x.id, "spec.advertise")], f"ebgp_peering {x.id}: advertising {p} to AS{x.peer_as} would announce "
                                                          f"{bad}; advertise only prefixes outside the tenant pool, the SID block, the "
                                                          "provider's infrastructure and internal prefixes, and the peer's own prefixes")  # fmt: skip

    # -- validation scope ----------------------------------------------------------------------------

    def service_nodes(self, sc: Scenario, out: dict[str, set[str]]) -> None:
        for x in sc.ebgp_peerings:
            out[f"ebgp_peering/{x.id}"] = {x.pe, x.router}

    def address_owners(self, sc: Scenario, out: dict[str, set[str]]) -> None:
        for x in sc.ebgp_peerings:
            out.setdefault(pe_addr(x), set()).add(x.pe)
            out.setdefault(router_addr(x), set()).add(x.router)

    def changed(self, old: Scenario, new: Scenario) -> set[str]:
        ol, nl = {x.id: x for x in old.ebgp_peerings}, {x.id: x for x in new.ebgp_peerings}
        return {f"ebgp_peering/{k}" for k in set(ol) | set(nl) if dump(ol.get(k)) != dump(nl.get(k))}

    def drop_dependents(self, sc: Scenario, cls: str, iid: str) -> None:
        if cls == "ebgp_peering":
            sc.ebgp_peerings = [x for x in sc.ebgp_peerings if x.id != iid]
