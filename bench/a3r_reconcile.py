#!/usr/bin/env python3
"""A3-R reconciler figures (issue 13, item 7) on a brownfield (default: the reference, 25 routers):

1. commit-to-converged: the change-set task's 5-operation change (two additions, two moves, one
   removal; ``harness.tasks.make_variant("change-set", ...)``) written as records through the A3-R
   server (in-process MCP client), committed, and waited for until the reconciler has applied it
   (its status names the commit). Baseline in the same run: the same change set through A3-T's
   ``apply_change_set`` on the lab reset to its baseline; the ratio is printed;
2. drift detection latency: a tenant route deleted out of band; time until the reconciler has put
   it back (the route is there again) and until the reconcile is recorded;
3. the idle reconciler's CPU: user + system time of the reconciler process and of the commands it
   ran (``/proc/PID/stat`` utime, stime, cutime, cstime) over ``--idle-s`` seconds with nothing
   changing, as a share of one core (goal: under 5 %).

Usage: sudo .venv/bin/python bench/a3r_reconcile.py [--manifest manifests/srv6-brownfield.yaml] [--interval 5] [--idle-s 60]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

import anyio
from mcp import Client

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.a3t_apply import change_set_ops  # noqa: E402
from harness.tasks import make_variant  # noqa: E402
from servers.a3_intent.server import build_server as build_a3t  # noqa: E402
from servers.a3_intent.transaction import Engine  # noqa: E402
from servers.a3_reconciled import reconciler as rc  # noqa: E402
from servers.a3_reconciled.server import build_server as build_a3r  # noqa: E402
from servers.common import ServerConfig  # noqa: E402
from substrate import controllers  # noqa: E402
from substrate.scenario import build, load_manifest  # noqa: E402
from substrate.scenario.deploy import deploy_scenario, reset  # noqa: E402

TICK = os.sysconf("SC_CLK_TCK")
#: Device deadlines of both servers: generous, the same for A3-T and A3-R, so that a machine
#: shared with other labs is not taken for frozen devices (the tests' SLOW_MACHINE).
DEADLINES = {"capture_timeout_s": 30.0, "device_timeout_s": 60.0}


def cpu_s(pid: int) -> float:
    """CPU seconds of a process and its waited-for children."""
    f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return sum(int(x) for x in f[11:15]) / TICK


def poll(cond: Any, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(0.05)  # poll interval: the figure's resolution


async def via_a3t(lab: Any, ops: list[dict[str, Any]]) -> float:
    srv = build_a3t(ServerConfig(lab=lab.name, devices="all", options=dict(DEADLINES)), lab=lab)
    try:
        async with Client(srv, mode="legacy") as c:
            t0 = time.monotonic()
            r = await c.call_tool("apply_change_set", {"ops": ops})
            took = time.monotonic() - t0
            assert not r.is_error and r.structured_content["status"] == "applied", r
            return took
    finally:
        srv.close()


async def via_a3r(lab: Any, ops: list[dict[str, Any]], interval_s: float) -> tuple[float, float]:
    """(seconds from commit to converged, seconds of the edit calls)."""
    srv = build_a3r(ServerConfig(lab=lab.name, devices="all", options={"interval_s": interval_s, **DEADLINES}), lab=lab)
    try:
        async with Client(srv, mode="legacy") as c:
            t0 = time.monotonic()
            for op in ops:
                key = {"service_class": op["service_class"], "id": op["id"]}
                if op["op"] == "create":
                    r = await c.call_tool("write_record", {**key, "spec": op["spec"]})
                elif op["op"] == "modify":
                    r = await c.call_tool("patch_record", {**key, "patch": op["spec"]})
                else:
                    r = await c.call_tool("delete_record", key)
                assert not r.is_error, r
            edit_s = time.monotonic() - t0
            r = await c.call_tool("commit", {"message": "bench: 5-operation change"})
            assert not r.is_error, r
            t1 = time.monotonic()
            head = r.structured_content["commit"]
            epoch = Engine(lab).records.epoch()
            poll(lambda: rc.read_status(lab, epoch).applied_commit == head or rc.read_status(lab, epoch).failed_commit == head,
                 600, "the commit reconciled")  # fmt: skip
            st = rc.read_status(lab, epoch)
            if st.applied_commit != head:
                raise SystemExit(f"the commit was not applied: {st.failed_message}")
            return time.monotonic() - t1, edit_s
    finally:
        srv.close()


def drift_and_idle(lab: Any, sc: Any, interval_s: float, idle_s: float) -> tuple[float, float, float, tuple[float, float]]:
    """(seconds to route restored, seconds to reconcile recorded, idle CPU share of one core, the
    machine's 1-minute load average at the start and at the end of the idle window)."""
    srv = build_a3r(ServerConfig(lab=lab.name, devices="all", options={"interval_s": interval_s, **DEADLINES}), lab=lab)
    try:
        pid = int(controllers.info(lab.dir, rc.CONTROLLER)["pid"])  # type: ignore[index]
        epoch = Engine(lab).records.epoch()
        poll(lambda: rc.read_status(lab, epoch).reconciles >= 1, 300, "the first reconcile")
        # idle
        c0, t0, load0 = cpu_s(pid), time.monotonic(), os.getloadavg()[0]
        time.sleep(idle_s)  # the measurement window
        idle = (cpu_s(pid) - c0) / (time.monotonic() - t0)
        load = (load0, os.getloadavg()[0])
        # drift
        site = next(s for t in sc.tenants for s in t.sites)
        route = next(r for r in sc.node_config[site.pe].routes6 if r.startswith(site.prefix6) and " table " in r)
        w = route.split()
        table = w[w.index("table") + 1]
        events = rc.read_status(lab, epoch).drift_events
        t1 = time.monotonic()
        lab.exec(site.pe, ["ip", "-6", "route", "del", *w[: w.index("table") + 2]], timeout_s=10)
        poll(lambda: bool(lab.exec(site.pe, ["ip", "-6", "route", "show", "table", table, w[0]], timeout_s=10).stdout.strip()), 300,
             "the route back")  # fmt: skip
        back = time.monotonic() - t1
        poll(lambda: rc.read_status(lab, epoch).drift_events > events, 300, "the drift recorded")
        return back, time.monotonic() - t1, idle, load
    finally:
        srv.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--manifest", default="manifests/srv6-brownfield.yaml")
    ap.add_argument("--interval", type=float, default=rc.DEFAULT_INTERVAL_S)
    ap.add_argument("--idle-s", type=float, default=60.0)
    args = ap.parse_args()
    sc = build(load_manifest(args.manifest))
    lab = deploy_scenario(sc, f"bench-a3r-{os.getpid() % 10000}")
    try:
        v = make_variant("change-set", sc, 0)
        ops = change_set_ops(v)

        def setup() -> None:
            for step in v.setup:
                lab.check([lab.exec(step.node, step.argv)])

        setup()
        a3t_s = anyio.run(via_a3t, lab, ops)
        rep = reset(lab)
        assert rep.exact, rep.residual
        setup()
        a3r_s, edit_s = anyio.run(via_a3r, lab, ops, args.interval)
        rep = reset(lab)
        assert rep.exact, rep.residual
        back, recorded, idle, load = drift_and_idle(lab, sc, args.interval, args.idle_s)
    finally:
        lab.destroy()
    routers = len(sc.topology.routers)
    print(f"A3-R reconciler on {sc.name} ({routers} routers), reconcile period {args.interval:g} s")
    print(f"  5-op change, commit -> converged   {a3r_s:7.2f} s   (edit calls before it: {edit_s:.2f} s)")
    print(f"  same change via A3-T apply          {a3t_s:7.2f} s   ratio A3-R/A3-T {a3r_s / a3t_s:.2f}")
    print(f"  drift: route deleted -> back        {back:7.2f} s   (reconcile recorded after {recorded:.2f} s)")
    print(f"  idle reconciler CPU                 {100 * idle:7.2f} % of one core over {args.idle_s:g} s (goal < 5 %)")
    print(f"  machine load average (1 min) over the idle window: {load[0]:.2f} -> {load[1]:.2f} on {os.cpu_count()} cores "
          "(other labs share them: the times above are inflated by it, the CPU share much less)")


if __name__ == "__main__":
    main()
