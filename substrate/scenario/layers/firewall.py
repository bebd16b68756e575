"""Layer ``firewall``: per-tenant firewall policy in nftables on the PEs.

All tenants share one table per PE, ``inet tenant_fw``, whose ``forward`` chain jumps to the
tenant's chain for traffic leaving toward one of the tenant's CE ports (a shared chain: flushing
or reordering it for one tenant touches all). A policy item protects one TCP port of one
destination site, either closed to every source (``drop`` from any) or open to one source site
only (``accept`` from it, then ``drop`` from any). Other ports stay open.

Invariants (service ``firewall/<tenant>``), with real TCP connection attempts from CE hosts:
denied flows time out (dropped), allowed flows reach the CE (its kernel answers, with a
connection or a reset), and one unlisted port stays open (the policy does not over-block).
Each is checked over IPv6 and, where both sites carry IPv4 (the policy's IPv4 rules render
then), over IPv4 too (issue 19: the IPv4 half of a policy was never probed).

Flows from outside the tenant (issue 19: deny checks stayed within a tenant): a drop rule
closes its port to *every* source, so where another party has a path to the protected site --
the external host through a floating IP of the site (IPv4, after the border PE's NAT), the
shared-services host through a route leak of the tenant (IPv6) -- its attempt on the port must
time out too, while its attempt on the open-port control reaches the CE (the path exists, so the
deny is not vacuous). A rule scoped to the tenant's own source prefixes fails these.

State (``nft_chain``, :func:`chain_invariants`): on every PE, the ``inet tenant_fw`` table holds
exactly the chains rendered there (none on a PE without one), its ``forward`` chain exactly its
jumps and each tenant chain exactly its rules (issue 19: a drop on a port no verdict check
samples, or a table created on a PE that has none, broke nothing the probes saw).
"""

from __future__ import annotations

import random
from typing import Annotated, Any

from pydantic import Field

from substrate.scenario.layers.base import Intent, Layer, LayerParams, nft_chain_invariants, node_cfg, register
from substrate.scenario.layers.l3vpn import ce_addr, dump, natural_key, site_changed, tenant_nodes
from substrate.scenario.layers.specs import InstanceId, Spec
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


def verdict_invariant(sc: Scenario, pol: FirewallPolicy, src: Site, dst: Site, port: int, expect: str, why: str,
                      family: int = 6) -> Invariant:
    """The invariant that TCP ``port`` from ``src`` to ``dst`` gets the verdict ``expect`` (allow
    or deny) over IPv``family`` (4 needs both sites to carry IPv4; the id of an IPv4 check ends
    in ``/4``)."""
    dst_prefix = dst.prefix6 if family == 6 else dst.prefix4
    assert dst_prefix and (family == 6 or src.prefix4), "an IPv4 verdict needs IPv4 on both sites"
    return Invariant(
        id=f"firewall/{pol.tenant}/{expect}/{src.id}->{dst.id}:{port}" + ("/4" if family == 4 else ""),
        kind="tcp_verdict",
        service=f"firewall/{pol.tenant}",
        params={"src": src.ce, "dst": ce_addr(dst_prefix, 2), "port": port, "expect": expect, "family": family},
        description=f"{sc.tenant(pol.tenant).name}: TCP {port} over IPv{family} from {src.id} to {dst.id} is "
                    f"{EXPECT_WORDS[expect]} ({why})",
    )


