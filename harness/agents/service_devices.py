"""The scripted operator's device-level firewall and floating-IP changes (task classes
``firewall-change`` and ``floating-ip-change`` at A0, A1 and A2).

The operator rebuilds, from the ticket (request.yaml, sites.csv) and what the devices show, the
few service records the change touches -- the tenant's rule set read back from its chain, the
tenant's floating IPs read back from the border PE -- once as they are and once as the ticket
wants them, renders both with the service layers' own renderers (the ones A3-T's planner renders
the inventory with: :func:`substrate.scenario.layers.firewall.render_firewalls`,
:func:`substrate.scenario.layers.floating_ip.render_floating`, and the tenant's VPN with
:func:`substrate.scenario.layers.l3vpn.render_tenant`, so lines the VPN shares with a floating
IP are in both renderings and never removed), and takes the difference
(:func:`substrate.scenario.apply.config_delta`). A change of rendering (a new NAT rule) flows
into every level without a second copy.

nftables tables are shared (``inet tenant_fw`` by every tenant of a PE, ``ip fip`` by every
floating IP of the border PE): the renderings hold only this ticket's part, so a table's new
text is the device's table with the rendering's difference spliced in (:func:`nft_splice`):
rules the before-rendering has and the after-rendering has not are removed, rules only the
after-rendering has are inserted where the after-rendering puts them. At A0 and A2 the table is
replaced by that text (``nft -f``; edit-config ``replace``), at A1 the splice is sent as nft
rule commands (:func:`nft_commands`: A1 refuses a table delete).

Pure: the agent (:mod:`harness.agents.scripted`) reads the devices and applies the deltas.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass, field
from typing import Any

from harness.agents.scripted import PeFacts, Request, node_id, plan_tenant_change
from substrate.journal import normalize_nft_table
from substrate.netconf.device import parse_nft, render_nft_table
from substrate.scenario.apply import ConfigDelta, config_delta
from substrate.scenario.layers.firewall import TABLE as FW_TABLE
from substrate.scenario.layers.firewall import render_firewalls
from substrate.scenario.layers.floating_ip import EXTERNAL_PREFIX, render_floating, render_hairpins
from substrate.scenario.layers.floating_ip import HAIRPIN_TABLE
from substrate.scenario.layers.floating_ip import TABLE as FIP_TABLE
from substrate.scenario.layers.l3vpn import ce_addr, render_tenant
from substrate.scenario.model import External, FirewallPolicy, FirewallRule, FloatingIP, NodeConfig, Scenario, Site, Tenant
from substrate.topology import Topology

#: The firewall-mark range floating IPs take marks from (the scenario pool, ``Pools.marks``).
MARKS = (0x100, 0x1FF)
_HANDLE = re.compile(r"\s*# handle (\d+)\s*$")


# -- nftables: the splice -------------------------------------------------------------------------


def rule_key(rule: str) -> str:
    """A rule line in comparable form (nft prints ``0x00000101`` for a mark written ``0x101``)."""
    return normalize_nft_table(rule)


@dataclass
class NftTable:
    """One table as the device shows it (``nft -a list table F N``): :func:`parse_nft`'s dict
    (``chains``: ``name``, base-chain fields, ``rules``; ``other``) and each chain's rule handles,
    in the order of ``rules``."""

    family: str
    name: str
    table: dict[str, Any] | None
    handles: dict[str, list[int]] = field(default_factory=dict)

    @classmethod
    def parse(cls, table: str, listing: str) -> NftTable:
        """``table``: ``"inet tenant_fw"``; ``listing``: ``nft -a list table`` text ('' = no table)."""
        fam, name = table.split()
        handles: dict[str, list[int]] = {}
        chain = None
        plain = []
        for line in listing.splitlines():
            s = line.strip()
            m = re.match(r"chain (\S+) \{", s)
            if m:
                chain = m.group(1)
                handles[chain] = []
            h = _HANDLE.search(line)
            body = _HANDLE.sub("", line)
            if h and chain and not m and not s.startswith(("table ", "type ")) and body.strip():
                handles[chain].append(int(h.group(1)))
            plain.append(body)
        parsed = parse_nft("\n".join(plain)).get((fam, name))
        return cls(family=fam, name=name, table=parsed, handles=handles)


def _chain(t: dict[str, Any] | None, name: str) -> dict[str, Any] | None:
    return next((c for c in (t or {}).get("chains", []) if c["name"] == name), None)


def nft_splice(device: dict[str, Any] | None, before: str | None, after: str | None, table: str) -> dict[str, Any] | None:
    """The device's table ``device`` (:func:`parse_nft` form, None = absent) with the difference
    between the renderings ``before`` and ``after`` (``nft -f`` text of ``table``, None = not
    rendered) applied: per chain, rules only ``before`` has are removed, rules only ``after`` has
    are inserted ahead of the first rule that follows them in ``after`` and is on the device
    (else at the end); a chain only ``after`` has is added (with its base-chain type), a chain
    ``before`` had and ``after`` has not is removed once no rule is left in it. Returns None when
    the table is left without chains (it goes)."""
    fam, name = table.split()
    b = parse_nft(before or "").get((fam, name)) or {"chains": [], "other": []}
    a = parse_nft(after or "").get((fam, name)) or {"chains": [], "other": []}
    out = {"chains": [dict(c, rules=list(c["rules"])) for c in (device or {}).get("chains", [])],
           "other": list((device or {}).get("other", []))}
    for bc in b["chains"]:
        if _chain(a, bc["name"]) is None:
            dc = _chain(out, bc["name"])
            if dc is not None:
                gone = {rule_key(r) for r in bc["rules"]}
                dc["rules"] = [r for r in dc["rules"] if rule_key(r) not in gone]
                if not dc["rules"]:
                    out["chains"].remove(dc)
    for ac in a["chains"]:
        bc = _chain(b, ac["name"]) or {"rules": []}
        dc = _chain(out, ac["name"])
        if dc is None:
            dc = {k: v for k, v in ac.items() if k != "rules"} | {"rules": []}
            out["chains"].append(dc)
        akeys = [rule_key(r) for r in ac["rules"]]
        gone = {rule_key(r) for r in bc["rules"]} - set(akeys)
        dc["rules"] = [r for r in dc["rules"] if rule_key(r) not in gone]
        for i, r in enumerate(ac["rules"]):
            if akeys[i] in {rule_key(x) for x in dc["rules"]}:
                continue
            have = [rule_key(x) for x in dc["rules"]]
            at = next((have.index(k) for k in akeys[i + 1:] if k in have), len(have))
            dc["rules"].insert(at, r)
    return out if out["chains"] else None


def nft_text(table: str, t: dict[str, Any] | None) -> str | None:
    """The ``nft -f`` text of a spliced table (None stays None: the table goes)."""
    if t is None:
        return None
    fam, name = table.split()
    return render_nft_table(fam, name, t) + "\n"


def _words(rule: str) -> str:
    """A rule in A1's nft words: no double quotes (``oifname eth3``: nft reads both alike)."""
    return rule.replace('"', "")


