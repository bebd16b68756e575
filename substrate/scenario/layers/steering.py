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
site go through the waypoint (its policy SID counter grows by at least the number sent), over
IPv6 and, where the destination and a site at the ingress PE carry IPv4, over IPv4 as well (issue
19). Both families share the policy SID, so the observer never runs two checks of one SID at once.
"""

from __future__ import annotations

import random
from typing import Any

from pydantic import Field

from substrate import addressing as a
from substrate.routes import route_key
from substrate.scenario.layers.addressing import Ipam
from substrate.scenario.layers.base import GenerationError, Intent, Layer, LayerParams, density_fits, node_cfg, register
from substrate.scenario.layers.l3vpn import ce_addr, dump, sid_of, site_changed
from substrate.scenario.layers.specs import InstanceId, NodeName, Spec
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


# -- typed specs (the A3-T catalog) ---------------------------------------------------------------------


class SteeringPolicySpec(Spec):
    """Traffic of ``tenant`` entering at ``ingress_pe`` toward ``dst_site`` goes through
    ``waypoint`` (a uSID End SID with the NEXT-C-SID flavor is allocated on the waypoint, RFC 9800)."""

    tenant: InstanceId
    ingress_pe: NodeName = Field(description="PE where the tenant has a site; its traffic to dst_site is steered.")
    dst_site: InstanceId = Field(description="Destination site (of the same tenant, on another PE).")
    waypoint: NodeName = Field(description="Router the traffic must cross (not the ingress or egress PE).")


class SteeringPolicyPatch(Spec):
    """Fields of a steering policy to change."""

    tenant: InstanceId | None = Field(default=None, description="Must equal the policy's tenant if given.")
    ingress_pe: NodeName | None = None
    dst_site: InstanceId | None = None
    waypoint: NodeName | None = None


class SteeringPolicyIntent(Intent):
    """Catalog class ``steering_policy``."""

    name = "steering_policy"
    Spec = SteeringPolicySpec
    Patch = SteeringPolicyPatch
    id_type = InstanceId
    id_doc = "New policy id (e.g. 'sp4'); left out = next free 'sp<N>'."
    info = {
        "description": "Pins a tenant's traffic from one PE to one remote site through a waypoint router: the segment "
                       "list is one uSID container <waypoint><policy End SID><egress PE><egress uDT6/uDX4> (RFC 9800).",
        "id_format": "sp<N>, e.g. 'sp3'",
        "allocated": ["End (NEXT-C-SID) SID function on the waypoint"],
        "layer": "steering",
    }  # fmt: skip
    examples = [{"op": "create", "service_class": "steering_policy", "id": "sp2",
                 "spec": {"tenant": "t3", "ingress_pe": "r1", "dst_site": "t3s1", "waypoint": "r5"}}]  # fmt: skip

    def instances(self, sc: Scenario) -> list[Any]:
        return list(sc.steering)

    def spec_of(self, x: Any) -> dict[str, Any]:
        return {"tenant": x.tenant, "ingress_pe": x.ingress_pe, "dst_site": x.dst_site, "waypoint": x.waypoint}

    def allocated(self, sc: Scenario, x: Any) -> dict[str, Any]:
        t = sc.tenant(x.tenant)
        dst = sc.site(x.dst_site)
        out = {"waypoint_sid": sid_of(sc, x.waypoint, x.waypoint_function), "segment_list6": policy_segs(sc, x, t.dt6_functions[dst.pe])}
        if dst.prefix4 and dst.dx4_function is not None:
            out["segment_list4"] = policy_segs(sc, x, dst.dx4_function)
        return out

    def service(self, x: Any) -> str:
        return f"steering/{x.id}"

    def apply(self, ctx: Any, i: int, op: Any) -> None:
        pols = {p.id: p for p in ctx.work.steering}
        if op.op == "create":
            sp = op.spec
            same = [p for p in ctx.work.steering if (p.tenant, p.ingress_pe, p.dst_site, p.waypoint) ==
                    (sp.tenant, sp.ingress_pe, sp.dst_site, sp.waypoint) and (op.id is None or p.id == op.id)]  # fmt: skip
            if same:
                ctx.result(i, op, same[0].id, "no change", notes=[f"policy {same[0].id} exists with this spec"])
                return
            iid = op.id or ctx.new_id("sp", set(ctx.ids()))
            if ctx.in_use(i, iid):
                return
            prev = ctx.gone.get(iid)
            keep = isinstance(prev, SteeringPolicy) and prev.waypoint == sp.waypoint
            p = SteeringPolicy(id=iid, tenant=sp.tenant, ingress_pe=sp.ingress_pe, dst_site=sp.dst_site, waypoint=sp.waypoint,
                               waypoint_function=prev.waypoint_function if keep else 0)  # fmt: skip
            ctx.work.steering.append(p)
            if not keep:
                ctx.pending("steering.waypoints").append((i, iid))
            ctx.result(i, op, iid, "created", notes=["takes back its waypoint SID"] if keep else [])
            return
        if op.id not in pols:
            ctx.missing(i, op, "steering_policy")
            return
        cur = pols[op.id]
        if op.op == "delete":
            ctx.work.steering.remove(cur)
            ctx.gone[cur.id] = cur
            ctx.result(i, op, cur.id, "deleted", notes=[f"End SID function {cur.waypoint_function:#x} on {cur.waypoint} freed"])
            return
        given = op.spec.model_fields_set
        if "tenant" in given and op.spec.tenant not in (None, cur.tenant):
            ctx.bad(f"ops[{i}].spec.tenant", f"a policy cannot change tenant ({cur.id} belongs to {cur.tenant})")
            return
        new = cur.model_copy(update={k: getattr(op.spec, k) for k in ("ingress_pe", "dst_site", "waypoint")
                                     if k in given and getattr(op.spec, k) is not None})  # fmt: skip
        if new == cur:
            ctx.result(i, op, cur.id, "no change")
            return
        if new.waypoint != cur.waypoint:
            # the old function number is the old waypoint's: left on the policy while allocating,
            # it would claim that number on the new waypoint too (0 is outside every function pool)
            new = new.model_copy(update={"waypoint_function": 0})
            ctx.pending("steering.waypoints").append((i, new.id))
        ctx.work.steering[ctx.work.steering.index(cur)] = new
        ctx.result(i, op, cur.id, "modified")


def _integrity(ctx: Any) -> None:
    """Steering rules (RFC 9800 uSID): the destination is a site of the policy's tenant on another
    PE, the waypoint a router other than the ingress and egress PEs, one policy per (tenant,
    ingress PE, destination); a policy the change set states needs a tenant site on its ingress
    PE (a policy merely left without one stays, with a warning: the layer keeps it and has no
    traffic to check)."""
    sites, tenants = ctx.sites(), ctx.tenants()
    flows: dict[tuple[str, str, str], str] = {}
    for p in ctx.work.steering:
        refs = [(p.id, "spec.tenant"), (p.dst_site, "spec.pe")]
        t = tenants.get(p.tenant)
        dst = sites.get(p.dst_site)
        if t is None:
            ctx.final(refs + [(p.tenant, "id")], f"steering_policy {p.id}: no tenant {p.tenant!r}")
            continue
        if dst is None or dst.tenant != p.tenant:
            what = "does not exist" if dst is None else f"belongs to {dst.tenant}"
            ctx.final([(p.id, "spec.dst_site"), (p.dst_site, "id")],
                      f"steering_policy {p.id} steers {p.tenant} traffic to site {p.dst_site}, which {what}; delete or change "
                      f"{p.id} in the same change set")  # fmt: skip
            continue
        if p.ingress_pe not in ctx.pes:
            ctx.final([(p.id, "spec.ingress_pe")], f"ingress_pe {p.ingress_pe!r} is not a PE")
        elif not any(s.pe == p.ingress_pe for s in t.sites):
            if p.id in ctx.touch:
                ctx.final([(p.id, "spec.ingress_pe")], f"steering_policy {p.id} needs a site of {p.tenant} on its ingress PE "
                                                       f"{p.ingress_pe} (the steered traffic enters there); {p.tenant} has none")  # fmt: skip
            elif any(s.pe == p.ingress_pe for s in ctx.old.all_sites() if s.tenant == p.tenant):
                # the layer keeps such a policy (it renders, and has no traffic to check): say so, do not refuse
                ctx.warnings.append(f"steering_policy {p.id} steers {p.tenant} traffic entering at {p.ingress_pe}, where "
                                    f"{p.tenant} has no site left: it stays in place but carries no traffic (delete it, "
                                    f"or give {p.tenant} a site on {p.ingress_pe} again)")  # fmt: skip
        if dst.pe == p.ingress_pe:
            ctx.final([(p.id, "spec.ingress_pe"), (dst.id, "spec.pe")],
                      f"steering_policy {p.id}: destination {dst.id} would be on the ingress PE {p.ingress_pe} itself")
        if p.waypoint not in ctx.routers:
            ctx.final([(p.id, "spec.waypoint")], f"waypoint {p.waypoint!r} is not a router; routers: {', '.join(ctx.routers)}")
        elif p.waypoint in (p.ingress_pe, dst.pe):
            ctx.final([(p.id, "spec.waypoint"), (dst.id, "spec.pe")],
                      f"steering_policy {p.id}: the waypoint {p.waypoint} must differ from the ingress PE and from the "
                      f"destination's PE ({dst.pe})")  # fmt: skip
        key = (p.tenant, p.ingress_pe, p.dst_site)
        if key in flows:
            ctx.final([(p.id, "spec.dst_site")], f"{flows[key]} already steers {p.tenant} traffic from {p.ingress_pe} to {p.dst_site}")
        flows[key] = p.id


@register
class Steering(Layer):
    name = "steering"
    requires = ("l3vpn",)
    Params = SteeringParams
    records = ("steering",)
    intents = (SteeringPolicyIntent(),)

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
            # the IPv4 half of the policy (render_policy steers it through the same waypoint SID)
            src4 = next((s for s in t.sites if s.pe == p.ingress_pe and s.prefix4), None)
            if dst.prefix4 and dst.dx4_function is not None and src4 is not None:
                out.append(Invariant(
                    id=f"steering/{p.id}/path/4", kind="steered_path", service=f"steering/{p.id}",
                    params={"src": src4.ce, "dst": ce_addr(dst.prefix4, 2), "family": 4, "node": p.waypoint,
                            "sid": sid_of(sc, p.waypoint, p.waypoint_function), "count": PATH_PROBES},
                    description=f"{t.name}: IPv4 traffic from {p.ingress_pe} to site {dst.id} goes through {p.waypoint}",
                ))
        return out

    def claim(self, sc: Scenario, ipam: Any) -> None:
        for p in sc.steering:
            ipam.functions.setdefault(p.waypoint, set()).add(p.waypoint_function)

    def sids(self, sc: Scenario) -> list[tuple[str, int, str, str, dict[str, Any]]]:
        return [(p.waypoint, p.waypoint_function, "End", f"steering {p.id}", {"flavors": ["next-csid"]}) for p in sc.steering]

    def allocate(self, ctx: Any, ipam: Any) -> None:
        """Waypoint End functions, in operation order."""
        pols = {p.id: p for p in ctx.work.steering}
        res = {r.id: r for r in ctx.results}
        for i, pid in ctx.pending("steering.waypoints"):
            p = pols.get(pid)
            if p is None or p.waypoint not in ctx.routers:
                continue
            try:
                p.waypoint_function = ipam.function(p.waypoint)
                res[pid].allocated["waypoint_sid"] = sid_of(ctx.old, p.waypoint, p.waypoint_function)
            except GenerationError as e:
                ctx.exhausted(i, "spec.waypoint", e)

    def integrity(self, ctx: Any) -> None:
        _integrity(ctx)

    def service_nodes(self, sc: Scenario, out: dict[str, set[str]]) -> None:
        sites = {s.id: s for s in sc.all_sites()}
        for p in sc.steering:
            dst = sites.get(p.dst_site)
            out[f"steering/{p.id}"] = {p.ingress_pe, p.waypoint} | ({dst.pe, dst.ce} if dst else set()) | {
                s.ce for t in sc.tenants if t.id == p.tenant for s in t.sites if s.pe == p.ingress_pe}

    def changed(self, old: Scenario, new: Scenario) -> set[str]:
        out: set[str] = set()
        ot, nt = {t.id: t for t in old.tenants}, {t.id: t for t in new.tenants}
        osites = {s.id: s for s in old.all_sites()}
        nsites = {s.id: s for s in new.all_sites()}

        def dt6(sc_t: dict[str, Any], tid: str, pe: str | None) -> int | None:
            t = sc_t.get(tid)
            return t.dt6_functions.get(pe) if t and pe else None

        op_, np_ = {p.id: p for p in old.steering}, {p.id: p for p in new.steering}
        for k in set(op_) | set(np_):
            p = np_.get(k) or op_[k]
            dpe = (nsites.get(p.dst_site) or osites.get(p.dst_site))
            ingress = lambda sites, p=p: sorted(x.id for x in sites.values() if x.tenant == p.tenant and x.pe == p.ingress_pe)  # noqa: E731
            if (dump(op_.get(k)) != dump(np_.get(k)) or site_changed(old, new, p.dst_site) or ingress(osites) != ingress(nsites)
                    or dt6(ot, p.tenant, dpe.pe if dpe else None) != dt6(nt, p.tenant, dpe.pe if dpe else None)):  # fmt: skip
                out.add(f"steering/{k}")
        return out

    def references(self, sc: Scenario, cls: str, iid: str) -> list[str]:
        if cls == "tenant":
            return [p.id for p in sc.steering if p.tenant == iid]
        if cls == "tenant_site":
            return [f"{p.id} (steering dst_site)" for p in sc.steering if p.dst_site == iid]
        return []

    def drop_dependents(self, sc: Scenario, cls: str, iid: str) -> None:
        if cls == "tenant":
            sc.steering = [p for p in sc.steering if p.tenant != iid]
        elif cls == "tenant_site":
            sc.steering = [p for p in sc.steering if p.dst_site != iid]
        elif cls == "steering_policy":
            sc.steering = [p for p in sc.steering if p.id != iid]

    def pins_site(self, sc: Scenario, site: str) -> bool:
        return any(p.dst_site == site for p in sc.steering)
