"""Shared fixtures. Real-lab tests need root, FRR and namespaces (CI runs as root)."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def shared_data(*parts: str) -> Path:
    """A file of the third-party data kept beside the project (../shared/data), never copied in.

    Looked up in $ANIBENCH_SHARED_DATA, then ../shared/data next to the checkout, then
    /work/shared/data. Skips the test (saying why) if none exists.
    """
    candidates = [os.environ.get("ANIBENCH_SHARED_DATA"), REPO.parent / "shared" / "data", "/work/shared/data"]
    for c in candidates:
        if c and Path(c, *parts).exists():
            return Path(c, *parts)
    pytest.skip(f"shared data {'/'.join(parts)} not found (set ANIBENCH_SHARED_DATA)")


def unique_name(prefix: str) -> str:
    """A lab name that no other test (or parallel test run) uses."""
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


def _can_run_labs() -> str | None:
    if os.geteuid() != 0:
        return "real-lab tests need root"
    if not Path("/usr/lib/frr/zebra").exists():
        return "FRR is not installed (./install.sh)"
    return None


def pytest_report_header(config: pytest.Config) -> str | None:
    """The data-plane line (which SRv6 data plane the labs of this run use, and why)."""
    if _can_run_labs():
        return None
    from substrate.dataplane import select
    from substrate.errors import EnvironmentProblem

    try:
        return select().line()
    except EnvironmentProblem as e:
        return str(e)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    why = _can_run_labs()
    if why:
        for item in items:
            if "lab" in item.keywords:
                item.add_marker(pytest.mark.skip(reason=why))


@pytest.fixture(scope="session")
def line3() -> Iterator:
    """A shared line:3 lab (r1 - r2 - r3, hosts h1 and h3) for read-mostly tests."""
    from substrate import Lab, Topology

    with Lab.create(Topology.from_spec("line:3"), unique_name("t-line")) as lab:
        yield lab


@pytest.fixture(scope="session")
def grid3() -> Iterator:
    """A shared grid:3x3 lab for path tests (PEs on the perimeter, r5 in the middle)."""
    from substrate import Lab, Topology

    with Lab.create(Topology.from_spec("grid:3x3"), unique_name("t-grid")) as lab:
        yield lab


@pytest.fixture(scope="session")
def campaign_lab() -> Iterator:
    """The small brownfield of the harness tests (tests/data/small-campaign.yaml, seed 7), deployed
    once for every module that runs single runs on it (each run resets it to its baseline).
    Yields (lab, scenario)."""
    from substrate.scenario import build, load_manifest
    from substrate.scenario.deploy import deploy_scenario

    sc = build(load_manifest(REPO / "tests" / "data" / "small-campaign.yaml"), seed=7)
    with deploy_scenario(sc, unique_name("t-hv")) as lab:
        yield lab, sc


@pytest.fixture(scope="session")
def reference_lab() -> Iterator:
    """The reference brownfield (manifests/srv6-brownfield.yaml, seed 9, density 2: variant 2 of
    ``harness demo`` and ``harness task validate``), deployed once for the modules that need its
    size (25 routers, floating IPs, firewalls, steering). Yields (lab, scenario)."""
    from substrate.scenario import build, load_manifest
    from substrate.scenario.deploy import deploy_scenario

    sc = build(load_manifest(REPO / "manifests" / "srv6-brownfield.yaml"), seed=9, density=2)
    with deploy_scenario(sc, unique_name("t-ref")) as lab:
        yield lab, sc


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def reachable(lab, src: str, dst: str, within_s: int = 10) -> bool:  # noqa: ANN001
    """``src`` gets an echo reply from ``dst`` within ``within_s`` seconds (bounded poll).

    ``ping -c 1 -w N`` keeps probing every 0.2 s until one reply arrives or N seconds pass, so
    the neighbour discovery and route re-installation that follow a restore or a fresh bring-up
    are waited for, while a real break still fails (after the deadline).
    """
    r = lab.exec(src, ["ping", "-6", "-n", "-c", "1", "-i", "0.2", "-W", "1", "-w", str(within_s), dst],
                 timeout_s=within_s + 5)
    return r.ok