def nft_commands(now: NftTable, new: dict[str, Any] | None) -> list[str]:
    """The nft commands (A1's forms) that turn the device's table ``now`` into ``new``: rules
    deleted by handle, rules added (``insert ... position H`` ahead of the rule that follows
    them, else ``add``), chains added (base chains with their type) and emptied chains deleted,
    the table added when it is new. A table left without chains keeps its empty shell (A1
    refuses ``delete table``)."""
    tbl = f"{now.family} {now.name}"
    cur = now.table or {"chains": [], "other": []}
    out: list[str] = [] if now.table is not None or new is None else [f"nft add table {tbl}"]
    new = new or {"chains": [], "other": []}
    for c in new["chains"]:
        if _chain(cur, c["name"]) is None:
            head = ""
            if c.get("type"):
                dev = f" device {c['device']}" if c.get("device") else ""
                head = (f" {{ type {c['type']} hook {c['hook']}{dev} priority {c['priority']} ; "
                        f"policy {c.get('policy') or 'accept'} ; }}")
            out.append(f"nft add chain {tbl} {c['name']}{head}")
    for c in cur["chains"]:
        nc = _chain(new, c["name"])
        keep = {rule_key(r) for r in (nc or {}).get("rules", [])}
        for r, h in zip(c["rules"], now.handles.get(c["name"], []), strict=False):
            if rule_key(r) not in keep:
                out.append(f"nft delete rule {tbl} {c['name']} handle {h}")
    for c in new["chains"]:
        dc = _chain(cur, c["name"])
        have = dict(zip([rule_key(r) for r in (dc or {}).get("rules", [])], now.handles.get(c["name"], []), strict=False))
        keys = [rule_key(r) for r in c["rules"]]
        for i, r in enumerate(c["rules"]):
            if keys[i] in have:
                continue
            nxt = next((have[k] for k in keys[i + 1:] if k in have), None)
            out.append(f"nft insert rule {tbl} {c['name']} position {nxt} {_words(r)}" if nxt is not None
                       else f"nft add rule {tbl} {c['name']} {_words(r)}")
    for c in cur["chains"]:
        if _chain(new, c["name"]) is None:
            out.append(f"nft delete chain {tbl} {c['name']}")
    return out


