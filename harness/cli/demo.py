"""``harness demo``: the main job on the embedded default substrate, end to end, in one command."""

from __future__ import annotations

import time
from typing import Annotated

import typer

from harness.cli.common import friendly_errors, out


@friendly_errors
def demo(
    topology: Annotated[str, typer.Option("--topology", "-t", help="Topology spec.")] = "grid:5x5",
) -> None:
    """Deploy a lab, show IS-IS and an SRv6 uSID-steered ping with its per-SID counters, destroy it."""
    import json

    from substrate import Lab, Topology
    from substrate import addressing as a

    topo = Topology.from_spec(topology)
    pes = [n for n in topo.routers if n.role.value == "PE" and any(h for h in topo.hosts if topo.gateway_of(h.name)[0].name == n.name)]
    if len(pes) < 2:
        out.print("demo needs a topology with at least two PEs with hosts")
        raise typer.Exit(2)
    src, dst = pes[0], pes[-1]
    via = next((r for r in topo.routers if r.role.value == "P"), topo.routers[len(topo.routers) // 2])
    t0 = time.monotonic()
    with Lab.create(topo, f"demo-{int(time.time()) % 100000}") as lab:
        out.print(f"lab up: {len(topo.routers)} routers, {len(topo.hosts)} hosts, converged in {time.monotonic() - t0:.1f} s")
        nbrs = lab.vtysh(via.name, "show isis neighbor").stdout.count(" Up ")
        out.print(f"{via.name}: {nbrs} IS-IS adjacencies up; locator {a.locator(via.node_id)} installed as End (NEXT-C-SID)")
        h_src = next(h.name for h in topo.hosts if topo.gateway_of(h.name)[0].name == src.name)
        h_dst = next(h.name for h in topo.hosts if topo.gateway_of(h.name)[0].name == dst.name)
        dst_net = a.base_host_prefix(dst.node_id, 0)
        dt6 = a.function_sid(dst.node_id, 0xE000)
        segs = a.usid_segment_list([via.node_id], dst.node_id, 0xE000)
        lab.check([lab.exec(dst.name, ["ip", "-6", "route", "add", str(dt6), "encap", "seg6local", "action", "End.DT6",
                                       "table", "main", "count", "dev", "sr0"])])
        first_if = topo.links_of(src.name)[0].endpoint_of(src.name).interface
        lab.check([lab.exec(src.name, ["ip", "-6", "route", "add", str(dst_net), "encap", "seg6", "mode", "encap.red",
                                       "segs", ",".join(map(str, segs)), "dev", first_if, "metric", "1"])])
        ping = lab.exec(h_src, ["ping", "-6", "-c", "5", "-i", "0.1", "-W", "1", str(dst_net.network_address + 2)])
        stats = json.loads(lab.exec(via.name, ["ip", "-6", "-s", "-j", "route", "show", str(a.locator(via.node_id))]).stdout)
        count = sum(x["stats64"]["packets"] for x in stats if x.get("encap") == "seg6local")
        out.print(f"{h_src} -> {h_dst} steered by uSID container {segs[0]} (via {via.name}): "
                  f"ping {'ok' if ping.ok else 'FAILED'}, {via.name} End counter = {count} packets")
    out.print(f"lab destroyed; total {time.monotonic() - t0:.1f} s")
