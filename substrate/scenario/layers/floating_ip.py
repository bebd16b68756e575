"""Layer ``floating_ip``: public IPv4 addresses NATed to tenant sites on a border PE.

An external host (``x1``, on 203.0.113.0/24, TEST-NET-3, RFC 5737) hangs off the border PE.
Each floating IP (from 198.51.100.0/24, TEST-NET-2) is a 1:1 destination NAT on the border PE
(nftables table ``ip fip``) to a site CE's IPv4 address, plus a firewall mark that a rule turns
into a lookup in the tenant's table (tenants may overlap: the mark, not the address, says whose
site it is). Replies leave the site's PE through an End.DX4 SID of the border PE toward the
external host; conntrack on the border PE (netfilter hooks enabled for SRv6-decapsulated
packets) undoes the translation. The NAT range, the mark space, the border PE's tenant tables
and its SID space are shared by every floating IP.

Hairpin (inside-out): a CE of the tenant on the site's PE reaching the floating address (the
site's own CE included) is translated on that PE -- destination NAT to the site's CE, source NAT
to the PE's end of the site's circuit, so the reply comes back through the PE's conntrack
(nftables table ``ip fip_hairpin``; without it the CE's own floating address was unreachable
from inside, issue 19). A CE of the tenant on another PE reaching the floating address is
translated on its own PE -- destination NAT to the site's CE only; the tenant table carries the
packet to that CE by SRv6 and the reply back through the same PE's conntrack (issue 36).

Invariants (service ``floating_ip/<id>``): the external host's pings to the floating IP get
replies *and* arrive at the site's CE, counted there after the NAT (``reach_at``: a NAT to
another CE answers too, from the wrong host); the border PE's NAT still maps it to the right CE;
and the site's CE, and every other IPv4 CE of the tenant on any PE, reaches the floating address
(``reach_at`` counted at the site's CE: hairpin).
State (``nft_chain``, :func:`chain_invariants`): the border PE's ``ip fip`` chains and every PE's
``ip fip_hairpin`` chains hold exactly what is rendered (issue 19: a spare public address NATed to
another tenant's CE broke no reach check).
"""

from __future__ import annotations

import ipaddress
import random
import re
from typing import Any

from pydantic import Field

from substrate.scenario.layers.addressing import Ipam
from substrate.scenario.layers.base import (
    GenerationError,
    Intent,
    Layer,
    LayerParams,
    density_fits,
    nft_chain_invariants,
    node_cfg,
    register,
)
from substrate.scenario.layers.l3vpn import attach_host, ce_addr, ce_iface, dump, interface_block, natural_key, segs, sid_of, site_changed
from substrate.scenario.layers.specs import AUTO, Address4, InstanceId, Spec
from substrate.scenario.model import (
    RULE_PRIO_FWMARK,
    UNREACHABLE_METRIC,
    External,
    FloatingIP,
    Invariant,
    NodeConfig,
    Scenario,
)
from substrate.topology import Role

TABLE = "ip fip"
#: The hairpin translation of a site PE (module docstring).
HAIRPIN_TABLE = "ip fip_hairpin"
#: An address the border PE's NAT rules translate or mark (what A3-T finds in use on a device).
_FIP_RE = re.compile(r"ip daddr (\d+\.\d+\.\d+\.\d+) (?:dnat to|meta mark set)")
EXTERNAL_PREFIX = "203.0.113.0/24"
EXTERNAL_HOST = "x1"


class FloatingIpParams(LayerParams):
    """Floating IPs per unit of density, and the border PE (default: drawn from the seed)."""

    per_density: int = Field(default=1, ge=0, le=100)
    border_pe: str | None = None


