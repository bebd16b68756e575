#!/usr/bin/env python3
"""Campaign throughput of the Ray executor on this machine against the local executor, in the
same run: the same campaign (scripted agent) run by

  local   harness campaign (one variant after the other, this process),
  ray x1  --executor ray on a one-node loopback Ray cluster, --labs-per-node 1,
  ray x2  the same cluster, --labs-per-node 2 (two labs at once on this host),

each as a fresh campaign in its own store. Prints wall time, runs per hour and the ratio to local;
the measured per-run cost (reset + agent + observe) and per-variant cost (deploy, verify, destroy:
what the settings share); and the load average of the host before and after (the machine may be
shared). Then the estimate of runs per hour on N hosts from those costs (README "Many machines").

Usage: sudo .venv/bin/python bench/campaign_ray.py [--variants 4] [--ani A0,A1] [--task onboarding]
         [--manifest tests/data/small-campaign.yaml] [--density 1]
"""

from __future__ import annotations

import argparse
import os
import sys
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from harness.cluster import loopback_cluster
from harness.store import CampaignStore, RunStatus

REPO = Path(__file__).resolve().parents[1]


def campaign(argv: list[str], db: Path, cid: str) -> tuple[float, list]:
    t0 = time.monotonic()
    r = subprocess.run(argv, cwd=REPO, capture_output=True, text=True)
    wall = time.monotonic() - t0
    if r.returncode != 0:
        raise SystemExit(f"{cid} failed: {r.stderr[-2000:]}")
    with CampaignStore(db) as store:
        return wall, store.runs(cid)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ani", default="A0,A1")
    ap.add_argument("--task", default="onboarding")
    ap.add_argument("--variants", type=int, default=4)
    ap.add_argument("--density", type=int, default=1)
    ap.add_argument("--manifest", default=str(REPO / "tests" / "data" / "small-campaign.yaml"))
    args = ap.parse_args()
    harness = str(Path(sys.executable).parent / "harness")
    load0 = os.getloadavg()
    results: dict[str, tuple[float, list]] = {}
    with tempfile.TemporaryDirectory(prefix="anibench-bench-ray-") as tmp:
        def argv(cid: str) -> list[str]:
            return [harness, "campaign", "--ani", args.ani, "--task", args.task, "--variants", str(args.variants),
                    "--manifest", args.manifest, "--density", str(args.density), "--seed", "7", "--db",
                    f"{tmp}/{cid}.sqlite", "--results", f"{tmp}/runs", "--id", cid, "--no-report"]

        results["local"] = campaign(argv("local"), Path(tmp, "local.sqlite"), "local")
        with loopback_cluster(1, cpus=os.cpu_count() or 1, temp_dir=Path(tmp, "ray")) as cluster:
            for n in (1, 2):
                cid = f"ray{n}"
                cmd = cluster.command([*argv(cid), "--executor", "ray", "--ray-address", cluster.address,
                                       "--labs-per-node", str(n)])
                results[f"ray x{n}"] = campaign(cmd, Path(tmp, f"{cid}.sqlite"), cid)
    load1 = os.getloadavg()
    settings = len(args.ani.split(","))
    planned = args.variants * settings
    print(f"{args.task} x {args.variants} variants x {settings} settings ({args.ani}), scripted agent, density "
          f"{args.density}, {Path(args.manifest).name}; {os.cpu_count()} CPUs; load average before "
          f"{load0[0]:.1f} / after {load1[0]:.1f} (1 min)")
    base = results["local"][0]
    mean = lambda xs: statistics.mean(xs) if xs else float("nan")  # noqa: E731
    for name, (wall, recs) in results.items():
        done = [r for r in recs if r.status is RunStatus.done]
        runs_wall = sum(r.wall_s for r in done)
        per_variant = (wall - runs_wall) / args.variants  # deploy, verify, destroy (+ start-up); serial runs only
        print(f"  {name:7s} {len(done)}/{planned} runs done in {wall:6.1f} s = {3600 * len(done) / wall:5.0f} runs/hour "
              f"(x{base / wall:.2f} of local); per run {mean([r.wall_s for r in done]):.2f} s (reset "
              f"{mean([r.reset_s for r in done]):.2f}, agent {mean([r.agent_s for r in done]):.2f}, observe "
              f"{mean([r.observe_s for r in done]):.2f})" + (f"; rest per variant {per_variant:.1f} s" if name != "ray x2" else ""))
    wall, recs = results["local"]
    run_s = mean([r.wall_s for r in recs])
    variant_s = wall / args.variants  # deploy + settings' runs + destroy, one variant on one lab
    print(f"estimate: one lab does a variant ({settings} runs) in {variant_s:.1f} s (runs {run_s:.1f} s each, deploy "
          f"and the rest {variant_s - settings * run_s:.1f} s): {3600 * settings / variant_s:.0f} runs/hour per lab; "
          f"N hosts x L labs each: about N x L x {3600 * settings / variant_s:.0f} runs/hour while each lab has its "
          f"cores (measured here: 2 labs on this host gave x{results['local'][0] / results['ray x2'][0]:.2f} of one "
          f"local lab)")


if __name__ == "__main__":
    main()