def outside_invariants(sc: Scenario, pol: FirewallPolicy) -> list[Invariant]:
    """Checks of a policy's drop rules against flows from outside its tenant (module
    docstring): per protected (site, port) reachable from the external host (a floating IP of
    the site) or the shared-services host (a route leak of the tenant), a deny on the port, and
    once per source and site an allow on :data:`OPEN_PORT` (the control that the path exists). Ids
    ``firewall/<tenant>/outside/<host>/{deny,allow}/<site>:<port>``."""
    out: list[Invariant] = []
    name = sc.tenant(pol.tenant).name
    controlled: set[tuple[str, str]] = set()
    leaked = sc.shared_services is not None and any(lk.tenant == pol.tenant for lk in sc.route_leaks)
    for r in pol.rules:
        if r.action != "drop":
            continue
        dst = sc.site(r.dst_site)
        sources: list[tuple[str, str, int, str]] = []  # (host, address, family, how)
        if sc.external is not None:
            sources += [(sc.external.host, f.address, 4, f"through floating IP {f.address}")
                        for f in sc.floating_ips if f.site == dst.id]
        if leaked:
            assert sc.shared_services is not None
            sources.append((sc.shared_services.host, ce_addr(dst.prefix6, 2), 6, "through the tenant's route leak"))
        for host, addr, fam, how in sources:
            checks = [(r.port, "deny", "protected port, closed to every source")]
            if (host, addr) not in controlled:  # one control per source and destination
                controlled.add((host, addr))
                checks.append((OPEN_PORT, "allow", "control: the path exists"))
            for port, expect, why in checks:
                out.append(Invariant(
                    id=f"firewall/{pol.tenant}/outside/{host}/{expect}/{dst.id}:{port}" + ("/4" if fam == 4 else ""),
                    kind="tcp_verdict", service=f"firewall/{pol.tenant}",
                    params={"src": host, "dst": addr, "port": port, "expect": expect, "family": fam},
                    description=f"{name}: TCP {port} from {host} (outside the tenant) to {dst.id} {how} is "
                                f"{EXPECT_WORDS[expect]} ({why})",
                ))
    return out


def chain_invariants(sc: Scenario) -> list[Invariant]:
    """Per PE of the topology: the ``inet tenant_fw`` table's chains (id ``firewall/table/<pe>``,
    service ``firewall/table/<pe>``; none where nothing is rendered), its ``forward`` chain
    (``.../forward``, same service) and each tenant chain (``.../<tenant>``, service
    ``firewall/<tenant>``), exactly as rendered (:func:`nft_chain_invariants`)."""
    from substrate.topology import Role

    out: list[Invariant] = []
    for pe in sorted((n.name for n in sc.topology.routers if n.role is Role.PE), key=natural_key):
        svc = f"firewall/table/{pe}"
        out += nft_chain_invariants(sc, pe, TABLE, id_prefix=svc, service=svc, what="tenant firewalls",
                                    chain_service=lambda c, svc=svc: svc if c == "forward" else f"firewall/{c}",
                                    unordered=frozenset({"forward"}))  # one jump per CE port: any order
    return out


# -- typed specs (the A3-T catalog) ---------------------------------------------------------------------

#: Firewall rule set ids may carry the generator's ``fw-<tenant>`` form.
FW_ID_RE = r"^[a-z][a-z0-9_-]{0,31}$"


class FirewallRuleSetSpec(Spec):
    """A tenant's firewall: rules in the tenant's chain of the shared ``inet tenant_fw`` table
    on each PE hosting a destination site. A rule protects one TCP port of one site: ``drop``
    from every source (``src_site`` null), optionally preceded by ``accept`` rules for chosen
    source sites. Other ports stay open."""

    tenant: InstanceId
    rules: list[FirewallRule] = Field(min_length=1, max_length=64)


class FirewallRuleSetPatch(Spec):
    """A new rule list for the set (replaces the old list)."""

    tenant: InstanceId | None = Field(default=None, description="Must equal the set's tenant if given.")
    rules: list[FirewallRule] | None = Field(default=None, min_length=1, max_length=64)


def _rule_text(r: Any) -> str:
    return f"{r.action} TCP {r.port} from {r.src_site or 'any'} to {r.dst_site}"