def render_floating(sc: Scenario, out: dict[str, NodeConfig]) -> None:
    """Device state of the external segment and every floating IP."""
    e = sc.external
    if e is None:
        return
    host = node_cfg(out, e.host)
    host.links_up.append(e.host_if)
    host.addresses.append(f"{ce_iface(e.prefix4, 2)} dev {e.host_if}")
    host.routes4.append(f"0.0.0.0/0 via {ce_addr(e.prefix4, 1)} dev {e.host_if}")
    border = node_cfg(out, e.border_pe)
    border.links_up.append(e.pe_if)
    border.frr.append(interface_block(e.pe_if, None, ce_iface(e.prefix4, 1)))
    border.sysctls["net/netfilter/nf_hooks_lwtunnel"] = "1"
    border.routes6.append(
        f"{sid_of(sc, e.border_pe, e.dx4_function)} metric 1024 encap seg6local action End.DX4 "
        f"nh4 {ce_addr(e.prefix4, 2)} count dev sr0"
    )
    marks, nats = [], []
    for f in sc.floating_ips:
        t = sc.tenant(f.tenant)
        s = sc.site(f.site)
        assert s.prefix4 is not None
        border.rules4.append(f"priority {RULE_PRIO_FWMARK} fwmark {f.mark:#x} lookup {t.table}")
        border.routes4.append(f"unreachable 0.0.0.0/0 table {t.table} metric {UNREACHABLE_METRIC}")
        site_pe = node_cfg(out, s.pe)
        if s.pe == e.border_pe:
            site_pe.routes4.append(f"{EXTERNAL_PREFIX} table {t.table} dev {e.pe_if}")
        else:
            assert s.dx4_function is not None
            border.routes4.append(
                f"{s.prefix4} table {t.table} encap seg6 mode encap.red segs {segs(sc, s.pe, s.dx4_function)} dev sr0"
            )
            site_pe.routes4.append(
                f"{EXTERNAL_PREFIX} table {t.table} encap seg6 mode encap.red segs {segs(sc, e.border_pe, e.dx4_function)} dev sr0"
            )
        marks.append(f'\t\tiifname "{e.pe_if}" ip daddr {f.address} meta mark set {f.mark:#x}')
        nats.append(f'\t\tiifname "{e.pe_if}" ip daddr {f.address} dnat to {ce_addr(s.prefix4, 2)}')
    render_hairpins(sc, out)
    if sc.floating_ips:
        border.nft[TABLE] = "\n".join([
            f"table {TABLE} {{",
            "\tchain prerouting_mark {", "\t\ttype filter hook prerouting priority mangle; policy accept;", *marks, "\t}",
            "\tchain prerouting_dnat {", "\t\ttype nat hook prerouting priority dstnat; policy accept;", *nats, "\t}",
            "}",
        ]) + "\n"


def render_hairpins(sc: Scenario, out: dict[str, NodeConfig]) -> None:
    """The ``ip fip_hairpin`` table of every PE holding an IPv4 site of a tenant that has a
    floating IP (issue 19, inside-out access):

    - on the floating IP's own PE, packets from a CE port of the tenant there to the floating
      address are translated to the site's CE (prerouting, dstnat) and their source to the PE's
      end of the site's circuit (postrouting, srcnat, only for connections the hairpin rule
      translated: ``ct status dnat`` and a source in one of those sites' prefixes), so the CE's
      reply goes back to the PE and its conntrack;
    - on every other PE of the tenant, packets from each IPv4 CE port of the tenant to the
      floating address are translated to the site's CE (prerouting, dstnat) and then take the
      tenant table's route to that CE's prefix (SRv6 to its End.DX4); the reply comes back the
      same way, to the CE's own prefix, through this PE's conntrack (netfilter runs on
      decapsulated packets: ``nf_hooks_lwtunnel``), which restores the floating address as its
      source. No source NAT: the CE's prefix is routed to this PE only.

    Rules in floating-IP order, then the tenant's sites in their order."""
    per_pe: dict[str, tuple[list[str], list[str]]] = {}
    for f in sc.floating_ips:
        s = sc.site(f.site)
        assert s.prefix4 is not None
        ce = ce_addr(s.prefix4, 2)
        for o in sc.tenant(f.tenant).sites:
            if not o.prefix4:
                continue
            dnat, snat = per_pe.setdefault(o.pe, ([], []))
            dnat.append(f'\t\tiifname "{o.pe_if}" ip daddr {f.address} dnat to {ce}')
            if o.pe == s.pe:
                snat.append(f'\t\toifname "{s.pe_if}" ip saddr {o.prefix4} ip daddr {ce} ct status dnat snat to {ce_addr(s.prefix4, 1)}')
    for pe, (dnat, snat) in sorted(per_pe.items()):
        node_cfg(out, pe).nft[HAIRPIN_TABLE] = "\n".join([
            f"table {HAIRPIN_TABLE} {{",
            "\tchain prerouting {", "\t\ttype nat hook prerouting priority dstnat; policy accept;", *dnat, "\t}",
            "\tchain postrouting {", "\t\ttype nat hook postrouting priority srcnat; policy accept;", *snat, "\t}",
            "}",
        ]) + "\n"


