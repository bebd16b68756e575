#!/usr/bin/env python3
"""Oracle sensitivity (issue 19 item 2, issue 36): inject each operator mistake kind of the noisy
agent (harness.agents.mistakes.KINDS) on the task classes at every level that can express it,
and print a table kind x level of detected / injected: an injection is detected when the run's
test cases or damage checks catch it (the run is not a clean success).

Each injection is one run of the noisy agent with ``kind=<kind>``: exactly one mistake of that
kind, at a change drawn by the run seed among those that can carry it. Not counted (listed
apart): injections no change of the variant could express (nothing to clean up in an
onboarding), and mistakes the level's tool refused (the agent redid the change without them:
the network never carried them). Before the first injection on a class, level and variant, a
clean run of the scripted agent there: one that is not a clean success is reported and its
cell skipped (its injections would say nothing about the oracle).

Which classes a cell (kind, level) runs on: with ``--per-kind N``, each cell takes the classes
in an order rotated by the cell's place (so that every class meets every kind somewhere) until
it holds ceil(N / the number of levels of LEVELS that can express the kind) counted injections
-- N counted injections per kind in all, spread over the levels; without it, every class. The
run prints exactly which cells ran on which classes.

Goal (issue 19, issue 36): every kind >= 0.95 detected at every level. Misses are printed with
the run directory and the mistake, to find the oracle's blind spot.

Usage: sudo .venv/bin/python bench/sensitivity.py [--levels A0,A1,A2,A3-T,A3-R,A4]
       [--classes onboarding,...] [--kinds ...] [--variants 1] [--first-variant 0] [--per-kind 10]
       [--manifest tests/data/small-campaign.yaml --seed 7 --density 1] [--keep DIR] [--json OUT]
       sudo .venv/bin/python bench/sensitivity.py --merge A.json B.json   (one table of several runs)
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

from harness.agents.mistakes import CLASS_INEXPRESSIBLE, INEXPRESSIBLE, KINDS
from harness.tasks import variant_skips

LEVELS = ("A0", "A1", "A2", "A3-T", "A3-R", "A4")


def cell_quota(kind: str, per_kind: int) -> int:
    """Counted injections a cell (kind, level) aims at: ``per_kind`` spread over the levels of
    :data:`LEVELS` that can express ``kind`` (harness.agents.mistakes.INEXPRESSIBLE)."""
    n = sum((kind, lv) not in INEXPRESSIBLE for lv in LEVELS)
    return math.ceil(per_kind / max(n, 1))


def rotated(classes: list[str], kind: str, level: str) -> list[str]:
    """``classes`` rotated by the cell's place in KINDS x LEVELS, so that cells with a small
    quota start on different classes."""
    k = KINDS.index(kind) * len(LEVELS) + (LEVELS.index(level) if level in LEVELS else 0)
    i = k % max(len(classes), 1)
    return classes[i:] + classes[:i]


def print_table(table: dict[str, dict[str, list[int]]], kinds: list[str], levels: list[str]) -> None:
    """The table kind x level: detected/injected per cell (``n/e``: the level cannot express the
    kind; ``-``: nothing counted), the fraction per kind, and the overall fraction."""
    print(f"{'kind':22s}" + "".join(f"{lv:>9s}" for lv in levels) + f"{'all':>10s}")
    tot = [0, 0]
    for kind in kinds:
        cells, k = [], [0, 0]
        for lv in levels:
            if (kind, lv) in INEXPRESSIBLE:
                cells.append(f"{'n/e':>9s}")
                continue
            det, cnt = table.get(kind, {}).get(lv, [0, 0])
            k[0] += det
            k[1] += cnt
            cells.append(f"{f'{det}/{cnt}':>9s}" if cnt else f"{'-':>9s}")
        tot[0] += k[0]
        tot[1] += k[1]
        frac = f"{k[0]}/{k[1]}={k[0] / k[1]:.2f}" if k[1] else "-"
        print(f"{kind:22s}" + "".join(cells) + f"{frac:>14s}")
    print(f"overall: {tot[0]}/{tot[1]} = {tot[0] / max(tot[1], 1):.3f} (goal: each kind >= 0.95 at every level)")
    print("n/e: the level cannot express the kind (harness.agents.mistakes.INEXPRESSIBLE)")


def merge(paths: list[str]) -> None:
    """Print one table of the JSON results of several runs of this bench (``--json``)."""
    table: dict[str, dict[str, list[int]]] = defaultdict(lambda: defaultdict(lambda: [0, 0]))
    levels: list[str] = []
    for p in paths:
        doc = json.loads(Path(p).read_text())
        print(f"{p}: {doc['command']} ({doc['runs']} runs, {doc['wall_s']} s{'' if doc.get('final') else ', stopped before the end'})")
        levels += [lv for lv in doc["levels"] if lv not in levels]
        for kind, row in doc["table"].items():
            for lv, (det, cnt) in row.items():
                table[kind][lv][0] += det
                table[kind][lv][1] += cnt
        for m in doc["misses"]:
            print("MISS", m)
    print_table(table, list(KINDS), [lv for lv in LEVELS if lv in levels])


def main() -> None:  # noqa: C901, PLR0915
    from harness.run import RunFailed, RunSpec, execute_run
    from harness.tasks import TASK_CLASSES, make_variant
    from substrate.scenario import build, load_manifest
    from substrate.scenario.deploy import deploy_scenario
    from substrate.signals import raise_if_interrupted

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--levels", default=",".join(LEVELS))
    ap.add_argument("--classes", default=",".join(TASK_CLASSES))
    ap.add_argument("--kinds", default=",".join(KINDS))
    ap.add_argument("--variants", type=int, default=1, help="variants per class (one injection per kind and level each)")
    ap.add_argument("--first-variant", type=int, default=0, help="the variants are FIRST .. FIRST+VARIANTS-1")
    ap.add_argument("--per-kind", type=int, default=None,
                    help="counted injections per kind, spread over the levels (module docstring); default: every class")
    ap.add_argument("--manifest", default="tests/data/small-campaign.yaml")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--density", type=int, default=1)
    ap.add_argument("--keep", default=None, help="keep the run directories here")
    ap.add_argument("--json", default=None, help="write the table, misses and command here (for --merge)")
    ap.add_argument("--merge", nargs="+", default=None, help="print one table of these --json files and exit")
    args = ap.parse_args()
    if args.merge:
        merge(args.merge)
        return
    levels, classes, kinds = args.levels.split(","), args.classes.split(","), args.kinds.split(",")
    command = " ".join(sys.argv)
    print(f"command: {command}", flush=True)
    root = Path(args.keep or tempfile.mkdtemp(prefix="sens-"))
    root.mkdir(parents=True, exist_ok=True)
    sc = build(load_manifest(Path(args.manifest)), seed=args.seed, density=args.density)
    vrange = range(args.first_variant, args.first_variant + args.variants)
    variants = {(c, v): make_variant(c, sc, v) for c in classes for v in vrange}
    # kind -> level -> [detected, counted]; and the runs left out
    table: dict[str, dict[str, list[int]]] = defaultdict(lambda: defaultdict(lambda: [0, 0]))
    refused: dict[tuple[str, str], int] = defaultdict(int)
    inexpressible: dict[tuple[str, str], set[str]] = defaultdict(set)
    ran: dict[tuple[str, str], list[str]] = defaultdict(list)
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

    clean: dict[tuple[str, str, int], bool] = {}
    no_reference: set[tuple[str, str, int]] = set()

    def dump(wall: float, final: bool = False) -> None:
        Path(args.json).write_text(json.dumps({"command": command, "levels": levels, "table": table, "misses": misses,
                                               "wall_s": round(wall), "runs": n, "final": final}, indent=1))

    def clean_ok(level: str, cls: str, v: int) -> bool:
        if (level, cls, v) not in clean and (why := variant_skips(variants[(cls, v)], [level]).get(level)):
            # no reference solution at this level (harness task validate skips it too): no clean
            # run can succeed, and it is no sign of a broken oracle
            clean[(level, cls, v)] = False
            no_reference.add((level, cls, v))
            print(f"no reference solution, skipped: {level} {cls} variant {v}: {why[:160]}", flush=True)
        if (level, cls, v) not in clean:
            try:
                rec, verdicts, _ = run(level, cls, v, "scripted", {}, f"clean/{level}/{cls}/{v}")
                clean[(level, cls, v)] = bool(rec.task_pass and rec.damage_free)
                bad = [x.id for x in verdicts if not x.ok][:6]
            except RunFailed as e:
                clean[(level, cls, v)], bad = False, [str(e)[:200]]
            if not clean[(level, cls, v)]:
                print(f"clean run not a clean success, skipped: {level} {cls} variant {v}: {bad}", flush=True)
        return clean[(level, cls, v)]

    with deploy_scenario(sc, f"sens{os.getpid() % 10000}") as lab:
        for kind in kinds:
            for level in levels:
                if (kind, level) in INEXPRESSIBLE:
                    continue
                quota = cell_quota(kind, args.per_kind) if args.per_kind else None
                for cls in rotated(classes, kind, level):
                    if (cls, level) in CLASS_INEXPRESSIBLE:
                        inexpressible[(kind, level)].add(cls)
                        continue
                    for v in vrange:
                        if quota is not None and table[kind][level][1] >= quota:
                            break
                        if not clean_ok(level, cls, v):
                            continue
                        key = f"{kind}/{level}/{cls}/{v}"
                        try:
                            rec, verdicts, made = run(level, cls, v, "noisy", {"rate": "0", "kind": kind}, key)
                        except RunFailed as e:
                            print(f"run failed {key}: {e}", flush=True)
                            continue
                        if made is None or made["inexpressible"] or not made["made"]:  # nothing injected
                            inexpressible[(kind, level)].add(cls)
                            print(f"{key:48s} not expressible" + ("" if made is None or made["inexpressible"]
                                                                else " (the noisy agent made no such mistake here)"), flush=True)
                            continue
                        if all(m["refused"] for m in made["made"]):
                            refused[(kind, level)] += 1
                            print(f"{key:48s} refused by the tool {made['made']}", flush=True)
                            continue
                        detected = not (rec.task_pass and rec.damage_free)
                        table[kind][level][0] += detected
                        table[kind][level][1] += 1
                        ran[(kind, level)].append(f"{cls}/{v}")
                        labelled[kind][0] += "specification_deviation" in rec.diagnostic_labels
                        labelled[kind][1] += 1
                        if not detected:
                            misses.append(f"{key}: {made['made']} -> clean success ({root / key})")
                        if args.json:  # kept current: a bench stopped half-way still leaves its table
                            dump(time.monotonic() - t0)
                        print(f"{key:48s} {'detected' if detected else 'MISSED'} {made['made']} {rec.diagnostic_labels} "
                              f"failed={[x.id for x in verdicts if not x.ok][:4]}", flush=True)
    wall = time.monotonic() - t0
    print(f"\ncommand: {command}")
    print(f"{n} runs in {wall:.0f} s; load average {os.getloadavg()[0]:.1f}; scenario {args.manifest} seed "
          f"{args.seed} density {args.density}, {args.variants} variant(s) per class"
          + (f", per kind {args.per_kind} (cell quota: {', '.join(f'{k} {cell_quota(k, args.per_kind)}' for k in kinds)})"
             if args.per_kind else ", every class per cell"))
    print_table(table, kinds, levels)
    print("diagnostic label specification_deviation set, per kind: " + ", ".join(
        f"{k} {labelled[k][0]}/{labelled[k][1]}" for k in kinds if labelled[k][1]))
    for (kind, lv), cs in sorted(ran.items()):
        print(f"counted: {kind} at {lv} on {', '.join(cs)}")
    for (kind, lv), cs in sorted(inexpressible.items()):
        print(f"not expressible in this variant: {kind} at {lv} in {', '.join(sorted(cs))}")
    for (kind, lv), c in sorted(refused.items()):
        print(f"refused by the tool (not counted): {kind} at {lv}: {c}")
    for (lv, cls, v), ok in sorted(clean.items()):
        if not ok:
            why = "no reference solution at the level" if (lv, cls, v) in no_reference else "clean run not a clean success"
            print(f"skipped ({why}): {lv} {cls} variant {v}")
    for m in misses:
        print("MISS", m)
    if args.json:
        dump(wall, final=True)
    if not args.keep:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    from substrate.signals import terminate_gracefully

    with terminate_gracefully():  # SIGTERM/SIGHUP unwind like Ctrl-C: the lab is destroyed
        main()