# -- the renderings -----------------------------------------------------------------------------


def _operator_scenario(tenant: Tenant, *, firewalls: list[FirewallPolicy] | None = None, external: External | None = None,
                       fips: list[FloatingIP] | None = None) -> Scenario:
    """A scenario holding only the records an operator rebuilt (for the layers' renderers)."""
    routers = sorted({s.pe for s in tenant.sites} | set(tenant.dt6_functions) | ({external.border_pe} if external else set()))
    topo = Topology.build("operator", [{"name": r, "role": "PE", "node_id": node_id(r)} for r in routers], [])
    return Scenario(name="operator", manifest_digest="", seed=0, density=1, layers=["l3vpn", "firewall", "floating_ip"],
                    topology=topo, tenants=[tenant], firewalls=firewalls or [], floating_ips=fips or [], external=external)


def render_services(tenant: Tenant, *, vpn: bool, firewalls: list[FirewallPolicy] | None = None,
                    external: External | None = None, fips: list[FloatingIP] | None = None) -> dict[str, NodeConfig]:
    """The layers' rendering of the records an operator rebuilt: the tenant's VPN (``vpn``), its
    rule sets, the external segment and its floating IPs."""
    sc = _operator_scenario(tenant, firewalls=firewalls, external=external, fips=fips)
    out: dict[str, NodeConfig] = {}
    if vpn:
        render_tenant(sc, tenant, out)
    render_firewalls(sc, out)
    render_floating(sc, out)
    return out


def device_deltas(b_cfg: dict[str, NodeConfig], a_cfg: dict[str, NodeConfig],
                  nft_now: dict[str, dict[str, NftTable]]) -> dict[str, ConfigDelta]:
    """Per node, the difference of the two renderings, each nft table it touches spliced into the
    device's (``nft_now``: node -> table -> what the device shows)."""
    out = {}
    for node in sorted(set(b_cfg) | set(a_cfg)):
        d = config_delta(node, b_cfg.get(node), a_cfg.get(node))
        for table in list(d.nft):
            now = nft_now.get(node, {}).get(table)
            if now is None:
                raise ValueError(f"{node}: the table {table} was not read")
            d.nft[table] = nft_text(table, nft_splice(now.table, (b_cfg.get(node) or NodeConfig()).nft.get(table),
                                                      (a_cfg.get(node) or NodeConfig()).nft.get(table), table))
        if not d.empty():
            out[node] = d
    return out


def _sites(req_tenant: str, sites: list[dict[str, str]]) -> list[Site]:
    return [Site(id=s["site"], tenant=req_tenant, pe=s["pe"], pe_if=s["pe_port"], ce=s.get("ce") or "ce",
                 prefix6=s["prefix6"], prefix4=s.get("prefix4") or None) for s in sites]


# -- firewall ---------------------------------------------------------------------------------------

_FW_RULE = re.compile(r"(?:ip6 saddr (\S+) )?ip6 daddr (\S+) tcp dport (\d+) (accept|drop)")


