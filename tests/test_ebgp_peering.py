"""Service class ``ebgp_peering`` (issue 18): external eBGP peering on a real lab.

The external AS's router is a node of role ``external`` (FRR bgpd outside the underlay). The
baseline's invariants hold (deploy verifies them); each kind of invariant fails when the state it
guards is broken through the substrate (a prefix-list widened on the PE both ways, the neighbor
shut down, the external router's bgpd killed by the daemon-crash fault) and passes again after a
lab reset; A3-T applies the class's reference change (accept the prefix the peer announces that
is not yet agreed, advertise one more) with active validation, and refuses a hijack."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from servers.a3_intent.catalog import ChangeSetRejected, parse_ops
from servers.a3_intent.inventory import expected_found
from servers.a3_intent.planner import plan
from servers.common.server import own_config_routers
from substrate import Lab
from substrate.faults import Fault, draw_schedule, inject
from substrate.scenario import Scenario, build, load_manifest
from substrate.scenario.deploy import reset
from substrate.scenario.layers.ebgp_peering import nth48, PROVIDER_SPACE, pe_addr, router_addr
from substrate.scenario.observer import observe
from substrate.topology import Role
from tests.a3t_support import back_to_baseline, deployed, server
from tests.conftest import REPO
from tests.servers_support import connect, data

MANIFEST = REPO / "tests" / "data" / "small-ebgp.yaml"


@pytest.fixture(scope="module")
def sc() -> Scenario:
    return build(load_manifest(MANIFEST))


def test_the_external_router_is_outside_the_underlay_and_the_pe_runs_bgpd(sc: Scenario) -> None:
    (x,) = sc.ebgp_peerings
    xr, pe = sc.topology.node(x.router), sc.topology.node(x.pe)
    assert xr.role is Role.EXTERNAL and xr.node_id is None and xr.self_configured and "bgpd" in xr.frr_daemons
    assert "bgpd" in pe.frr_daemons and "isisd" in pe.frr_daemons
    assert not any(x.router in (lk.a.node, lk.b.node) for lk in sc.topology.core_links())
    assert not any(x.router in str(i.params) for i in sc.invariants if i.service == "underlay")
    assert {i.id.rsplit("/", 1)[1] for i in sc.invariants if i.service == "ebgp_peering/peer1"} == {"session", "received", "advertised"}
    # the peer announces more than the PE accepts: one own prefix not agreed, a default route, the tenant pool
    assert set(x.accept) < set(x.announced) and {"::/0", sc.pools.prefix6} <= set(x.announced)
    # a fault schedule's daemon crash on the external router kills the daemon it runs (bgpd)
    crashes = [f for f in draw_schedule(1, 1.0, 400, sc.topology, kinds=["daemon_crash"]) if f.target["node"] == x.router]
    assert crashes and {f.target["daemon"] for f in crashes} == {"bgpd"}


@pytest.mark.parametrize(("layer", "words"), [
    ("ebgp_peering: {link6: 'fd00::/64'}", "link6: fd00::/64 overlaps the loopback net fd00::/64"),
    ("ebgp_peering: {link6: 'fcbb:bb00:1::/64'}", "overlaps the SID block fcbb:bb00::/32"),
    ("ebgp_peering: {link6: '2001:db8:1000::/64'}", "overlaps 2001:db8:1000::/40"),
    ("ebgp_peering: {link6: 'fd5e::/64'}", "overlaps fd5e::2 (r"),  # the shared services' link
    ("shared_services: {prefix6: 'fd00:1:3::/64'}", "overlaps the base-host net fd00:1::/32"),
    # A3-T's lists hold 100 prefixes: a generated peering it could not modify is refused
    ("ebgp_peering: {peer_prefixes_per_density: 50}", "A3-T's lists hold at most 100"),
])
def test_a_manifest_whose_peering_does_not_fit_the_address_plan_is_refused(layer: str, words: str) -> None:
    """Each /64 a manifest gives a layer stays out of the address plan (a PE address on the
    loopback net, say, would make two interfaces answer for one address)."""
    from substrate.scenario.manifest import ManifestError, parse_manifest

    extra = "  - shared_services\n" if layer.startswith("ebgp") else ""
    text = f"name: m\ntopology: grid:2x2\ndensity: 3\nlayers:\n  - underlay\n  - addressing\n  - l3vpn\n{extra}  - {layer}\n"
    with pytest.raises(ManifestError) as e:
        build(parse_manifest(text))
    assert words in str(e.value), e.value


def test_the_levels_do_not_present_the_external_router_as_the_operators(sc: Scenario) -> None:
    """Another AS's router is no lab-own-configuration router in a level's instructions (which
    would say the lab was imported from Containerlab)."""
    assert own_config_routers(sc.topology) is None


@pytest.mark.parametrize(("spec", "path", "words"), [
    ({"accept": ["::/0"]}, "ops[0].spec.accept", "a default route"),
    ({"accept": ["fd10:0:1::/48"]}, "ops[0].spec.accept", "the tenant pool fd10::/32"),
    ({"advertise": ["2001:db8:1000::/48"]}, "ops[0].spec.advertise", "would announce 2001:db8:1000::/48"),
    # the provider's infrastructure: loopbacks, the peering link, the internal prefix (never advertised)
    ({"accept": ["fd00::/64"]}, "ops[0].spec.accept", "the loopback net fd00::/64"),
    ({"accept": ["2001:db8:fe00::/64"]}, "ops[0].spec.accept", "2001:db8:fe00::1 (r3)"),
    ({"advertise": ["2001:db8:2fff::/48"]}, "ops[0].spec.advertise", "would announce the provider's internal prefix 2001:db8:2fff::/48"),
    ({"advertise": ["2001:db8:1000::/40"]}, "ops[0].spec.advertise", "would announce 2001:db8:1000::/48"),
    # a default route advertised is blamed on advertise (not on every accepted prefix it covers)
    ({"advertise": ["::/0"]}, "ops[0].spec.advertise", "a default route"),
    # not global unicast, a zone index, an entry twice: refused by the schema, before any device is touched
    ({"advertise": ["ff0e::/16"]}, "ops[0].spec.advertise[0]", "multicast space"),
    ({"advertise": ["fe80::/64"]}, "ops[0].spec.advertise[0]", "link-local space"),
    ({"accept": ["::ffff:0:0/96"]}, "ops[0].spec.accept[0]", "IPv4-mapped space"),
    ({"accept": ["2001:db8:1000::%eth1/48"]}, "ops[0].spec.accept[0]", "zone index"),
    ({"accept": ["2001:db8:1000::/48", "2001:db8:1000::/48"]}, "ops[0].spec.accept", "listed twice"),
])
def test_a3t_refuses_a_hijack_or_a_leak(sc: Scenario, spec: dict[str, Any], path: str, words: str) -> None:
    with pytest.raises(ChangeSetRejected) as e:
        plan(sc, parse_ops([{"op": "modify", "service_class": "ebgp_peering", "id": "peer1", "spec": spec}]), expected_found(sc))
    assert words in str(e.value) and e.value.problems[0].path == path and len(e.value.problems) == 1, e.value.problems


def test_a3t_refuses_to_create_or_delete_a_peering(sc: Scenario) -> None:
    for op in ({"op": "delete", "service_class": "ebgp_peering", "id": "peer1"},
               {"op": "create", "service_class": "ebgp_peering", "spec": {"accept": [], "advertise": []}}):
        with pytest.raises(ChangeSetRejected) as e:
            plan(sc, parse_ops([op]), expected_found(sc))
        assert "cabled by the provider" in str(e.value)


@pytest.fixture(scope="module")
def bf(sc: Scenario) -> Iterator[tuple[Lab, Scenario]]:
    with deployed(sc, "t-ebgp") as lab:  # verifies every baseline invariant
        yield lab, sc


@pytest.fixture
def lab(bf: tuple[Lab, Scenario]) -> Iterator[Lab]:
    yield bf[0]
    back_to_baseline(bf[0])


def verdicts(lab: Lab, sc: Scenario) -> dict[str, bool]:
    return {v.id.rsplit("/", 1)[1]: v.ok for v in observe(lab, [i for i in sc.invariants if i.service.startswith("ebgp_peering/")])}


def vtysh(lab: Lab, node: str, *lines: str) -> None:
    r = lab.exec(node, ["vtysh", "-c", "configure terminal", *[a for ln in lines for a in ("-c", ln)]], timeout_s=20)
    assert r.ok and not r.stdout.strip(), r.stdout + r.stderr


def holds(lab: Lab, node: str, neighbor: str, prefix: str, present: bool = True) -> None:
    """Wait (bounded) until ``node`` holds (or no longer holds) ``prefix`` from ``neighbor``."""
    deadline = time.monotonic() + 30
    while True:
        r = lab.exec(node, ["vtysh", "-c", f"show bgp ipv6 unicast neighbors {neighbor} routes"], timeout_s=10)
        if (prefix in r.stdout) == present:
            return
        assert time.monotonic() < deadline, f"{node} {'never got' if present else 'still holds'} {prefix} from {neighbor}: {r.stdout}"
        time.sleep(0.2)


@pytest.mark.lab
def test_each_invariant_fails_when_broken_and_reset_repairs_it(lab: Lab, sc: Scenario) -> None:
    (x,) = sc.ebgp_peerings
    every = {"session": True, "received": True, "advertised": True}
    assert verdicts(lab, sc) == every
    # the PE's prefix-lists widened: the peer's default route leaks in, the internal prefix leaks out
    vtysh(lab, x.pe, "ipv6 prefix-list PEER1-IN seq 900 permit ::/0", f"ipv6 prefix-list PEER1-OUT seq 900 permit {x.internal[0]}")
    holds(lab, x.pe, router_addr(x), "::/0")
    holds(lab, x.router, pe_addr(x), x.internal[0])
    assert verdicts(lab, sc) == {"session": True, "received": False, "advertised": False}
    reset(lab)
    assert verdicts(lab, sc) == every

    # the neighbor shut down on the PE: no session, nothing exchanged
    vtysh(lab, x.pe, "router bgp 64500", f"neighbor {router_addr(x)} shutdown")
    holds(lab, x.pe, router_addr(x), x.accept[0], present=False)
    assert verdicts(lab, sc) == {"session": False, "received": False, "advertised": False}
    reset(lab)
    assert verdicts(lab, sc) == every

    # the external AS's bgpd crashes (the fault injector's daemon crash): not silent, and reset revives it
    inject(lab, Fault(id="f1", kind="daemon_crash", step=1, duration_steps=1, target={"node": x.router, "daemon": "bgpd"}))
    holds(lab, x.pe, router_addr(x), x.accept[0], present=False)  # the PE saw the session drop
    assert verdicts(lab, sc)["session"] is False
    rep = reset(lab)
    assert f"{x.router}:bgpd" in rep.restarted_daemons and rep.exact, rep
    assert verdicts(lab, sc) == every

    # the PE's bgpd crashes: restarted, it gets its route-maps and prefix-lists back too (zebra's and
    # isisd's copies of them filled vtysh's merged running configuration, so a reset that compared
    # only that configuration left bgpd without them: a session Established, nothing exchanged)
    inject(lab, Fault(id="f2", kind="daemon_crash", step=1, duration_steps=1, target={"node": x.pe, "daemon": "bgpd"}))
    holds(lab, x.router, pe_addr(x), x.advertise[0], present=False)
    rep = reset(lab)
    assert f"{x.pe}:bgpd" in rep.restarted_daemons and rep.exact, rep
    assert verdicts(lab, sc) == every


@pytest.mark.lab
@pytest.mark.anyio
async def test_a3t_accepts_and_advertises_one_more_prefix(lab: Lab, sc: Scenario) -> None:
    """The reference change of the class: accept the prefix the peer announces that is not agreed yet, advertise one more."""
    (x,) = sc.ebgp_peerings
    new_in = next(p for p in x.announced if p not in x.accept and p.startswith("2001:db8:1"))
    new_out = nth48(PROVIDER_SPACE, len(x.advertise))
    async with connect(server(lab)) as c:
        cat = data(await c.call_tool("list_service_classes", {}))
        assert "ebgp_peering" in [k["name"] for k in cat["classes"]]
        res: dict[str, Any] = data(await c.call_tool("apply_change_set", {"ops": [
            {"op": "modify", "service_class": "ebgp_peering", "id": "peer1",
             "spec": {"accept": [*x.accept, new_in], "advertise": [*x.advertise, new_out]}}]}))
        assert res["status"] == "applied", res
        assert "ebgp_peering/peer1" in res["validation"]["services"] and not res["validation"]["failed"], res
        holds(lab, x.pe, router_addr(x), new_in)
        holds(lab, x.router, pe_addr(x), new_out)
        detail = data(await c.call_tool("get_service", {"id": "peer1"}))
        assert detail["device_state"]["in_sync"] and x.pe in detail["devices"], detail["device_state"]


@pytest.mark.lab
@pytest.mark.anyio
async def test_a3t_refuses_leaking_the_internal_prefix_before_touching_the_pe(lab: Lab, sc: Scenario) -> None:
    """Advertising the provider's internal prefix was applied (the new 'advertised' invariant
    expected the leak, so validation passed); a duplicate entry was applied as a second
    prefix-list line, and a multicast prefix rolled back only after the BGP checks' wait."""
    (x,) = sc.ebgp_peerings
    async with connect(server(lab)) as c:
        for spec in ({"advertise": [*x.advertise, x.internal[0]]}, {"advertise": [*x.advertise, x.advertise[0]]},
                     {"advertise": [*x.advertise, "ff0e::/16"]}):  # fmt: skip
            r = await c.call_tool("apply_change_set", {"ops": [{"op": "modify", "service_class": "ebgp_peering", "id": "peer1", "spec": spec}]})
            res = r.structured_content or {}
            assert res.get("status") != "applied" and not res.get("devices"), (spec, res or r.content)
    holds(lab, x.router, pe_addr(x), x.internal[0], present=False)


