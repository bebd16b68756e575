"""Service class ``shared_services``: shared-service route leaking.

A shared-services host (``svc1``, DNS/NTP-like) hangs off one PE, the services PE, on a /64 of
its own outside the tenant pools (default ``fd5e::/64``: PE ``::1``, host ``::2``). Its port is
policy-routed into a routing table of its own (the services table, from the table pool), which
ends in ``unreachable ::/0`` like a tenant table; an End.DT6 SID of the services PE decapsulates
into it. A *route leak* grants one tenant access (the leak policy on the PEs, as an L3VPN
import/export of the shared-services route would on a VRF-capable router):

- in the tenant's table on every PE of the tenant, a route to the shared prefix -- H.Encaps.Red
  to the services PE's End.DT6 SID, or out of the services port on the services PE itself;
- in the services table, a route back to each of the tenant's site prefixes -- H.Encaps.Red to
  the site PE's End.DT6 SID of the tenant, or out of the site's port on the services PE.

Tenants without a leak have no route to the shared prefix, and the services table holds only
leaked tenants' sites, so a tenant cannot transit the services table to another tenant: traffic
it sends there is looked up in its own table, which has no route to the other tenant. Two leaked
tenants must not use overlapping prefixes (the services table would route one tenant's replies to
the other): the generator leaks only tenants whose prefixes are disjoint from those already
leaked, and A3-T refuses a change that breaks this. IPv6 only.

Invariants: per leak (service ``route_leak/<id>``) the tenant's probe site (its first site)
reaches the shared host with real pings; per scenario (service ``shared_services``) up to two
tenants without a leak cannot reach it, and up to two pairs of leaked tenants still cannot reach
each other (no transit through the services table). Isolation is counted where the probe would
arrive (``isolated`` with ``dst_node``: the shared host, the other tenant's CE), so a one-way
leak -- a tenant's table routing to the services while the way back is missing -- fails too.
"""

from __future__ import annotations

import random
from typing import Any

from pydantic import Field, field_validator

from substrate.scenario.layers.addressing import Ipam
from substrate.scenario.layers.base import GenerationError, Layer, LayerParams, RecordIntent, address_plan_clash, density_fits, node_cfg, register
from substrate.scenario.layers.l3vpn import (
    attach_host,
    ce_addr,
    ce_iface,
    dump,
    interface_block,
    overlaps,
    segs,
    sid_of,
    tenant_nodes,
)
from substrate.scenario.layers.specs import InstanceId, Spec, link_slash64
from substrate.scenario.model import (
    RULE_PRIO_SIDS,
    RULE_PRIO_TENANT,
    SID_BLOCK,
    UNREACHABLE_METRIC,
    Invariant,
    NodeConfig,
    RouteLeak,
    Scenario,
    SharedServices,
    Tenant,
)
from substrate.topology import Role

SERVICE = "shared_services"
HOST = "svc1"


class SharedServicesParams(LayerParams):
    """The services PE (default: drawn from the seed), the shared prefix, and leaks per unit of density."""

    pe: str | None = None
    prefix6: str = "fd5e::/64"
    leaks_per_density: int = Field(default=1, ge=0, le=100)

    @field_validator("prefix6")
    @classmethod
    def _slash64(cls, v: str) -> str:
        return link_slash64(v, "the shared prefix is a /64 (PE ::1, host ::2)")


def shared_addr(ss: SharedServices) -> str:
    """The shared host's address (host 2 of the shared prefix)."""
    return ce_addr(ss.prefix6, 2)


def prefixes_of(t: Tenant) -> list[str]:
    return [s.prefix6 for s in t.sites]


def clashes(t: Tenant, others: list[Tenant]) -> list[tuple[str, str, str]]:
    """(prefix of ``t``, other tenant, its prefix) pairs that overlap: the services table cannot hold both."""
    return [(p, o.id, q) for p in prefixes_of(t) for o in others if o.id != t.id for q in prefixes_of(o) if overlaps(p, q)]