def chain_invariants(sc: Scenario) -> list[Invariant]:
    """The NAT tables exactly as rendered (:func:`nft_chain_invariants`): ``ip fip`` on the border
    PE (ids ``floating_ip/nat/<border>[/<chain>]``, service ``floating_ip/nat``) and ``ip
    fip_hairpin`` on every PE (``floating_ip/hairpin/<pe>[/<chain>]``, service
    ``floating_ip/hairpin/<pe>``; no chains where none is rendered). None without an external
    segment."""
    e = sc.external
    if e is None:
        return []
    out = nft_chain_invariants(sc, e.border_pe, TABLE, id_prefix=f"floating_ip/nat/{e.border_pe}", service="floating_ip/nat",
                               what="floating-IP NAT")
    for pe in sorted((n.name for n in sc.topology.routers if n.role is Role.PE), key=natural_key):
        out += nft_chain_invariants(sc, pe, HAIRPIN_TABLE, id_prefix=f"floating_ip/hairpin/{pe}",
                                    service=f"floating_ip/hairpin/{pe}", what="floating-IP hairpin NAT")
    return out


# -- typed specs (the A3-T catalog) ---------------------------------------------------------------------


class FloatingIpSpec(Spec):
    """A public address (TEST-NET-2, RFC 5737) NATed 1:1 to the CE of an IPv4 site on the border PE."""

    site: InstanceId = Field(description="Site whose CE receives the traffic (it must have IPv4).")
    address: Address4 = AUTO


class FloatingIpPatch(Spec):
    """Fields of a floating IP to change."""

    site: InstanceId | None = None
    address: Address4 | None = None


