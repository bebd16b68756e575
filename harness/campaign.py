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
import random
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal, NamedTuple

from pydantic import BaseModel, Field, model_serializer

from harness.ablations import parse_ani_setting, parse_ani_settings
from harness.errors import AnibenchError
from harness.run import RunFailed, RunSpec, execute_run
from harness.store import CampaignStore, RunRecord, RunStatus, run_key
from harness.tasks import TASK_CLASSES, make_variant

Factor = Literal["ani", "agent", "model", "mode"]
DEFAULT_DB = Path("results/anibench.sqlite")
#: Fields added after campaigns were first stored, with the value that means "not used": a spec
#: leaves such a field out of its stored form and of its id's digest while it holds that value, so
#: a campaign started before the field existed keeps its id, its run keys and its stored spec, and
#: ``--resume`` still finds it.
_LATER_FIELDS: dict[str, Any] = {"mode": [None], "budget_tokens": None, "dataplane": "kernel"}


class Setting(NamedTuple):
    """What one setting of the controlled factor fixes (the other factors at their single value)."""

    level: str
    ablations: tuple[str, ...]
    agent: str
    model: str | None
    mode: str | None


class CampaignSpec(BaseModel):
    """Everything that defines a campaign (stored with it; a resume must match it exactly)."""

    campaign_id: str
    factor: Factor = Field(description="The controlled factor: the one option given several values.")
    ani: list[str] = Field(description="ANI settings: a level, optionally with ablations (A1+blocklist).")
    agent: list[str]
    model: list[str | None]
    mode: list[str | None] = Field(default_factory=lambda: [None],
                                   description="Agent modes of the model-driven agent (None: its default, react).")
    task: str
    variants: int = Field(ge=1)
    manifest: str
    manifest_digest: str
    seed: int = Field(description="Scenario seed of variant 0; variant v uses seed + v.")
    density: int = Field(ge=1)
    fault_rate: float = Field(ge=0, le=1, description="Faults per agent step (lambda).")
    budget_steps: int = Field(ge=1)
    budget_tokens: int | None = Field(default=None, ge=1,
                                      description="Tokens per run, enforced by the agent adapter (None: no budget).")
    wall_cap_s: float = Field(gt=0)
    agent_options: dict[str, str] = Field(default_factory=dict)
    dataplane: Literal["kernel", "ebpf"] = Field(
        default="kernel", description="The SRv6 data plane of every lab of the campaign (substrate.dataplane): runs "
                                      "are never paired across data planes.")  # fmt: skip

    @model_serializer(mode="wrap")
    def _drop_unused_later_fields(self, handler: Any) -> dict[str, Any]:
        data: dict[str, Any] = handler(self)
        for name, unused in _LATER_FIELDS.items():
            if name in data and data[name] == unused:
                del data[name]
        return data

    def values(self, factor: str) -> list[str | None]:
        """The values given for one factor (several for the controlled factor, one otherwise)."""
        return list(getattr(self, factor))

    @property
    def settings(self) -> list[str]:
        """The settings of the controlled factor, as written in run keys and reports."""
        return [v or "-" for v in self.values(self.factor)]

    def setting_values(self, setting: str) -> Setting:
        """What ``setting`` (a value of the controlled factor) fixes."""
        def value(f: str) -> str | None:
            if f == self.factor:
                return None if setting == "-" else setting
            return self.values(f)[0]

        ani = parse_ani_setting(value("ani") or "")
        return Setting(ani.level, ani.ablations, value("agent") or "", value("model"), value("mode"))


def parse_levels(values: list[str]) -> list[str]:
    """The ANI settings named by ``--ani`` (already split on commas), canonical and in order: a
    level, or a level with ablations (``A1+blocklist``, :mod:`harness.ablations`).

    Shared by ``harness campaign`` and ``harness task validate`` so both refuse the same input.

    Raises:
        AnibenchError: no value, an unknown level (naming the registered ones) or ablation, an
            ablation the level lacks, or a value twice.
    """
    return [str(s) for s in parse_ani_settings(values)]


def _local_dataplane() -> str:
    """The data plane a lab deployed by this process runs on (``kernel`` where none can be told:
    not root, or none usable)."""
    from substrate.dataplane import select
    from substrate.errors import SubstrateError

    try:
        return select().dataplane or "kernel"
    except SubstrateError:
        return "kernel"