def rules_on_devices(tenant: str, sites: list[dict[str, str]], tables: dict[str, NftTable]) -> list[FirewallRule]:
    """The tenant's rule set as its chain on the PEs shows it (the IPv6 rule of each item; a line
    naming no site of the tenant is not the tenant's rule and is left alone)."""
    by6 = {str(ipaddress.ip_network(s["prefix6"])): s["site"] for s in sites}
    out: list[FirewallRule] = []
    for pe in sorted(tables):
        c = _chain(tables[pe].table, tenant)
        for r in (c or {}).get("rules", []):
            m = _FW_RULE.fullmatch(" ".join(r.split()))
            if not m:
                continue
            src = by6.get(str(ipaddress.ip_network(m.group(1)))) if m.group(1) else None
            dst = by6.get(str(ipaddress.ip_network(m.group(2))))
            if dst is None or (m.group(1) and src is None):
                continue
            rule = FirewallRule(src_site=src, dst_site=dst, port=int(m.group(3)), action=m.group(4))  # type: ignore[arg-type]
            if rule not in out:
                out.append(rule)
    return out


def plan_firewall(req: dict[str, Any], sites: list[dict[str, str]], tables: dict[str, NftTable]) -> dict[str, ConfigDelta]:
    """Per-PE changes of a firewall ticket: the tenant's rule set becomes ``req["rules"]``.

    ``tables``: PE -> its ``inet tenant_fw`` (every PE of the tenant's sites).

    Raises:
        ValueError: a rule names a site the tenant does not have.
    """
    tenant = str(req["tenant"])
    t = Tenant(id=tenant, name=tenant, table=1, sites=_sites(tenant, sites))
    known = {s.id for s in t.sites}
    new = [FirewallRule.model_validate(r) for r in req["rules"]]
    bad = sorted({x for r in new for x in (r.src_site, r.dst_site) if x is not None and x not in known})
    if bad:
        raise ValueError(f"the rule set names sites {bad} that sites.csv does not list")
    old = rules_on_devices(tenant, sites, tables)
    fid = str(req.get("rule_set") or f"fw-{tenant}")
    b = render_services(t, vpn=False, firewalls=[FirewallPolicy(id=fid, tenant=tenant, rules=old)] if old else [])
    a = render_services(t, vpn=False, firewalls=[FirewallPolicy(id=fid, tenant=tenant, rules=new)])
    return device_deltas(b, a, {pe: {FW_TABLE: tb} for pe, tb in tables.items()})


def plan_removed_sources(tenant: str, sites: list[dict[str, str]], removed: list[str],
                         tables: dict[str, NftTable]) -> dict[str, ConfigDelta]:
    """Per-PE changes that take the accept rules whose source is a removed site out of the
    tenant's chains (what the firewall layer does when a site goes: ``Firewall.site_gone``), the
    rule set read off the devices (:func:`rules_on_devices`; ``tables``: PE -> its ``inet
    tenant_fw``, every PE of the remaining sites). Empty when no rule names a removed site."""
    old = rules_on_devices(tenant, sites, tables)
    new = [r for r in old if r.src_site not in removed]
    if new == old:
        return {}
    return plan_firewall({"tenant": tenant, "rules": [r.model_dump(mode="json") for r in new]}, sites, tables)


# -- floating IP -------------------------------------------------------------------------------------


@dataclass
class Border:
    """The border PE as the operator finds it: the router whose End.DX4 SID decapsulates toward
    the external segment (``nh4`` in 203.0.113.0/24), its port toward it, its IPv4 rules and
    its ``ip fip`` table."""

    pe: str
    dx4_function: int
    nh4: str
    pe_if: str
    rules4: list[dict[str, Any]]
    fip: NftTable


def find_border(facts: dict[str, PeFacts]) -> tuple[str, int, str] | None:
    """(router, End.DX4 function, nh4) of the SID toward the external segment, from main-table
    SIDs (:class:`PeFacts`), or None."""
    ext = ipaddress.ip_network(EXTERNAL_PREFIX)
    for r in sorted(facts):
        for rt in facts[r].routes6:
            if rt.get("encap") == "seg6local" and rt.get("action") == "End.DX4" and rt.get("nh4") \
                    and ipaddress.ip_address(rt["nh4"]) in ext:  # fmt: skip
                return r, (int(ipaddress.IPv6Network(rt["dst"]).network_address) >> 64) & 0xFFFF, rt["nh4"]
    return None


_MARK = re.compile(r"ip daddr (\S+) meta mark set (0x[0-9a-f]+)")
_DNAT = re.compile(r"ip daddr (\S+) dnat to (\S+)")
_IIF = re.compile(r'iifname "?([^"\s]+)"?')