@pytest.mark.lab
def test_reset_restores_each_daemons_own_configuration(lab: Lab, sc: Scenario) -> None:
    """Damage to one daemon that vtysh's merged view hides is restored too (an attack of issue 18:
    a prefix-list removed from the PE's bgpd alone survived a reset, which compared the merged
    view, where zebra's and isisd's copies still showed it; the next run inherited a PE that drops
    every route at the next route refresh). Each FRR daemon's own configuration is compared and
    restored: lines removed from one daemon (bgpd's prefix-list and route-map entry, zebra's
    prefix-list, an IS-IS interface line of isisd, a static route of staticd) and lines added to
    one (a wider prefix-list entry in bgpd alone, another interface description in zebra alone)."""
    from substrate.devstate import daemon_config_lines
    from substrate.scenario.deploy import load_baseline

    (x,) = sc.ebgp_peerings
    core_if = sorted(lk.endpoint_of(x.pe).interface for lk in sc.topology.core_links() if x.pe in (lk.a.node, lk.b.node))[0]
    damage = {
        "bgpd": ["no ipv6 prefix-list PEER1-IN", "no route-map PEER1-OUT permit 10", "ipv6 prefix-list PEER1-IN seq 900 permit ::/0"],
        "zebra": ["no ipv6 prefix-list PEER1-OUT", f"interface {core_if}", "description changed by an agent"],
        "isisd": [f"interface {core_if}", "no isis network point-to-point"],
        "staticd": [f"no ipv6 route {x.advertise[0]} blackhole"],
    }
    for daemon, lines in damage.items():
        answers = lab.vty(x.pe, daemon, "configure terminal", *lines, "end", timeout_s=10)
        assert all(status == 0 for _, status in answers), (daemon, answers)
    merged = lab.exec(x.pe, ["vtysh", "-c", "show running-config"], timeout_s=20).stdout
    # the merged view hides the removals from bgpd and zebra (the other daemons' copies show)
    assert "route-map PEER1-OUT permit 10" in merged and "ipv6 prefix-list PEER1-IN seq 5" in merged
    assert "ipv6 prefix-list PEER1-OUT seq 5" in merged, merged
    rep = reset(lab)
    assert rep.exact and [r.node for r in rep.restored] == [x.pe], (rep.summary(), rep.residual, [(r.node, r.actions) for r in rep.restored])
    want = load_baseline(lab)[x.pe].frr_daemons or {}
    have = lab.frr_daemon_configs(x.pe)
    assert sorted(have) == sorted(want)
    for d in want:
        assert daemon_config_lines(have[d]) == daemon_config_lines(want[d]), (d, have[d])
    # what the damage broke works again after a route refresh (bgpd filters with its own copies)
    assert lab.exec(x.pe, ["vtysh", "-c", "clear bgp ipv6 unicast * soft"], timeout_s=20).ok
    holds(lab, x.pe, router_addr(x), x.accept[0])
    holds(lab, x.router, pe_addr(x), x.advertise[0])
    assert verdicts(lab, sc) == {"session": True, "received": True, "advertised": True}
