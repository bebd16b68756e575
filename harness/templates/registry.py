"""The value registry of a live scenario (NetConfArena Algorithm 1's ``V``) and the devices'
capabilities (its ``C``).

Templates draw their parameters from it through Jinja expressions (``values: "core_links()"``);
every function returns a list in a stable order (the seed picks among them), of plain values or
mappings (Jinja reads ``x.key`` of a mapping). What it offers is read off the scenario: the
service inventory and the rendered device state (``Scenario.node_config``), so that a parameter
drawn "free" (a SID function, a table id, a prefix) is free of everything the brownfield uses,
and a parameter drawn from what exists (a link, a site, a firewall rule, a peering) places the
task where it interacts with existing state.

Functions (the Jinja globals of parameter expressions):

- ``routers(role=None)`` -> ``{name, id, role, locator, loopback}`` (role ``PE`` / ``P``);
- ``core_links()`` -> ``{a, a_if, b, b_if}``; ``neighbors(node)`` -> ``{node, interface, peer, peer_if}``;
- ``transits()`` -> ``{via, src, dst, src_if}``: every shortest path from router ``src`` to
  router ``dst`` passes router ``via``, and a path avoiding it exists (``src_if``: ``src``'s port
  toward ``via``);
- ``sites(family=None, tenant=None)`` -> ``{id, tenant, table, pe, pe_if, ce, ce_if, prefix6,
  prefix4, ce6, ce4, pe6, pe4}``; ``tenants()`` -> ``{id, table, pes, sites}``;
- ``spares()`` -> ``{pe, pe_if, ce, ce_if}`` (unconfigured attachment circuits);
- ``firewall_rules(action=None)`` -> ``{tenant, dst_site, src_site, port, action, pe, chain}``;
- ``floating_ips()``, ``external()`` (list of 0 or 1), ``steering()``;
- ``ebgp_peerings()`` -> the peering with ``pe_addr``, ``nbr``, ``policy``, ``unaccepted`` (what
  the peer announces that is not accepted and is no bogon);
- ``free_functions(node, n=32)``: SID functions of the pool unused on ``node``;
  ``free_tables(n=16)``: table ids of the pool unused anywhere;
  ``free_prefixes6(space, length, n=32)``: subnets of ``space`` overlapping nothing in use;
  ``used_rule_priorities(node, family=6)``; ``uses_table(node, table)``;
  ``nft_has(node, table, text)``: a line of that nftables table contains ``text``;
  ``usid(node_id, function)``: the uSID ``fcbb:bb00:<N>:<F>::`` (RFC 9800, design.md);
- ``has(capability)``: the devices have ``capability`` (below).

Capabilities: FRR daemons that can run here (``isisd``, ``bgpd``, ``staticd``, ...) and the
kernel's SRv6 behaviours and tools (``seg6local:End``, ``seg6local:End.X``, ``seg6local:End.DT6``,
``seg6local:End.DX4``, ``seg6local:End.DX6``, ``nftables``). Without a probe they are the
substrate's documented set (shared/notes/substrate.md); :func:`probed_capabilities` reads what
this machine's kernel does (substrate.features).
"""

from __future__ import annotations

import ipaddress
import re
from collections import deque
from typing import Any

from substrate import addressing
from substrate.scenario.model import Scenario
from substrate.topology import Role

#: The substrate's documented capabilities (shared/notes/substrate.md, substrate.frr_daemons).
BASE_CAPABILITIES = frozenset({
    "zebra", "staticd", "isisd", "bgpd", "nftables", "policy-routing",
    "seg6local:End", "seg6local:End.X", "seg6local:End.DT6", "seg6local:End.DX4", "seg6local:End.DX6",
})  # fmt: skip


def probed_capabilities() -> frozenset[str]:
    """:data:`BASE_CAPABILITIES` restricted to what this machine's kernel probe found
    (substrate.features: a required SRv6 feature missing takes its behaviour away)."""
    from substrate.features import probe

    rep = probe()
    caps = set(BASE_CAPABILITIES)
    for name, cap in (("seg6local-end-dt6", "seg6local:End.DT6"), ("seg6local-end-dx4", "seg6local:End.DX4"),
                      ("seg6local-end-next-csid", "seg6local:End")):
        if name in rep.missing_required:
            caps.discard(cap)
    return frozenset(caps)


def _seg6local_dst(line: str) -> str | None:
    w = line.split()
    return w[0] if "seg6local" in w and w else None