class FloatingIpIntent(Intent):
    """Catalog class ``floating_ip``."""

    name = "floating_ip"
    Spec = FloatingIpSpec
    Patch = FloatingIpPatch
    id_type = InstanceId
    id_doc = "New floating IP id (e.g. 'fip3'); left out = next free 'fip<N>'."
    info = {
        "description": "A public IPv4 address (198.51.100.0/24, RFC 5737) NATed 1:1 on the border PE to the CE of an "
                       "IPv4 site, with a firewall mark that selects the tenant's table; replies return through the "
                       "border PE's End.DX4 SID toward the external host.",
        "id_format": "fip<N>, e.g. 'fip2'",
        "allocated": ["address when 'auto' (pools.floating4)", "firewall mark (pools.marks)"],
        "layer": "floating_ip",
    }  # fmt: skip
    examples = [{"op": "create", "service_class": "floating_ip", "id": "fip2", "spec": {"site": "t3s2", "address": "auto"}}]

    def instances(self, sc: Scenario) -> list[Any]:
        return list(sc.floating_ips)

    def spec_of(self, x: Any) -> dict[str, Any]:
        return {"site": x.site, "address": x.address}

    def summary(self, x: Any) -> dict[str, Any]:
        return {"id": x.id, **self.spec_of(x), "tenant": x.tenant}

    def allocated(self, sc: Scenario, x: Any) -> dict[str, Any]:
        return {"mark": hex(x.mark), "border_pe": sc.external.border_pe if sc.external else None,
                "nat_to": ce_addr(sc.site(x.site).prefix4 or "0.0.0.0/24", 2)}  # fmt: skip

    def service(self, x: Any) -> str:
        return f"floating_ip/{x.id}"

    def apply(self, ctx: Any, i: int, op: Any) -> None:  # noqa: C901 - one operation's rules in one place
        fips = {f.id: f for f in ctx.work.floating_ips}
        if ctx.work.external is None:
            ctx.bad(f"ops[{i}].service_class", "this network has no external segment (no floating_ip layer): floating IPs cannot be used")
            return
        if op.op == "create":
            sp = op.spec
            same = [f for f in ctx.work.floating_ips if f.site == sp.site and sp.address in (AUTO, f.address)
                    and (op.id is None or f.id == op.id)]  # fmt: skip
            if same:
                ctx.result(i, op, same[0].id, "no change", notes=[f"{same[0].id} already maps {same[0].address} to {sp.site}"])
                return
            iid = op.id or ctx.new_id("fip", set(ctx.ids()))
            if ctx.in_use(i, iid):
                return
            site = ctx.sites().get(sp.site)
            if site is None:
                ctx.bad(f"ops[{i}].spec.site", f"no site {sp.site!r}")
                return
            prev = ctx.gone.get(iid)
            if isinstance(prev, FloatingIP) and prev.site == sp.site and sp.address in (AUTO, prev.address):
                ctx.work.floating_ips.append(prev.model_copy())
                ctx.result(i, op, iid, "created", notes=[f"takes back {prev.address} and mark {prev.mark:#x}"])
                return
            ctx.work.floating_ips.append(FloatingIP(id=iid, tenant=site.tenant, site=sp.site, address=sp.address, mark=0))
            ctx.pending("floating_ip.fips").append((i, iid, sp.address == AUTO, True))
            ctx.result(i, op, iid, "created")
            return
        if op.id not in fips:
            ctx.missing(i, op, "floating_ip")
            return
        cur = fips[op.id]
        if op.op == "delete":
            ctx.work.floating_ips.remove(cur)
            ctx.gone[cur.id] = cur
            ctx.result(i, op, cur.id, "deleted", notes=[f"{cur.address} and mark {cur.mark:#x} freed"])
            return
        given = op.spec.model_fields_set
        new = cur.model_copy()
        if "site" in given and op.spec.site is not None:
            site = ctx.sites().get(op.spec.site)
            if site is None:
                ctx.bad(f"ops[{i}].spec.site", f"no site {op.spec.site!r}")
                return
            new.site, new.tenant = site.id, site.tenant
        auto = False
        if "address" in given and op.spec.address is not None and op.spec.address != cur.address:
            auto = op.spec.address == AUTO
            new.address = op.spec.address
        if new == cur:
            ctx.result(i, op, cur.id, "no change")
            return
        ctx.work.floating_ips[ctx.work.floating_ips.index(cur)] = new
        if auto:
            ctx.pending("floating_ip.fips").append((i, new.id, True, False))
        ctx.result(i, op, cur.id, "modified")


def _integrity(ctx: Any) -> None:
    """Floating IPs (RFC 5737 TEST-NET-2): the site has IPv4; the address is in
    ``Pools.floating4`` and unique; the border PE holds no other site with the same IPv4 prefix
    (the NATed traffic could not tell them apart)."""
    sites = ctx.sites()
    ext = ctx.work.external
    addrs: dict[str, str] = {}
    pool = ipaddress.ip_network(ctx.old.pools.floating4)
    for f in ctx.work.floating_ips:
        s = sites.get(f.site)
        if s is None:
            ctx.final([(f.id, "spec.site"), (f.site, "id")], f"floating_ip {f.id} maps {f.address} to site {f.site}, which would not "
                                                             f"exist; delete or change {f.id} in the same change set")  # fmt: skip
            continue
        if not s.prefix4:
            ctx.final([(f.id, "spec.site"), (s.id, "spec.prefix4")], f"floating_ip {f.id}: site {s.id} has no IPv4 prefix to NAT to")
        if f.address != AUTO:
            ip = ipaddress.ip_address(f.address)
            if ip not in pool or ip in (pool.network_address, pool.broadcast_address):
                ctx.final([(f.id, "spec.address")], f"{f.address} is outside the floating pool {pool} (pools.floating4)")
            if f.address in addrs:
                ctx.final([(f.id, "spec.address")], f"{f.address} is already {addrs[f.address]}'s")
            elif f.address in ctx.unexplained.floating:
                ctx.final([(f.id, "spec.address")], f"{f.address} is NATed on the border PE by state no service record explains")
            addrs[f.address] = f.id
        if ext is not None and s.prefix4:
            clash = [o for o in ctx.work.all_sites() if o.pe == ext.border_pe and o.prefix4 == s.prefix4 and o.id != s.id]
            if clash:
                ctx.final([(f.id, "spec.site"), (s.id, "spec.prefix4"), *[(o.id, "spec.pe") for o in clash]],
                          f"floating_ip {f.id}: the border PE {ext.border_pe} has site {clash[0].id} with the same IPv4 prefix "
                          f"{s.prefix4} as {s.id}; the NATed traffic could not tell them apart")  # fmt: skip


