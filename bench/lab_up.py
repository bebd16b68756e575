#!/usr/bin/env python3
"""Lab bring-up and teardown figures for a topology (default grid:5x5), against a floor measured
in the same run.

Prints:
- anibench: time to converged (every router has every other router's loopback, locator and
  base-host prefixes in its kernel FIB), per-stage split, time to destroy, memory per router
  (RSS and PSS of the router's processes: FRR daemons + node init; on the eBPF data plane also
  its share of the lab's data-plane service's PSS and of the BPF programs and maps that came
  with the lab, ``bpftool`` memlock: run it alone, that count is a before/after difference);
- floor: the same topology built with the least possible work -- plain ``ip netns`` namespaces,
  one ``ip -batch`` of veths, FRR daemons started with ``ip netns exec ... -N`` (pathspaces
  instead of private mounts) and configured by the same ``vtysh -b`` (no mount/PID/UTS
  isolation, no SRv6 data plane) -- timed to the same convergence condition;
- ratio anibench / floor.

Usage: sudo .venv/bin/python bench/lab_up.py [--topology grid:5x5] [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from substrate import Lab, Topology, frr
from substrate import addressing as a
from substrate.backends.netns import ip_batch


def mem_of(pids: list[int]) -> tuple[float, float]:
    """(RSS, PSS) in MiB summed over ``pids``."""
    rss = pss = 0
    for p in pids:
        try:
            for line in Path(f"/proc/{p}/smaps_rollup").read_text().splitlines():
                if line.startswith("Rss:"):
                    rss += int(line.split()[1])
                elif line.startswith("Pss:"):
                    pss += int(line.split()[1])
        except OSError:
            continue
    return rss / 1024, pss / 1024


def netns_pids(ns: str) -> list[int]:
    out = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


def bpf_objects() -> dict[str, dict[int, int]]:
    """{"prog"|"map": {id: bytes_memlock}} of every BPF object on the machine (bpftool -j)."""
    out: dict[str, dict[int, int]] = {}
    for kind in ("prog", "map"):
        res = subprocess.run(["bpftool", "-j", kind, "show"], capture_output=True, text=True, check=False)
        out[kind] = {o["id"]: int(o.get("bytes_memlock", 0)) for o in json.loads(res.stdout or "[]")}
    return out


def service_pids(lab: Lab) -> list[int]:
    """The lab's data-plane service (eBPF): its supervisor and the supervisor's children."""
    from substrate.dataplane.ebpf import service

    sup = service.running(lab.dir)
    if sup is None:
        return []
    kids = []
    for st in Path("/proc").glob("[0-9]*/stat"):
        try:
            if int(st.read_text().rsplit(")", 1)[1].split()[1]) == sup:
                kids.append(int(st.parent.name))
        except (OSError, ValueError, IndexError):
            continue
    return [sup, *kids]


def run_anibench(topo: Topology, name: str) -> dict:
    before = bpf_objects() if shutil.which("bpftool") else {}
    t0 = time.monotonic()
    lab = Lab.create(topo, name)
    up = time.monotonic() - t0
    stages = dict(lab.record.meta.get("bringup_s", {}))
    mems = [mem_of(netns_pids(lab.state(r).netns)) for r in lab.routers()]
    after = bpf_objects() if before else {}
    bpf = sum(v for kind in after for i, v in after[kind].items() if i not in before[kind]) / 2**20
    svc = mem_of(service_pids(lab))[1]
    dataplane = lab.record.dataplane
    t1 = time.monotonic()
    lab.destroy()
    down = time.monotonic() - t1
    return {
        "up": up,
        "down": down,
        "stages": stages,
        "rss": statistics.mean(m[0] for m in mems),
        "pss": statistics.mean(m[1] for m in mems),
        "svc": svc / len(mems),
        "bpf": bpf / len(mems),
        "dataplane": dataplane,
    }


def run_floor(topo: Topology) -> dict:
    """Bare namespaces + veths + daemons, no isolation; converged by the same FIB condition."""
    tag = f"fl{os.getpid() % 100000}"
    nss = {n.name: f"anibench-floor-{tag}-{n.name}" for n in topo.nodes}
    work = Path(tempfile.mkdtemp(prefix="anibench-floor-"))
    t0 = time.monotonic()
    try:
        ip_batch([f"netns add {ns}" for ns in nss.values()])
        for ns in nss.values():
            subprocess.run(["ip", "netns", "exec", ns, "sysctl", "-qw", "net.ipv6.conf.all.forwarding=1",
                            "net.ipv6.conf.all.accept_dad=0", "net.ipv6.conf.default.accept_dad=0"], check=True)
        ip_batch([f"link add name {lk.a.interface} netns {nss[lk.a.node]} type veth peer name {lk.b.interface} "
                  f"netns {nss[lk.b.node]}" for lk in topo.links])
        for n in topo.nodes:
            lines = ["link set lo up"] + [f"link set {lk.endpoint_of(n.name).interface} up" for lk in topo.links_of(n.name)]
            if n.is_router:
                lines += ["link add sr0 type bridge", "link set sr0 up"]
            ip_batch(lines, netns=nss[n.name])
        procs = []
        for r in topo.routers:
            ps = f"{tag}{r.name}"
            conf_dir, run_dir = Path("/etc/frr") / ps, Path("/var/run/frr") / ps
            for d in (conf_dir, run_dir):
                d.mkdir(parents=True, exist_ok=True)
                shutil.chown(d, "frr", "frr")
            (conf_dir / "frr.conf").write_text(frr.render_router(topo, r.name))
            (conf_dir / "vtysh.conf").write_text(frr.VTYSH_CONF)
            script = "; ".join(f"/usr/lib/frr/{d} -d -N {ps} -A 127.0.0.1" for d in frr.BASE_DAEMONS)
            procs.append(subprocess.Popen(
                ["ip", "netns", "exec", nss[r.name], "bash", "-c", f"{script}; vtysh -N {ps} -b"],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        for p in procs:
            p.wait()
        deadline = time.monotonic() + 120
        pending = {r.name for r in topo.routers}
        expected = {r.name: _expected(topo, r.name) for r in topo.routers}
        while pending and time.monotonic() < deadline:
            for rt in list(pending):
                out = subprocess.run(["ip", "-n", nss[rt], "-6", "-j", "route", "show"], capture_output=True, text=True).stdout
                have = {x["dst"] if "/" in x["dst"] else x["dst"] + "/128" for x in json.loads(out or "[]")}
                if expected[rt] <= have:
                    pending.discard(rt)
            if pending:
                time.sleep(0.1)
        up = time.monotonic() - t0
        if pending:
            up = float("nan")
        return {"up": up}
    finally:
        for ns in nss.values():
            for p in netns_pids(ns):
                try:
                    os.kill(p, 9)
                except ProcessLookupError:
                    pass
        ip_batch([f"netns del {ns}" for ns in nss.values()])
        shutil.rmtree(work, ignore_errors=True)
        for r in topo.routers:
            shutil.rmtree(Path("/etc/frr") / f"{tag}{r.name}", ignore_errors=True)
            shutil.rmtree(Path("/var/run/frr") / f"{tag}{r.name}", ignore_errors=True)


def _expected(topo: Topology, router: str) -> set[str]:
    out = set()
    for n in topo.routers:
        if n.name != router and n.node_id is not None:
            out |= {str(a.loopback(n.node_id).network), str(a.locator(n.node_id))}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--topology", default="grid:5x5")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    topo = Topology.from_spec(args.topology)
    runs, floors = [], []
    for i in range(args.repeat):
        floors.append(run_floor(topo))
        runs.append(run_anibench(topo, f"bench-up-{os.getpid() % 10000}-{i}"))
    med = lambda xs: statistics.median(xs)  # noqa: E731
    up, down, floor = med([r["up"] for r in runs]), med([r["down"] for r in runs]), med([f["up"] for f in floors])
    print(f"topology {args.topology}: {len(topo.routers)} routers, {len(topo.hosts)} hosts, {len(topo.links)} links; "
          f"median of {args.repeat} runs")
    print(f"anibench  converged in {up:6.2f} s  (stages: " + ", ".join(
        f"{k} {med([r['stages'].get(k, 0) for r in runs]):.2f}" for k in runs[0]["stages"]) + ", rest = IS-IS convergence)")
    print(f"floor     converged in {floor:6.2f} s  (bare netns + veth + daemons, same convergence condition)")
    print(f"ratio     anibench / floor = {up / floor:.2f}   (target <= 1.5)")
    print(f"destroy   {down:6.2f} s   (target < 3 s)")
    pss, svc, bpf = (med([r[k] for r in runs]) for k in ("pss", "svc", "bpf"))
    print(f"memory    per router: RSS {med([r['rss'] for r in runs]):.1f} MiB, PSS {pss:.1f} MiB (FRR, node init)"
          f" + data-plane service {svc:.1f} MiB + BPF programs and maps {bpf:.2f} MiB = {pss + svc + bpf:.1f} MiB"
          f"   (data plane {runs[0]['dataplane']}; target < 20 MiB)")


if __name__ == "__main__":
    main()