class ValueRegistry:
    """The values of scenario ``sc`` (module docstring). Pure: reads the scenario only."""

    FUNCTIONS = ("routers", "core_links", "neighbors", "transits", "sites", "tenants", "spares", "firewall_rules",
                 "floating_ips", "external", "steering", "ebgp_peerings", "free_functions", "free_tables",
                 "free_prefixes6", "used_rule_priorities", "uses_table", "nft_has", "usid", "has")

    def __init__(self, sc: Scenario, capabilities: frozenset[str] | None = None):
        self.sc = sc
        self.capabilities = BASE_CAPABILITIES if capabilities is None else capabilities
        self._ids = {r.name: r.node_id for r in sc.topology.routers if r.node_id is not None}

    def globals(self) -> dict[str, Any]:
        """The registry functions by name, for Jinja."""
        return {name: getattr(self, name) for name in self.FUNCTIONS}

    # -- topology ------------------------------------------------------------------------------

    def routers(self, role: str | None = None) -> list[dict[str, Any]]:
        out = []
        for r in self.sc.topology.routers:
            if r.node_id is None or (role is not None and r.role.value != role):
                continue
            out.append({"name": r.name, "id": r.node_id, "role": r.role.value,
                        "locator": str(addressing.locator(r.node_id)), "loopback": str(addressing.loopback(r.node_id).ip)})
        return out

    def core_links(self) -> list[dict[str, str]]:
        return [{"a": lk.a.node, "a_if": lk.a.interface, "b": lk.b.node, "b_if": lk.b.interface}
                for lk in self.sc.topology.core_links()]

    def neighbors(self, node: str) -> list[dict[str, str]]:
        out = []
        for lk in self.sc.topology.core_links():
            for me, peer in ((lk.a, lk.b), (lk.b, lk.a)):
                if me.node == node:
                    out.append({"node": me.node, "interface": me.interface, "peer": peer.node, "peer_if": peer.interface})
        return out

    def _adj(self, without: str | None = None) -> dict[str, set[str]]:
        adj: dict[str, set[str]] = {r: set() for r in self._ids if r != without}
        for lk in self.sc.topology.core_links():
            if without in (lk.a.node, lk.b.node):
                continue
            adj.setdefault(lk.a.node, set()).add(lk.b.node)
            adj.setdefault(lk.b.node, set()).add(lk.a.node)
        return adj

    @staticmethod
    def _dist(adj: dict[str, set[str]], src: str) -> dict[str, int]:
        d, q = {src: 0}, deque([src])
        while q:
            u = q.popleft()
            for v in sorted(adj.get(u, ())):
                if v not in d:
                    d[v] = d[u] + 1
                    q.append(v)
        return d

    def transits(self) -> list[dict[str, str]]:
        full = self._adj()
        dist = {r: self._dist(full, r) for r in sorted(full)}
        out = []
        for via in sorted(full):
            cut = self._adj(without=via)
            for src in sorted(full):
                if src == via:
                    continue
                dcut = self._dist(cut, src)
                for dst in sorted(full):
                    if dst in (src, via) or dst not in dist[src]:
                        continue
                    on_all = dist[src][via] + dist[via][dst] == dist[src][dst] and dcut.get(dst, 10**9) > dist[src][dst]
                    if on_all and dst in dcut and via in full[src]:
                        port = next(n["interface"] for n in self.neighbors(src) if n["peer"] == via)
                        out.append({"via": via, "src": src, "dst": dst, "src_if": port})
        return out

    # -- services ------------------------------------------------------------------------------

    def sites(self, family: int | None = None, tenant: str | None = None) -> list[dict[str, Any]]:
        from substrate.scenario.layers.l3vpn import ce_addr

        out = []
        for t in self.sc.tenants:
            if tenant is not None and t.id != tenant:
                continue
            for s in t.sites:
                if family == 4 and not s.prefix4:
                    continue
                out.append({"id": s.id, "tenant": t.id, "table": t.table, "pe": s.pe, "pe_if": s.pe_if, "ce": s.ce,
                            "ce_if": s.ce_if, "prefix6": s.prefix6, "prefix4": s.prefix4,
                            "ce6": ce_addr(s.prefix6, 2), "pe6": ce_addr(s.prefix6, 1),
                            "ce4": ce_addr(s.prefix4, 2) if s.prefix4 else None,
                            "pe4": ce_addr(s.prefix4, 1) if s.prefix4 else None})
        return out

    def tenants(self) -> list[dict[str, Any]]:
        return [{"id": t.id, "table": t.table, "pes": sorted({s.pe for s in t.sites}), "sites": [s.id for s in t.sites]}
                for t in self.sc.tenants if t.sites]

    def spares(self) -> list[dict[str, str]]:
        return [sp.model_dump() for sp in self.sc.spares]

    def firewall_rules(self, action: str | None = None) -> list[dict[str, Any]]:
        by_id = {s["id"]: s for s in self.sites()}
        out = []
        for fw in self.sc.firewalls:
            for r in fw.rules:
                if action is not None and r.action != action:
                    continue
                dst = by_id[r.dst_site]
                out.append({"tenant": fw.tenant, "dst_site": dst, "src_site": by_id.get(r.src_site) if r.src_site else None,
                            "port": r.port, "action": r.action, "pe": dst["pe"], "chain": fw.tenant})
        return out

    def floating_ips(self) -> list[dict[str, Any]]:
        return [x.model_dump() for x in self.sc.floating_ips]

    def external(self) -> list[dict[str, Any]]:
        return [self.sc.external.model_dump()] if self.sc.external else []

    def steering(self) -> list[dict[str, Any]]:
        return [x.model_dump() for x in self.sc.steering]

    def ebgp_peerings(self) -> list[dict[str, Any]]:
        from substrate.scenario.layers.ebgp_peering import pe_addr, policy_name, router_addr

        out = []
        for x in self.sc.ebgp_peerings:
            d = x.model_dump()
            bogon = [p for p in x.announced if ipaddress.ip_network(p).prefixlen == 0 or
                     ipaddress.ip_network(p).overlaps(ipaddress.ip_network(self.sc.pools.prefix6))]
            d.update(pe_addr=pe_addr(x), nbr=router_addr(x), policy=policy_name(x),
                     unaccepted=[p for p in x.announced if p not in x.accept and p not in bogon])
            out.append(d)
        return out

    # -- free resources ------------------------------------------------------------------------

    def _all_lines(self, node: str | None = None) -> list[str]:
        cfgs = self.sc.node_config.items() if node is None else [(node, self.sc.node_config.get(node))]
        out: list[str] = []
        for _, c in cfgs:
            if c is None:
                continue
            out += c.routes6 + c.routes4 + c.rules6 + c.rules4 + c.addresses + c.frr + list(c.nft.values())
        return out

    def free_functions(self, node: str, n: int = 32) -> list[int]:
        nid = self._ids.get(node)
        if nid is None:
            return []
        group = f"{addressing.usid_value(nid):x}"
        used = set()
        for cfg in self.sc.node_config.values():
            for line in cfg.routes6:
                # a SID of the node (seg6local destination) or one that remote nodes point at (segs)
                for g, fn in re.findall(r"fcbb:bb00:([0-9a-f]{1,4}):([0-9a-f]{1,4})(?=[:/])", line):
                    if g == group:
                        used.add(int(fn, 16))
        lo, hi = self.sc.pools.functions
        return [f for f in range(lo, hi + 1) if f not in used][:n]

    def free_tables(self, n: int = 16) -> list[int]:
        used = {t.table for t in self.sc.tenants}
        if self.sc.shared_services:
            used.add(self.sc.shared_services.table)
        for line in self._all_lines():
            used |= {int(x) for x in re.findall(r"(?:table|lookup) (\d+)", line)}
        lo, hi = self.sc.pools.tables
        return [t for t in range(lo, hi + 1) if t not in used][:n]

    def _prefixes_in_use(self) -> list[ipaddress.IPv6Network | ipaddress.IPv4Network]:
        nets = []
        for tok in re.findall(r"[0-9a-fA-F:.]+/\d+", " ".join(self._all_lines())):
            try:
                net = ipaddress.ip_network(tok, strict=False)
            except ValueError:
                continue
            if net.prefixlen > 0:  # a default route overlaps everything and uses nothing
                nets.append(net)
        for p in (self.sc.pools.prefix6, self.sc.pools.prefix4, "fcbb:bb00::/32", "fd00::/64"):
            nets.append(ipaddress.ip_network(p))
        for x in self.sc.ebgp_peerings:
            nets += [ipaddress.ip_network(p) for p in [*x.announced, *x.accept, *x.advertise, *x.internal, x.link6]
                     if ipaddress.ip_network(p).prefixlen > 0]
        return nets

    def free_prefixes6(self, space: str, length: int, n: int = 32) -> list[str]:
        net = ipaddress.IPv6Network(space)
        used = [u for u in self._prefixes_in_use() if u.version == 6]
        out = []
        for sub in net.subnets(new_prefix=length):
            if not any(sub.overlaps(u) for u in used):
                out.append(str(sub))
                if len(out) >= n:
                    break
        return out

    def used_rule_priorities(self, node: str, family: int = 6) -> list[int]:
        c = self.sc.node_config.get(node)
        if c is None:
            return []
        rules = c.rules6 if family == 6 else c.rules4
        return sorted({int(m) for r in rules for m in re.findall(r"priority (\d+)", r)})

    def uses_table(self, node: str, table: int) -> bool:
        return any(re.search(rf"(?:table|lookup) {int(table)}\b", x) for x in self._all_lines(node))

    def nft_has(self, node: str, table: str, text: str) -> bool:
        """Whether nftables table ``table`` (``"inet tenant_fw"``) of ``node`` has a line containing ``text``."""
        c = self.sc.node_config.get(node)
        return c is not None and any(text in ln for ln in c.nft.get(table, "").splitlines())

    @staticmethod
    def usid(node_id: int, function: int) -> str:
        return str(addressing.usid_container([addressing.usid_value(int(node_id)), int(function)]))

    def has(self, capability: str) -> bool:
        return capability in self.capabilities
