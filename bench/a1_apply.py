#!/usr/bin/env python3
"""Cost of telling the truth: A1 apply_config and paged outputs against the raw work, measured in
the same run, interleaved.

Rows (times in ms, p50 and p95 over --n calls after 3 warm-up calls):
- ``apply 10 FRR lines``: apply_config of ten FRR lines that change the router each time
  (alternating two values), through the in-process server -- lock, snapshot, per-line answers,
  read-backs -- against the floor: one ``vtysh -E -c ...`` of the same lines, and against the
  pasted stdin session the old implementation used (``vtysh`` reading the lines on stdin);
- ``apply own running config``: get_running_config of r1 applied back (a no-op, every line
  answered ``unchanged``) against one ``vtysh -E -c`` of its FRR lines;
- ``page 1.9 MB to the end``: A0 ``run_shell seq 1 300000`` over stdio plus every
  ``read_output`` page until the end, against the raw ``Lab.exec`` of the command; prints the
  pages, the largest JSON-RPC line and the bound.

Usage: sudo .venv/bin/python bench/a1_apply.py [--lab NAME] [--n 20]
"""

from __future__ import annotations

import argparse
import asyncio
import re
import sys
import time
import uuid
from pathlib import Path

import anyio
from mcp import Client

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from servers.a1_wrapper.vtysh import argv_for  # noqa: E402
from servers.common import ServerConfig  # noqa: E402
from servers.common.paging import DEFAULT_MAX_MESSAGE_BYTES  # noqa: E402
from servers.registry import build_server  # noqa: E402
from substrate import Lab, Topology  # noqa: E402


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))] * 1000


def row(name: str, xs: list[float], floor: list[float], label: str = "floor") -> None:
    print(f"{name:<34} {pct(xs, .5):9.1f} {pct(xs, .95):9.1f}   {label} {pct(floor, .5):8.1f}   ratio {pct(xs, .5) / pct(floor, .5):5.2f}")


def lines(k: int) -> list[str]:
    v = 2 + k % 2
    return ["router isis CORE", f"lsp-gen-interval {v}", "exit", "interface eth1", f"description bench value {v}",
            f"isis metric {20 + v}", "exit", f"ipv6 prefix-list BENCH seq 5 permit fd99:{v}::/64",
            f"route-map BENCH permit 10", f"set metric {v}"]  # fmt: skip


async def bench(lab: Lab, n: int) -> None:
    print(f"lab {lab.name}; {n} calls per row after 3 warm-up calls; times in ms")
    srv = build_server("A1", ServerConfig(lab=lab.name))
    new, floor, pasted = [], [], []
    async with Client(srv) as c:
        for k in range(n + 3):
            t = time.perf_counter()
            r = await c.call_tool("apply_config", {"commands": {"r1": lines(k)}})
            d = time.perf_counter() - t
            assert not r.is_error and not r.structured_content["devices"]["r1"]["rejected"], r
            sent = ["configure terminal", *lines(k + 1)]
            t = time.perf_counter()
            lab.exec("r1", argv_for(sent), timeout_s=30)
            d2 = time.perf_counter() - t
            t = time.perf_counter()
            lab.exec("r1", ["vtysh"], input="\n".join([*sent, "end"]) + "\n", timeout_s=30)
            d3 = time.perf_counter() - t
            if k >= 3:
                new.append(d)
                floor.append(d2)
                pasted.append(d3)
        row("apply 10 FRR lines", new, floor, "vtysh -c")
        row("", new, pasted, "stdin   ")
        cfg = (await c.call_tool("get_running_config", {"devices": ["r1"]})).structured_content["r1"]
        frr = [x for x in cfg.split("! ===== r1: kernel")[0].splitlines()[1:] if x.strip() and not x.startswith("!")]
        own, floor = [], []
        for k in range(n + 3):
            t = time.perf_counter()
            r = await c.call_tool("apply_config", {"commands": {"r1": cfg}})
            d = time.perf_counter() - t
            assert not r.is_error and not r.structured_content["devices"]["r1"]["applied"], r
            t = time.perf_counter()
            lab.exec("r1", argv_for(["configure terminal", *[" ".join(x.split()) for x in frr if x.strip() != "end"]]))
            d2 = time.perf_counter() - t
            if k >= 3:
                own.append(d)
                floor.append(d2)
        total = len([x for x in cfg.splitlines() if x.strip() and not x.startswith("!")])
        row(f"apply own running config ({total} l.)", own, floor, "vtysh -c")
    await paging(lab, max(3, n // 5))


async def paging(lab: Lab, n: int) -> None:
    import json

    from tests.servers_support import RawStdio

    served, raw, pages, biggest = [], [], 0, 0
    for _ in range(n):
        async with RawStdio.start("A0", lab.name) as c:
            t = time.perf_counter()
            res = await c.tool("run_shell", {"device": "r1", "command": "seq 1 300000"})
            out = res["structuredContent"]["stdout"]
            m = re.search(r'read_output\(output_id="(out-\d+)", offset=(\d+)\)', out[-300:])
            assert m, out[-300:]
            oid, off, got = m.group(1), int(m.group(2)), out[: int(m.group(2))]
            pages = 0
            while off is not None:
                page = (await c.tool("read_output", {"output_id": oid, "offset": off}))["structuredContent"]
                got += page["text"]
                off = page["next_offset"]
                pages += 1
            served.append(time.perf_counter() - t)
            biggest = max(biggest, *(len(x) for x in c.lines))
            assert len(got) == len("".join(f"{i}\n" for i in range(1, 300001))), len(got)
        t = time.perf_counter()
        lab.exec("r1", ["bash", "-c", "seq 1 300000"], confined=True)
        raw.append(time.perf_counter() - t)
    row("page 1.9 MB to the end (stdio)", served, raw, "raw exec")
    print(f"  {pages + 1} messages; largest JSON-RPC line {biggest} bytes (bound {DEFAULT_MAX_MESSAGE_BYTES}); "
          f"{json.dumps(len(got))} characters read")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lab", help="an existing line:N lab (default: a fresh line:3)")
    ap.add_argument("--n", type=int, default=20)
    a = ap.parse_args()
    if a.lab:
        anyio.run(bench, Lab.attach(a.lab), a.n)
        return
    with Lab.create(Topology.from_spec("line:3"), f"bench-a1-{uuid.uuid4().hex[:6]}") as lab:
        anyio.run(bench, lab, a.n)


if __name__ == "__main__":
    asyncio.get_event_loop_policy()  # asyncio is the anyio backend here
    main()
