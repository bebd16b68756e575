"""Layer ``firewall``: per-tenant firewall policy in nftables on the PEs.

All tenants share one table per PE, ``inet tenant_fw``, whose ``forward`` chain jumps to the
tenant's chain for traffic leaving toward one of the tenant's CE ports (a shared chain: flushing
or reordering it for one tenant touches all). A policy item protects one TCP port of one
destination site, either closed to every source (``drop`` from any) or open to one source site
only (``accept`` from it, then ``drop`` from any). Other ports stay open.

Invariants (service ``firewall/<tenant>``), with real TCP connection attempts from CE hosts:
denied flows time out (dropped), allowed flows reach the CE (its kernel answers, with a
connection or a reset), and one unlisted port stays open (the policy does not over-block).
"""

from __future__ import annotations

import random
from typing import Annotated

from pydantic import Field

from substrate.scenario.layers.base import Layer, LayerParams, node_cfg, register
from substrate.scenario.layers.l3vpn import ce_addr
from substrate.scenario.model import FirewallPolicy, FirewallRule, Invariant, NodeConfig, Scenario, Site

TABLE = "inet tenant_fw"
PORTS = (22, 23, 80, 443, 3306, 5432, 8080)
#: A port no generated rule uses: the open-port control.
OPEN_PORT = 8443


class FirewallParams(LayerParams):
    """Policy items per tenant (min, max) and the share that opens a port to one source site."""

    items_per_tenant: tuple[Annotated[int, Field(ge=0, le=50)], Annotated[int, Field(ge=0, le=50)]] = (1, 3)
    allow_share: float = Field(default=0.5, ge=0, le=1)


def _match(src: Site | None, dst: Site, fam: int) -> str:
    if fam == 6:
        return (f"ip6 saddr {src.prefix6} " if src else "") + f"ip6 daddr {dst.prefix6}"
    assert dst.prefix4
    return (f"ip saddr {src.prefix4} " if src and src.prefix4 else "") + f"ip daddr {dst.prefix4}"


def render_firewalls(sc: Scenario, out: dict[str, NodeConfig]) -> None:
    """The ``inet tenant_fw`` table of every PE hosting a destination of some policy."""
    chains: dict[str, dict[str, list[str]]] = {}  # pe -> tenant -> rules
    jumps: dict[str, list[tuple[str, str]]] = {}  # pe -> [(port, tenant)]
    for pol in sc.firewalls:
        for rule in sorted(pol.rules, key=lambda r: r.action != "accept"):  # accepts first
            dst = sc.site(rule.dst_site)
            src = sc.site(rule.src_site) if rule.src_site else None
            lines = chains.setdefault(dst.pe, {}).setdefault(pol.tenant, [])
            for fam in (6, 4):
                if fam == 4 and (not dst.prefix4 or (src is not None and not src.prefix4)):
                    continue
                lines.append(f"{_match(src, dst, fam)} tcp dport {rule.port} {rule.action}")
            if (dst.pe_if, pol.tenant) not in jumps.setdefault(dst.pe, []):
                jumps[dst.pe].append((dst.pe_if, pol.tenant))
    for pe in sorted(chains):
        text = [f"table {TABLE} {{", "\tchain forward {",
                "\t\ttype filter hook forward priority filter; policy accept;"]
        text += [f'\t\toifname "{port}" jump {tenant}' for port, tenant in sorted(jumps[pe])]
        text.append("\t}")
        for tenant in sorted(chains[pe]):
            text.append(f"\tchain {tenant} {{")
            text += [f"\t\t{line}" for line in chains[pe][tenant]]
            text.append("\t}")
        text.append("}")
        node_cfg(out, pe).nft[TABLE] = "\n".join(text) + "\n"


#: The verdict an invariant expects, as its description words it.
EXPECT_WORDS = {"allow": "allowed", "deny": "denied"}


def verdict_invariant(sc: Scenario, pol: FirewallPolicy, src: Site, dst: Site, port: int, expect: str, why: str) -> Invariant:
    """The invariant that TCP ``port`` from ``src`` to ``dst`` gets the verdict ``expect`` (allow or deny)."""
    return Invariant(
        id=f"firewall/{pol.tenant}/{expect}/{src.id}->{dst.id}:{port}",
        kind="tcp_verdict",
        service=f"firewall/{pol.tenant}",
        params={"src": src.ce, "dst": ce_addr(dst.prefix6, 2), "port": port, "expect": expect, "family": 6},
        description=f"{sc.tenant(pol.tenant).name}: TCP {port} from {src.id} to {dst.id} is {EXPECT_WORDS[expect]} ({why})",
    )


@register
class Firewall(Layer):
    name = "firewall"
    requires = ("l3vpn",)
    Params = FirewallParams

    def generate(self, sc: Scenario, params: LayerParams, rng: random.Random, density: int) -> Scenario:
        assert isinstance(params, FirewallParams)
        policies = list(sc.firewalls)
        for t in sc.tenants:
            if len(t.sites) < 2:
                continue
            lo, hi = params.items_per_tenant
            rules: list[FirewallRule] = []
            used: set[tuple[str, int]] = set()
            for _ in range(rng.randint(lo, hi)):
                dst = rng.choice(t.sites)
                port = rng.choice(PORTS)
                if (dst.id, port) in used:
                    continue
                used.add((dst.id, port))
                if rng.random() < params.allow_share:
                    src = rng.choice([s for s in t.sites if s.id != dst.id])
                    rules.append(FirewallRule(src_site=src.id, dst_site=dst.id, port=port, action="accept"))
                rules.append(FirewallRule(src_site=None, dst_site=dst.id, port=port, action="drop"))
            if rules:
                policies.append(FirewallPolicy(id=f"fw-{t.id}", tenant=t.id, rules=rules))
        return sc.model_copy(update={"firewalls": policies})

    def render(self, sc: Scenario, out: dict[str, NodeConfig]) -> None:
        render_firewalls(sc, out)

    def invariants(self, sc: Scenario) -> list[Invariant]:
        out: list[Invariant] = []
        for pol in sc.firewalls:
            t = sc.tenant(pol.tenant)
            rng = random.Random(f"{sc.seed}/fw/{pol.id}")
            allowed = {(r.src_site, r.dst_site, r.port) for r in pol.rules if r.action == "accept"}
            for r in pol.rules:
                dst = sc.site(r.dst_site)
                if r.action == "accept" and r.src_site:
                    out.append(verdict_invariant(sc, pol, sc.site(r.src_site), dst, r.port, "allow", "allowed source"))
                elif r.action == "drop":
                    others = [s for s in t.sites if s.id != dst.id and (s.id, dst.id, r.port) not in allowed]
                    if others:
                        out.append(verdict_invariant(sc, pol, rng.choice(others), dst, r.port, "deny", "protected port"))
            dst = sc.site(pol.rules[0].dst_site)
            src = rng.choice([s for s in t.sites if s.id != dst.id])
            out.append(verdict_invariant(sc, pol, src, dst, OPEN_PORT, "allow", "unlisted port stays open"))
        return out
