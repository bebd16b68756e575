#!/usr/bin/env python3
"""Campaign throughput: runs per hour of the scripted agent on the reference brownfield
(density 2, 25 routers), and the split of a run's wall time (reset, agent, observation), plus
the per-variant deploy the campaign pays once for all settings.

Target (issue 6): >= 100 runs/hour.

Usage: sudo .venv/bin/python bench/campaign.py [--ani A0,A1,A3-T] [--task change-set] [--variants 3]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from harness.campaign import make_spec, run_campaign
from harness.store import CampaignStore, RunStatus


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ani", default="A0,A1,A3-T")
    ap.add_argument("--task", default="change-set")
    ap.add_argument("--variants", type=int, default=3)
    ap.add_argument("--agent", default="scripted")
    ap.add_argument("--density", type=int, default=2)
    ap.add_argument("--manifest", default="manifests/srv6-brownfield.yaml")
    args = ap.parse_args()
    spec = make_spec(ani=args.ani.split(","), agent=[args.agent], model=[None], task=args.task, variants=args.variants,
                     manifest=args.manifest, seed=7, density=args.density, fault_rate=0.0, budget_steps=40,
                     wall_cap_s=300, agent_options={})
    with tempfile.TemporaryDirectory(prefix="anibench-bench-") as tmp:
        with CampaignStore(Path(tmp) / "db.sqlite") as store:
            t0 = time.monotonic()
            recs = run_campaign(spec, store, results_dir=Path(tmp) / "runs")
            total = time.monotonic() - t0
    done = [r for r in recs if r.status is RunStatus.done]
    mean = lambda xs: statistics.mean(xs) if xs else float("nan")  # noqa: E731
    runs_wall = sum(r.wall_s for r in done)
    print(f"{args.task} x {args.variants} variants x {len(spec.settings)} settings ({', '.join(spec.settings)}), "
          f"agent {args.agent}, density {args.density}: {len(done)}/{len(recs)} runs done in {total:.1f} s")
    print(f"throughput  {3600 * len(recs) / total:6.0f} runs/hour (target >= 100)")
    print(f"per run     {mean([r.wall_s for r in done]):.2f} s = reset {mean([r.reset_s for r in done]):.2f} + agent "
          f"{mean([r.agent_s for r in done]):.2f} + observe {mean([r.observe_s for r in done]):.2f} (+ bookkeeping)")
    print(f"per variant deploy + verify (shared by the settings): {(total - runs_wall) / args.variants:.2f} s")
    for s in spec.settings:
        rs = [r for r in done if r.setting == s]
        print(f"  {s:5s} agent {mean([r.agent_s for r in rs]):.2f} s, steps {mean([r.steps for r in rs]):.1f}, "
              f"pass {sum(bool(r.task_pass) for r in rs)}/{len(rs)}, damage-free {sum(bool(r.damage_free) for r in rs)}/{len(rs)}")


if __name__ == "__main__":
    main()
