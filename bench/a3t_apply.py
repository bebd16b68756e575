#!/usr/bin/env python3
"""A3-T plan and apply times of a 5-operation change set on the reference brownfield (25 routers,
density 2): the draft's pilot task (section 7.1), two additions, two moves and one removal on the
large live tenant, drawn by ``harness.tasks.make_variant("change-set", ...)``.

Each repeat takes a different variant: the lab is reset to its baseline, the variant's customer
side is set up (new CEs configured, moved sites' old CEs unplugged), then through the A3-T server
(in-process MCP client): ``plan_change_set``; ``apply_change_set`` while the first new site's CE
drops pings (validation fails: the change set is rolled back -- the undo path); the same apply
once the CE answers (committed); and the same apply again (idempotent: no device touched).
Reported per call: client wall time, and the server's split -- device scan + planning, device
time (snapshot, apply, rollback), pre-check (invariants in scope checked before applying, beside
the snapshot), journal writes (fsync'd per phase) and validation time (observer) -- plus the
invariants checked and devices touched. Afterwards the variant's hidden test cases and damage
checks are observed out of band (a correctness line, not timed). Run it against another
checkout (``PYTHONPATH=/path/to/other/checkout``) to compare versions in the same conditions.

Usage: sudo .venv/bin/python bench/a3t_apply.py [--repeat 3] [--manifest manifests/srv6-brownfield.yaml]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from typing import Any

import anyio
from mcp import Client

from harness.tasks import make_variant
from servers.a3_intent.inventory import circuits
from servers.a3_intent.server import build_server
from servers.common import ServerConfig
from substrate.scenario import build, load_manifest
from substrate.scenario.deploy import deploy_scenario, reset
from substrate.scenario.observer import observe


def change_set_ops(v: Any) -> list[dict[str, Any]]:
    """The scripted agent's A3-T change set for a change-set variant."""
    ch = v.changes
    ops: list[dict[str, Any]] = []
    for a in ch.add:
        spec = {"tenant": ch.tenant, "pe": a.pe, "pe_interface": a.pe_interface, "prefix6": a.prefix6}
        if a.prefix4:
            spec["prefix4"] = a.prefix4
        ops.append({"op": "create", "service_class": "tenant_site", "id": a.site, "spec": spec})
    ops += [{"op": "modify", "service_class": "tenant_site", "id": m.site, "spec": {"pe": m.pe, "pe_interface": m.pe_interface}}
            for m in ch.move]  # fmt: skip
    ops += [{"op": "delete", "service_class": "tenant_site", "id": r} for r in ch.remove]
    return ops


DROP_PINGS = ("table inet bench_drop {\n chain input {\n  type filter hook input priority 0; policy accept;\n"
              "  icmpv6 type echo-request drop\n  icmp type echo-request drop\n }\n}\n")  # fmt: skip


async def one_run(lab: Any, ops: list[dict[str, Any]], ce: str) -> dict[str, Any]:
    srv = build_server(ServerConfig(lab=lab.name), lab=lab)
    out: dict[str, Any] = {}
    async with Client(srv) as c:
        for name, tool in (("plan", "plan_change_set"), ("rollback", "apply_change_set"), ("apply", "apply_change_set"),
                           ("again", "apply_change_set")):  # fmt: skip
            if name == "rollback":
                lab.check([lab.exec(ce, ["nft", "-f", "-"], input=DROP_PINGS)])
            elif name == "apply":
                lab.check([lab.exec(ce, ["nft", "delete", "table", "inet", "bench_drop"])])
            t = time.monotonic()
            r = await c.call_tool(tool, {"ops": ops})
            wall = time.monotonic() - t
            if r.is_error:
                raise SystemExit(f"{tool} failed: {r.content[0].text}")  # type: ignore[union-attr]
            out[name] = {"wall": wall, **r.structured_content}  # type: ignore[dict-item]
    return out