def render_shared(sc: Scenario, out: dict[str, NodeConfig]) -> None:
    """Device state of the shared-services segment and every leak."""
    ss = sc.shared_services
    if ss is None:
        return
    host = node_cfg(out, ss.host)
    host.links_up.append(ss.host_if)
    host.addresses.append(f"{ce_iface(ss.prefix6, 2)} dev {ss.host_if}")
    host.routes6.append(f"::/0 metric 1024 via {ce_addr(ss.prefix6, 1)} dev {ss.host_if}")
    pe = node_cfg(out, ss.pe)
    pe.links_up.append(ss.pe_if)
    pe.frr.append(interface_block(ss.pe_if, ce_iface(ss.prefix6, 1), None))
    pe.rules6.append(f"priority {RULE_PRIO_SIDS} to {SID_BLOCK} lookup main")
    pe.rules6.append(f"priority {RULE_PRIO_TENANT} iif {ss.pe_if} lookup {ss.table}")
    pe.routes6.append(f"unreachable ::/0 table {ss.table} metric {UNREACHABLE_METRIC}")
    pe.routes6.append(f"{ss.prefix6} table {ss.table} metric 1024 dev {ss.pe_if}")
    pe.routes6.append(f"{sid_of(sc, ss.pe, ss.dt6_function)} metric 1024 encap seg6local action End.DT6 table {ss.table} count dev sr0")
    for leak in sc.route_leaks:
        t = sc.tenant(leak.tenant)
        for tpe in sorted(t.dt6_functions):
            cfg = node_cfg(out, tpe)
            if tpe == ss.pe:
                cfg.routes6.append(f"{ss.prefix6} table {t.table} metric 1024 dev {ss.pe_if}")
            else:
                cfg.routes6.append(f"{ss.prefix6} table {t.table} metric 1024 encap seg6 mode encap.red "
                                   f"segs {segs(sc, ss.pe, ss.dt6_function)} dev sr0")  # fmt: skip
        for s in t.sites:
            if s.pe == ss.pe:
                pe.routes6.append(f"{s.prefix6} table {ss.table} metric 1024 dev {s.pe_if}")
            else:
                pe.routes6.append(f"{s.prefix6} table {ss.table} metric 1024 encap seg6 mode encap.red "
                                  f"segs {segs(sc, s.pe, t.dt6_functions[s.pe])} dev sr0")  # fmt: skip


# -- typed specs (the A3-T catalog) ---------------------------------------------------------------------


class RouteLeakSpec(Spec):
    """Grant a tenant access to the shared services (DNS/NTP-like hosts on the services PE): its sites reach the
    shared prefix and the shared hosts reach its sites; tenants without a leak cannot."""

    tenant: InstanceId = Field(description="Tenant id, e.g. 't3'.")


class RouteLeakPatch(Spec):
    """Fields of a leak to change: another tenant gets the access instead."""

    tenant: InstanceId | None = Field(default=None, description="Tenant id, e.g. 't3'.")


class RouteLeakIntent(RecordIntent):
    """Catalog class ``route_leak``."""

    name = "route_leak"
    field = "route_leaks"
    id_prefix = "leak"
    Record = RouteLeak
    Spec = RouteLeakSpec
    Patch = RouteLeakPatch
    id_type = InstanceId
    id_doc = "New leak id (e.g. 'leak3'); left out = next free 'leak<N>'."
    info = {
        "description": "Shared-service route leaking: the tenant's table on each of its PEs gets a route to the shared "
                       "prefix (H.Encaps.Red to the services PE's End.DT6 SID into the services table), and the services "
                       "table gets a route back to each of the tenant's sites. Tenants without a leak cannot reach the "
                       "shared services; leaked tenants still cannot reach each other. Two leaked tenants cannot use "
                       "overlapping prefixes (the services table would send one's replies to the other). One leak per tenant.",
        "id_format": "leak<N>, e.g. 'leak2'",
        "allocated": [],
        "layer": "shared_services",
    }  # fmt: skip
    examples = [{"op": "create", "service_class": "route_leak", "id": "leak3", "spec": {"tenant": "t4"}}]

    def spec_of(self, x: Any) -> dict[str, Any]:
        return {"tenant": x.tenant}

    def allocated(self, sc: Scenario, x: Any) -> dict[str, Any]:
        ss = sc.shared_services
        if ss is None:
            return {}
        return {"shared_prefix": ss.prefix6, "shared_host": shared_addr(ss), "services_pe": ss.pe, "services_table": ss.table,
                "services_sid": sid_of(sc, ss.pe, ss.dt6_function)}  # fmt: skip

    def service(self, x: Any) -> str:
        return f"route_leak/{x.id}"

    def refuse(self, ctx: Any, i: int, op: Any) -> bool:
        if ctx.work.shared_services is None:
            ctx.bad(f"ops[{i}].service_class", "this network has no shared services (no shared_services layer): route leaks cannot be used")
            return True
        return False

    def delete_notes(self, x: Any) -> list[str]:
        return [f"{x.tenant} loses access to the shared services"]


