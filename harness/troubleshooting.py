"""Task class ``troubleshooting`` (draft section 5.4's task taxonomy; issue 15, item 1).

A variant breaks one service on purpose before the agent starts, with a misconfiguration drawn
(seeded) from :data:`CATALOG`; the ticket states only the symptom, as the customer (or the NOC's
monitoring) would; the agent finds the cause and repairs it.

- The breakage is a list of :class:`~harness.tasks.SetupStep` the harness runs through the
  substrate (``Lab.exec`` in the node's namespace, never an ANI server) after the lab has been
  reset to its baseline -- so the baseline snapshot never holds it and the next ``lab reset``
  removes it like any other change.
- Hidden test cases: every invariant of the services the broken element carries (the tenant's
  VPN and every service bound to the tenant for a tenant-side breakage; the link's IS-IS
  adjacencies for an underlay one; the floating IP's reachability and NAT, with a probe counted
  at the right CE, for a NAT one), taken from the scenario, i.e. the state before the breakage:
  the repair must bring that state back. Damage checks: every other invariant. Doing nothing is
  a clean failure, never damage: what the breakage disturbs is always a test case.

Catalog (each entry picks its target with the variant's generator, or says the scenario has
none): ``wrong_sid_behaviour`` (a tenant's End.DT6 SID on one PE re-installed as a plain End),
``missing_ip_rule`` (a site's policy rules into the tenant table deleted), ``isis_interface_removed``
(``no ipv6 router isis`` on one end of a core link), ``firewall_shadow`` (a drop rule inserted
ahead of a tenant's accept rule, shadowing an allowed flow), ``nat_wrong_ce`` (a floating IP's
DNAT rule rewritten to another CE's address), ``link_down`` (a PE's attachment-circuit port
set down).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import yaml

from harness.errors import AnibenchError
from harness.tasks import (
    DESIGN_MD,
    SetupStep,
    TaskClass,
    TaskVariant,
    _sites_csv,
    register_task,
)
from substrate.scenario.layers.l3vpn import ce_addr, sid_of
from substrate.scenario.model import Invariant, Scenario

PROMPT = (
    "You operate a multi-tenant SRv6 provider network. Ticket: a customer reports a problem. request.yaml "
    "gives the customer's report as they wrote it (what stopped working, from where to where); sites.csv "
    "lists the tenant's sites; design.md describes how tenant services are built in this network. Find the "
    "cause on the provider network and repair it so that the service works as designed again, without "
    "disturbing any other service. Check your work, then call submit."
)


@dataclass
class Breakage:
    """One drawn misconfiguration: what the harness does (``steps``), what the customer says
    (``report``, the request.yaml body besides tenant and customer), the tenant whose sites
    sites.csv lists, and which invariants are the hidden test cases (``is_test``)."""

    kind: str
    tenant: str
    steps: list[SetupStep]
    report: dict[str, Any]
    is_test: Callable[[Invariant], bool]
    detail: dict[str, Any] = field(default_factory=dict)


def tenant_services(sc: Scenario, tenant: str) -> set[str]:
    """The services bound to ``tenant``: its VPN, firewall, steering policies, floating IPs and
    the leaks of shared services into its table (service ids as the layers name them)."""
    out = {f"l3vpn/{tenant}", f"firewall/{tenant}"}
    out |= {f"steering/{p.id}" for p in sc.steering if p.tenant == tenant}
    out |= {f"floating_ip/{f.id}" for f in sc.floating_ips if f.tenant == tenant}
    out |= {i.service for i in sc.invariants if i.service.startswith("shared") and tenant in i.service.split("/")}
    return out


def _tenant_test(sc: Scenario, tenant: str, *, sid: str | None = None,
                 port: tuple[str, str] | None = None) -> Callable[[Invariant], bool]:
    """Test-case selector of a tenant-side breakage: the tenant's services, and any other
    service's invariant about the broken element itself (its SID, its PE port)."""
    own = tenant_services(sc, tenant)

    def is_test(i: Invariant) -> bool:
        p = i.params
        if i.service in own or (sid is not None and p.get("sid") == sid):
            return True
        return port is not None and (p.get("node"), p.get("interface")) == port

    return is_test


def _pick_tenant_pes(sc: Scenario, rng: random.Random) -> tuple[Any, str] | None:
    cands = [(t, pe) for t in sc.tenants for pe in sorted(t.dt6_functions) if len({s.pe for s in t.sites}) >= 2]
    return rng.choice(cands) if cands else None