@register
class FloatingIp(Layer):
    name = "floating_ip"
    requires = ("l3vpn",)
    Params = FloatingIpParams
    records = ("floating_ips",)
    intents = (FloatingIpIntent(),)

    def generate(self, sc: Scenario, params: LayerParams, rng: random.Random, density: int) -> Scenario:
        assert isinstance(params, FloatingIpParams)
        pes = [n.name for n in sc.topology.routers if n.role is Role.PE]
        topo = sc.topology
        ipam = Ipam.from_scenario(sc)
        ext = sc.external
        if ext is None:
            border = params.border_pe or rng.choice(pes)
            if border not in pes:
                raise GenerationError("layers.floating_ip.border_pe", f"{border!r} is not a PE; PEs: {', '.join(pes)}")
            topo, port = attach_host(topo, border, EXTERNAL_HOST)
            ext = External(border_pe=border, pe_if=port, host=EXTERNAL_HOST, prefix4=EXTERNAL_PREFIX,
                           dx4_function=ipam.function(border))
        v4_sites = [s for s in sc.all_sites() if s.prefix4 and s.id not in {f.site for f in sc.floating_ips}]
        want = params.per_density * density
        fips = list(sc.floating_ips)
        for s in rng.sample(v4_sites, min(want, len(v4_sites))):
            # an IPv4 prefix may appear once per PE: the border must not already route another
            # tenant's identical prefix to a different place for a local site
            clash = [o for o in sc.all_sites() if o.pe == ext.border_pe and o.prefix4 == s.prefix4 and o.id != s.id]
            if clash:
                continue
            with density_fits(density):
                fips.append(FloatingIP(id=f"fip{len(fips) + 1}", tenant=s.tenant, site=s.id,
                                       address=ipam.floating4(), mark=ipam.mark()))
        return sc.model_copy(update={"topology": topo, "external": ext, "floating_ips": fips})

    def render(self, sc: Scenario, out: dict[str, NodeConfig]) -> None:
        render_floating(sc, out)

    def invariants(self, sc: Scenario) -> list[Invariant]:
        out = []
        e = sc.external
        if e is None:
            return out
        for f in sc.floating_ips:
            s = sc.site(f.site)
            assert s.prefix4
            ce = ce_addr(s.prefix4, 2)
            out.append(Invariant(
                id=f"floating_ip/{f.id}/reach", kind="reach_at", service=f"floating_ip/{f.id}",
                params={"src": e.host, "dst": f.address, "family": 4, "dst_node": s.ce, "dst_at": ce},
                description=f"the external host reaches floating IP {f.address}, answered by {s.ce} (site {s.id})",
            ))
            out.append(Invariant(
                id=f"floating_ip/{f.id}/hairpin", kind="reach_at", service=f"floating_ip/{f.id}",
                params={"src": s.ce, "dst": f.address, "family": 4, "dst_node": s.ce, "dst_at": ce},
                description=f"{s.ce} reaches its own floating IP {f.address} from inside the tenant (hairpin NAT on {s.pe})",
            ))
            for o in sc.tenant(f.tenant).sites:
                if o.prefix4 and o.id != s.id:
                    out.append(Invariant(
                        id=f"floating_ip/{f.id}/hairpin/{o.id}", kind="reach_at", service=f"floating_ip/{f.id}",
                        params={"src": o.ce, "dst": f.address, "family": 4, "dst_node": s.ce, "dst_at": ce},
                        description=f"{o.ce} (site {o.id} on {o.pe}) reaches floating IP {f.address} from inside the "
                                    f"tenant, answered by {s.ce} (hairpin NAT on {o.pe})",
                    ))  # fmt: skip
            out.append(Invariant(
                id=f"floating_ip/{f.id}/nat", kind="nft_rule", service=f"floating_ip/{f.id}",
                params={"node": e.border_pe, "table": TABLE, "contains": [f"ip daddr {f.address}", f"dnat to {ce}"]},
                description=f"{e.border_pe} translates {f.address} to {ce} (site {s.id})",
            ))
        return out + chain_invariants(sc)

    def claim(self, sc: Scenario, ipam: Any) -> None:
        for f in sc.floating_ips:
            ipam.marks.add(f.mark)
            ipam.floating.add(f.address)
        if sc.external:
            ipam.functions.setdefault(sc.external.border_pe, set()).add(sc.external.dx4_function)

    def found_in(self, node: str, state: Any, found: Any) -> None:
        found.floating |= set(_FIP_RE.findall(state.nft))

    def hosts(self, sc: Scenario) -> set[str]:
        return {sc.external.host} if sc.external else set()

    def sids(self, sc: Scenario) -> list[tuple[str, int, str, str, dict[str, Any]]]:
        e = sc.external
        if e is None:
            return []
        return [(e.border_pe, e.dx4_function, "End.DX4", "external segment", {"nh4": str(ipaddress.IPv4Network(e.prefix4).network_address + 2)})]

    def allocate(self, ctx: Any, ipam: Any) -> None:
        """Floating addresses and marks, in operation order."""
        fips = {f.id: f for f in ctx.work.floating_ips}
        res = {r.id: r for r in ctx.results}
        for i, fid, auto, mark in ctx.pending("floating_ip.fips"):
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
                ctx.exhausted(i, "spec.address" if auto else "spec", e)

    def integrity(self, ctx: Any) -> None:
        _integrity(ctx)

    def service_nodes(self, sc: Scenario, out: dict[str, set[str]]) -> None:
        sites = {s.id: s for s in sc.all_sites()}
        for f in sc.floating_ips:
            s = sites.get(f.site)
            out[f"floating_ip/{f.id}"] = ({s.pe, s.ce} if s else set()) | ({sc.external.border_pe, sc.external.host} if sc.external else set())

    def address_owners(self, sc: Scenario, out: dict[str, set[str]]) -> None:
        sites = {s.id: s for s in sc.all_sites()}
        for f in sc.floating_ips:
            s = sites.get(f.site)
            if s and sc.external:
                out.setdefault(f.address, set()).update({s.ce, s.pe, sc.external.border_pe})

    def changed(self, old: Scenario, new: Scenario) -> set[str]:
        of, nf = {f.id: f for f in old.floating_ips}, {f.id: f for f in new.floating_ips}
        return {f"floating_ip/{k}" for k in set(of) | set(nf)
                if dump(of.get(k)) != dump(nf.get(k)) or site_changed(old, new, (nf.get(k) or of[k]).site)}  # fmt: skip

    def references(self, sc: Scenario, cls: str, iid: str) -> list[str]:
        if cls == "tenant":
            return [f.id for f in sc.floating_ips if f.tenant == iid]
        if cls == "tenant_site":
            return [f"{f.id} (floating IP)" for f in sc.floating_ips if f.site == iid]
        return []

    def drop_dependents(self, sc: Scenario, cls: str, iid: str) -> None:
        if cls == "tenant":
            sc.floating_ips = [f for f in sc.floating_ips if f.tenant != iid]
        elif cls == "tenant_site":
            sc.floating_ips = [f for f in sc.floating_ips if f.site != iid]
        elif cls == "floating_ip":
            sc.floating_ips = [f for f in sc.floating_ips if f.id != iid]

    def pins_site(self, sc: Scenario, site: str) -> bool:
        return any(f.site == site for f in sc.floating_ips)
