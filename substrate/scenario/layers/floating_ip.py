"""Layer ``floating_ip``: public IPv4 addresses NATed to tenant sites on a border PE.

An external host (``x1``, on 203.0.113.0/24, TEST-NET-3, RFC 5737) hangs off the border PE.
Each floating IP (from 198.51.100.0/24, TEST-NET-2) is a 1:1 destination NAT on the border PE
(nftables table ``ip fip``) to a site CE's IPv4 address, plus a firewall mark that a rule turns
into a lookup in the tenant's table (tenants may overlap: the mark, not the address, says whose
site it is). Replies leave the site's PE through an End.DX4 SID of the border PE toward the
external host; conntrack on the border PE (netfilter hooks enabled for SRv6-decapsulated
packets) undoes the translation. The NAT range, the mark space, the border PE's tenant tables
and its SID space are shared by every floating IP.

Invariants (service ``floating_ip/<id>``): the external host reaches the floating IP with real
pings, and the border PE's NAT still maps it to the right CE.
"""

from __future__ import annotations

import random

from pydantic import Field

from substrate.scenario.layers.addressing import Ipam
from substrate.scenario.layers.base import GenerationError, Layer, LayerParams, density_fits, node_cfg, register
from substrate.scenario.layers.l3vpn import attach_host, ce_addr, ce_iface, interface_block, segs, sid_of
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
    if sc.floating_ips:
        border.nft[TABLE] = "\n".join([
            f"table {TABLE} {{",
            "\tchain prerouting_mark {", "\t\ttype filter hook prerouting priority mangle; policy accept;", *marks, "\t}",
            "\tchain prerouting_dnat {", "\t\ttype nat hook prerouting priority dstnat; policy accept;", *nats, "\t}",
            "}",
        ]) + "\n"


@register
class FloatingIp(Layer):
    name = "floating_ip"
    requires = ("l3vpn",)
    Params = FloatingIpParams

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
                id=f"floating_ip/{f.id}/reach", kind="reach", service=f"floating_ip/{f.id}",
                params={"src": e.host, "dst": f.address, "family": 4},
                description=f"the external host reaches floating IP {f.address} (site {s.id})",
            ))
            out.append(Invariant(
                id=f"floating_ip/{f.id}/nat", kind="nft_rule", service=f"floating_ip/{f.id}",
                params={"node": e.border_pe, "table": TABLE, "contains": [f"ip daddr {f.address}", f"dnat to {ce}"]},
                description=f"{e.border_pe} translates {f.address} to {ce} (site {s.id})",
            ))
        return out