@register
class SharedServicesClass(Layer):
    """Shared-service route leaking (see module docstring)."""

    name = "shared_services"
    requires = ("l3vpn",)
    Params = SharedServicesParams
    records = ("route_leaks",)
    intents = (RouteLeakIntent(),)

    def generate(self, sc: Scenario, params: LayerParams, rng: random.Random, density: int) -> Scenario:
        assert isinstance(params, SharedServicesParams)
        pes = [n.name for n in sc.topology.routers if n.role is Role.PE]
        clash = address_plan_clash(sc, params.prefix6)
        if clash:
            raise GenerationError("layers.shared_services.prefix6", f"{params.prefix6} overlaps {clash}")
        ipam = Ipam.from_scenario(sc)
        topo, ss = sc.topology, sc.shared_services
        if ss is None:
            pe = params.pe or rng.choice(pes)
            if pe not in pes:
                raise GenerationError("layers.shared_services.pe", f"{pe!r} is not a PE; PEs: {', '.join(pes)}")
            topo, port = attach_host(topo, pe, HOST)
            with density_fits(density):
                ss = SharedServices(pe=pe, pe_if=port, host=HOST, prefix6=params.prefix6, table=ipam.table(),
                                    dt6_function=ipam.function(pe))
        leaks = list(sc.route_leaks)
        leaked = [sc.tenant(x.tenant) for x in leaks]
        want = params.leaks_per_density * density
        cands = [t for t in sc.tenants if t.sites and t.id not in {x.tenant for x in leaks}]
        for t in rng.sample(cands, len(cands)):
            if len(leaks) >= want:
                break
            if clashes(t, leaked):  # its replies could not be told from another leaked tenant's
                continue
            leaks.append(RouteLeak(id=f"leak{len(leaks) + 1}", tenant=t.id))
            leaked.append(t)
        return sc.model_copy(update={"topology": topo, "shared_services": ss, "route_leaks": leaks})

    def render(self, sc: Scenario, out: dict[str, NodeConfig]) -> None:
        render_shared(sc, out)

    def invariants(self, sc: Scenario) -> list[Invariant]:
        ss = sc.shared_services
        if ss is None:
            return []
        dst = shared_addr(ss)
        out: list[Invariant] = []
        leaked = {x.tenant for x in sc.route_leaks}
        for x in sc.route_leaks:
            t = sc.tenant(x.tenant)
            if not t.sites:
                continue
            src = t.sites[0]
            out.append(Invariant(
                id=f"route_leak/{x.id}/reach/{src.id}", kind="reach", service=f"route_leak/{x.id}",
                params={"src": src.ce, "dst": dst, "family": 6},
                description=f"{t.name}: site {src.id} reaches the shared services ({dst}) through leak {x.id}",
            ))
        rng = random.Random(f"{sc.seed}/shared_services")
        others = [t for t in sc.tenants if t.id not in leaked and t.sites]
        for t in rng.sample(others, min(2, len(others))):
            src = t.sites[0]
            out.append(Invariant(
                id=f"shared_services/isolated/{t.id}", kind="isolated", service=SERVICE,
                params={"src": src.ce, "dst": dst, "dst_node": ss.host, "family": 6},
                description=f"{t.name} has no leak: site {src.id} cannot reach the shared services ({dst})",
            ))
        pairs = [(a, b) for a in sc.route_leaks for b in sc.route_leaks if a.tenant != b.tenant]
        for a, b in rng.sample(pairs, min(2, len(pairs))):
            ta, tb = sc.tenant(a.tenant), sc.tenant(b.tenant)
            if not ta.sites or not tb.sites:
                continue
            out.append(Invariant(
                id=f"shared_services/no_transit/{ta.sites[0].id}-x-{tb.sites[0].id}", kind="isolated", service=SERVICE,
                params={"src": ta.sites[0].ce, "dst": ce_addr(tb.sites[0].prefix6, 2), "dst_node": tb.sites[0].ce, "family": 6},
                description=f"leaked tenants stay apart: {ta.name}'s site {ta.sites[0].id} cannot reach {tb.name}'s site "
                            f"{tb.sites[0].id} (no transit through the services table)",
            ))  # fmt: skip
        return out

    # -- inventory and pools ----------------------------------------------------------------------

    def claim(self, sc: Scenario, ipam: Any) -> None:
        ss = sc.shared_services
        if ss is not None:
            ipam.tables.add(ss.table)
            ipam.functions.setdefault(ss.pe, set()).add(ss.dt6_function)

    def hosts(self, sc: Scenario) -> set[str]:
        return {sc.shared_services.host} if sc.shared_services else set()

    def sids(self, sc: Scenario) -> list[tuple[str, int, str, str, dict[str, Any]]]:
        ss = sc.shared_services
        return [(ss.pe, ss.dt6_function, "End.DT6", "shared services", {"table": str(ss.table)})] if ss else []

    # -- planner hooks -------------------------------------------------------------------------------

    def integrity(self, ctx: Any) -> None:
        """Leak rules: the tenant exists and has a site; one leak per tenant; leaked tenants' prefixes
        do not overlap (the services table holds one route per prefix: the replies of one would go
        to the other)."""
        tenants = ctx.tenants()
        seen: dict[str, str] = {}
        leaked: list[Tenant] = []
        for x in ctx.work.route_leaks:
            t = tenants.get(x.tenant)
            if t is None:
                ctx.final([(x.id, "spec.tenant"), (x.tenant, "id")], f"route_leak {x.id}: no tenant {x.tenant!r}")
                continue
            if x.tenant in seen:
                ctx.final([(x.id, "spec.tenant")], f"tenant {x.tenant} already has leak {seen[x.tenant]} (one per tenant)")
            seen[x.tenant] = x.id
            if not t.sites and x.id in ctx.touch:
                ctx.final([(x.id, "spec.tenant")], f"route_leak {x.id}: tenant {x.tenant} has no site to leak the shared services to")
            for p, other, q in clashes(t, leaked):
                refs = [(x.id, "spec.tenant"), *[(s.id, "spec.prefix6") for s in t.sites if s.prefix6 == p]]
                refs += [(seen[other], "spec.tenant"), *[(s.id, "spec.prefix6") for s in tenants[other].sites if s.prefix6 == q]]
                ctx.final(refs, f"route_leak {x.id}: {x.tenant}'s {p} overlaps {other}'s {q}, also leaked to the shared services "
                                "(their table would route one tenant's replies to the other); choose another prefix or drop one leak")  # fmt: skip
            leaked.append(t)

    # -- validation scope ----------------------------------------------------------------------------

    def service_nodes(self, sc: Scenario, out: dict[str, set[str]]) -> None:
        ss = sc.shared_services
        if ss is None:
            return
        out[SERVICE] = {ss.pe, ss.host}
        tenants = {t.id: t for t in sc.tenants}
        for x in sc.route_leaks:
            t = tenants.get(x.tenant)
            out[f"route_leak/{x.id}"] = (tenant_nodes(t) if t else set()) | {ss.pe, ss.host}

    def address_owners(self, sc: Scenario, out: dict[str, set[str]]) -> None:
        ss = sc.shared_services
        if ss is not None:
            out.setdefault(shared_addr(ss), set()).update({ss.host, ss.pe})

    def changed(self, old: Scenario, new: Scenario) -> set[str]:
        ol, nl = {x.id: x for x in old.route_leaks}, {x.id: x for x in new.route_leaks}
        ot, nt = {t.id: t for t in old.tenants}, {t.id: t for t in new.tenants}
        out = set()
        for k in set(ol) | set(nl):
            x = nl.get(k) or ol[k]
            if dump(ol.get(k)) != dump(nl.get(k)) or dump(ot.get(x.tenant)) != dump(nt.get(x.tenant)):
                out.add(f"route_leak/{k}")
        if out:
            out.add(SERVICE)
        return out

    # -- references between instances ----------------------------------------------------------------

    def references(self, sc: Scenario, cls: str, iid: str) -> list[str]:
        return [x.id for x in sc.route_leaks if x.tenant == iid] if cls == "tenant" else []

    def drop_dependents(self, sc: Scenario, cls: str, iid: str) -> None:
        if cls == "tenant":
            sc.route_leaks = [x for x in sc.route_leaks if x.tenant != iid]
        elif cls == "route_leak":
            sc.route_leaks = [x for x in sc.route_leaks if x.id != iid]

    def pins_site(self, sc: Scenario, site: str) -> bool:
        """A leaked tenant's probe site (its first) carries the leak's check."""
        leaked = {x.tenant for x in sc.route_leaks}
        return any(t.sites and t.sites[0].id == site for t in sc.tenants if t.id in leaked)
