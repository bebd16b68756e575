"""One run (draft section 2): one agent, one task variant, one setting of every factor, one budget.

Steps (DESIGN.md "the data flow of one run"): reset the lab to the scenario baseline; perform
the variant's customer-side setup; start the level's MCP server with the step budget and the
trajectory recorder; start the fault schedule; run the agent under a wall-clock cap; clear the
faults; kill what the agent left running in the nodes (each such node is a damage finding,
``leftover/NODE``); let the underlay converge; observe out-of-band (the task's test cases and every
baseline invariant of the services the task must not change); compute the outcome and the
process metrics from the server's trajectory.

A run never raises for the agent's failures (they are outcomes); it raises only when the harness
itself cannot complete the run (:class:`RunFailed`), which campaigns record as a failed run.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from harness import metrics
from harness.ablations import AniSetting
from harness.agents.base import AgentContext, AgentOutcome, make_agent
from harness.diagnostics import diagnostic_labels
from harness.errors import AnibenchError
from harness.store import RunRecord, RunStatus, completion_mode
from harness.tasks import TaskVariant
from substrate.faults import Fault, FaultInjector, draw_schedule
from substrate.lab import Lab
from substrate.errors import SubstrateError
from substrate.scenario.deploy import kill_strays, reset
from substrate.scenario.observer import Verdict, observe


#: Damage-check id of a node where the agent left processes running (``leftover/r3``).
LEFTOVER_PREFIX = "leftover/"


class RunFailed(AnibenchError):
    """The harness could not complete a run (lab not restorable, server could not start, ...)."""


class RunSpec(BaseModel):
    """The settings of one run."""

    campaign_id: str
    run_key: str
    factor: str = Field(description="Controlled factor of the campaign (ani, agent, model, mode).")
    setting: str
    level: str
    ablations: list[str] = Field(default_factory=list, description="Ablations within the level (harness.ablations).")
    agent: str
    agent_options: dict[str, str] = Field(default_factory=dict)
    model: str | None = None
    mode: str | None = Field(default=None, description="Agent mode of a model-driven agent (None: its default).")
    density: int
    fault_rate: float = 0.0
    budget_steps: int = 60
    budget_tokens: int | None = Field(default=None, ge=1, description="Token budget, enforced by the agent adapter.")
    wall_cap_s: float = 600.0
    run_dir: Path

    @property
    def ani(self) -> AniSetting:
        """The level with its ablations."""
        return AniSetting(self.level, tuple(self.ablations))


#: Files a run leaves in its directory besides the trajectory (read by the report and the export).
HAI_FILE = "hai.json"
TOOLS_FILE = "tools.json"
VERDICTS_FILE = "verdicts.json"
AGENT_FILE = "agent.json"


def _server_config(lab: Lab, spec: RunSpec, trajectory: Path | None) -> Any:
    from servers.common import ServerConfig

    return ServerConfig(lab=lab.name, budget_steps=spec.budget_steps, trajectory=trajectory,
                        devices=lab.routers(), run_id=spec.run_key, **spec.ani.server_config())


def serve_argv(lab: Lab, spec: RunSpec, trajectory: Path) -> list[str]:
    """The command that serves the run's level over stdio, for an external agent: only what differs
    from ``harness serve``'s defaults (the transport is stdio, the devices are the lab's routers),
    the run id (copied into every trajectory line) and absolute paths."""
    from harness import harness_command

    return [*harness_command(), "serve", "--ani", spec.level, *spec.ani.serve_args(), "--lab", lab.name,
            "--budget-steps", str(spec.budget_steps), "--trajectory", str(trajectory), "--run-id", spec.run_key]


def _tools_file(server: Any) -> dict[str, Any]:
    """What the server offers the agent: its instructions and its tools (MCP descriptions)."""
    import anyio

    listed = anyio.run(server.list_tools)
    return {"level": server.level, "instructions": server.instructions,
            "tools": [{"name": t.name, "description": t.description or "", "inputSchema": t.input_schema}
                      for t in listed]}


class _TrajectoryFollower(threading.Thread):
    """Advances the fault schedule for agents whose tool calls the harness does not see (external
    processes): after the k-th recorded call, step k+1 is next."""

    def __init__(self, path: Path, injector: FaultInjector):
        super().__init__(daemon=True, name="fault-follower")
        self.path, self.injector, self.stop = path, injector, threading.Event()

    def run(self) -> None:
        seen = -1
        while not self.stop.wait(0.05):
            try:
                with self.path.open("rb") as f:
                    n = sum(1 for _ in f)
            except OSError:
                n = 0
            if n != seen:
                seen = n
                self.injector.on_step(n + 1)


def _sha256(data: str | bytes) -> str:
    return hashlib.sha256(data.encode() if isinstance(data, str) else data).hexdigest()


def input_digests(lab: Lab, variant: TaskVariant, schedule: list[Fault]) -> dict[str, str]:
    """SHA-256 of a run's inputs (:attr:`RunRecord.input_digests`): the scenario file deployed on
    ``lab`` (``Scenario.to_json``: byte-stable), the fault schedule and the task variant as
    canonical JSON (sorted keys). A lab not deployed from a scenario has no ``scenario`` digest."""
    from substrate.scenario.deploy import SCENARIO_FILE

    path = lab.dir / SCENARIO_FILE
    return digests_of(path.read_bytes() if path.exists() else None, variant, schedule)


def digests_of(scenario_file: str | bytes | None, variant: TaskVariant, schedule: list[Fault]) -> dict[str, str]:
    """The digests of :func:`input_digests` from the inputs themselves (``scenario_file``: the
    scenario's canonical JSON, ``Scenario.to_json``; None: no scenario digest)."""
    out = {}
    if scenario_file is not None:
        out["scenario"] = _sha256(scenario_file)
    out["fault_schedule"] = _sha256(json.dumps([f.model_dump(mode="json") for f in schedule], sort_keys=True))
    out["task_variant"] = _sha256(json.dumps(variant.model_dump(mode="json"), sort_keys=True))
    return out


#: Beside the verdicts: the run's configuration deltas and their F1 (harness.config_f1).
CONFIG_DELTA_FILE = "config_delta.json"


def config_f1_of_run(lab: Lab, variant: TaskVariant, digests: dict[str, str], run_dir: Path) -> Any:
    """The run's configuration F1 (:class:`harness.config_f1.ConfigF1`) when the variant has a
    reference configuration (a protocol template's A0 reference), else None. Writes both deltas
    to :data:`CONFIG_DELTA_FILE`; a delta that cannot be measured is noted there and gives None
    (the run's verdicts do not depend on it)."""
    reference = getattr(variant, "reference", None)
    a0 = reference.get("A0") if isinstance(reference, dict) else None
    if not isinstance(a0, dict):
        return None
    from harness import config_f1 as cf

    try:
        agent = cf.config_delta(cf.baseline_routers(lab), cf.capture_routers(lab))
        key = f"{digests.get('scenario', 'none')[:16]}-{digests['task_variant'][:16]}"
        ref = cf.reference_delta(lab, key, list(a0.items()), [(st.node, st.argv) for st in variant.setup])
    except Exception as e:  # noqa: BLE001 - a metric that cannot be measured is noted, not fatal
        (run_dir / CONFIG_DELTA_FILE).write_text(json.dumps({"error": f"{type(e).__name__}: {e}"[:2000]}, indent=1))
        return None
    score = cf.config_f1(agent, ref)
    (run_dir / CONFIG_DELTA_FILE).write_text(json.dumps({
        "precision": score.precision, "recall": score.recall, "f1": score.f1,
        "agent": sorted(agent), "reference": sorted(ref), "common": sorted(agent & ref)}, indent=1))
    return score


def reconciled_counts(lab: Lab, level: str | None, since: float) -> tuple[int | None, int | None, int | None]:
    """What a run record counts of a level with a reconciled source of truth (A3-R, A4):
    ``(reconcile attempts, drift events, supervisor restarts)`` -- the first two from the
    reconciler's status of the lab's current epoch (since the run's reset:
    :func:`servers.a3_reconciled.reconciler.counts`), the restarts from its supervisor's log since
    ``since`` (Unix time the run started: :func:`~servers.a3_reconciled.reconciler.restarts_since`).
    ``(None, None, None)`` at the other levels. Read before anything resets the lab again."""
    from servers.registry import RECONCILED_LEVELS

    if level not in RECONCILED_LEVELS:
        return None, None, None
    from servers.a3_reconciled.reconciler import counts, restarts_since

    reconciles, drift_events = counts(lab)
    return reconciles, drift_events, restarts_since(lab, since)


def execute_run(lab: Lab, spec: RunSpec, variant: TaskVariant) -> tuple[RunRecord, list[Verdict]]:
    """Run ``variant`` on ``lab`` with ``spec``; see module docstring.

    Returns:
        The run record and every verdict (test cases first, then damage checks).

    Raises:
        RunFailed: the harness could not complete the run.
    """
    import anyio

    started = datetime.now(UTC)
    t0 = time.monotonic()
    # absolute: the server's --trajectory and an external agent's files must not depend on the
    # working directory of the process that reads them (an external agent runs in files/)
    run_dir = spec.run_dir.resolve()
    run_dir.mkdir(parents=True, exist_ok=True)
    trajectory = run_dir / "trajectory.jsonl"
    trajectory.unlink(missing_ok=True)
    files_dir = run_dir / "files"
    files_dir.mkdir(exist_ok=True)
    for name, text in variant.files.items():
        (files_dir / name).write_text(text)
    (run_dir / HAI_FILE).write_text(json.dumps({"prompt": variant.prompt, "files": variant.files}, indent=1))

    try:
        rep = reset(lab)
    except SubstrateError as e:  # e.g. the underlay did not converge after a restarted daemon
        raise RunFailed(f"the lab could not be reset to its baseline: {e}") from e
    if not rep.exact:
        raise RunFailed(f"the lab could not be reset to its baseline: {json.dumps(rep.residual)[:400]}")
    for step in variant.setup:
        r = lab.exec(step.node, step.argv, timeout_s=10)
        if not r.ok:
            raise RunFailed(f"setup step failed ({step.why}): {r.summary()}")
    reset_s = time.monotonic() - t0

    schedule = draw_schedule(variant.fault_seed, spec.fault_rate, spec.budget_steps, lab.topology)
    digests = input_digests(lab, variant, schedule)
    injector = FaultInjector(lab, schedule)
    agent = make_agent(spec.agent, {**spec.agent_options, **({"mode": spec.mode} if spec.mode else {})})
    external = spec.agent == "command"
    server = None
    from servers.registry import build_server

    try:
        # an external agent starts its own server; this one only lists what it offers
        server = build_server(spec.level, _server_config(lab, spec, None if external else trajectory))
        (run_dir / TOOLS_FILE).write_text(json.dumps(_tools_file(server), indent=1))
    except Exception as e:  # noqa: BLE001 - any setup failure of the server fails the run
        if server is not None:
            server.close()
        raise RunFailed(f"the {spec.ani} server could not start: {e}") from e
    if external:
        server.close()
        server = None
    follower = _TrajectoryFollower(trajectory, injector) if external else None
    ctx = AgentContext(
        level=spec.level, prompt=variant.prompt, files=variant.files, workdir=run_dir, server=server,
        serve_argv=serve_argv(lab, spec, trajectory), budget_steps=spec.budget_steps,
        budget_tokens=spec.budget_tokens, deadline=time.monotonic() + spec.wall_cap_s, on_step=injector.on_step,
        seed=variant.seed, options=spec.agent_options,
    )
    t1 = time.monotonic()
    outcome = AgentOutcome()
    capped = False

    def partial(error: str) -> AgentOutcome:
        """What the agent had counted so far (tokens, events), when it keeps it, with ``error``:
        a run cut at the cap or ended by the agent's crash still reports what it spent."""
        kept = getattr(agent, "outcome", None)
        kept = kept if isinstance(kept, AgentOutcome) else AgentOutcome()
        kept.error = error
        return kept

    async def drive() -> AgentOutcome:
        nonlocal capped
        with anyio.move_on_after(spec.wall_cap_s) as scope:
            return await agent.run(ctx)
        capped = scope.cancelled_caught
        return partial(f"wall-clock cap of {spec.wall_cap_s:g} s reached")

    try:
        if follower:
            follower.start()
        outcome = anyio.run(drive)
    except Exception as e:  # noqa: BLE001 - the agent's crash is an outcome, not a harness failure
        while isinstance(e, BaseExceptionGroup) and len(e.exceptions) == 1:  # the task group's wrapping
            e = e.exceptions[0]
        outcome = partial(f"agent crashed: {type(e).__name__}: {e}"[:2000])
    finally:
        if follower:
            follower.stop.set()
            follower.join()
        injector.clear()
        if server is not None:
            server.close()
    agent_s = time.monotonic() - t1
    from harness.agents.command import CAPPED

    if outcome.run_failed:
        raise RunFailed(outcome.error or "the agent could not run as specified")
    capped = capped or bool(outcome.error and f"({CAPPED})" in outcome.error)

    t2 = time.monotonic()
    # processes the agent left running in a node (a background loop, a delayed change) are state
    # no request asked for: killed before observing, so that the verdicts are of the state the
    # agent submitted, and each node that had any counts as damage
    leftovers = kill_strays(lab, also_keep={st.node: st.daemons for st in variant.setup if st.daemons})
    try:
        lab.wait_converged(timeout_s=30)
    except Exception:  # noqa: BLE001 - an unconverged underlay is the agent's damage: observe it
        pass
    verdicts = observe(lab, [*variant.test_cases, *variant.damage_checks])
    observe_s = time.monotonic() - t2
    # configuration F1 (NetConfArena III-D1): the agent's delta is read now, before the reference's
    # is measured (which resets the lab: the verdicts above are already taken, and so are the
    # reconciler's counts, which are of the lab's epoch since the run's reset)
    reconciles, drift_events, restarts = reconciled_counts(lab, spec.level, started.timestamp())
    cfg = config_f1_of_run(lab, variant, digests, run_dir)
    tests = verdicts[: len(variant.test_cases)]
    damage = verdicts[len(variant.test_cases):]
    passed = sum(v.ok for v in tests)
    task_pass = passed == len(tests)
    violated = [v.id for v in damage if not v.ok]
    violated += sorted({f"{LEFTOVER_PREFIX}{k.split(':')[0]}" for k in leftovers})

    from servers.common import read_trajectory

    calls = read_trajectory(trajectory) if trajectory.exists() else []
    executed = [c for c in calls if not c.get("refused")]
    # the server's count, or the model-driven agent's, which adds the turns that made no call
    steps_hit = (any(c.get("refused") == "budget" for c in calls) or len(executed) >= spec.budget_steps
                 or outcome.stop_reason == "step_budget")
    exhausted = "steps" if steps_hit else "tokens" if outcome.token_budget_hit else None
    ended = completion_mode(submitted=metrics.submitted(calls), config_attempted=metrics.config_attempted(calls),
                            budget_hit=exhausted is not None, task_pass=task_pass)
    (run_dir / VERDICTS_FILE).write_text(json.dumps([v.model_dump() for v in verdicts], indent=1))
    (run_dir / AGENT_FILE).write_text(json.dumps({**outcome.__dict__, "capped": capped, "leftover_processes": leftovers},
                                                 indent=1))
    labels, findings = diagnostic_labels(verdicts)
    record = RunRecord(
        campaign_id=spec.campaign_id, run_key=spec.run_key, factor=spec.factor, setting=spec.setting,
        task_class=variant.task_class, variant=variant.variant, scenario_seed=variant.scenario_seed,
        fault_seed=variant.fault_seed, density=spec.density, fault_rate=spec.fault_rate,
        budget_steps=spec.budget_steps, agent=spec.agent, model=outcome.model or spec.model, level=spec.level,
        ablations=list(spec.ablations), mode=outcome.mode or spec.mode, budget_tokens=spec.budget_tokens,
        status=RunStatus.done, task_pass=task_pass, test_case_score=passed / len(tests) if tests else 1.0,
        test_cases_passed=passed, test_cases_total=len(tests), damage_free=not violated,
        violated_invariants=violated, diagnostic_labels=labels, diagnostics=findings[:20], completion_mode=ended, steps=len(executed), tokens_in=outcome.tokens_in,
        tokens_out=outcome.tokens_out, wall_s=time.monotonic() - t0, reset_s=reset_s, agent_s=agent_s,
        observe_s=observe_s, error_action_rate=metrics.error_action_rate(calls),
        repeat_action_rate=metrics.repeat_action_rate(calls),
        config_f1=cfg.f1 if cfg else None, config_precision=cfg.precision if cfg else None,
        config_recall=cfg.recall if cfg else None,
        faults=[e.model_dump() for e in injector.events], input_digests=digests, reconciles=reconciles,
        drift_events=drift_events, supervisor_restarts=restarts, dataplane=lab.record.dataplane,
        budget_exhausted=exhausted, agent_stop=outcome.stop_reason,
        agent_error=None if capped else outcome.error, agent_exit_status=outcome.exit_status,
        agent_log=outcome.log or str(run_dir / AGENT_FILE), trajectory_path=str(trajectory),
        started_at=started, finished_at=datetime.now(UTC),
    )
    return record, verdicts