def external_port(fip: NftTable) -> str | None:
    """The border PE's port toward the external segment, as its NAT rules name it."""
    for c in (fip.table or {}).get("chains", []):
        for r in c["rules"]:
            m = _IIF.search(r)
            if m:
                return m.group(1)
    return None


def _mark_of(v: Any) -> int | None:
    """A rule's firewall mark (``0x100``, ``0x100/0xffffffff``; iproute2 JSON or the A2 model,
    which says ``all`` for none), or None."""
    try:
        return int(str(v).split("/")[0], 0) if v not in (None, "", "all") else None
    except ValueError:
        return None


def plan_floating(req: dict[str, Any], sites: list[dict[str, str]], facts: dict[str, PeFacts], border: Border,
                  hairpins: dict[str, NftTable]) -> dict[str, ConfigDelta]:
    """Per-device changes of a floating-IP ticket (add ``address`` for ``to_site``, or move the
    address from ``from_site`` to ``to_site``), both within the tenant of sites.csv: the border
    PE's mark, DNAT and rule, and the hairpin translation (``ip fip_hairpin``) on the PE of the
    site the address leaves and of the one it reaches.

    ``facts``: every PE of the tenant's sites (and the border PE). ``hairpins``: PE -> its
    ``ip fip_hairpin`` table as read (``table=None`` where it has none), at least the PEs of
    ``to_site`` and ``from_site`` (the only ones whose hairpin changes).

    Raises:
        ValueError: the devices do not show what the design says, or the move leaves the tenant.
    """
    tenant = str(req["tenant"])
    before_t, _after, _d = plan_tenant_change(Request(tenant=tenant, sites=sites), facts)
    by_ce4 = {ce_addr(s.prefix4, 2): s for s in before_t.sites if s.prefix4}
    site_ids = {s.id for s in before_t.sites}
    for k in ("to_site", "from_site"):
        if req.get(k) and req[k] not in site_ids:
            raise ValueError(f"{k} {req[k]} is not a site of {tenant} (sites.csv)")
    ext = External(border_pe=border.pe, pe_if=border.pe_if, host="x1", prefix4=f"{border.nh4}/32", dx4_function=border.dx4_function)
    # the tenant's floating IPs now: a mark whose rule looks up the tenant's table, its address, its DNAT target
    marks = {m: str(r.get("table")) for r in border.rules4 if (m := _mark_of(r.get("fwmark"))) is not None}
    addr_mark: dict[str, int] = {}
    addr_to: dict[str, str] = {}
    for c in (border.fip.table or {}).get("chains", []):
        for r in c["rules"]:
            if m := _MARK.search(r):
                addr_mark[m.group(1)] = int(m.group(2), 16)
            if m := _DNAT.search(r):
                addr_to[m.group(1)] = m.group(2)
    fid = str(req["floating_ip"])
    mine = []
    for addr, mark in sorted(addr_mark.items()):
        if marks.get(mark) == str(before_t.table) and addr_to.get(addr) in by_ce4:
            mine.append(FloatingIP(id=fid if addr == req["address"] else f"x{mark:x}", tenant=tenant,
                                   site=by_ce4[addr_to[addr]].id, address=addr, mark=mark))
    cur = next((f for f in mine if f.address == req["address"]), None)
    if req["action"] == "move" and cur is None:
        raise ValueError(f"{border.pe} shows no floating IP {req['address']} of {tenant} (mark, rule and DNAT)")
    after = [f for f in mine if f.address != req["address"]]
    if cur is not None:
        after.append(cur.model_copy(update={"site": req["to_site"]}))
    else:
        used = set(marks) | set(addr_mark.values())
        mark = next((m for m in range(MARKS[0], MARKS[1] + 1) if m not in used), None)
        if mark is None:
            raise ValueError(f"no free firewall mark on {border.pe}")
        after.append(FloatingIP(id=fid, tenant=tenant, site=req["to_site"], address=req["address"], mark=mark))
    b = render_services(before_t, vpn=True, external=ext, fips=mine)
    a = render_services(before_t, vpn=True, external=ext, fips=after)
    now: dict[str, dict[str, NftTable]] = {pe: {HAIRPIN_TABLE: t} for pe, t in hairpins.items()}
    now.setdefault(border.pe, {})[FIP_TABLE] = border.fip
    return device_deltas(b, a, now)