class FirewallRuleSetIntent(Intent):
    """Catalog class ``firewall_rule_set``."""

    name = "firewall_rule_set"
    Spec = FirewallRuleSetSpec
    Patch = FirewallRuleSetPatch
    id_type = Annotated[str, Field(pattern=FW_ID_RE)]
    id_doc = "Rule set id; left out = 'fw-<tenant>'."
    owned_nft = True
    info = {
        "description": "A tenant's firewall rules (nftables chain <tenant> in the shared 'inet tenant_fw' table of each PE "
                       "hosting a destination site). A drop rule closes a TCP port of a site to every source (src_site "
                       "null); accept rules before it let chosen source sites through. One set per tenant. Port 8443 is "
                       "the open-port control of the set's checks and cannot be filtered.",
        "id_format": "fw-<tenant>, e.g. 'fw-t3'",
        "allocated": [],
        "layer": "firewall",
    }  # fmt: skip
    examples = [{"op": "modify", "service_class": "firewall_rule_set", "id": "fw-t3", "spec": {"rules": [
        {"src_site": "t3s2", "dst_site": "t3s1", "port": 22, "action": "accept"},
        {"src_site": None, "dst_site": "t3s1", "port": 22, "action": "drop"}]}}]  # fmt: skip

    def instances(self, sc: Scenario) -> list[Any]:
        return list(sc.firewalls)

    def spec_of(self, x: Any) -> dict[str, Any]:
        return {"tenant": x.tenant, "rules": [r.model_dump(mode="json") for r in x.rules]}

    def summary(self, x: Any) -> dict[str, Any]:
        return {"id": x.id, "tenant": x.tenant, "rules": len(x.rules)}

    def service(self, x: Any) -> str:
        return f"firewall/{x.tenant}"

    def devices(self, sc: Scenario, x: Any, owned: list[str]) -> list[str]:
        from substrate.scenario.layers.l3vpn import natural_key

        return sorted({sc.site(r.dst_site).pe for r in x.rules}, key=natural_key)

    def apply(self, ctx: Any, i: int, op: Any) -> None:
        sets = {f.id: f for f in ctx.work.firewalls}
        if op.op == "create":
            sp = op.spec
            same = [f for f in ctx.work.firewalls if f.tenant == sp.tenant and f.rules == sp.rules and (op.id is None or f.id == op.id)]
            if same:
                ctx.result(i, op, same[0].id, "no change", notes=[f"rule set {same[0].id} exists with these rules"])
                return
            iid = op.id or f"fw-{sp.tenant}"
            if ctx.in_use(i, iid):
                return
            ctx.work.firewalls.append(FirewallPolicy(id=iid, tenant=sp.tenant, rules=list(sp.rules)))
            ctx.result(i, op, iid, "created")
            return
        if op.id not in sets:
            ctx.missing(i, op, "firewall_rule_set")
            return
        cur = sets[op.id]
        if op.op == "delete":
            ctx.work.firewalls.remove(cur)
            ctx.result(i, op, cur.id, "deleted")
            return
        given = op.spec.model_fields_set
        if "tenant" in given and op.spec.tenant not in (None, cur.tenant):
            ctx.bad(f"ops[{i}].spec.tenant", f"a rule set cannot change tenant ({cur.id} belongs to {cur.tenant})")
            return
        if "rules" not in given or op.spec.rules is None or op.spec.rules == cur.rules:
            ctx.result(i, op, cur.id, "no change")
            return
        ctx.work.firewalls[ctx.work.firewalls.index(cur)] = cur.model_copy(update={"rules": list(op.spec.rules)})
        ctx.result(i, op, cur.id, "modified")