def _wrong_sid(sc: Scenario, rng: random.Random) -> Breakage | None:
    got = _pick_tenant_pes(sc, rng)
    if got is None:
        return None
    t, pe = got
    sid = sid_of(sc, pe, t.dt6_functions[pe])
    here = [s for s in t.sites if s.pe == pe]
    there = [s for s in t.sites if s.pe != pe]
    dst, src = rng.choice(here), rng.choice(there)
    step = SetupStep(node=pe, argv=["ip", "-6", "route", "replace", sid, "metric", "1024", "encap", "seg6local", "action", "End",
                                    "count", "dev", "sr0"], why=f"breakage: {t.id}'s End.DT6 SID on {pe} made a plain End")
    report = {"from_site": src.id, "to_site": dst.id,
              "report": f"Since this morning nothing from our site {src.id} reaches our site {dst.id} (no answer "
                        "at all). Other sites of ours may be affected too."}
    return Breakage("wrong_sid_behaviour", t.id, [step], report, _tenant_test(sc, t.id, sid=sid), {"node": pe, "sid": sid})


def _missing_rule(sc: Scenario, rng: random.Random) -> Breakage | None:
    cands = [(t, s) for t in sc.tenants if len(t.sites) >= 2 for s in t.sites]
    if not cands:
        return None
    t, s = rng.choice(cands)
    steps = [SetupStep(node=s.pe, argv=["ip", "-6", "rule", "del", "priority", "1000", "iif", s.pe_if, "lookup", str(t.table)],
                       why=f"breakage: {s.id}'s IPv6 policy rule deleted")]
    if s.prefix4:
        steps.append(SetupStep(node=s.pe, argv=["ip", "-4", "rule", "del", "priority", "1000", "iif", s.pe_if, "lookup",
                                                str(t.table)], why=f"breakage: {s.id}'s IPv4 policy rule deleted"))
    other = rng.choice([x for x in t.sites if x.id != s.id])
    report = {"from_site": s.id, "to_site": other.id,
              "report": f"Our site {s.id} cannot reach any of our other sites, e.g. {other.id}, since this morning."}
    return Breakage("missing_ip_rule", t.id, steps, report, _tenant_test(sc, t.id), {"node": s.pe, "port": s.pe_if})


def _isis_removed(sc: Scenario, rng: random.Random) -> Breakage | None:
    from substrate.frr import ISIS_TAG

    links = sc.topology.core_links()
    if not links or not sc.tenants:
        return None
    lk = rng.choice(links)
    me, peer = rng.choice([(lk.a, lk.b), (lk.b, lk.a)])
    step = SetupStep(node=me.node, argv=["vtysh", "-c", "configure terminal", "-c", f"interface {me.interface}",
                                         "-c", f"no ipv6 router isis {ISIS_TAG}"],
                     why=f"breakage: IS-IS left out on {me.node} {me.interface}")
    ends = {(lk.a.node, lk.a.interface), (lk.b.node, lk.b.interface)}
    report = {"routers": [me.node, peer.node], "report": f"NOC monitoring: since this morning the core link between {me.node} and {peer.node} carries "
                        f"no traffic (the routers no longer see each other over it; traffic takes longer paths)."}
    t = sc.tenants[0]
    return Breakage("isis_interface_removed", t.id, [step], report,
                    lambda i: i.kind == "isis_adjacency" and (i.params["node"], i.params["interface"]) in ends,
                    {"node": me.node, "interface": me.interface, "peer": peer.node})


