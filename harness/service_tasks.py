"""Task classes that change the other service classes (issue 15, item 2): ``steering-change``
(create or modify an SRv6 steering policy), ``firewall-change`` (a tenant's rule set gets a new
protected port, open to one source site), ``floating-ip-change`` (add a floating IP, or move one
to another site).

A variant states its change as the customer would (request.yaml: the service, the action, the
values -- ``service_class`` names the catalog class) and holds, hidden, the same change as an
A3-T change set (``TaskVariant.ops``). The expected inventory is that change set planned by the
A3-T planner on the scenario (:func:`servers.a3_intent.planner.plan`, pure: the service layers'
own rendering and invariants); its invariants of the services the planner says changed, and
those the change adds or alters whatever their service, are the hidden test cases, the rest
(baseline invariants the change leaves as they are) the damage checks (:func:`split_checks`). Class-specific test cases are added where the
layer's own invariants do not say enough:

- steering: the layer's ``steered_path`` (the waypoint's policy SID counter grows by at least
  the probes sent, and they get replies);
- firewall: the new port's deny and allow verdicts over IPv6 *and* IPv4 (the layer samples IPv6);
- floating IP: pings from the external host arrive at the right CE (``reach_at``: the counter at
  the CE, after the NAT), beside the layer's reach and NAT-rule checks.

Known gap (adversarial review, h15r): a change made to the *wrong* tenant is a clean failure, not
damage, when it only adds filtering the other tenant's checks do not sample -- the firewall
ticket applied to t2 instead of t1 on the small campaign lab (a new drop on TCP 80 of a t2 site)
broke no damage check: a tenant's firewall invariants sample its own rules' ports and the open
port only. Likewise nothing checks that a floating IP does *not* reach another tenant's site.

Variants are placed to interact with existing state: policies on flows next to existing ones,
firewall items on tenants that already have a rule set, floating IPs next to the existing ones on
the shared border PE (its NAT table, marks and tenant tables).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import yaml

from harness.errors import AnibenchError
from harness.tasks import DESIGN_MD, TaskClass, TaskVariant, _sites_csv, register_task
from substrate.scenario.layers.l3vpn import ce_addr
from substrate.scenario.model import Invariant, Scenario

_COMMON = (
    "You operate a multi-tenant SRv6 provider network. request.yaml gives the customer's change request; sites.csv "
    "lists the tenant's sites; design.md describes how tenant services are built in this network. "
)
PROMPTS = {
    "steering-change": _COMMON + (
        "Ticket: steer a tenant's traffic through a waypoint router. The policy (new, or an existing one to change) "
        "pins the tenant's traffic entering at the ingress PE toward the destination site through the waypoint: a "
        "uSID End SID with the NEXT-C-SID flavor of its own on the waypoint, and the ingress PE's routes toward the "
        "site carrying the container <waypoint><that SID><egress PE><egress SID> (RFC 9800). Leave every other "
        "service intact. Check your work, then call submit."
    ),
    "firewall-change": _COMMON + (
        "Ticket: change a tenant's firewall. request.yaml gives the tenant's complete new rule set (rules in order: "
        "accept rules for chosen source sites, then a drop for every other source, per protected TCP port of a "
        "site; other ports stay open), as nftables rules in the tenant's chain of the shared 'inet tenant_fw' "
        "table on the PE of each protected site, for IPv6 and IPv4. Leave every other service intact. Check your "
        "work, then call submit."
    ),
    "floating-ip-change": _COMMON + (
        "Ticket: a floating (public) IPv4 address for a tenant site, added or moved to another site. On the "
        "border PE, where the external network attaches, the address is destination-NATed 1:1 to the site CE's "
        "IPv4 address and marked so that a rule looks it up in the tenant's table; replies return through SRv6. "
        "Afterwards the external host must reach the address, at the right site's CE. Leave every other service "
        "intact. Check your work, then call submit."
    ),
}

#: The levels at which the scripted reference of each class is not written, and why (none: the
#: device-level references are :mod:`harness.agents.steering_ops` and
#: :mod:`harness.agents.service_devices`).
INEXPRESSIBLE: dict[str, dict[str, str]] = {"steering-change": {}, "firewall-change": {}, "floating-ip-change": {}}


def expected_after(sc: Scenario, ops: list[dict[str, Any]]) -> tuple[Scenario, set[str]]:
    """The inventory after the change set ``ops`` and the services it changes (A3-T's planner).

    Raises:
        AnibenchError: the planner refuses the change set (a defect of the variant's draw).
    """
    from servers.a3_intent.catalog import ChangeSetRejected, parse_ops
    from servers.a3_intent.inventory import expected_found
    from servers.a3_intent.planner import plan

    try:
        p = plan(sc, parse_ops(ops), expected_found(sc))
    except ChangeSetRejected as e:
        raise AnibenchError(f"the variant's change set is refused by the planner: {e}") from None
    return p.new, set(p.changed_services)


def split_checks(sc: Scenario, after: Scenario, changed: set[str]) -> tuple[list[Invariant], list[Invariant]]:
    """The expected inventory's invariants as (test cases, damage checks). A damage check is an
    invariant of an unchanged service that holds in the baseline already, as it is; every other
    one -- of a changed service, or one the change adds or alters whatever service owns it (the
    new waypoint's SID is ``addressing``'s, the steered route in the tenant table ``l3vpn``'s)
    -- is a test case, so that doing nothing fails test cases and breaks no damage check."""
    base = {i.id: i for i in sc.invariants}
    tests, damage = [], []
    for i in after.invariants:
        (damage if i.service not in changed and base.get(i.id) == i else tests).append(i)
    return tests, damage


def _steering(sc: Scenario, variant: int, rng: random.Random) -> tuple[dict[str, Any], list[dict[str, Any]], list[Invariant]]:
    from substrate.scenario.layers.steering import waypoints
    from substrate.topology import Role

    cores = [n.name for n in sc.topology.routers if n.role is Role.P] or [n.name for n in sc.topology.routers]
    if variant % 2 == 1 and sc.steering:
        p = rng.choice(sc.steering)
        dst = sc.site(p.dst_site)
        # another P router where there is one, else any other router (a PE can be a waypoint too)
        alt = [w for w in waypoints(cores, p.ingress_pe, dst.pe) if w != p.waypoint] or [
            w for w in waypoints([n.name for n in sc.topology.routers], p.ingress_pe, dst.pe) if w != p.waypoint]
        if alt:
            wp = rng.choice(alt)
            req = {"service_class": "steering_policy", "action": "modify", "policy": p.id, "tenant": p.tenant,
                   "customer": sc.tenant(p.tenant).name, "ingress_pe": p.ingress_pe, "dst_site": p.dst_site,
                   "waypoint": wp, "was_waypoint": p.waypoint}
            return req, [{"op": "modify", "service_class": "steering_policy", "id": p.id, "spec": {"waypoint": wp}}], []
    taken = {(p.tenant, p.ingress_pe, p.dst_site) for p in sc.steering}
    flows = sorted({(t.id, s.pe, d.id) for t in sc.tenants for s in t.sites for d in t.sites
                    if s.pe != d.pe and (t.id, s.pe, d.id) not in taken and waypoints(cores, s.pe, d.pe)})
    if not flows:
        raise AnibenchError("steering-change needs a tenant flow between two PEs with a router to steer through")
    # interact with existing state: prefer a flow entering where a policy already steers traffic
    busy = [f for f in flows if f[1] in {p.ingress_pe for p in sc.steering}]
    tid, ing, dst_id = rng.choice(busy or flows)
    wp = rng.choice(waypoints(cores, ing, sc.site(dst_id).pe))
    pid = f"sp{max([int(p.id[2:]) for p in sc.steering if p.id[2:].isdigit()], default=0) + 1}"
    req = {"service_class": "steering_policy", "action": "create", "policy": pid, "tenant": tid,
           "customer": sc.tenant(tid).name, "ingress_pe": ing, "dst_site": dst_id, "waypoint": wp}
    spec = {"tenant": tid, "ingress_pe": ing, "dst_site": dst_id, "waypoint": wp}
    return req, [{"op": "create", "service_class": "steering_policy", "id": pid, "spec": spec}], []


def _verdict4(sc: Scenario, tenant: str, src: Any, dst: Any, port: int, expect: str) -> Invariant:
    return Invariant(id=f"task/firewall/{tenant}/{expect}/{src.id}->{dst.id}:{port}/v4", kind="tcp_verdict",
                     service=f"firewall/{tenant}",
                     params={"src": src.ce, "dst": ce_addr(dst.prefix4, 2), "port": port, "expect": expect, "family": 4},
                     description=f"TCP {port} from {src.id} to {dst.id} over IPv4 is {expect}ed")


def _verdict6(sc: Scenario, tenant: str, src: Any, dst: Any, port: int, expect: str) -> Invariant:
    return Invariant(id=f"task/firewall/{tenant}/{expect}/{src.id}->{dst.id}:{port}/v6", kind="tcp_verdict",
                     service=f"firewall/{tenant}",
                     params={"src": src.ce, "dst": ce_addr(dst.prefix6, 2), "port": port, "expect": expect, "family": 6},
                     description=f"TCP {port} from {src.id} to {dst.id} over IPv6 is {expect}ed")


def _firewall(sc: Scenario, variant: int, rng: random.Random) -> tuple[dict[str, Any], list[dict[str, Any]], list[Invariant]]:
    from substrate.scenario.layers.firewall import PORTS

    # a tenant with three sites: a protected one, an allowed source, a denied source; both
    # families on the allowed and denied pairs where possible
    def fits(t: Any) -> bool:
        return len(t.sites) >= 3

    cands = [t for t in sc.tenants if fits(t)]
    if not cands:
        raise AnibenchError("firewall-change needs a tenant with at least three sites")
    with_set = [t for t in cands if any(f.tenant == t.id for f in sc.firewalls)]
    t = rng.choice(with_set or cands)
    pol = next((f for f in sc.firewalls if f.tenant == t.id), None)
    used = {(r.dst_site, r.port) for r in pol.rules} if pol else set()
    v4 = [s for s in t.sites if s.prefix4]
    dst = rng.choice(v4 if len(v4) >= 3 else t.sites)
    ports = [p for p in PORTS if (dst.id, p) not in used]
    if not ports:
        raise AnibenchError(f"firewall-change: every port of {dst.id} is protected already")
    port = rng.choice(ports)
    others = [s for s in t.sites if s.id != dst.id]
    others.sort(key=lambda s: (s.prefix4 is None, s.id))  # IPv4 sites first: both families tested
    allow_src, deny_src = others[0], others[1]
    old = [r.model_dump() for r in pol.rules] if pol else []
    new_rules = [*old, {"src_site": allow_src.id, "dst_site": dst.id, "port": port, "action": "accept"},
                 {"src_site": None, "dst_site": dst.id, "port": port, "action": "drop"}]
    fid = pol.id if pol else f"fw-{t.id}"
    ops = [{"op": "modify" if pol else "create", "service_class": "firewall_rule_set", "id": fid,
            "spec": {"rules": new_rules} if pol else {"tenant": t.id, "rules": new_rules}}]
    req = {"service_class": "firewall_rule_set", "action": "modify" if pol else "create", "rule_set": fid,
           "tenant": t.id, "customer": t.name,
           "change": f"protect TCP {port} of site {dst.id}: open to {allow_src.id} only", "rules": new_rules}
    extra = [_verdict6(sc, t.id, allow_src, dst, port, "allow"), _verdict6(sc, t.id, deny_src, dst, port, "deny")]
    if dst.prefix4 and allow_src.prefix4:
        extra.append(_verdict4(sc, t.id, allow_src, dst, port, "allow"))
    if dst.prefix4 and deny_src.prefix4:
        extra.append(_verdict4(sc, t.id, deny_src, dst, port, "deny"))
    return req, ops, extra


def _floating(sc: Scenario, variant: int, rng: random.Random) -> tuple[dict[str, Any], list[dict[str, Any]], list[Invariant]]:
    from substrate.scenario.layers.addressing import Ipam

    if sc.external is None:
        raise AnibenchError("floating-ip-change needs a scenario with the floating_ip layer (an external segment)")
    taken = {f.site for f in sc.floating_ips}
    border = sc.external.border_pe
    # a site the planner accepts as a floating IP's: no other site on the border PE has its IPv4
    # prefix (substrate.scenario.layers.floating_ip._integrity: the NATed traffic could not tell
    # them apart; tenants may reuse address space)
    v4 = [s for s in sc.all_sites() if s.prefix4 and s.id not in taken
          and not any(o.pe == border and o.prefix4 == s.prefix4 and o.id != s.id for o in sc.all_sites())]
    if not v4:
        raise AnibenchError("floating-ip-change needs an IPv4 site without a floating IP whose prefix no other site on the border PE has")
    if variant % 2 == 1 and sc.floating_ips:
        f = rng.choice(sc.floating_ips)
        dests = [s for s in v4 if s.tenant == f.tenant] or v4
        s = rng.choice(dests)
        req = {"service_class": "floating_ip", "action": "move", "floating_ip": f.id, "address": f.address,
               "tenant": s.tenant, "customer": sc.tenant(s.tenant).name, "from_site": f.site, "to_site": s.id}
        ops = [{"op": "modify", "service_class": "floating_ip", "id": f.id, "spec": {"site": s.id}}]
        fid, address = f.id, f.address
    else:
        s = rng.choice(v4)
        address = Ipam.from_scenario(sc).floating4()
        fid = f"fip{max([int(x.id[3:]) for x in sc.floating_ips if x.id[3:].isdigit()], default=0) + 1}"
        req = {"service_class": "floating_ip", "action": "add", "floating_ip": fid, "address": address,
               "tenant": s.tenant, "customer": sc.tenant(s.tenant).name, "to_site": s.id}
        ops = [{"op": "create", "service_class": "floating_ip", "id": fid, "spec": {"site": s.id, "address": address}}]
    assert s.prefix4
    extra = [Invariant(id=f"task/floating_ip/{fid}/at/{s.ce}", kind="reach_at", service=f"floating_ip/{fid}",
                       params={"src": sc.external.host, "dst": address, "family": 4, "dst_node": s.ce,
                               "dst_at": ce_addr(s.prefix4, 2)},
                       description=f"pings from the external host to {address} arrive at {s.id}'s CE {s.ce}")]
    return req, ops, extra


_DRAW: dict[str, Callable[[Scenario, int, random.Random], tuple[dict[str, Any], list[dict[str, Any]], list[Invariant]]]] = {
    "steering-change": _steering,
    "firewall-change": _firewall,
    "floating-ip-change": _floating,
}


def _maker(name: str) -> Callable[[Scenario, int, int, random.Random, int | None], TaskVariant]:
    def make(sc: Scenario, variant: int, seed: int, rng: random.Random, fault_seed: int | None) -> TaskVariant:
        req, ops, extra = _DRAW[name](sc, variant, rng)
        after, changed = expected_after(sc, ops)
        tests, damage = split_checks(sc, after, changed)
        have = {i.id for i in tests}
        tests += [i for i in extra if i.id not in have]
        files = {"request.yaml": yaml.safe_dump(req, sort_keys=False), "sites.csv": _sites_csv(sc, req["tenant"]),
                 "design.md": DESIGN_MD}
        return TaskVariant(task_class=name, variant=variant, seed=seed, scenario_seed=sc.seed,
                           fault_seed=fault_seed if fault_seed is not None else seed, prompt=PROMPTS[name], files=files,
                           setup=[], ops=ops, test_cases=tests, damage_checks=damage)

    return make


for _name in _DRAW:
    register_task(TaskClass(name=_name, prompt=PROMPTS[_name], make=_maker(_name), kind="service-change",
                            inexpressible=INEXPRESSIBLE[_name]))
