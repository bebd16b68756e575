"""Service class ``shared_services`` (issue 18): shared-service route leaking on a real lab.

The baseline's invariants hold (deploy verifies them); each kind of invariant fails when the
state it guards is broken on purpose and passes again after a lab reset; A3-T grants and
revokes a leak (the class's reference change) with active validation; the planner refuses a
leak whose prefixes would collide with another leaked tenant's in the services table."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from servers.a3_intent.catalog import ChangeSetRejected, parse_ops
from servers.a3_intent.inventory import expected_found
from servers.a3_intent.planner import plan
from substrate import Lab
from substrate.scenario import Scenario, build, load_manifest
from substrate.scenario.deploy import reset
from substrate.scenario.layers.l3vpn import ce_addr, segs
from substrate.scenario.observer import observe
from tests.a3t_support import back_to_baseline, deployed, server
from tests.conftest import REPO
from tests.servers_support import connect, data

MANIFEST = REPO / "tests" / "data" / "small-new-classes.yaml"


@pytest.fixture(scope="module")
def sc() -> Scenario:
    return build(load_manifest(MANIFEST))


def test_generation_leaks_only_tenants_whose_prefixes_do_not_collide(sc: Scenario) -> None:
    ss = sc.shared_services
    assert ss is not None and len(sc.route_leaks) == 2 and ss.host not in {c.ce for c in sc.spares}
    a, b = (sc.tenant(x.tenant) for x in sc.route_leaks)
    assert not {s.prefix6 for s in a.sites} & {s.prefix6 for s in b.sites}
    kinds = {i.id.split("/")[0] + "/" + i.id.split("/")[2 if i.id.startswith("route_leak") else 1]
             for i in sc.invariants if i.service.startswith(("route_leak", "shared_services"))}
    assert kinds == {"route_leak/reach", "shared_services/isolated", "shared_services/no_transit"}


def test_a_leak_colliding_with_another_leaked_tenant_is_refused(sc: Scenario) -> None:
    leaked = {x.tenant for x in sc.route_leaks}
    clash = next(t for t in sc.tenants if t.id not in leaked
                 and any(s.prefix6 == o.prefix6 for s in t.sites for lt in leaked for o in sc.tenant(lt).sites))
    with pytest.raises(ChangeSetRejected) as e:
        plan(sc, parse_ops([{"op": "create", "service_class": "route_leak", "spec": {"tenant": clash.id}}]), expected_found(sc))
    assert "also leaked to the shared services" in str(e.value) and e.value.problems[0].path == "ops[0].spec.tenant"


@pytest.fixture(scope="module")
def bf(sc: Scenario) -> Iterator[tuple[Lab, Scenario]]:
    with deployed(sc, "t-leak") as lab:  # verifies every baseline invariant
        yield lab, sc


@pytest.fixture
def lab(bf: tuple[Lab, Scenario]) -> Iterator[Lab]:
    yield bf[0]
    back_to_baseline(bf[0])


def verdicts(lab: Lab, sc: Scenario, prefix: str) -> dict[str, bool]:
    return {v.id: v.ok for v in observe(lab, [i for i in sc.invariants if i.id.startswith(prefix)])}


def sh(lab: Lab, node: str, cmd: str) -> None:
    r = lab.sh(node, cmd, timeout_s=20)
    assert r.ok, r.stderr


@pytest.mark.lab
def test_each_invariant_fails_when_broken_and_reset_repairs_it(lab: Lab, sc: Scenario) -> None:
    ss = sc.shared_services
    assert ss is not None
    leak = sc.route_leaks[0]
    t = sc.tenant(leak.tenant)
    probe = t.sites[0]
    reach_id = f"route_leak/{leak.id}/reach/{probe.id}"
    assert verdicts(lab, sc, reach_id) == {reach_id: True}
    # the leak policy withdrawn on the probe site's PE: the tenant loses the shared services
    sh(lab, probe.pe, f"ip -6 route del {ss.prefix6} table {t.table}")
    assert verdicts(lab, sc, reach_id) == {reach_id: False}
    reset(lab)
    assert verdicts(lab, sc, reach_id) == {reach_id: True}

    # a tenant without a leak given one by hand, one way (its table routes to the services, the
    # services table has no way back): the probes arrive at the shared host, no reply returns
    iso = next(i for i in sc.invariants if i.id.startswith("shared_services/isolated/"))
    other = sc.tenant(iso.id.rsplit("/", 1)[1])
    src = other.sites[0]
    via_ss = segs(sc, ss.pe, ss.dt6_function)
    forward = (f"ip -6 route replace {ss.prefix6} table {other.table} dev {ss.pe_if}" if src.pe == ss.pe else
               f"ip -6 route replace {ss.prefix6} table {other.table} encap seg6 mode encap.red segs {via_ss} dev sr0")
    sh(lab, src.pe, forward)
    (v,) = observe(lab, [iso])
    assert not v.ok and "probes arrived, 0 replies" in v.detail and " 0 probes arrived" not in v.detail, v.detail
    reset(lab)
    # both directions: isolation fails
    if src.pe == ss.pe:
        sh(lab, src.pe, f"ip -6 route replace {ss.prefix6} table {other.table} dev {ss.pe_if}")
        sh(lab, ss.pe, f"ip -6 route replace {src.prefix6} table {ss.table} dev {src.pe_if}")
    else:
        sh(lab, src.pe, f"ip -6 route replace {ss.prefix6} table {other.table} encap seg6 mode encap.red segs {via_ss} dev sr0")
        back = segs(sc, src.pe, other.dt6_functions[src.pe])
        sh(lab, ss.pe, f"ip -6 route replace {src.prefix6} table {ss.table} encap seg6 mode encap.red segs {back} dev sr0")
    assert verdicts(lab, sc, iso.id) == {iso.id: False}
    reset(lab)
    assert verdicts(lab, sc, iso.id) == {iso.id: True}

    # a careless leak between the two leaked tenants (each table routes the other's probe prefix
    # into the services table): no-transit fails
    nt = next(i for i in sc.invariants if i.id.startswith("shared_services/no_transit/"))
    a, b = (sc.tenant(x.tenant) for x in sc.route_leaks)
    for x, y in ((a, b), (b, a)):
        sh(lab, x.sites[0].pe, f"ip -6 route replace {y.sites[0].prefix6} table {x.table} encap seg6 mode encap.red "
                               f"segs {via_ss} dev sr0")
    assert verdicts(lab, sc, nt.id) == {nt.id: False}
    reset(lab)
    assert verdicts(lab, sc, nt.id) == {nt.id: True}


@pytest.mark.lab
@pytest.mark.anyio
async def test_a3t_grants_and_revokes_a_leak(lab: Lab, sc: Scenario) -> None:
    """The reference change of the class: a leak for a tenant without one, through A3-T, then its removal."""
    ss = sc.shared_services
    assert ss is not None
    leaked = {x.tenant for x in sc.route_leaks}
    fits = [t for t in sc.tenants if t.id not in leaked and t.sites
            and not any(s.prefix6 == o.prefix6 for s in t.sites for lt in leaked for o in sc.tenant(lt).sites)]
    if not fits:
        pytest.skip("every tenant without a leak collides with a leaked one in this scenario")
    t = fits[0]
    async with connect(server(lab)) as c:
        cat = data(await c.call_tool("list_service_classes", {}))
        assert "route_leak" in [k["name"] for k in cat["classes"]]
        res: dict[str, Any] = data(await c.call_tool("apply_change_set", {"ops": [
            {"op": "create", "service_class": "route_leak", "id": "leak9", "spec": {"tenant": t.id}}]}))
        assert res["status"] == "applied", res
        assert "route_leak/leak9" in res["validation"]["services"] and not res["validation"]["failed"]
        r = lab.exec(t.sites[0].ce, ["ping", "-6", "-c", "2", "-W", "2", ce_addr(ss.prefix6, 2)], timeout_s=15)
        assert r.ok, r.stdout
        detail = data(await c.call_tool("get_service", {"id": "leak9"}))
        assert detail["device_state"]["in_sync"] and ss.pe in detail["devices"]
        res = data(await c.call_tool("apply_change_set", {"ops": [{"op": "delete", "service_class": "route_leak", "id": "leak9"}]}))
        assert res["status"] == "applied", res
        r = lab.exec(t.sites[0].ce, ["ping", "-6", "-c", "2", "-W", "1", ce_addr(ss.prefix6, 2)], timeout_s=15)
        assert not r.ok