def _firewall_shadow(sc: Scenario, rng: random.Random) -> Breakage | None:
    from substrate.scenario.layers.firewall import OPEN_PORT

    allowed = [(pol, r) for pol in sc.firewalls for r in pol.rules if r.action == "accept" and r.src_site]
    if allowed:
        pol, r = rng.choice(allowed)
        dst, src, port = sc.site(r.dst_site), sc.site(r.src_site), r.port
    else:  # the open-port control: a port the policy leaves open for everyone
        cands = [(pol, r) for pol in sc.firewalls for r in pol.rules]
        if not cands:
            return None
        pol, r = rng.choice(cands)
        dst, port = sc.site(r.dst_site), OPEN_PORT
        src = rng.choice([s for s in sc.tenant(pol.tenant).sites if s.id != dst.id] or [dst])
    args = ["nft", "insert", "rule", "inet", "tenant_fw", pol.tenant, "ip6", "daddr", dst.prefix6, "tcp", "dport", str(port), "drop"]
    steps = [SetupStep(node=dst.pe, argv=args, why=f"breakage: a drop rule shadows TCP {port} to {dst.id}")]
    if dst.prefix4 and src.prefix4:  # the flow has an IPv4 accept only when both ends have IPv4
        steps.append(SetupStep(node=dst.pe, argv=["nft", "insert", "rule", "inet", "tenant_fw", pol.tenant, "ip", "daddr",
                                                  dst.prefix4, "tcp", "dport", str(port), "drop"],
                               why=f"breakage: a drop rule shadows TCP {port} to {dst.id} (IPv4)"))
    report = {"from_site": src.id, "to_site": dst.id, "port": port,
              "report": f"Connections from our site {src.id} to TCP port {port} at our site {dst.id} time out since "
                        "this morning, although our firewall policy allows them."}
    return Breakage("firewall_shadow", pol.tenant, steps, report, _tenant_test(sc, pol.tenant),
                    {"node": dst.pe, "chain": pol.tenant, "port": port})


def _nat_wrong_ce(sc: Scenario, rng: random.Random) -> Breakage | None:
    from substrate.scenario.layers.floating_ip import TABLE

    e = sc.external
    if e is None or not sc.floating_ips:
        return None
    f = rng.choice(sc.floating_ips)
    site = sc.site(f.site)
    others = [s for s in sc.all_sites() if s.prefix4 and s.id != site.id and s.prefix4 != site.prefix4]
    if not others:
        return None
    wrong = rng.choice(others)
    assert site.prefix4 and wrong.prefix4
    fam, name = TABLE.split()
    script = (f"h=$(nft -a list chain {fam} {name} prerouting_dnat | "
              f"awk '/ip daddr {f.address} dnat to/ {{print $NF}}'); "
              f"[ -n \"$h\" ] && nft replace rule {fam} {name} prerouting_dnat handle $h "
              f"iifname '\"{e.pe_if}\"' ip daddr {f.address} dnat to {ce_addr(wrong.prefix4, 2)}")
    step = SetupStep(node=e.border_pe, argv=["bash", "-c", script],
                     why=f"breakage: floating IP {f.address} NATed to {wrong.id}'s CE instead of {site.id}'s")
    report = {"to_site": site.id, "floating_ip": f.address,
              "report": f"Our public address {f.address} should lead to our server at site {site.id}; since this "
                        "morning connections from the Internet land somewhere else (not on our server)."}
    own = tenant_services(sc, f.tenant) | {f"floating_ip/{f.id}"}
    return Breakage("nat_wrong_ce", f.tenant, [step], report, lambda i: i.service in own,
                    {"node": e.border_pe, "floating_ip": f.id, "wrong_site": wrong.id})


def _link_down(sc: Scenario, rng: random.Random) -> Breakage | None:
    cands = [(t, s) for t in sc.tenants if len(t.sites) >= 2 for s in t.sites]
    if not cands:
        return None
    t, s = rng.choice(cands)
    step = SetupStep(node=s.pe, argv=["ip", "link", "set", s.pe_if, "down"], why=f"breakage: {s.pe} {s.pe_if} ({s.id}) down")
    other = rng.choice([x for x in t.sites if x.id != s.id])
    report = {"from_site": other.id, "to_site": s.id,
              "report": f"Our site {s.id} is completely cut off since this morning: nothing reaches it, e.g. from {other.id}."}
    return Breakage("link_down", t.id, [step], report, _tenant_test(sc, t.id, port=(s.pe, s.pe_if)),
                    {"node": s.pe, "interface": s.pe_if})


#: Breakage kinds whose repair no reference can state at a level, and why. At A3-R and A4 the
#: reconciler reverts every kind of the catalog (its drift reading covers all the rendering owns --
#: nft chains' rule lists in order, the underlay's FRR lines and ports; issue 13). At A2 (NETCONF)
#: the operator sees and edits what the models hold (harness.agents.troubleshoot.NetconfHands).
#: Such runs are skipped, not scored as the reference's failure.
_A2_NO_LINK = ("cannot express: the A2 models hold no kernel link state (frr-zebra's 'shutdown' is FRR configuration, "
               "which the breakage leaves unchanged), so the port set down is neither visible nor a configuration difference")
