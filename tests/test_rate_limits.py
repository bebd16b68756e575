"""Service class ``rate_limits`` (issue 18): per-tenant shapers on attachment circuits, on a real lab.

The baseline's rate probes hold (deploy verifies them); the held-rate check fails when the
shaper is removed, the shaper check when it is removed or its rate halved and the unaffected check fails when the neighbour's circuit is shaped too, and
both pass again after a lab reset (which re-creates the shaper); A3-T changes a limit's rate and
removes a limit (the class's reference change) with active validation, and undoes a change whose
validation fails."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from servers.a3_intent.catalog import ChangeSetRejected, parse_ops
from servers.a3_intent.inventory import expected_found
from servers.a3_intent.planner import plan
from substrate import Lab
from substrate.scenario import Scenario, build, load_manifest
from substrate.scenario.apply import TBF_OPTIONS, qdisc_command, qdisc_value
from substrate.scenario.deploy import reset
from substrate.scenario.observer import observe
from tests.a3t_support import back_to_baseline, deployed, server
from tests.conftest import REPO
from tests.servers_support import connect, data

MANIFEST = REPO / "tests" / "data" / "small-new-classes.yaml"


@pytest.fixture(scope="module")
def sc() -> Scenario:
    return build(load_manifest(MANIFEST))


def test_limits_render_a_shaper_per_circuit_and_a3t_checks_their_rules(sc: Scenario) -> None:
    x = sc.rate_limits[0]
    s = sc.site(x.site)
    assert sc.node_config[s.pe].qdiscs == {s.pe_if: qdisc_value("tbf", x.rate_mbit * 1_000_000)}
    assert qdisc_command(s.pe_if, "tbf rate 5bit") == f"tc qdisc replace dev {s.pe_if} root handle 1: tbf rate 5bit {TBF_OPTIONS}"
    p = plan(sc, parse_ops([{"op": "modify", "service_class": "rate_limit", "id": x.id, "spec": {"rate_mbit": 7}}]), expected_found(sc))
    assert p.deltas[s.pe].qdiscs == {s.pe_if: "tbf rate 7000000bit"} and f"rate_limit/{x.id}" in p.changed_services
    with pytest.raises(ChangeSetRejected) as e:
        plan(sc, parse_ops([{"op": "create", "service_class": "rate_limit", "spec": {"site": x.site, "rate_mbit": 5}}]), expected_found(sc))
    assert f"site {x.site} already has rate limit {x.id}" in str(e.value)
    with pytest.raises(ChangeSetRejected) as e:
        plan(sc, parse_ops([{"op": "delete", "service_class": "tenant_site", "id": x.site}]), expected_found(sc))
    assert f"rate_limit {x.id} shapes site {x.site}, which would not exist" in str(e.value)


@pytest.fixture(scope="module")
def bf(sc: Scenario) -> Iterator[tuple[Lab, Scenario]]:
    with deployed(sc, "t-rate") as lab:  # verifies every baseline invariant
        yield lab, sc


@pytest.fixture
def lab(bf: tuple[Lab, Scenario]) -> Iterator[Lab]:
    yield bf[0]
    back_to_baseline(bf[0])


def verdict(lab: Lab, sc: Scenario, iid: str) -> tuple[bool, str]:
    (v,) = observe(lab, [i for i in sc.invariants if i.id == iid])
    return v.ok, v.detail


def sh(lab: Lab, node: str, cmd: str) -> None:
    r = lab.sh(node, cmd, timeout_s=20)
    assert r.ok, r.stderr


@pytest.mark.lab
def test_each_invariant_fails_when_broken_and_reset_repairs_it(lab: Lab, sc: Scenario) -> None:
    x = next(x for x in sc.rate_limits if any(i.id.startswith(f"rate_limit/{x.id}/unaffected/") for i in sc.invariants))
    s = sc.site(x.site)
    held = next(i.id for i in sc.invariants if i.id.startswith(f"rate_limit/{x.id}/held/"))
    unaffected = next(i for i in sc.invariants if i.id.startswith(f"rate_limit/{x.id}/unaffected/"))
    shaper = f"rate_limit/{x.id}/shaper"
    ok, detail = verdict(lab, sc, held)
    assert ok, detail
    assert verdict(lab, sc, shaper)[0]
    # the shaper removed: the circuit runs at line rate
    sh(lab, s.pe, f"tc qdisc del dev {s.pe_if} root")
    ok, detail = verdict(lab, sc, held)
    assert not ok and "Mbit/s" in detail, detail
    ok, detail = verdict(lab, sc, shaper)
    assert not ok and "noqueue" in detail, detail
    # the limit halved: within the probe's tolerance for a loaded machine, not the device state's
    sh(lab, s.pe, qdisc_command(s.pe_if, qdisc_value("tbf", x.rate_mbit * 500_000)))
    ok, detail = verdict(lab, sc, shaper)
    assert not ok and f"tbf rate {x.rate_mbit * 500_000}bit (expected tbf rate {x.rate_mbit * 1_000_000}bit)" in detail, detail
    rep = reset(lab)
    assert rep.exact, rep.residual
    ok, detail = verdict(lab, sc, held)
    assert ok, detail
    assert verdict(lab, sc, shaper)[0]

    # the neighbour's circuit (another tenant, same PE) shaped to the limit too
    ok, detail = verdict(lab, sc, unaffected.id)
    assert ok, detail
    other = next(o for o in sc.all_sites() if o.ce == unaffected.params["dst_node"])
    sh(lab, s.pe, qdisc_command(other.pe_if, qdisc_value("tbf", x.rate_mbit * 1_000_000)))
    ok, detail = verdict(lab, sc, unaffected.id)
    assert not ok, detail
    rep = reset(lab)
    assert rep.exact, rep.residual
    ok, detail = verdict(lab, sc, unaffected.id)
    assert ok, detail


@pytest.mark.lab
@pytest.mark.anyio
async def test_a3t_changes_and_removes_a_limit(lab: Lab, sc: Scenario) -> None:
    """The reference change of the class: a limit's rate changed, then the limit removed, through A3-T
    (after a shaper removed outside A3-T shows as drift of the limit)."""
    x = sc.rate_limits[0]
    s = sc.site(x.site)
    new_rate = 20 if x.rate_mbit != 20 else 10
    async with connect(server(lab)) as c:
        detail = data(await c.call_tool("get_service", {"id": x.id}))
        assert detail["devices"] == [s.pe] and detail["device_state"]["in_sync"], detail
        sh(lab, s.pe, f"tc qdisc del dev {s.pe_if} root")  # removed outside A3-T: the drift shows
        detail = data(await c.call_tool("get_service", {"id": x.id}))
        assert not detail["device_state"]["in_sync"], detail
        assert any("qdisc missing" in ln for ln in detail["device_state"]["differences"][s.pe]), detail
        res: dict[str, Any] = data(await c.call_tool("apply_change_set", {"ops": [
            {"op": "modify", "service_class": "rate_limit", "id": x.id, "spec": {"rate_mbit": new_rate}}]}))
        assert res["status"] == "applied", res
        assert f"rate_limit/{x.id}" in res["validation"]["services"] and not res["validation"]["failed"]
        shown = lab.exec(s.pe, ["tc", "-j", "qdisc", "show", "dev", s.pe_if]).stdout
        assert f'"rate":{new_rate * 125000}' in shown, shown
        res = data(await c.call_tool("apply_change_set", {"ops": [{"op": "delete", "service_class": "rate_limit", "id": x.id}]}))
        assert res["status"] == "applied", res
        assert '"tbf"' not in lab.exec(s.pe, ["tc", "-j", "qdisc", "show", "dev", s.pe_if]).stdout
