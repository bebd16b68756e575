#!/usr/bin/env python3
"""Oracle sensitivity (issue 19, item 2): inject each operator mistake kind of the noisy agent
(harness.agents.mistakes.KINDS) on every task class at every level that can express it, and
print, per kind and level, the fraction of injections the run's test cases or damage checks
detect (the run is not a clean success), plus the overall fraction.

Each injection is one run of the noisy agent with ``kind=<kind>``: exactly one mistake of that
kind, at a change drawn by the run seed among those that can carry it. Not counted (listed
apart): injections no change of the variant could express (nothing to clean up in an
onboarding), and mistakes the level's tool refused (the agent redid the change without them:
the network never carried them). A clean run of the scripted agent per class and level comes
first: a class/level whose clean run is not a clean success is reported and skipped (its
injections would say nothing about the oracle).

Goal (issue 19): every kind >= 95 % detected, overall >= 0.95. Misses are printed with the run
directory and the mistake, to find the oracle's blind spot.

Usage: sudo .venv/bin/python bench/sensitivity.py [--levels A0,A1,A2,A3-T,A4,A3-R]
       [--classes onboarding,change-set,decommissioning] [--kinds ...] [--variants 1]
       [--manifest tests/data/small-campaign.yaml --seed 7 --density 1] [--keep DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
from collections import defaultdict
from pathlib import Path

from harness.agents.mistakes import INEXPRESSIBLE, KINDS
from harness.run import RunFailed, RunSpec, execute_run
from harness.tasks import TASK_CLASSES, make_variant
from substrate.signals import raise_if_interrupted, terminate_gracefully
from substrate.scenario import build, load_manifest
from substrate.scenario.deploy import deploy_scenario

LEVELS = ("A0", "A1", "A2", "A3-T", "A4", "A3-R")


def main() -> None:  # noqa: C901
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--levels", default=",".join(LEVELS))
    ap.add_argument("--classes", default=",".join(TASK_CLASSES))
    ap.add_argument("--kinds", default=",".join(KINDS))
    ap.add_argument("--variants", type=int, default=1, help="variants per class (one injection per kind and level each)")
    ap.add_argument("--manifest", default="tests/data/small-campaign.yaml")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--density", type=int, default=1)
    ap.add_argument("--keep", default=None, help="keep the run directories here")
    ap.add_argument("--no-clean", action="store_true", help="skip the clean scripted runs (already checked)")
    args = ap.parse_args()
    levels, classes, kinds = args.levels.split(","), args.classes.split(","), args.kinds.split(",")
    root = Path(args.keep or tempfile.mkdtemp(prefix="anibench-sens-"))
    root.mkdir(parents=True, exist_ok=True)
    sc = build(load_manifest(Path(args.manifest)), seed=args.seed, density=args.density)
    variants = {(c, v): make_variant(c, sc, v) for c in classes for v in range(args.variants)}
    # kind -> level -> [detected, counted]; and the runs left out
    table: dict[str, dict[str, list[int]]] = defaultdict(lambda: defaultdict(lambda: [0, 0]))
    refused: dict[tuple[str, str], int] = defaultdict(int)
    inexpressible: dict[tuple[str, str], set[str]] = defaultdict(set)
    misses: list[str] = []
    #: kind -> [injections labelled specification_deviation, counted] (harness.diagnostics)
    labelled: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    n = 0
    t0 = time.monotonic()

    def run(level: str, cls: str, v: int, agent: str, opts: dict[str, str], key: str):  # noqa: ANN202
        nonlocal n
        raise_if_interrupted()  # a Ctrl-C or SIGTERM dropped inside a run stops the bench here, lab destroyed
        n += 1
        d = root / key
        spec = RunSpec(campaign_id="sens", run_key=key, factor="ani", setting=level, level=level, agent=agent,
                       agent_options=opts, density=args.density, run_dir=d, wall_cap_s=300)
        rec, verdicts = execute_run(lab, spec, variants[(cls, v)])
        made = json.loads((d / "mistakes.json").read_text()) if (d / "mistakes.json").exists() else None
        return rec, verdicts, made

    with deploy_scenario(sc, f"sens{os.getpid() % 10000}") as lab:
        skip: set[tuple[str, str]] = set()
        for level in [] if args.no_clean else levels:
            for cls, v in variants:
                rec, verdicts, _ = run(level, cls, v, "scripted", {}, f"clean/{level}/{cls}/{v}")
                if not (rec.task_pass and rec.damage_free):
                    skip.add((level, cls, v))
                    print(f"clean run not a clean success, skipped: {level} {cls} variant {v}: "
                          f"{[v.id for v in verdicts if not v.ok][:6]}", flush=True)
        for kind in kinds:
            for level in levels:
                if (kind, level) in INEXPRESSIBLE:
                    continue
                for cls, v in variants:
                    if (level, cls, v) in skip:
                        continue
                    key = f"{kind}/{level}/{cls}/{v}"
                    try:
                        rec, verdicts, made = run(level, cls, v, "noisy", {"rate": "0", "kind": kind}, key)
                    except RunFailed as e:
                        print(f"run failed {key}: {e}", flush=True)
                        continue
                    if made is None or made["inexpressible"] or not made["made"]:  # nothing injected: says nothing of the oracle
                        inexpressible[(kind, level)].add(cls)
                        print(f"{key:45s} not expressible" + ("" if made is None or made["inexpressible"]
                                                             else " (the noisy agent made no such mistake here)"), flush=True)
                        continue
                    if made["made"] and all(m["refused"] for m in made["made"]):
                        refused[(kind, level)] += 1
                        print(f"{key:45s} refused by the tool {made['made']}", flush=True)
                        continue
                    detected = not (rec.task_pass and rec.damage_free)
                    table[kind][level][0] += detected
                    table[kind][level][1] += 1
                    labelled[kind][0] += "specification_deviation" in rec.diagnostic_labels
                    labelled[kind][1] += 1
                    if not detected:
                        misses.append(f"{key}: {made['made']} -> clean success ({root / key})")
                    print(f"{key:45s} {'detected' if detected else 'MISSED'} {made['made']} {rec.diagnostic_labels} "
                          f"failed={[v.id for v in verdicts if not v.ok][:4]}", flush=True)
    wall = time.monotonic() - t0
    print(f"\n{n} runs in {wall:.0f} s; load average {os.getloadavg()[0]:.1f}; scenario {args.manifest} seed "
          f"{args.seed} density {args.density}, {args.variants} variant(s) per class")
    print(f"{'kind':22s}" + "".join(f"{lv:>8s}" for lv in levels) + f"{'all':>10s}")
    tot = [0, 0]
    for kind in kinds:
        cells, k = [], [0, 0]
        for lv in levels:
            if (kind, lv) in INEXPRESSIBLE:
                cells.append("    n/e ")
                continue
            det, cnt = table[kind][lv]
            k[0] += det
            k[1] += cnt
            cells.append(f"{det:>4d}/{cnt:<3d}" if cnt else "     -  ")
        tot[0] += k[0]
        tot[1] += k[1]
        frac = f"{k[0] / k[1]:.2f}" if k[1] else "-"
        print(f"{kind:22s}" + "".join(cells) + f"{frac:>10s}")
    print(f"overall: {tot[0]}/{tot[1]} = {tot[0] / max(tot[1], 1):.3f} (goal >= 0.95, each kind >= 0.95)")
    print("n/e: the level cannot express the kind (harness.agents.mistakes.INEXPRESSIBLE)")
    print("diagnostic label specification_deviation set, per kind: " + ", ".join(
        f"{k} {labelled[k][0]}/{labelled[k][1]}" for k in kinds if labelled[k][1]))
    for (kind, lv), cs in sorted(inexpressible.items()):
        print(f"not expressible in this variant: {kind} at {lv} in {', '.join(sorted(cs))}")
    for (kind, lv), c in sorted(refused.items()):
        print(f"refused by the tool (not counted): {kind} at {lv}: {c}")
    for m in misses:
        print("MISS", m)
    if not args.keep:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    with terminate_gracefully():  # SIGTERM/SIGHUP unwind like Ctrl-C: the lab is destroyed
        main()