def make_spec(*, ani: list[str], agent: list[str], model: list[str | None], task: str, variants: int, manifest: str,
              seed: int, density: int, fault_rate: float, budget_steps: int, wall_cap_s: float,
              agent_options: dict[str, str], campaign_id: str | None = None, mode: list[str | None] | None = None,
              budget_tokens: int | None = None, dataplane: str | None = None) -> CampaignSpec:
    """Validate the options of a campaign and name its controlled factor.

    Args:
        mode: agent modes (``single-turn``, ``react``, ``planner-executor``, each optionally
            ``-norecovery``; :mod:`harness.agents.modes`); only for the ``openai`` agent.
        budget_tokens: tokens per run (prompt + completion), enforced by the agent adapter; not
            for the ``command`` agent, whose tokens the harness cannot see.
        dataplane: the data plane the labs will run on (``kernel`` or ``ebpf``); None: the one
            :func:`substrate.dataplane.select` chooses here (``kernel`` where it cannot tell).

    Raises:
        AnibenchError: unknown task class, level, ablation, agent or mode; more than one factor
            varied; a value twice; a mode or a token budget for an agent that has none; bad
            manifest.
    """
    from harness.agents.base import AGENTS, MODEL_AGENTS, TOKEN_BUDGET_AGENTS
    from harness.agents.modes import parse_mode
    from substrate.scenario import load_manifest

    mode = mode if mode is not None else [None]
    from harness.templates.tasks import is_template

    if task not in TASK_CLASSES and not is_template(task):
        raise AnibenchError(f"unknown task class {task!r}; known: {', '.join(TASK_CLASSES)} and the templates of "
                            "harness task list")
    given: dict[str, list[Any]] = {"ani": ani, "agent": agent, "model": model, "mode": mode}
    for name, vals in given.items():
        if not vals:
            raise AnibenchError(f"--{name} needs at least one value")
    if any(model) and set(agent) <= {"scripted", "noisy"}:
        raise AnibenchError("--model is for model-driven agents (openai, command); the scripted and noisy agents use none")
    if wall_cap_s <= 0 or seed < 0 or variants < 1 or budget_steps < 1 or density < 1 or not 0 <= fault_rate <= 1:
        raise AnibenchError("out of range: --wall-cap > 0, --seed >= 0, --variants >= 1, --budget-steps >= 1, "
                            "--density >= 1, 0 <= --faults <= 1")
    if budget_tokens is not None and budget_tokens < 1:
        raise AnibenchError("out of range: --budget-tokens >= 1")
    given["ani"] = ani = parse_levels(ani)
    for a in agent:
        if a not in AGENTS:
            raise AnibenchError(f"unknown agent {a!r}; available: {', '.join(AGENTS)}")
    if any(mode):
        given["mode"] = mode = [str(parse_mode(m)) if m else None for m in mode]
        if not set(agent) <= MODEL_AGENTS:
            raise AnibenchError(f"--mode is for the model-driven agent ({', '.join(sorted(MODEL_AGENTS))}); "
                                f"{', '.join(a for a in agent if a not in MODEL_AGENTS)} has no modes")
    if "mode" in agent_options:
        raise AnibenchError("give the agent mode with --mode, not --agent-opt mode=...")
    if budget_tokens is not None and not set(agent) <= TOKEN_BUDGET_AGENTS:
        raise AnibenchError(f"--budget-tokens is enforced by the agent adapter; the "
                            f"{', '.join(a for a in agent if a not in TOKEN_BUDGET_AGENTS)} agent's tokens are not "
                            "measured, so its budget cannot be enforced")
    varied = [name for name, vals in given.items() if len(vals) > 1]
    if len(varied) > 1:
        raise AnibenchError(f"a campaign varies one controlled factor at a time; {' and '.join(varied)} have several values")
    for name, vals in given.items():
        if len(set(vals)) != len(vals):
            raise AnibenchError(f"--{name} lists a value twice")
    m = load_manifest(manifest)
    factor: Factor = varied[0] if varied else "ani"  # type: ignore[assignment]
    spec = CampaignSpec(campaign_id="", factor=factor, ani=ani, agent=agent, model=model, mode=mode, task=task,
                        variants=variants, manifest=str(Path(manifest).resolve()), manifest_digest=m.digest(),
                        seed=seed, density=density, fault_rate=fault_rate, budget_steps=budget_steps,
                        budget_tokens=budget_tokens, wall_cap_s=wall_cap_s, agent_options=agent_options,
                        dataplane=dataplane or _local_dataplane())
    if campaign_id is None:
        digest = hashlib.sha256(spec.model_dump_json(exclude={"campaign_id"}).encode()).hexdigest()[:8]
        campaign_id = f"{task}-{'-'.join(spec.settings)}-{digest}".replace("/", "_")
    spec.campaign_id = campaign_id
    return spec


