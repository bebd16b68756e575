#!/usr/bin/env python3
"""MCP server overhead of the ANI servers: latency of a call through the server against the raw
work it wraps, measured in the same run, interleaved.

Calls:
- ``get_topology`` (A1): cheap, pure Python; raw = the tool function called directly;
- a show command: A1 ``execute_validation {"r1": "show version"}`` against the raw
  ``Lab.exec(r1, ["vtysh", "-E", "-c", "show version"])`` it performs;
- a shell command: A0 ``run_shell(r1, "true")`` against the raw confined ``Lab.exec``.

Paths: the SDK client in-process (initialize handshake and 2026-07-28 modes), the same with the
trajectory recorder on (fsync per line to a file on disk), and over stdio to ``harness serve``.
Prints p50/p95 per path and call and the overhead (server p50 - raw p50). Target: < 5 ms p50.

Usage: sudo .venv/bin/python bench/mcp_overhead.py [--lab NAME] [--n 200]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path

import anyio
from mcp import Client, StdioServerParameters

from servers.common import ServerConfig
from servers.registry import build_server
from substrate import Lab, Topology


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))] * 1000


async def measure(n: int, server_call: Callable[[], Awaitable[object]], raw_call: Callable[[], object]) -> tuple[list[float], list[float]]:
    srv, raw = [], []
    for i in range(n + 10):
        t = time.perf_counter()
        r = await server_call()
        d = time.perf_counter() - t
        assert not getattr(r, "is_error", False), r
        t = time.perf_counter()
        raw_call()
        d2 = time.perf_counter() - t
        if i >= 10:  # warm-up
            srv.append(d)
            raw.append(d2)
    return srv, raw


def row(path: str, call: str, srv: list[float], raw: list[float]) -> str:
    return (f"{path:<26} {call:<22} {pct(srv, .5):8.2f} {pct(srv, .95):8.2f} {pct(raw, .5):8.2f} {pct(raw, .95):8.2f} "
            f"{pct(srv, .5) - pct(raw, .5):9.2f}")  # fmt: skip


async def bench(lab: Lab, n: int) -> None:
    print(f"lab {lab.name}; {n} calls per row after 10 warm-up calls; times in ms")
    print(f"{'path':<26} {'call':<22} {'p50':>8} {'p95':>8} {'raw p50':>8} {'raw p95':>8} {'overhead':>9}")
    show_raw = lambda: lab.exec("r1", ["vtysh", "-E", "-c", "show version"], timeout_s=15)  # noqa: E731
    shell_raw = lambda: lab.exec("r1", ["bash", "-c", "true"], confined=True)  # noqa: E731
    with tempfile.TemporaryDirectory(prefix="anibench-bench-", dir=str(Path.home())) as tmp:
        for label, traj, mode in (("in-process legacy", None, "legacy"), ("in-process 2026-07-28", None, "auto"),
                                  ("in-process + recorder", Path(tmp) / "t.jsonl", "legacy")):  # fmt: skip
            a1 = build_server("A1", ServerConfig(lab=lab.name, trajectory=traj))
            topo_fn = a1._tool_manager.get_tool("get_topology").fn  # type: ignore[union-attr]
            async with Client(a1, mode=mode) as c:
                s, r = await measure(n, lambda: c.call_tool("get_topology", {}), topo_fn)
                print(row(label, "A1 get_topology", s, r))
                s, r = await measure(n, lambda: c.call_tool("execute_validation", {"commands": {"r1": "show version"}}), show_raw)
                print(row(label, "A1 show version", s, r))
            a1.close()
            a0 = build_server("A0", ServerConfig(lab=lab.name, trajectory=Path(tmp) / "a0.jsonl" if traj else None))
            async with Client(a0, mode=mode) as c:
                s, r = await measure(n, lambda: c.call_tool("run_shell", {"device": "r1", "command": "true"}), shell_raw)
                print(row(label, "A0 run_shell true", s, r))
            a0.close()
        params = StdioServerParameters(command=sys.executable, args=["-m", "harness.cli", "serve", "--ani", "A1", "--lab", lab.name])
        t0 = time.perf_counter()
        async with Client(params, mode="legacy") as c:
            print(f"(stdio: harness serve started and initialized in {(time.perf_counter() - t0) * 1000:.0f} ms)")
            topo_fn = build_server("A1", ServerConfig(lab=lab.name))._tool_manager.get_tool("get_topology").fn  # type: ignore[union-attr]
            s, r = await measure(n, lambda: c.call_tool("get_topology", {}), topo_fn)
            print(row("stdio legacy", "A1 get_topology", s, r))
            s, r = await measure(n, lambda: c.call_tool("execute_validation", {"commands": {"r1": "show version"}}), show_raw)
            print(row("stdio legacy", "A1 show version", s, r))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lab", help="use this deployed lab instead of creating a line:3 one")
    ap.add_argument("--n", type=int, default=200, help="calls per row")
    args = ap.parse_args()
    if args.lab:
        anyio.run(bench, Lab.attach(args.lab), args.n)
        return
    with Lab.create(Topology.from_spec("line:3"), f"bench-mcp-{uuid.uuid4().hex[:4]}") as lab:
        anyio.run(bench, lab, args.n)


if __name__ == "__main__":
    main()