def _integrity(ctx: Any) -> None:  # noqa: C901 - one check per rule, in one place
    """Firewall rules: one rule set per tenant, whose rules name sites of the tenant; a drop
    applies to every source, an accept names its source and needs the drop it makes an exception
    to; port 8443 is the layer's open-port control; the tenant keeps at least two sites (the
    layer's checks send traffic between them)."""
    sites, tenants = ctx.sites(), ctx.tenants()
    per_tenant: dict[str, str] = {}
    for f in ctx.work.firewalls:
        t = tenants.get(f.tenant)
        if t is None:
            ctx.final([(f.id, "spec.tenant")], f"{f.id}: no tenant {f.tenant!r}")
            continue
        if f.tenant in per_tenant:
            ctx.final([(f.id, "spec.tenant")], f"tenant {f.tenant} already has rule set {per_tenant[f.tenant]} (one per tenant)")
        per_tenant[f.tenant] = f.id
        tsites = {s.id for s in t.sites}
        if len(t.sites) < 2:
            ctx.final([(f.id, "spec.rules"), *[(s.id, "spec.pe") for s in ctx.old.all_sites() if s.tenant == f.tenant]],
                      f"{f.id} needs tenant {f.tenant} to keep at least 2 sites (a rule filters traffic between its sites); "
                      f"delete or change {f.id} in the same change set")  # fmt: skip
        seen: set[tuple[Any, ...]] = set()
        drops = {(r.dst_site, r.port) for r in f.rules if r.action == "drop"}
        for k, r in enumerate(f.rules):
            rp = f"spec.rules[{k}]"
            rt = _rule_text(r)
            for fld in ("dst_site", "src_site"):
                v = getattr(r, fld)
                if v is not None and v not in tsites:
                    what = "does not exist" if v not in sites else f"belongs to {sites[v].tenant}"
                    ctx.final([(f.id, f"{rp}.{fld}"), (v, "id")], f"{f.id} rule '{rt}': site {v} {what}; rules name sites of "
                                                                   f"{f.tenant}; delete or change {f.id} in the same change set")  # fmt: skip
            if r.src_site is not None and r.src_site == r.dst_site:
                ctx.final([(f.id, f"{rp}.src_site")], f"{f.id} rule '{rt}': source and destination are the same site")
            if r.action == "drop" and r.src_site is not None:
                ctx.final([(f.id, f"{rp}.src_site")], f"{f.id} rule '{rt}': a drop rule applies to every source (src_site null); "
                                                      "to let one source through, add an accept rule for it")  # fmt: skip
            if r.action == "accept" and r.src_site is None:
                ctx.final([(f.id, f"{rp}.src_site")], f"{f.id} rule '{rt}': an accept rule names its source site")
            if r.action == "accept" and (r.dst_site, r.port) not in drops:
                ctx.final([(f.id, f"{rp}")], f"{f.id} rule '{rt}': an accept without a drop "
                                             f"rule for {r.dst_site}:{r.port} filters nothing (other ports stay open)")  # fmt: skip
            if r.port == OPEN_PORT:
                ctx.final([(f.id, f"{rp}.port")], f"port {OPEN_PORT} is the rule set's open-port control and cannot be filtered")
            key2 = (r.src_site, r.dst_site, r.port, r.action)
            if key2 in seen:
                ctx.final([(f.id, f"{rp}")], f"{f.id} rule '{rt}' is given twice")
            seen.add(key2)


