"""Campaigns (draft sections 4.2-4.5, 7): one controlled factor varied, the others fixed; every
task variant -- request, scenario seed, fault seed -- replayed across the factor's settings
(paired runs, common random numbers); results stored durably after each run; resumable.

Order: variant-major. For each variant a fresh brownfield is generated from its own scenario
seed and deployed once; each setting's run starts from a reset of that lab to the baseline, so
every setting meets the same network, the same request and the same faults at the same steps.
A crash or Ctrl-C leaves the store consistent: completed runs are kept, the interrupted one is
redone on ``--resume`` (never duplicated), and the lab is destroyed.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field

from harness.errors import AnibenchError
from harness.run import RunFailed, RunSpec, execute_run
from harness.store import CampaignStore, RunRecord, RunStatus, run_key
from harness.tasks import TASK_CLASSES, make_variant

Factor = Literal["ani", "agent", "model"]
DEFAULT_DB = Path("results/anibench.sqlite")


class CampaignSpec(BaseModel):
    """Everything that defines a campaign (stored with it; a resume must match it exactly)."""

    campaign_id: str
    factor: Factor = Field(description="The controlled factor: the one option given several values.")
    ani: list[str]
    agent: list[str]
    model: list[str | None]
    task: str
    variants: int = Field(ge=1)
    manifest: str
    manifest_digest: str
    seed: int = Field(description="Scenario seed of variant 0; variant v uses seed + v.")
    density: int = Field(ge=1)
    fault_rate: float = Field(ge=0, le=1, description="Faults per agent step (lambda).")
    budget_steps: int = Field(ge=1)
    wall_cap_s: float = Field(gt=0)
    agent_options: dict[str, str] = Field(default_factory=dict)

    @property
    def settings(self) -> list[str]:
        return {"ani": self.ani, "agent": self.agent, "model": [m or "-" for m in self.model]}[self.factor]

    def setting_values(self, setting: str) -> tuple[str, str, str | None]:
        """(level, agent, model) of one setting."""
        level = setting if self.factor == "ani" else self.ani[0]
        agent = setting if self.factor == "agent" else self.agent[0]
        model = setting if self.factor == "model" else self.model[0]
        return level, agent, model


def parse_levels(values: list[str]) -> list[str]:
    """The ANI levels named by ``--ani`` (already split on commas), canonical and in order.

    Shared by ``harness campaign`` and ``harness task validate`` so both refuse the same input.

    Raises:
        AnibenchError: no level, an unknown level (naming the registered ones), or a level twice.
    """
    from servers.registry import normalize_level

    if not values:
        raise AnibenchError("--ani needs at least one value")
    try:
        levels = [normalize_level(a) for a in values]
    except KeyError as e:
        raise AnibenchError(str(e.args[0])) from None
    if len(set(levels)) != len(levels):
        raise AnibenchError("--ani lists a value twice")
    return levels


def make_spec(*, ani: list[str], agent: list[str], model: list[str | None], task: str, variants: int, manifest: str,
              seed: int, density: int, fault_rate: float, budget_steps: int, wall_cap_s: float,
              agent_options: dict[str, str], campaign_id: str | None = None) -> CampaignSpec:
    """Validate the options of a campaign and name its controlled factor.

    Raises:
        AnibenchError: unknown task class, level or agent; more than one factor varied; bad
            manifest.
    """
    from harness.agents.base import AGENTS
    from substrate.scenario import load_manifest

    if task not in TASK_CLASSES:
        raise AnibenchError(f"unknown task class {task!r}; known: {', '.join(TASK_CLASSES)}")
    for name, vals in (("ani", ani), ("agent", agent), ("model", model)):
        if not vals:
            raise AnibenchError(f"--{name} needs at least one value")
    if any(model) and set(agent) <= {"scripted", "noisy"}:
        raise AnibenchError("--model is for model-driven agents (openai, command); the scripted and noisy agents use none")
    if wall_cap_s <= 0 or seed < 0 or variants < 1 or budget_steps < 1 or density < 1 or not 0 <= fault_rate <= 1:
        raise AnibenchError("out of range: --wall-cap > 0, --seed >= 0, --variants >= 1, --budget-steps >= 1, "
                            "--density >= 1, 0 <= --faults <= 1")
    ani = parse_levels(ani)
    for a in agent:
        if a not in AGENTS:
            raise AnibenchError(f"unknown agent {a!r}; available: {', '.join(AGENTS)}")
    varied = [name for name, vals in (("ani", ani), ("agent", agent), ("model", model)) if len(vals) > 1]
    if len(varied) > 1:
        raise AnibenchError(f"a campaign varies one controlled factor at a time; {' and '.join(varied)} both have several values")
    for name, vals in (("ani", ani), ("agent", agent), ("model", model)):
        if len(set(vals)) != len(vals):
            raise AnibenchError(f"--{name} lists a value twice")
    m = load_manifest(manifest)
    factor: Factor = varied[0] if varied else "ani"  # type: ignore[assignment]
    spec = CampaignSpec(campaign_id="", factor=factor, ani=ani, agent=agent, model=model, task=task, variants=variants,
                        manifest=str(Path(manifest).resolve()), manifest_digest=m.digest(), seed=seed, density=density,
                        fault_rate=fault_rate, budget_steps=budget_steps, wall_cap_s=wall_cap_s,
                        agent_options=agent_options)
    if campaign_id is None:
        digest = hashlib.sha256(spec.model_dump_json(exclude={"campaign_id"}).encode()).hexdigest()[:8]
        campaign_id = f"{task}-{'-'.join(spec.settings)}-{digest}".replace("/", "_")
    spec.campaign_id = campaign_id
    return spec


def _failed(spec: CampaignSpec, key: str, setting: str, variant: int, error: str) -> RunRecord:
    level, agent, model = spec.setting_values(setting)
    now = datetime.now(UTC)
    return RunRecord(campaign_id=spec.campaign_id, run_key=key, factor=spec.factor, setting=setting, task_class=spec.task,
                     variant=variant, scenario_seed=spec.seed + variant, fault_seed=spec.seed * 1000 + variant,
                     density=spec.density, fault_rate=spec.fault_rate, budget_steps=spec.budget_steps, agent=agent,
                     model=model, status=RunStatus.failed, error=error[:2000], started_at=now, finished_at=now)


def run_campaign(
    spec: CampaignSpec,
    store: CampaignStore,
    *,
    results_dir: Path,
    resume: bool = False,
    on_run: Callable[[str, RunRecord | None], None] | None = None,
    on_stage: Callable[[str], None] | None = None,
) -> list[RunRecord]:
    """Run every pending run of ``spec``; returns the records of the runs done now.

    Args:
        spec: the campaign.
        store: the results store (durable after each run).
        results_dir: where each run's files go (trajectory, verdicts, request files).
        resume: continue a campaign that exists in the store (its spec must match).
        on_run: called with (run key, record) after each run, and (run key, None) before it.
        on_stage: called with a short message when a variant's lab is built.

    Raises:
        AnibenchError: the campaign exists and ``resume`` is false, or its stored spec differs.
        KeyboardInterrupt / substrate.signals.Terminated: after destroying the lab; the store
            stays consistent and the campaign can be resumed.
    """
    from substrate.scenario import build, load_manifest
    from substrate.scenario.deploy import deploy_scenario
    from substrate.signals import terminate_gracefully

    data = spec.model_dump(mode="json")
    if spec.campaign_id in store.campaigns():
        if not resume:
            raise AnibenchError(f"campaign {spec.campaign_id!r} exists in the store: add --resume to continue it")
    store.create_campaign(spec.campaign_id, data)
    store.recover(spec.campaign_id)
    keys = {(s, v): run_key(spec.campaign_id, s, v) for v in range(spec.variants) for s in spec.settings}
    store.plan(spec.campaign_id, list(keys.values()))
    pending = set(store.pending_runs(spec.campaign_id))
    manifest = load_manifest(spec.manifest)
    done: list[RunRecord] = []
    say = on_stage or (lambda _m: None)
    lab_name = f"camp-{os.getpid() % 100000}"
    with terminate_gracefully():
        for v in range(spec.variants):
            todo = [(s, keys[(s, v)]) for s in spec.settings if keys[(s, v)] in pending]
            if not todo:
                continue
            sc = build(manifest, seed=spec.seed + v, density=spec.density)
            try:
                variant = make_variant(spec.task, sc, v, fault_seed=spec.seed * 1000 + v)
            except AnibenchError as e:
                for s, k in todo:
                    store.mark_running(k)
                    rec = _failed(spec, k, s, v, f"task variant could not be made: {e}")
                    store.save_result(rec)
                    done.append(rec)
                    if on_run:
                        on_run(k, rec)
                continue
            say(f"variant {v}: deploying scenario seed {sc.seed} ({len(sc.topology.nodes)} nodes)")
            with deploy_scenario(sc, lab_name) as lab:
                for s, k in todo:
                    level, agent, model = spec.setting_values(s)
                    opts = dict(spec.agent_options)
                    if model:
                        opts["model"] = model
                    run_spec = RunSpec(
                        campaign_id=spec.campaign_id, run_key=k, factor=spec.factor, setting=s, level=level,
                        agent=agent, agent_options=opts, model=model, density=spec.density, fault_rate=spec.fault_rate,
                        budget_steps=spec.budget_steps, wall_cap_s=spec.wall_cap_s,
                        run_dir=results_dir / spec.campaign_id / s / f"v{v}",
                    )
                    store.mark_running(k)
                    if on_run:
                        on_run(k, None)
                    try:
                        rec, _verdicts = execute_run(lab, run_spec, variant)
                    except RunFailed as e:
                        rec = _failed(spec, k, s, v, str(e))
                    store.save_result(rec)
                    done.append(rec)
                    if on_run:
                        on_run(k, rec)
    return done


def summary_line(rec: RunRecord) -> str:
    """One line per finished run, for progress output."""
    if rec.status is RunStatus.failed:
        return f"{rec.setting} v{rec.variant}: FAILED ({(rec.error or '')[:120]})"
    return (f"{rec.setting} v{rec.variant}: {rec.outcome_label.value if rec.outcome_label else '?'}, "
            f"{rec.test_cases_passed}/{rec.test_cases_total} tests, {len(rec.violated_invariants)} violated, "
            f"{rec.steps} steps, {rec.wall_s:.1f} s")


def spec_json(spec: CampaignSpec) -> str:
    return json.dumps(spec.model_dump(mode="json"), indent=1, sort_keys=True)
