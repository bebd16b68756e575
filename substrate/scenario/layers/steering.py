"""Layer ``steering``: SRv6 traffic-steering policies (a tenant flow pinned through a core router).

A policy takes a tenant's traffic entering at one PE toward one remote site through a waypoint
(a P router when there is one, else another PE), never the ingress or the egress PE itself: there
the path invariant would hold whatever the path. A flow with no such router is not a candidate;
when no flow has one, the layer refuses the manifest. Its segment list is one uSID container (RFC 9800):
``<waypoint uN><policy function><egress PE uN><egress uDT6 or uDX4>``. The policy function is a
SID of its own on the waypoint, an End with the NEXT-C-SID flavor and a 32-bit node+function
length, so the waypoint shifts both C-SIDs at once and its packet counter counts this policy's
traffic alone: the path invariant is exact, not inferred from reachability.

Invariants (service ``steering/<id>``): packets from a site at the ingress PE to the destination
site go through the waypoint (its policy SID counter grows by at least the number sent).
"""

from __future__ import annotations

import random

from pydantic import Field

from substrate import addressing as a
from substrate.routes import route_key
from substrate.scenario.layers.addressing import Ipam
from substrate.scenario.layers.base import GenerationError, Layer, LayerParams, density_fits, node_cfg, register
from substrate.scenario.layers.l3vpn import ce_addr, sid_of
from substrate.scenario.model import Invariant, NodeConfig, Scenario, SteeringPolicy
from substrate.topology import Role

#: Packets a path check sends.
PATH_PROBES = 5


class SteeringParams(LayerParams):
    """Steering policies per unit of density."""

    per_density: int = Field(default=2, ge=0, le=100)


def policy_segs(sc: Scenario, p: SteeringPolicy, egress_function: int) -> str:
    def nid(n: str) -> int:
        v = sc.topology.node(n).node_id
        assert v is not None
        return a.usid_value(v)

    dst = sc.site(p.dst_site)
    return str(a.usid_container([nid(p.waypoint), p.waypoint_function, nid(dst.pe), egress_function]))


def _replace(routes: list[str], new: str) -> None:
    key = route_key(new)
    routes[:] = [r for r in routes if route_key(r) != key] + [new]


def render_policy(sc: Scenario, p: SteeringPolicy, out: dict[str, NodeConfig]) -> None:
    """Device state of one policy: the waypoint SID and the ingress PE's steered routes."""
    t = sc.tenant(p.tenant)
    dst = sc.site(p.dst_site)
    wp = node_cfg(out, p.waypoint)
    wp.routes6.append(
        f"{sid_of(sc, p.waypoint, p.waypoint_function)} metric 1024 encap seg6local action End "
        f"flavors next-csid lblen {a.BLOCK_LEN} nflen {2 * a.CSID_LEN} count dev sr0"
    )
    ing = node_cfg(out, p.ingress_pe)
    _replace(ing.routes6, f"{dst.prefix6} table {t.table} metric 1024 encap seg6 mode encap.red "
                          f"segs {policy_segs(sc, p, t.dt6_functions[dst.pe])} dev sr0")
    if dst.prefix4 and dst.dx4_function is not None:
        _replace(ing.routes4, f"{dst.prefix4} table {t.table} encap seg6 mode encap.red "
                              f"segs {policy_segs(sc, p, dst.dx4_function)} dev sr0")


def waypoints(cores: list[str], ingress_pe: str, egress_pe: str) -> list[str]:
    """The routers a flow from ``ingress_pe`` to a site on ``egress_pe`` may be steered through.

    ``cores`` are the P routers (or every router when the topology has none); a waypoint is never
    the ingress or the egress PE, where the path check would pass whatever the path. Empty when
    the flow cannot be steered.
    """
    return [c for c in cores if c not in (ingress_pe, egress_pe)]


@register
class Steering(Layer):
    name = "steering"
    requires = ("l3vpn",)
    Params = SteeringParams

    def generate(self, sc: Scenario, params: LayerParams, rng: random.Random, density: int) -> Scenario:
        assert isinstance(params, SteeringParams)
        ipam = Ipam.from_scenario(sc)
        cores = [n.name for n in sc.topology.routers if n.role is Role.P] or [n.name for n in sc.topology.routers]
        # candidate flows: (tenant, ingress PE with a site of the tenant, remote site of the tenant)
        flows = sorted({
            (t.id, src.pe, dst.id)
            for t in sc.tenants for src in t.sites for dst in t.sites if src.pe != dst.pe
        })
        want = params.per_density * density
        if want and not flows:
            raise GenerationError("layers.steering.per_density", "no tenant has sites on two PEs to steer between")
        # a flow with no waypoint but its own two PEs (line:2) cannot be steered: never a candidate
        flows = [f for f in flows if waypoints(cores, f[1], sc.site(f[2]).pe)]
        if want and not flows:
            raise GenerationError("layers.steering.per_density",
                                  "no router to steer through besides the ingress and egress PEs of a flow "
                                  "(the topology needs a third router on the way, e.g. line:3)")
        policies = list(sc.steering)
        taken = {(p.tenant, p.ingress_pe, p.dst_site) for p in policies}
        free = [f for f in flows if f not in taken]
        for tid, ing, dst in rng.sample(free, min(want, len(free))):
            wp = rng.choice(waypoints(cores, ing, sc.site(dst).pe))
            with density_fits(density):
                fn = ipam.function(wp)
            policies.append(SteeringPolicy(id=f"sp{len(policies) + 1}", tenant=tid, ingress_pe=ing,
                                           dst_site=dst, waypoint=wp, waypoint_function=fn))
        return sc.model_copy(update={"steering": policies})

    def render(self, sc: Scenario, out: dict[str, NodeConfig]) -> None:
        for p in sc.steering:
            render_policy(sc, p, out)

    def invariants(self, sc: Scenario) -> list[Invariant]:
        out = []
        for p in sc.steering:
            t = sc.tenant(p.tenant)
            src = next((s for s in t.sites if s.pe == p.ingress_pe), None)
            dst = sc.site(p.dst_site)
            if src is None:
                continue
            out.append(Invariant(
                id=f"steering/{p.id}/path", kind="steered_path", service=f"steering/{p.id}",
                params={"src": src.ce, "dst": ce_addr(dst.prefix6, 2), "family": 6, "node": p.waypoint,
                        "sid": sid_of(sc, p.waypoint, p.waypoint_function), "count": PATH_PROBES},
                description=f"{t.name}: traffic from {p.ingress_pe} to site {dst.id} goes through {p.waypoint}",
            ))
        return out
