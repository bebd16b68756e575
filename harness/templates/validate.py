"""Validation of templates in a real lab (NetConfArena section IV-C): each instance's reference
solution at each level is applied by the scripted operator through the level's MCP server, and
every hidden test case must pass with no baseline invariant broken. All instances of a template
share the scenario (instances vary the parameters, NetConfArena V-A3), so one deployed lab
serves every template and instance; each run resets it to its baseline first.
"""

from __future__ import annotations

import time
from pathlib import Path

from pydantic import BaseModel

from harness.templates.instantiate import DEFAULT_INSTANCES
from harness.templates.schema import InstantiationRefused
from substrate.lab import Lab
from substrate.scenario.model import Scenario


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


def validate_template(lab: Lab, sc: Scenario, name: str, levels: list[str], run_dir: Path,
                      instances: int = DEFAULT_INSTANCES) -> list[ValidationRow]:
    """Validate ``instances`` instances of template ``name`` at ``levels`` on ``lab`` (deployed
    from ``sc``). A level the template cannot express is a ``skipped`` row with the reason; an
    instance the scenario cannot host is a ``refused`` row with the parameter and the reason.
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
