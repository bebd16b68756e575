#!/usr/bin/env python3
"""Every variant of the chosen task classes on one deployed brownfield: first with no agent
(the variant's setup -- a troubleshooting breakage -- applied and observed: how many test cases
fail, how many damage checks fail; a variant where no test case fails, or some damage check
does, is a defect), then each level's scripted reference solution (harness.run.execute_run:
reset, setup, agent, observation), with the wall time of each run. A level a class cannot
express is printed as skipped, with the reason. Exits 1 when anything is invalid.

Usage: sudo .venv/bin/python bench/task_classes.py [--task troubleshooting] [--variants 6]
       [--ani A0,A1,A3-R,A4] [--manifest tests/data/small-campaign.yaml] [--seed 7]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

from harness.run import RunSpec, execute_run
from harness.tasks import make_variant, skipped_levels, variant_skips
from substrate.scenario import build, load_manifest
from substrate.scenario.deploy import deploy_scenario, reset
from substrate.scenario.observer import observe


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--task", default="troubleshooting")
    ap.add_argument("--variants", type=int, default=6)
    ap.add_argument("--ani", default="A0,A1,A3-R,A4")
    ap.add_argument("--manifest", default="tests/data/small-campaign.yaml")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--no-baseline", action="store_true", help="Skip the no-agent observation.")
    a = ap.parse_args()
    sc = build(load_manifest(a.manifest), seed=a.seed)
    levels = a.ani.split(",")
    skipped = skipped_levels(a.task, levels)
    for lv, why in skipped.items():
        print(f"skipped {lv}: {why}")
    levels = [lv for lv in levels if lv not in skipped]
    bad = 0
    print(f"load average {os.getloadavg()[0]:.1f}")
    with tempfile.TemporaryDirectory() as tmp, deploy_scenario(sc, f"bench-tc-{os.getpid() % 100000}") as lab:
        for v in range(a.variants):
            var = make_variant(a.task, sc, v)
            what = (var.breakage or {}).get("kind", "")
            if not a.no_baseline and var.setup:
                t0 = time.monotonic()
                reset(lab)
                for st in var.setup:
                    r = lab.exec(st.node, st.argv, timeout_s=10)
                    if not r.ok:
                        print(f"v{v} {what}: setup failed: {st.why}: {r.summary()}")
                verdicts = observe(lab, [*var.test_cases, *var.damage_checks])
                tests, damage = verdicts[: len(var.test_cases)], verdicts[len(var.test_cases):]
                tf = [x.id for x in tests if not x.ok]
                df = [x.id for x in damage if not x.ok]
                ok = bool(tf) and not df
                bad += not ok
                print(f"v{v} {what}: no agent: {len(tf)}/{len(tests)} test cases fail, {len(df)}/{len(damage)} damage "
                      f"checks fail {df[:4]} -> {'ok' if ok else 'DEFECT'} ({time.monotonic() - t0:.0f} s)")
            own = variant_skips(var, levels)
            for lv, why in own.items():
                print(f"v{v} {what} {lv}: skipped ({why})")
            for lv in [x for x in levels if x not in own]:
                spec = RunSpec(campaign_id="bench", run_key=f"bench/{lv}/{v}", factor="ani", setting=lv, level=lv,
                               agent="scripted", density=sc.density, run_dir=Path(tmp) / lv / str(v))
                t0 = time.monotonic()
                rec, verdicts = execute_run(lab, spec, var)
                ok = rec.task_pass and rec.damage_free
                bad += not ok
                failed = [x.id for x in verdicts if not x.ok][:4]
                print(f"v{v} {what} {lv}: tests {rec.test_cases_passed}/{rec.test_cases_total}, damage "
                      f"{len(rec.violated_invariants)} -> {'valid' if ok else 'INVALID ' + str(failed)} "
                      f"({time.monotonic() - t0:.0f} s; agent error: {rec.agent_error})")
    print(f"load average {os.getloadavg()[0]:.1f}")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