@register
class Firewall(Layer):
    name = "firewall"
    requires = ("l3vpn",)
    Params = FirewallParams
    records = ("firewalls",)
    intents = (FirewallRuleSetIntent(),)

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
        """Per policy: each accept's allowed source, each drop from one other site, the
        open-port control -- over IPv6, and over IPv4 where the sites carry it (the IPv4 sources
        are drawn from a stream of their own, so the IPv6 checks stay those of before) -- and the
        flows from outside the tenant (:func:`outside_invariants`)."""
        out: list[Invariant] = []
        for pol in sc.firewalls:
            t = sc.tenant(pol.tenant)
            rng = random.Random(f"{sc.seed}/fw/{pol.id}")
            rng4 = random.Random(f"{sc.seed}/fw4/{pol.id}")
            allowed = {(r.src_site, r.dst_site, r.port) for r in pol.rules if r.action == "accept"}
            for r in pol.rules:
                dst = sc.site(r.dst_site)
                if r.action == "accept" and r.src_site:
                    src = sc.site(r.src_site)
                    out.append(verdict_invariant(sc, pol, src, dst, r.port, "allow", "allowed source"))
                    if src.prefix4 and dst.prefix4:
                        out.append(verdict_invariant(sc, pol, src, dst, r.port, "allow", "allowed source", 4))
                elif r.action == "drop":
                    others = [s for s in t.sites if s.id != dst.id and (s.id, dst.id, r.port) not in allowed]
                    if others:
                        out.append(verdict_invariant(sc, pol, rng.choice(others), dst, r.port, "deny", "protected port"))
                    others4 = [s for s in others if s.prefix4]
                    if dst.prefix4 and others4:
                        out.append(verdict_invariant(sc, pol, rng4.choice(others4), dst, r.port, "deny", "protected port", 4))
            dst = sc.site(pol.rules[0].dst_site)
            src = rng.choice([s for s in t.sites if s.id != dst.id])
            out.append(verdict_invariant(sc, pol, src, dst, OPEN_PORT, "allow", "unlisted port stays open"))
            v4 = [s for s in t.sites if s.id != dst.id and s.prefix4]
            if dst.prefix4 and v4:
                out.append(verdict_invariant(sc, pol, rng4.choice(v4), dst, OPEN_PORT, "allow", "unlisted port stays open", 4))
            out += outside_invariants(sc, pol)
        return out + chain_invariants(sc)

    def integrity(self, ctx: Any) -> None:
        _integrity(ctx)

    def service_nodes(self, sc: Scenario, out: dict[str, set[str]]) -> None:
        for t in sc.tenants:
            out[f"firewall/{t.id}"] = tenant_nodes(t)

    def changed(self, old: Scenario, new: Scenario) -> set[str]:
        """A rule set whose record differs, that names a site that changed, or whose flows from
        outside the tenant differ (:func:`outside_invariants` derives them from the floating IPs
        of its protected sites and the tenant's route leaks: a floating IP moved off a protected
        site takes its deny checks with it)."""
        out: set[str] = set()
        ofw, nfw = {f.tenant: f for f in old.firewalls}, {f.tenant: f for f in new.firewalls}
        for t in set(ofw) | set(nfw):
            f = nfw.get(t) or ofw[t]
            if dump(ofw.get(t)) != dump(nfw.get(t)) or any(site_changed(old, new, r.dst_site) or site_changed(old, new, r.src_site)
                                                           for r in f.rules):  # fmt: skip
                out.add(f"firewall/{t}")
            elif [i.model_dump() for i in outside_invariants(old, ofw[t])] != [i.model_dump() for i in outside_invariants(new, f)]:
                out.add(f"firewall/{t}")
        return out

    def references(self, sc: Scenario, cls: str, iid: str) -> list[str]:
        if cls == "tenant":
            return [f.id for f in sc.firewalls if f.tenant == iid]
        if cls == "tenant_site":
            return [f"{f.id} (firewall rule)" for f in sc.firewalls if any(iid in (r.src_site, r.dst_site) for r in f.rules)]
        return []

    def drop_dependents(self, sc: Scenario, cls: str, iid: str) -> None:
        if cls == "tenant":
            sc.firewalls = [f for f in sc.firewalls if f.tenant != iid]
        elif cls == "tenant_site":
            sc.firewalls = [f for f in sc.firewalls if not any(iid in (r.src_site, r.dst_site) for r in f.rules)]
        elif cls == "firewall_rule_set":
            sc.firewalls = [f for f in sc.firewalls if f.id != iid]

    def site_gone(self, sc: Scenario, site: str) -> list[tuple[str, list[str]]]:
        """Accept rules whose source is the removed site go with it; a set left without rules goes too."""
        out = []
        for pol in list(sc.firewalls):
            gone = [r for r in pol.rules if r.src_site == site]
            if gone:
                pol.rules = [r for r in pol.rules if r.src_site != site]
                notes = [f"{pol.id}: {len(gone)} accept rule(s) from {site} removed with it"]
                if not pol.rules:
                    sc.firewalls.remove(pol)
                    notes.append(f"{pol.id} had no rule left and was removed")
                out.append((pol.id, notes))
        return out

    def pins_site(self, sc: Scenario, site: str) -> bool:
        return any(r.dst_site == site for f in sc.firewalls for r in f.rules)