def _failed(spec: CampaignSpec, key: str, setting: str, variant: int, error: str) -> RunRecord:
    s = spec.setting_values(setting)
    now = datetime.now(UTC)
    return RunRecord(campaign_id=spec.campaign_id, run_key=key, factor=spec.factor, setting=setting, task_class=spec.task,
                     variant=variant, scenario_seed=spec.seed + variant, fault_seed=spec.seed * 1000 + variant,
                     density=spec.density, fault_rate=spec.fault_rate, budget_steps=spec.budget_steps, agent=s.agent,
                     model=s.model, level=s.level, ablations=list(s.ablations), mode=s.mode,
                     budget_tokens=spec.budget_tokens, status=RunStatus.failed, error=error[:2000], started_at=now,
                     finished_at=now, dataplane=spec.dataplane)


def run_spec(spec: CampaignSpec, key: str, setting: str, variant: int, results_dir: Path) -> RunSpec:
    """The :class:`RunSpec` of one run of the campaign."""
    s = spec.setting_values(setting)
    opts = dict(spec.agent_options)
    if s.model:
        opts["model"] = s.model
    return RunSpec(
        campaign_id=spec.campaign_id, run_key=key, factor=spec.factor, setting=setting, level=s.level,
        ablations=list(s.ablations), agent=s.agent, agent_options=opts, model=s.model, mode=s.mode,
        density=spec.density, fault_rate=spec.fault_rate, budget_steps=spec.budget_steps,
        budget_tokens=spec.budget_tokens, wall_cap_s=spec.wall_cap_s,
        run_dir=results_dir / spec.campaign_id / setting / f"v{variant}",
    )


def order_seed(spec: CampaignSpec) -> str:
    """The seed of the campaign's run order (recorded in every run: ``RunRecord.order_seed``)."""
    return f"order/{spec.seed}"


def settings_order(spec: CampaignSpec, v: int) -> list[str]:
    """The order in which variant ``v`` runs the campaign's settings: the rows of a Latin square
    (the settings rotated by ``v`` plus an offset drawn from :func:`order_seed`), so that over
    any ``n`` consecutive variants every setting runs once in every position -- an effect of
    running first (a warm cache, a lab that ages) falls on every setting alike, and the report
    can test for it (issue 19)."""
    settings = list(spec.settings)
    n = len(settings)
    k = (random.Random(order_seed(spec)).randrange(n) + v) % n if n else 0
    return settings[k:] + settings[:k]


def campaign_variant(spec: CampaignSpec, sc: Any, v: int) -> Any:
    """Task variant ``v`` of the campaign in its scenario ``sc`` (scenario seed ``spec.seed + v``,
    fault seed ``spec.seed * 1000 + v``).

    Raises:
        AnibenchError: the scenario cannot host the task.
    """
    return make_variant(spec.task, sc, v, fault_seed=spec.seed * 1000 + v)


def planned_digests(spec: CampaignSpec, v: int) -> dict[str, str]:
    """The input digests (:attr:`harness.store.RunRecord.input_digests`) every run of variant
    ``v`` must record, computed from the specification alone -- no lab: the scenario file, the
    fault schedule and the task variant. Equal on every machine for the same specification
    (issue 19, determinism).

    Raises:
        AnibenchError: the scenario cannot host the task.
    """
    from harness.run import digests_of
    from substrate.faults import draw_schedule
    from substrate.scenario import build, load_manifest

    sc = build(load_manifest(spec.manifest), seed=spec.seed + v, density=spec.density)
    variant = campaign_variant(spec, sc, v)
    schedule = draw_schedule(variant.fault_seed, spec.fault_rate, spec.budget_steps, sc.topology)
    return digests_of(sc.to_json(), variant, schedule)


def plan_campaign(spec: CampaignSpec, store: CampaignStore, *, resume: bool) -> tuple[dict[tuple[str, int], str], set[str]]:
    """Create (or find, with ``resume``) the campaign in the store and plan its runs; shared by
    every executor (local and :mod:`harness.cluster`).

    Returns:
        The run key of every (setting, variant) and the keys still pending (runs left *running* by
        a crash are put back to pending first).

    Raises:
        AnibenchError: the campaign exists and ``resume`` is false, or its stored spec differs.
    """
    if spec.campaign_id in store.campaigns() and not resume:
        raise AnibenchError(f"campaign {spec.campaign_id!r} exists in the store: add --resume to continue it")
    if spec.campaign_id in store.campaigns():
        ran_on = store.campaign_spec(spec.campaign_id).get("dataplane", "kernel")
        if ran_on != spec.dataplane:
            raise AnibenchError(f"campaign {spec.campaign_id!r} ran on the {ran_on} data plane, this one would run on "
                                f"{spec.dataplane}: runs are never paired across data planes (--dataplane {ran_on})")
    store.create_campaign(spec.campaign_id, spec.model_dump(mode="json"))
    store.recover(spec.campaign_id)
    keys = {(s, v): run_key(spec.campaign_id, s, v) for v in range(spec.variants) for s in spec.settings}
    store.plan(spec.campaign_id, list(keys.values()))
    return keys, set(store.pending_runs(spec.campaign_id))