def fmt(xs: list[float]) -> str:
    return f"{statistics.median(xs):6.2f} s" + (f"  (min {min(xs):.2f}, max {max(xs):.2f})" if len(xs) > 1 else "")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--manifest", default="manifests/srv6-brownfield.yaml")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    sc = build(load_manifest(args.manifest))
    t0 = time.monotonic()
    lab = deploy_scenario(sc, f"bench-a3t-{os.getpid() % 10000}")
    deploy_s = time.monotonic() - t0
    runs: list[dict[str, Any]] = []
    try:
        for k in range(args.repeat):
            v = make_variant("change-set", sc, k)
            for step in v.setup:
                lab.check([lab.exec(step.node, step.argv)])
            ops = change_set_ops(v)
            ce = circuits(sc)[(v.changes.add[0].pe, v.changes.add[0].pe_interface)].ce
            res = anyio.run(one_run, lab, ops, ce)
            if res["rollback"]["status"] != "rolled_back":
                raise SystemExit(f"variant {k}: the CE dropping pings did not roll back: {res['rollback']['message']}")
            applied = res["apply"]
            if applied["status"] != "applied":
                raise SystemExit(f"variant {k}: {applied['message']}")
            verdicts = observe(lab, v.test_cases + v.damage_checks)
            res["tests_failed"] = [x.id for x in verdicts if not x.ok]
            res["checks"] = (len(v.test_cases), len(v.damage_checks))
            res["ops"] = [f"{o['op']} {o['id']}" for o in ops]
            runs.append(res)
            rep = reset(lab)
            assert rep.exact, rep.residual
    finally:
        lab.destroy()

    print(f"{args.manifest}: {len(sc.topology.routers)} routers, {len(sc.topology.nodes)} nodes, density {sc.density}, "
          f"{len(sc.invariants)} baseline invariants; deployed in {deploy_s:.1f} s; {len(runs)} change-set variant(s)")  # fmt: skip
    for k, r in enumerate(runs):
        a = r["apply"]
        print(f"  variant {k}: {', '.join(r['ops'])} on {a['ops'][0]['service_class']}s of "
              f"{next(iter({o['id'][:2] for o in a['ops']}))}: {len(a['devices'])} devices, {a['validation']['checked']} invariants "
              f"checked; hidden test cases + damage checks ({r['checks'][0]} + {r['checks'][1]}) failing: {r['tests_failed'] or 'none'}")  # fmt: skip
    col = lambda call, key: [r[call]["timings"].get(key, 0.0) for r in runs]  # noqa: E731
    dev = [r["apply"]["timings"]["snapshot_s"] + r["apply"]["timings"]["apply_s"] + r["apply"]["timings"]["rollback_s"] for r in runs]
    print("plan_change_set (dry run)")
    print(f"  client wall        {fmt([r['plan']['wall'] for r in runs])}")
    print(f"  device scan        {fmt(col('plan', 'scan_s'))}   (kernel state of every router and CE, for resources in use)")
    print(f"  planning           {fmt(col('plan', 'plan_s'))}   (validate, allocate, render both inventories, diff, scope)")
    print("apply_change_set (one transaction)")
    print(f"  client wall        {fmt([r['apply']['wall'] for r in runs])}")
    print(f"  scan + plan        {fmt([x + y for x, y in zip(col('apply', 'scan_s'), col('apply', 'plan_s'), strict=True)])}")
    print(f"  device time        {fmt(dev)}   (snapshot {statistics.median(col('apply', 'snapshot_s')):.2f}, apply "
          f"{statistics.median(col('apply', 'apply_s')):.2f}, rollback {statistics.median(col('apply', 'rollback_s')):.2f})")  # fmt: skip
    checked = statistics.median(r["apply"]["validation"]["checked"] for r in runs)
    print(f"  pre-check          {fmt(col('apply', 'precheck_s'))}   (invariants in scope before applying, beside the snapshot)")
    print(f"  journal writes     {fmt(col('apply', 'journal_s'))}   (fsync'd per phase)")
    print(f"  validation time    {fmt(col('apply', 'validation_s'))}   (observer: {checked:.0f} invariants, real traffic)")
    print(f"  locks              {fmt(col('apply', 'lock_wait_s'))}")
    print("apply_change_set rolled back (the first new site's CE drops pings)")
    print(f"  client wall        {fmt([r['rollback']['wall'] for r in runs])}")
    print(f"  rollback           {fmt(col('rollback', 'rollback_s'))}   (undo on every touched device, checked)")
    print(f"  validation time    {fmt(col('rollback', 'validation_s'))}   (observer, and the recheck of the failures after the rollback)")
    print(f"apply again (no change, no device touched): client wall {fmt([r['again']['wall'] for r in runs])}, "
          f"status {sorted({r['again']['status'] for r in runs})}")  # fmt: skip


if __name__ == "__main__":
    main()
