#!/usr/bin/env python3
"""Containerlab import figures, against baselines measured in the same run.

Prints:
- translation: time to import a Containerlab file (parse with lines, inheritance, checks, FRR
  files, the export's defaults recognised) for the upstream frr01 example and for the export of
  grid:5x5, against building the same grid:5x5 model from its spec (``Topology.from_spec``);
- with ``--up FILE``: time to deploy an imported lab, split into bring-up (namespaces, links, FRR,
  exec commands) and the wait for its IGP adjacencies, and the time until the first ping between
  the given hosts gets a reply, against a generated lab with as many routers (line:N).

Usage: sudo .venv/bin/python bench/clab_import.py [--repeat 20] [--up frr01.clab.yml --ping pc1:192.168.13.2]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from substrate import Lab, Topology
from substrate.clab import load
from substrate.export import write_containerlab


def timed(fn, repeat: int) -> float:  # noqa: ANN001
    """Median seconds of ``fn()`` over ``repeat`` runs."""
    out = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return statistics.median(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--frr01", default="/work/shared/data/containerlab/frr01/frr01.clab.yml")
    ap.add_argument("--up", help="A Containerlab file to deploy (needs root).")
    ap.add_argument("--ping", help="SRC:ADDRESS to ping once the lab is up, e.g. pc1:192.168.13.2.")
    args = ap.parse_args()

    with tempfile.TemporaryDirectory() as d:
        grid = write_containerlab(Topology.from_spec("grid:5x5"), "grid", Path(d))
        base = timed(lambda: Topology.from_spec("grid:5x5"), args.repeat)
        t_grid = timed(lambda: load(grid), args.repeat)
        t_frr01 = timed(lambda: load(args.frr01), args.repeat) if Path(args.frr01).exists() else None
    print(f"baseline Topology.from_spec('grid:5x5'): {base * 1000:.1f} ms")
    print(f"import of the grid:5x5 export:           {t_grid * 1000:.1f} ms ({t_grid / base:.1f}x baseline)")
    if t_frr01 is not None:
        print(f"import of frr01 (6 nodes):               {t_frr01 * 1000:.1f} ms ({t_frr01 / base:.2f}x baseline)")

    if args.up:
        topo = load(args.up).topology
        stages: dict[str, float] = {}
        t0 = time.monotonic()

        def say(msg: str) -> None:
            stages[msg] = time.monotonic() - t0

        with Lab.create(topo, f"bench-clab-{int(t0) % 100000}", progress=say) as lab:
            up = time.monotonic() - t0
            first_ping = None
            if args.ping:
                src, dst = args.ping.split(":", 1)
                while time.monotonic() - t0 < up + 60:
                    if lab.exec(src, ["ping", "-n", "-c", "1", "-W", "1", dst], timeout_s=5).ok:
                        first_ping = time.monotonic() - t0
                        break
        igp = next((v for k, v in stages.items() if k.startswith("waiting")), up)
        n = len(topo.routers)
        t1 = time.monotonic()
        with Lab.create(Topology.from_spec(f"line:{max(n, 2)}"), f"bench-line-{int(t1) % 100000}"):
            gen = time.monotonic() - t1
        print(f"imported lab {topo.name}: up in {up:.1f} s (bring-up {igp:.1f} s, IGP adjacencies {up - igp:.1f} s)"
              + (f", first ping reply at {first_ping:.1f} s" if first_ping else ""))
        print(f"generated line:{max(n, 2)} (IS-IS, fast timers): up in {gen:.1f} s; ratio {up / gen:.1f}x "
              "(the imported lab's own OSPF timers: 40 s wait on broadcast links)")


if __name__ == "__main__":
    main()
