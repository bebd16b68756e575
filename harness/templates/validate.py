"""Validation of templates in a real lab (NetConfArena section IV-C): each instance's reference
solution at each level is applied by the scripted operator through the level's MCP server, and
every hidden test case must pass with no baseline invariant broken. All instances of a template
share the scenario (instances vary the parameters, NetConfArena V-A3), so one deployed lab
serves every template and instance; each run resets it to its baseline first. Each instance is
first observed with no agent at all: some test case must fail there (else a do-nothing agent
would score a success).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import BaseModel

from harness.templates.check import DEVICE_CHECK_KEYS
from harness.templates.instantiate import DEFAULT_INSTANCES
from harness.templates.schema import InstantiationRefused
from substrate.lab import Lab
from substrate.scenario.model import Scenario

if TYPE_CHECKING:
    from harness.templates.tasks import TemplateVariant


class ValidationRow(BaseModel):
    """One (template, instance, level) of a validation."""

    template: str
    family: str = ""
    instance: int
    level: str
    status: str  # valid | INVALID | skipped | refused
    test_cases: str = ""
    damage_checks: str = ""
    config_f1: float | None = None
    detail: str = ""
    seconds: float = 0.0


def do_nothing_passes(lab: Lab, var: TemplateVariant) -> list[str] | None:
    """The ids of the test cases that pass when nobody acts (the lab reset to its baseline, the
    customer-side setup run), or None when some test case fails there, as it must: a task whose
    every test case passes with no change scores a do-nothing agent as a success. The device
    checks are read once (``settle_s`` 0: at the baseline nothing is settling).

    Raises:
        SubstrateError: the reset failed. RuntimeError: a setup step failed.
    """
    from substrate.scenario.deploy import reset
    from substrate.scenario.observer import observe

    reset(lab)
    for st in var.setup:
        r = lab.exec(st.node, st.argv, timeout_s=10)
        if not r.ok:
            raise RuntimeError(f"setup step failed on {st.node}: {r.summary()}")
    once = [t.model_copy(update={"params": {**t.params, "settle_s": 0}}) if t.kind in DEVICE_CHECK_KEYS else t
            for t in var.test_cases]
    verdicts = observe(lab, once)
    return None if not all(v.ok for v in verdicts) else [v.id for v in verdicts]


def validate_template(lab: Lab, sc: Scenario, name: str, levels: list[str], run_dir: Path,
                      instances: int = DEFAULT_INSTANCES, *, probe: bool = True) -> list[ValidationRow]:
    """Validate ``instances`` instances of template ``name`` at ``levels`` on ``lab`` (deployed
    from ``sc``). A level the template cannot express is a ``skipped`` row with the reason; an
    instance the scenario cannot host is a ``refused`` row with the parameter and the reason.
    With ``probe``, each instance is first observed with no agent (:func:`do_nothing_passes`):
    when every test case passes there, the instance is an ``INVALID`` row at level ``-`` (its
    test cases cannot tell a solution from doing nothing) and its levels are not run.
    """
    from harness.ablations import parse_ani_settings
    from harness.run import RunFailed, RunSpec, execute_run
    from harness.templates.tasks import make_template_variant

    rows: list[ValidationRow] = []
    for i in range(instances):
        try:
            var = make_template_variant(name, sc, i)
        except InstantiationRefused as e:
            rows.append(ValidationRow(template=name, instance=i, level="-", status="refused", detail=str(e)))
            continue
        if probe:
            t0 = time.monotonic()
            try:
                idle = do_nothing_passes(lab, var)
            except Exception as e:  # noqa: BLE001 - the probe's failure is the instance's verdict
                rows.append(ValidationRow(template=name, family=var.family, instance=i, level="-", status="INVALID",
                                          detail=f"the no-agent probe failed: {type(e).__name__}: {e}"[:300],
                                          seconds=time.monotonic() - t0))
                continue
            if idle is not None:
                rows.append(ValidationRow(template=name, family=var.family, instance=i, level="-", status="INVALID",
                                          test_cases=f"{len(idle)}/{len(idle)}",
                                          detail="a do-nothing agent passes every test case: "
                                                 + ", ".join(x.rsplit("/", 1)[-1] for x in idle)[:300],
                                          seconds=time.monotonic() - t0))
                continue
        for setting in parse_ani_settings(levels):
            level = setting.level
            why = var.reference.get(level)
            if isinstance(why, str):
                rows.append(ValidationRow(template=name, family=var.family, instance=i, level=level, status="skipped",
                                          detail=why))
                continue
            spec = RunSpec(campaign_id="validate", run_key=f"validate/{name}/{level}/{i}", factor="ani",
                           setting=str(setting), level=level, ablations=list(setting.ablations), agent="scripted",
                           density=sc.density, run_dir=run_dir / name / str(setting) / str(i))
            t0 = time.monotonic()
            try:
                rec, verdicts = execute_run(lab, spec, var)
            except RunFailed as e:
                rows.append(ValidationRow(template=name, family=var.family, instance=i, level=level, status="INVALID",
                                          detail=f"run failed: {e}"[:300], seconds=time.monotonic() - t0))
                continue
            ok = rec.task_pass and rec.damage_free and not rec.agent_error
            failed = [x.id + ": " + x.detail for x in verdicts if not x.ok]
            rows.append(ValidationRow(
                template=name, family=var.family, instance=i, level=level, status="valid" if ok else "INVALID",
                test_cases=f"{rec.test_cases_passed}/{rec.test_cases_total}",
                damage_checks=f"{len(var.damage_checks) - len(rec.violated_invariants)}/{len(var.damage_checks)}",
                config_f1=getattr(rec, "config_f1", None),
                detail="; ".join(([rec.agent_error] if rec.agent_error else []) + failed[:3])[:400],
                seconds=time.monotonic() - t0))
    return rows