_A2_NO_ISIS = ("not written: the scripted A2 edit payloads carry kernel objects and interface addresses only; the "
               "frr-isisd interface settings this repair needs are not built")
_A2_DUPLICATE = ("cannot express: the shadowing rule is a copy of the policy's own drop, and the A2 model lists a "
                 "chain's rules as a leaf-list (unique values): both read as one entry, so the chain's order can be "
                 "neither read nor written (a table replace from the model's view deletes the policy's drop: observed)")
NO_REFERENCE: dict[str, dict[str, str]] = {
    "firewall_shadow": {"A2": _A2_DUPLICATE},
    "isis_interface_removed": {"A2": _A2_NO_ISIS},
    "link_down": {"A2": _A2_NO_LINK},
}

#: The catalog of breakages (name -> picker), in the order variants cycle through.
CATALOG: dict[str, Callable[[Scenario, random.Random], Breakage | None]] = {
    "wrong_sid_behaviour": _wrong_sid,
    "missing_ip_rule": _missing_rule,
    "isis_interface_removed": _isis_removed,
    "firewall_shadow": _firewall_shadow,
    "nat_wrong_ce": _nat_wrong_ce,
    "link_down": _link_down,
}


def _variant(sc: Scenario, variant: int, seed: int, rng: random.Random, fault_seed: int | None) -> TaskVariant:
    """Variant ``variant``: breakage ``CATALOG[variant mod 6]`` (so any six consecutive variants
    cover the catalog), its target drawn with ``rng``; a kind the scenario cannot host gives
    way to the next one."""
    kinds = list(CATALOG)
    for k in range(len(kinds)):
        kind = kinds[(variant + k) % len(kinds)]
        b = CATALOG[kind](sc, rng)
        if b is not None:
            break
    else:
        raise AnibenchError("troubleshooting needs a scenario with tenants (no breakage of the catalog fits)")
    t = sc.tenant(b.tenant)
    # a router's whole rule set or SID set (issue 36) is broken with any of its rules or SIDs:
    # on the routers the breakage changes, a test case too (doing nothing stays a clean failure)
    touched = {st.node for st in b.steps}
    own = b.is_test

    def is_test(i: Invariant) -> bool:
        return own(i) or (i.kind in ("policy_rules", "local_sids", "port_state") and i.params.get("node") in touched)

    b.is_test = is_test
    tests = [i for i in sc.invariants if b.is_test(i)]
    if b.kind == "nat_wrong_ce":
        f = next(x for x in sc.floating_ips if x.id == b.detail["floating_ip"])
        s = sc.site(f.site)
        assert s.prefix4 and sc.external
        tests.append(Invariant(id=f"task/fip/{f.id}/at/{s.ce}", kind="reach_at", service=f"floating_ip/{f.id}",
                               params={"src": sc.external.host, "dst": f.address, "family": 4, "dst_node": s.ce,
                                       "dst_at": ce_addr(s.prefix4, 2)},
                               description=f"pings from the external host to {f.address} arrive at {s.id}'s CE {s.ce}"))
    damage = [i for i in sc.invariants if not b.is_test(i)]
    request = {"tenant": t.id, "customer": t.name, **b.report}
    files = {"request.yaml": yaml.safe_dump(request, sort_keys=False), "sites.csv": _sites_csv(sc, t.id), "design.md": DESIGN_MD}
    return TaskVariant(task_class="troubleshooting", variant=variant, seed=seed, scenario_seed=sc.seed,
                       fault_seed=fault_seed if fault_seed is not None else seed, prompt=PROMPT, files=files,
                       setup=b.steps, test_cases=tests, damage_checks=damage,
                       breakage={"kind": b.kind, **b.detail, "no_reference": NO_REFERENCE.get(b.kind, {})})


#: Levels whose reference solution is not stated, and why (``harness task list`` shows them).
INEXPRESSIBLE = {
    "A3-T": "the broken service's intent is unchanged: a typed change set of the same services is a no-op, and A3-T "
            "has no operation that re-applies an unchanged intent (the breakage is drift below its abstraction)",
}

register_task(TaskClass(name="troubleshooting", prompt=PROMPT, make=_variant, kind="troubleshooting",
                        inexpressible=INEXPRESSIBLE))
