#!/usr/bin/env python3
"""Observer throughput: time to check every baseline invariant of a deployed brownfield.

Deploys the reference manifest at a density giving at least --min-invariants invariants, then
times full observation passes. Prints the pass time (median), invariants per second, and the
slowest kinds. Target (issue 3): 500 invariants in < 5 s.

Usage: sudo .venv/bin/python bench/observer.py [--manifest manifests/srv6-brownfield.yaml] [--min-invariants 500]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections import defaultdict

from substrate.scenario import build, load_manifest
from substrate.scenario.deploy import deploy_scenario
from substrate.scenario.observer import observe


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--manifest", default="manifests/srv6-brownfield.yaml")
    ap.add_argument("--min-invariants", type=int, default=500)
    ap.add_argument("--passes", type=int, default=3)
    args = ap.parse_args()
    m = load_manifest(args.manifest)
    density = 1
    sc = build(m, density=density)
    while len(sc.invariants) < args.min_invariants and density < 20:
        density += 1
        sc = build(m, density=density)
    print(f"{args.manifest} density {density}: {len(sc.topology.nodes)} nodes, {len(sc.invariants)} invariants")
    t0 = time.monotonic()
    lab = deploy_scenario(sc, f"bench-obs-{os.getpid() % 10000}", verify=False)
    print(f"deployed in {time.monotonic() - t0:.1f} s")
    try:
        times, per_kind = [], defaultdict(list)
        for _ in range(args.passes):
            t = time.monotonic()
            verdicts = observe(lab, sc.invariants)
            times.append(time.monotonic() - t)
            for v in verdicts:
                per_kind[v.kind].append(v.duration_s)
            failed = sum(not v.ok for v in verdicts)
        med = statistics.median(times)
        print(f"observe: {len(sc.invariants)} invariants in {med:.2f} s (median of {args.passes}; "
              f"{len(sc.invariants) / med:.0f}/s; {failed} failed)   target: 500 in < 5 s")
        print("per kind (count, mean s per check): " + ", ".join(
            f"{k} {len(v) // args.passes} x {statistics.mean(v):.2f}" for k, v in sorted(per_kind.items())))
    finally:
        lab.destroy()


if __name__ == "__main__":
    main()
