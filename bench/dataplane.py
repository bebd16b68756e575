#!/usr/bin/env python3
"""The eBPF SRv6 data plane's figures (issue 34, Deliver item 5), each against a baseline measured
in the same run, on one lab (``line:3`` by default: h1 - r1 - r2 - r3 - h3, FRR + IS-IS).

Prints:
- throughput: TCP bulk (iperf3, one stream, ``--seconds`` each) from h1 to h3, alternately over
  plain IPv6 forwarding and over SRv6 on the same veths -- r1 H.Encaps to the uSID container
  ``<r2><r3><DT6>`` (End with NEXT-C-SID at r2, End.DT6 at r3, the inner packet delivered by
  the main table) --, median of ``--repeat`` each; ratio SRv6 / plain (target >= 0.8). The
  return path (ACKs) is plain IPv6 both times. The router-router links get MTU 9000 first, as
  SRv6 cores are run: at the lab's 1500 the encapsulated full-size packets do not fit, and on
  both data planes the Packet Too Big goes to the encapsulating router, not to the sender.
- 1,000 SRv6 routes in one ``ip -batch`` inside r1 (``encap seg6 mode encap``, through the
  node's ``ip``, shim and the lab's data-plane service), against 1,000 plain routes the same way;
  wall seconds (target < 2 s) and the ratio. Twice: all to one segment list (one shared program
  instance), and each to a segment list of its own (one program each: the worst case).

The data plane is the one ``--dataplane`` (default: auto) picks; the kernel plane prints the same
figures for comparison. Memory per router (programs and maps counted) is bench/lab_up.py's.

Usage: sudo .venv/bin/python bench/dataplane.py [--topology line:3] [--repeat 3] [--seconds 4]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from substrate import Lab, Topology  # noqa: E402
from substrate import addressing as a  # noqa: E402
from substrate.dataplane import ENV, require  # noqa: E402

DT6_FUNCTION = 0xE000  # a function of r3's locator for the bench's End.DT6 SID


def iperf(lab: Lab, src: str, dst: str, seconds: float) -> float:
    """Gbit/s of one iperf3 TCP stream from node ``src`` to ``dst`` (a server), receiver side."""
    res = lab.exec(src, ["iperf3", "-6", "-J", "-c", dst, "-t", str(seconds), "-O", "1"], timeout_s=seconds + 30)
    if res.returncode != 0:
        raise SystemExit(f"iperf3 client failed: {res.stderr.strip() or res.stdout[-400:]}")
    return json.loads(res.stdout)["end"]["sum_received"]["bits_per_second"] / 1e9


def batch_seconds(lab: Lab, node: str, lines: list[str]) -> float:
    """Wall seconds of ``ip -6 -batch -`` with ``lines`` in ``node`` (its own ``ip``)."""
    t0 = time.monotonic()
    lab.check([lab.exec(node, ["ip", "-6", "-batch", "-"], input="\n".join(lines) + "\n", timeout_s=300)])
    return time.monotonic() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--topology", default="line:3")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--routes", type=int, default=1000)
    ap.add_argument("--dataplane", default=None)
    args = ap.parse_args()
    choice = require(args.dataplane)
    os.environ[ENV] = choice.dataplane  # the lab below takes it
    print(choice.line())
    topo = Topology.from_spec(args.topology)
    lab = Lab.create(topo, f"bench-dp-{os.getpid() % 10000}")
    try:
        routers = lab.routers()
        n = len(routers)
        for lk in topo.links:
            if topo.node(lk.a.node).is_router and topo.node(lk.b.node).is_router:
                for ep in (lk.a, lk.b):
                    lab.check([lab.exec(ep.node, ["ip", "link", "set", "dev", ep.interface, "mtu", "9000"])])

        first, last = routers[0], routers[-1]
        src_host, dst_host = topo.base_hosts_of(first)[0], topo.base_hosts_of(last)[0]
        dst = lab.exec(dst_host, ["ip", "-6", "-j", "addr", "show", "scope", "global"]).stdout
        dst = next(i["local"] for x in json.loads(dst) for i in x["addr_info"] if i["family"] == "inet6")
        ids = [topo.node(r).node_id for r in routers]
        (segs,) = map(str, a.usid_segment_list(ids[1:-1], ids[-1], DT6_FUNCTION))  # r2's uN, r3's uN, uDT6
        sid = str(a.function_sid(ids[-1], DT6_FUNCTION))
        lab.check([lab.exec(last, ["ip", "-6", "route", "add", sid, "encap", "seg6local", "action",
                                   "End.DT6", "table", "254", "dev", "sr0"])])
        lab.check([lab.exec(dst_host, ["iperf3", "-s", "-D", "-B", dst, "-I", "/tmp/iperf3.pid"])])
        try:
            plain, srv6 = [], []
            route = ["ip", "-6", "route", "replace", f"{dst}/128", "encap", "seg6", "mode", "encap", "segs", segs,
                     "dev", "sr0"]
            for _ in range(args.repeat):
                lab.exec(first, ["ip", "-6", "route", "del", f"{dst}/128"])
                plain.append(iperf(lab, src_host, dst, args.seconds))
                lab.check([lab.exec(first, route)])
                srv6.append(iperf(lab, src_host, dst, args.seconds))
            lab.exec(first, ["ip", "-6", "route", "del", f"{dst}/128"])
        finally:
            lab.exec(dst_host, ["sh", "-c", "kill $(cat /tmp/iperf3.pid)"])

        k = args.routes
        t_plain = batch_seconds(lab, first, [f"route add fd99:{i >> 8:x}:{i & 0xFF:x}::/64 dev sr0"
                                             for i in range(k)])
        t_one = batch_seconds(lab, first, [f"route add fd98:{i >> 8:x}:{i & 0xFF:x}::/64 encap seg6 mode encap "
                                           f"segs {segs} dev sr0" for i in range(k)])
        t_own = batch_seconds(lab, first, [f"route add fd97:{i >> 8:x}:{i & 0xFF:x}::/64 encap seg6 mode encap "
                                           f"segs {segs},fcbb:bb00:{i + 1:x}:: dev sr0" for i in range(k)])
        shown = lab.exec(first, ["ip", "-6", "route", "show"], max_output=1 << 24).stdout.count("encap seg6 mode encap")
    finally:
        lab.destroy()

    med = statistics.median
    print(f"topology {args.topology} ({n} routers, core MTU 9000); data plane {choice.dataplane}; median of {args.repeat}")
    print(f"throughput  plain IPv6 {med(plain):6.2f} Gbit/s   SRv6 (H.Encaps, End NEXT-C-SID, End.DT6) "
          f"{med(srv6):6.2f} Gbit/s   ratio {med(srv6) / med(plain):.2f}   (target >= 0.8)")
    print(f"            runs: plain {', '.join(f'{x:.2f}' for x in plain)}; SRv6 {', '.join(f'{x:.2f}' for x in srv6)}")
    print(f"routes      {k} plain routes in one batch {t_plain:5.2f} s; {k} SRv6 routes, one segment list "
          f"{t_one:5.2f} s (ratio {t_one / t_plain:.1f}), a segment list each {t_own:5.2f} s (ratio "
          f"{t_own / t_plain:.1f})   (target < 2 s; {shown} SRv6 routes shown after)")


if __name__ == "__main__":
    main()
