"""Fixtures and helpers shared by the A3-T lab tests (not a test module): the small brownfield
lab (module scope, put back at its baseline after each test), an in-process A3-T server, and a
hook on the engine's active validation."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from servers.a3_intent import transaction as txn_mod
from servers.a3_intent.server import build_server
from servers.common import ServerConfig
from substrate import Lab
from substrate.devstate import DeviceState, capture
from substrate.scenario import Scenario, build, load_manifest
from substrate.scenario.deploy import deploy_scenario, reset
from tests.conftest import REPO, unique_name

SMALL = REPO / "tests" / "data" / "small-brownfield.yaml"


@contextlib.contextmanager
def deployed(sc: Scenario, prefix: str) -> Iterator[Lab]:
    """``sc`` deployed as a lab of a unique name (every baseline invariant verified), destroyed after."""
    lab = deploy_scenario(sc, unique_name(prefix))
    try:
        yield lab
    finally:
        lab.destroy()


def back_to_baseline(lab: Lab) -> None:
    """Reset ``lab`` and check that every node is at its baseline again."""
    rep = reset(lab)
    assert rep.exact, rep.residual


@pytest.fixture(scope="module")
def bf() -> Iterator[tuple[Lab, Scenario]]:
    """The small brownfield (3x3 grid, the six original layers, 91 invariants), deployed for the module."""
    sc = build(load_manifest(SMALL))
    with deployed(sc, "t-a3t") as lab:
        yield lab, sc


@pytest.fixture
def lab(bf: tuple[Lab, Scenario]) -> Iterator[Lab]:
    """The module's lab, put back at its baseline after each test (and checked to be there)."""
    lab_, _ = bf
    yield lab_
    back_to_baseline(lab_)


@pytest.fixture
def sc(bf: tuple[Lab, Scenario]) -> Scenario:
    return bf[1]


#: Deadlines of the servers in tests: generous, so that a loaded machine (tests run beside other
#: labs) is not mistaken for a frozen device; tests about frozen devices set their own.
SLOW_MACHINE = {"capture_timeout_s": 30.0, "device_timeout_s": 60.0}


def server(lab: Lab, tmp_path: Path | None = None, **kw: Any):  # noqa: ANN201
    """The A3-T server over ``lab``; every node (CEs included) is a device unless ``devices`` says otherwise."""
    traj = tmp_path / "trajectory.jsonl" if tmp_path is not None else None
    kw.setdefault("devices", "all")
    kw["options"] = {**SLOW_MACHINE, **kw.get("options", {})}
    return build_server(ServerConfig(lab=lab.name, trajectory=traj, **kw), lab=lab)


def on_validation(monkeypatch: pytest.MonkeyPatch, act: Callable[[], Any]) -> None:
    """Run ``act()`` when active validation starts: the engine's second observation (the first is
    the pre-check, before any device is touched)."""
    real = txn_mod.observe
    calls: list[int] = []

    def hooked(lab_: Lab, invs: Any, **kw: Any) -> Any:
        calls.append(1)
        if len(calls) == 2:
            act()
        return real(lab_, invs, **kw)

    monkeypatch.setattr(txn_mod, "observe", hooked)


def damage_other_tenant(monkeypatch: pytest.MonkeyPatch, sc: Scenario, new_site: str = "t3s3") -> str:
    """Make the planner's rendering (deliberately) wrong: once the inventory has ``new_site``, it
    drops the tenant route of t1's second site on its PE. Returns the id of t1's invariant that
    active validation then finds broken."""
    from servers.a3_intent import planner as planner_mod

    t1 = sc.tenant("t1")
    victim = t1.sites[1]
    bad_route = f"{victim.prefix6} table {t1.table} metric 1024 dev {victim.pe_if}"
    real = planner_mod.render_scenario

    def buggy(s: Scenario):  # noqa: ANN202
        out = real(s)
        if any(x.id == new_site for x in s.all_sites()):
            out[victim.pe].routes6 = [r for r in out[victim.pe].routes6 if r != bad_route]
        return out

    monkeypatch.setattr(planner_mod, "render_scenario", buggy)
    return f"l3vpn/t1/reach/{t1.sites[0].id}->{victim.id}/6"


def everything(lab: Lab) -> dict[str, DeviceState]:
    """Every node's full state (kernel and FRR), with a deadline fit for a loaded machine."""
    names = lab.node_names()
    return dict(zip(names, lab.map(lambda n: capture(lab, n, timeout_s=90.0), names), strict=True))
