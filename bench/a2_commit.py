"""A2 commit latency and NETCONF server memory (issue 12, item 7).

Deploys the density-2 25-router brownfield (or uses --lab NAME), then, in the same run:
- A2: per router of a 5-device change, NETCONF edit-config (candidate) + commit through
  ncclient; the change is the same on each device (a /64 route and a rule in a spare table);
  p50 of several rounds (apply, then remove); once device after device (one client doing one
  device at a time) and once with the five devices in parallel (one session per device, as an
  NMS or an agent making parallel tool calls does: the devices commit independently);
- A1: the same change through the A1 server's apply_config;
- the RSS of the lab's NETCONF server process.
Prints figures; asserts nothing. Targets: A2 commit of 5 devices < 2 s; RSS < 100 MiB.
"""

from __future__ import annotations

import argparse
import statistics
import time


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--lab", help="an existing lab (default: deploy the brownfield)")
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    from contextlib import nullcontext

    from substrate import netconf
    from substrate.lab import Lab

    if args.lab:
        ctx = nullcontext(Lab.attach(args.lab))
    else:
        from substrate.scenario import build, load_manifest
        from substrate.scenario.deploy import deploy_scenario

        sc = build(load_manifest("manifests/srv6-brownfield.yaml"), seed=7, density=2)
        ctx = deploy_scenario(sc, f"bench-a2-{int(time.time()) % 100000}")
    with ctx as lab:
        devs = lab.routers()[:5]
        eps = netconf.ensure_server(lab)
        from servers.a2_netconf.server import connect

        ms = {d: connect(eps[d], timeout_s=60) for d in devs}
        k = "urn:anibench:yang:kernel"

        def change(op: str) -> str:
            o = ' xmlns:nc="urn:ietf:params:xml:ns:netconf:base:1.0" nc:operation="remove"' if op else ""
            return (f'<config xmlns="urn:ietf:params:xml:ns:netconf:base:1.0"><kernel xmlns="{k}"><table><id>4090</id>'
                    f"<route{o}><destination>2001:db8:99::/64</destination><metric>1024</metric>"
                    + ("" if op else "<type>unreachable</type>") + f"</route></table><rule{o}><family>ipv6</family>"
                    "<priority>4090</priority><from>2001:db8:98::/64</from><to>all</to><iif>all</iif><fwmark>all</fwmark>"
                    + ("" if op else "<table>4090</table>") + "</rule></kernel></config>")

        from concurrent.futures import ThreadPoolExecutor

        def one(d: str, i: int) -> None:
            ms[d].edit_config(change("remove" if i % 2 else ""), target="candidate")
            ms[d].commit()

        a2, a2p = [], []
        pool = ThreadPoolExecutor(len(devs))
        for i in range(args.rounds * 2):
            t0 = time.monotonic()
            for d in devs:
                one(d, i)
            a2.append(time.monotonic() - t0)
        for i in range(args.rounds * 2):
            t0 = time.monotonic()
            list(pool.map(lambda d, i=i: one(d, i), devs))
            a2p.append(time.monotonic() - t0)
        pool.shutdown()
        from servers.common import ServerConfig
        from servers.registry import build_server

        srv = build_server("A1", ServerConfig(lab=lab.name))
        import anyio
        from mcp import Client

        a1 = []

        async def run_a1() -> None:
            async with Client(srv, mode="legacy") as c:
                for i in range(args.rounds * 2):
                    verb = "del" if i % 2 else "add"
                    cmds = {d: [f"ip -6 route {'del' if i % 2 else 'add'} unreachable 2001:db8:99::/64 table 4090",
                                f"ip -6 rule {verb} priority 4090 from 2001:db8:98::/64 lookup 4090"] for d in devs}
                    t0 = time.monotonic()
                    r = await c.call_tool("apply_config", {"commands": cmds})
                    a1.append(time.monotonic() - t0)
                    assert not r.is_error, r.content[0].text[:300]

        anyio.run(run_a1)
        srv.close()
        pid = netconf.server_pid(lab)
        rss = 0
        for line in open(f"/proc/{pid}/status"):
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1]) // 1024
        for m in ms.values():
            m.close_session()
        p2, p2p, p1 = statistics.median(a2), statistics.median(a2p), statistics.median(a1)
        print(f"A2 edit-config + commit, 5 devices one after another: p50 {p2:.2f} s (min {min(a2):.2f}, max {max(a2):.2f})")
        print(f"A2 edit-config + commit, 5 devices in parallel:       p50 {p2p:.2f} s (min {min(a2p):.2f}, max {max(a2p):.2f})")
        print(f"A1 apply_config of the same change, 5 devices:        p50 {p1:.2f} s; ratio A2/A1 {p2 / p1:.1f} "
              f"(one after another), {p2p / p1:.1f} (parallel)")
        print(f"NETCONF server of the {len(lab.routers())}-router lab: RSS {rss} MiB")


if __name__ == "__main__":
    main()