def run_variant(spec: CampaignSpec, v: int, todo: list[tuple[str, str]], results_dir: Path, lab_name: str,
                on_stage: Callable[[str], None] | None = None) -> Iterator[tuple[str, RunRecord | None]]:
    """Run the pending runs of one task variant on its own lab: the unit of work of every executor.

    Builds the variant's brownfield from its scenario seed, deploys it once as ``lab_name`` and runs
    each setting's paired run on it (each from a reset to the baseline); the lab is destroyed when
    the generator ends or is closed.

    Args:
        todo: (setting, run key) of the runs to do, in the order to run them (:func:`settings_order`).
        results_dir: where each run's directory goes (``results_dir/CAMPAIGN/SETTING/vN``).

    Yields:
        ``(run key, None)`` before a run starts, then ``(run key, record)`` when it is finished
        (a *failed* record when the harness could not complete it, or the variant could not be made).
    """
    from substrate.scenario import build, load_manifest
    from substrate.scenario.deploy import deploy_scenario

    sc = build(load_manifest(spec.manifest), seed=spec.seed + v, density=spec.density)
    try:
        variant = campaign_variant(spec, sc, v)
    except AnibenchError as e:
        for s, k in todo:
            yield k, None
            yield k, _failed(spec, k, s, v, f"task variant could not be made: {e}")
        return
    if on_stage:
        on_stage(f"variant {v}: deploying scenario seed {sc.seed} ({len(sc.topology.nodes)} nodes)")
    order = settings_order(spec, v)
    with deploy_scenario(sc, lab_name) as lab:
        if lab.record.dataplane != spec.dataplane:
            for s, k in todo:
                yield k, None
                yield k, _failed(spec, k, s, v, f"the lab came up on the {lab.record.dataplane} data plane, the campaign "
                                                f"runs on {spec.dataplane} (--dataplane {spec.dataplane})")
            return
        for s, k in todo:
            yield k, None
            try:
                rec, _verdicts = execute_run(lab, run_spec(spec, k, s, v, results_dir), variant)
            except RunFailed as e:
                rec = _failed(spec, k, s, v, str(e))
            yield k, rec.model_copy(update={"run_position": order.index(s), "order_seed": order_seed(spec)})


def run_campaign(
    spec: CampaignSpec,
    store: CampaignStore,
    *,
    results_dir: Path,
    resume: bool = False,
    on_run: Callable[[str, RunRecord | None], None] | None = None,
    on_stage: Callable[[str], None] | None = None,
) -> list[RunRecord]:
    """Run every pending run of ``spec`` on this machine (the local executor), one variant after
    the other; returns the records of the runs done now.

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
    from substrate.signals import raise_if_interrupted, terminate_gracefully

    keys, pending = plan_campaign(spec, store, resume=resume)
    done: list[RunRecord] = []
    lab_name = f"camp-{os.getpid() % 100000}"
    with terminate_gracefully():
        for v in range(spec.variants):
            order = settings_order(spec, v)
            todo = [(s, keys[(s, v)]) for s in order if keys[(s, v)] in pending]
            if not todo:
                continue
            for k, rec in run_variant(spec, v, todo, results_dir, lab_name, on_stage):
                if rec is None:
                    store.mark_running(k)
                else:
                    store.save_result(rec)
                    done.append(rec)
                if on_run:
                    on_run(k, rec)
                raise_if_interrupted()  # a Ctrl-C Python swallowed (raised in a callback) stops here
    return done


def summary_line(rec: RunRecord) -> str:
    """One line per finished run, for progress output."""
    if rec.status is RunStatus.failed:
        return f"{rec.setting} v{rec.variant}: FAILED ({(rec.error or '')[:120]})"
    from harness.report import agent_error_line, tokens_of

    tokens = tokens_of(rec)
    return (f"{rec.setting} v{rec.variant}: {rec.outcome_label.value if rec.outcome_label else '?'}, "
            f"{rec.test_cases_passed}/{rec.test_cases_total} tests, {len(rec.violated_invariants)} violated, "
            f"{rec.steps} steps" + (f", {tokens:,} tokens" if tokens else "")
            + (f" ({rec.budget_exhausted} budget hit)" if rec.budget_exhausted else "") + f", {rec.wall_s:.1f} s"
            + (f"; {agent_error_line(rec, 'AGENT ERROR')}" if rec.agent_error else ""))


def spec_json(spec: CampaignSpec) -> str:
    return json.dumps(spec.model_dump(mode="json"), indent=1, sort_keys=True)
