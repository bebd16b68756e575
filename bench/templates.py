#!/usr/bin/env python3
"""Validate every protocol template (harness/templates/library) at every instance and level in
one real lab: the reference solution of each level applied by the scripted operator through the
level's MCP server, every hidden test case passing and no baseline invariant broken
(NetConfArena section IV-C; ``harness task validate TEMPLATE`` for one template). Prints the pass
table (template x level: valid instances / instances, mean seconds per run, mean configuration
F1) and the load average; exits 1 when any instance is invalid or refused.

Usage: sudo .venv/bin/python bench/templates.py [--instances 5] [--ani A0,A1] [--only T1,T2]
       [--lab NAME]  (an already deployed scenario lab; default: deploy tests/data/templates-small.yaml)
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from harness.templates.tasks import templates  # noqa: E402
from harness.templates.validate import validate_template  # noqa: E402
from substrate.lab import Lab  # noqa: E402
from substrate.scenario import build, load_manifest  # noqa: E402
from substrate.scenario.deploy import deploy_scenario, load_scenario  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--instances", type=int, default=5)
    ap.add_argument("--ani", default="A0,A1")
    ap.add_argument("--only", default="")
    ap.add_argument("--lab", default=None)
    ap.add_argument("--manifest", default=str(REPO / "tests" / "data" / "templates-small.yaml"))
    ap.add_argument("--seed", type=int, default=7)
    a = ap.parse_args()
    names = [x for x in a.only.split(",") if x] or sorted(templates())
    levels = [x for x in a.ani.split(",") if x]
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="bench-templates-") as tmp, contextlib.ExitStack() as stack:
        if a.lab:
            lab = Lab.attach(a.lab)
            sc = load_scenario(lab)
        else:
            sc = build(load_manifest(a.manifest), seed=a.seed)
            lab = stack.enter_context(deploy_scenario(sc, f"bench-tpl-{os.getpid() % 100000}"))
        print(f"lab ready in {time.monotonic() - t0:.1f} s; load {os.getloadavg()[0]:.1f}", flush=True)
        rows = []
        for name in names:
            got = validate_template(lab, sc, name, levels, Path(tmp), instances=a.instances)
            for r in got:
                if r.status != "valid":
                    print(f"  {r.template} #{r.instance} {r.level}: {r.status} {r.detail}", flush=True)
            rows += got
    print(f"\n{'template':22} {'family':9} " + " ".join(f"{lv:>20}" for lv in levels))
    for name in names:
        cells = []
        for lv in levels:
            rs = [r for r in rows if r.template == name and r.level in (lv, "-")]
            ok = sum(r.status == "valid" for r in rs)
            secs = [r.seconds for r in rs if r.seconds]
            f1 = [r.config_f1 for r in rs if r.config_f1 is not None]
            skipped = all(r.status == "skipped" for r in rs) and rs
            cells.append("skipped" if skipped else f"{ok}/{len(rs)} {statistics.mean(secs) if secs else 0:5.1f}s "
                         f"F1 {statistics.mean(f1) if f1 else float('nan'):.2f}")
        fam = next((r.family for r in rows if r.template == name and r.family), "")
        print(f"{name:22} {fam:9} " + " ".join(f"{c:>20}" for c in cells))
    bad = [r for r in rows if r.status in ("INVALID", "refused")]
    valid = sum(r.status == "valid" for r in rows)
    print(f"\n{valid} valid, {len(bad)} invalid or refused, {sum(r.status == 'skipped' for r in rows)} skipped; "
          f"{time.monotonic() - t0:.0f} s in all; load average {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