# -- the same-PE hairpin NAT of a site change -----------------------------------------------------------


def hairpin_pes(before: Tenant, after: Tenant) -> list[str]:
    """The PEs whose hairpin NAT (``ip fip_hairpin``) a site change of the tenant may alter, and
    whose tables tell the tenant's floating IPs: every PE holding an IPv4 site of the tenant
    before or after the change (each such PE translates the floating addresses for its IPv4 CE
    ports, :func:`substrate.scenario.layers.floating_ip.render_hairpins`; the floating IPs
    themselves are read off these tables, :func:`hairpin_fips`). None when the tenant has no IPv4
    site."""
    pes = {x.pe for t in (before, after) for x in t.sites if x.prefix4}
    return sorted(pes, key=node_id)


def hairpin_fips(tenant: Tenant, pe: str, table: NftTable) -> list[FloatingIP]:
    """The tenant's floating IPs as ``pe``'s hairpin table shows them: a DNAT rule of chain
    ``prerouting`` from one of the tenant's IPv4 CE ports on ``pe`` to the CE address of one of
    the tenant's IPv4 sites (an IPv4 prefix is unique within a tenant, so the CE address names
    the site; the port keeps another tenant's rules with an equal address apart)."""
    by_ce4 = {ce_addr(x.prefix4, 2): x for x in tenant.sites if x.prefix4}
    ports = {x.pe_if for x in tenant.sites if x.pe == pe and x.prefix4}
    out: dict[str, FloatingIP] = {}
    for r in (_chain(table.table, "prerouting") or {}).get("rules", []):
        m, i = _DNAT.search(r), _IIF.search(r)
        if m and i and i.group(1) in ports and m.group(2) in by_ce4 and m.group(1) not in out:
            out[m.group(1)] = FloatingIP(id=f"fip-{m.group(1)}", tenant=tenant.id, site=by_ce4[m.group(2)].id,
                                         address=m.group(1), mark=0)
    return list(out.values())


def plan_hairpins(before: Tenant, after: Tenant, tables: dict[str, NftTable]) -> dict[str, ConfigDelta]:
    """Per-PE changes of the hairpin NAT that a site change of the tenant needs (issue 19: the
    references moved a site onto or off a floating IP's PE and left its hairpin rules as they
    were; issue 36: every IPv4 CE port of the tenant translates its floating addresses): the
    tenant's floating IPs, read off every table of ``tables`` (``ip fip_hairpin`` as read, at
    least :func:`hairpin_pes`; :func:`hairpin_fips`), rendered with the floating-IP layer's
    :func:`render_hairpins` for the tenant before and after the change (a floating IP whose
    site goes goes with it), the difference spliced into each device's table
    (:func:`device_deltas`)."""
    fips: dict[str, FloatingIP] = {}
    for pe in sorted(tables, key=node_id):
        for f in hairpin_fips(before, pe, tables[pe]):
            fips.setdefault(f.address, f)
    if not fips:
        return {}
    staying = {x.id for x in after.sites}
    cfgs: list[dict[str, NodeConfig]] = []
    for t, kept in ((before, list(fips.values())), (after, [f for f in fips.values() if f.site in staying])):
        out: dict[str, NodeConfig] = {}
        render_hairpins(_operator_scenario(t, fips=kept), out)
        cfgs.append({pe: NodeConfig(nft={HAIRPIN_TABLE: out[pe].nft[HAIRPIN_TABLE]}) for pe in tables if pe in out})
    return device_deltas(cfgs[0], cfgs[1], {pe: {HAIRPIN_TABLE: t} for pe, t in tables.items()})


def merge_deltas(deltas: dict[str, ConfigDelta], more: dict[str, ConfigDelta]) -> dict[str, ConfigDelta]:
    """``deltas`` with the nftables tables of ``more`` (per node) added: into the node's delta,
    or as the node's delta when it has none."""
    out = dict(deltas)  # the plan's order is kept (mistakes are placed by it); new nodes come last
    for node, d in more.items():
        if node in out:
            out[node].nft.update(d.nft)
        else:
            out[node] = d
    return out
