"""Deploying a scenario on a lab, and resetting a lab to its scenario baseline.

Deploy: the topology (routers, CE and external hosts) comes up as a lab, every node's rendered
service state is applied in parallel, and every baseline invariant is checked by the observer.
A scenario whose invariants do not all pass is refused: the lab is destroyed and the error lists
what failed (draft section 6: "every pre-existing service passes its invariants before the run").
The scenario and the baseline device state of every node are kept in the lab's directory.

Reset: back to that baseline without redeploying. Faults are cleared, stopped processes resumed,
dead FRR daemons restarted, deleted links re-created, then every node whose state differs from
the baseline is restored (only what differs), and the underlay is left converged.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

from pydantic import BaseModel, Field

from substrate.devstate import DeviceState, RestoreReport, capture_many, restore
from substrate.errors import SubstrateError
from substrate.lab import Lab
from substrate.scenario.apply import apply_config
from substrate.scenario.model import Scenario
from substrate.scenario.observer import Verdict, observe

SCENARIO_FILE = "scenario.json"
BASELINE_FILE = "baseline.json"


class ScenarioInvalid(SubstrateError):
    """Baseline invariants failed on a freshly deployed scenario (the lab was destroyed)."""

    def __init__(self, failed: list[Verdict]):
        self.failed = failed
        lines = "; ".join(f"{v.id}: {v.detail}" for v in failed[:8])
        more = f" (and {len(failed) - 8} more)" if len(failed) > 8 else ""
        super().__init__(f"{len(failed)} baseline invariant(s) failed: {lines}{more}")


def load_scenario(lab: Lab) -> Scenario:
    """The scenario deployed on ``lab``.

    Raises:
        SubstrateError: the lab was not deployed from a scenario.
    """
    path = lab.dir / SCENARIO_FILE
    if not path.exists():
        raise SubstrateError(f"lab {lab.name} was not deployed from a scenario (harness lab up --scenario FILE)")
    return Scenario.model_validate_json(path.read_text())


def load_baseline(lab: Lab) -> dict[str, DeviceState]:
    """Baseline device state of every node of a scenario lab."""
    data = json.loads((lab.dir / BASELINE_FILE).read_text())
    return {k: DeviceState.model_validate(v) for k, v in data.items()}


def deploy_scenario(
    scenario: Scenario | str | Path,
    name: str,
    *,
    detached: bool = False,
    verify: bool = True,
    progress: Callable[[str], None] | None = None,
) -> Lab:
    """Deploy ``scenario`` (object or file) as lab ``name``; see module docstring.

    Raises:
        ScenarioInvalid: some baseline invariant failed (lab destroyed).
        SubstrateError and subclasses: as :meth:`Lab.create`.
    """
    sc = scenario if isinstance(scenario, Scenario) else Scenario.model_validate_json(Path(scenario).read_text())
    say = progress or (lambda _m: None)
    frr_extra = {n: cfg.frr for n, cfg in sc.node_config.items() if cfg.frr}
    lab = Lab.create(sc.topology, name, detached=detached, frr_extra=frr_extra, progress=say)
    try:
        t0 = time.monotonic()
        say(f"applying service state to {len(sc.node_config)} nodes")
        lab.map(lambda n: apply_config(lab, n, sc.node_config[n].model_copy(update={"frr": []})), sorted(sc.node_config))
        (lab.dir / SCENARIO_FILE).write_text(sc.to_json())
        lab.save_meta(scenario=sc.name, seed=sc.seed, density=sc.density, services_s=time.monotonic() - t0)
        if verify:
            say(f"checking {len(sc.invariants)} baseline invariants")
            verdicts = observe(lab, sc.invariants)
            failed = [v for v in verdicts if not v.ok]
            if failed:
                raise ScenarioInvalid(failed)
        say("recording the baseline")
        save_baseline(lab)
        return lab
    except BaseException:
        lab.destroy()
        raise


def save_baseline(lab: Lab) -> dict[str, DeviceState]:
    """Capture every node and store it as the lab's baseline."""
    states = capture_many(lab)
    (lab.dir / BASELINE_FILE).write_text(json.dumps({k: v.model_dump(mode="json") for k, v in states.items()}))
    return states


class ResetReport(BaseModel):
    """What :func:`reset` did."""

    seconds: float
    restored: list[RestoreReport] = Field(default_factory=list, description="Nodes that needed changes.")
    repaired_links: list[str] = Field(default_factory=list)
    restarted_daemons: list[str] = Field(default_factory=list)
    residual: dict[str, list[str]] = Field(default_factory=dict, description="Differences left (empty = exact).")

    @property
    def exact(self) -> bool:
        return not self.residual


def repair_links(lab: Lab, states: dict[str, DeviceState]) -> list[str]:
    """Re-create veth pairs of the topology whose end is missing in some node (deleted by an
    agent or a fault). Returns the links re-created, as ``a:if--b:if``."""
    from substrate.backends.netns import ip_batch

    repaired = []
    for lk in lab.topology.links:
        a, b = lk.a, lk.b
        if a.interface in states[a.node].links and b.interface in states[b.node].links:
            continue
        for ep in (a, b):  # delete the surviving end, then re-create the pair
            if ep.interface in states[ep.node].links:
                lab.exec(ep.node, ["ip", "link", "del", ep.interface])
        r = ip_batch([f"link add name {a.interface} netns {lab.state(a.node).netns} type veth "
                      f"peer name {b.interface} netns {lab.state(b.node).netns}"])
        if r.ok:
            repaired.append(f"{a}--{b}")
    return repaired


def reset(lab: Lab, *, converge_timeout_s: float = 60.0) -> ResetReport:
    """Put ``lab`` back to its scenario baseline (see module docstring).

    Raises:
        SubstrateError: the lab has no baseline, or a node is dead (redeploy).
    """
    from substrate.faults import clear_all

    t0 = time.monotonic()
    baseline = load_baseline(lab)
    clear_all(lab)
    lab.map(lambda n: lab.exec(n, ["kill", "-CONT", "-1"], timeout_s=5), lab.node_names())
    restarted = []
    for rt in lab.routers():
        for d in lab.state(rt).daemons:
            if lab.daemon_pid(rt, d) is None:
                lab.start_daemon(rt, d, load_config=False)
                restarted.append(f"{rt}:{d}")
    current = capture_many(lab)
    repaired = repair_links(lab, current)
    if repaired:
        current = capture_many(lab)
    changed = [n for n in lab.node_names() if not current[n].same_as(baseline[n])]
    reports = lab.map(lambda n: restore(lab, baseline[n], current[n]), changed)
    lab.wait_converged(timeout_s=converge_timeout_s)
    residual = {r.node: r.residual for r in reports if r.residual}
    return ResetReport(seconds=time.monotonic() - t0, restored=reports, repaired_links=repaired,
                       restarted_daemons=restarted, residual=residual)
