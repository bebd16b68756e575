#!/usr/bin/env python3
"""HTML report with trajectory pages: time to build the page and its size, against the page
without trajectory pages (the baseline, measured in the same run), for a campaign of N runs with
full-budget trajectories (40 calls, results of a few KiB), a fault every few steps and a
brownfield-sized verdict list (500 damage checks, a few violated in the A0 runs). Also the time of the three
exports over the same runs. No lab needed: the run files are written as a run writes them.

Usage: .venv/bin/python bench/report_html.py [--runs 100] [--calls 40] [--checks 500]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

from harness.export import export
from harness.report import build_report
from harness.report_html import to_html
from harness.store import CampaignStore, RunRecord, run_key

CID = "bench"


def write_run(root: Path, setting: str, v: int, calls: int, checks: int, damaged: bool) -> RunRecord:
    d = root / setting / f"v{v}"
    d.mkdir(parents=True)
    traj = d / "trajectory.jsonl"
    with traj.open("w") as f:
        for seq in range(1, calls + 1):
            tool = "submit" if seq == calls else "run_shell"
            f.write(json.dumps({"schema_version": 1, "seq": seq, "level": "A0", "tool": tool,
                                "arguments": {"device": f"r{seq % 9 + 1}", "command": "ip -6 route show " * 4},
                                "kind": "submit" if tool == "submit" else "validation", "is_error": seq % 7 == 0,
                                "tool_error": seq % 7 == 0, "result": "fcbb:bb00:1::/48 via fe80::1 dev eth1\n" * 80,
                                "error": None, "started_at": 0.0, "ended_at": 0.1, "duration_s": 0.1}) + "\n")
    verdicts = [{"id": f"inv/{i}", "kind": "reach", "service": "t1", "ok": not damaged or i % 97 != 5, "detail": "c1 -> c2",
                 "evidence": [{"node": "c1", "command": "ping -6 fd00::2", "exit_code": 1, "output": "x" * 400}]}
                for i in range(checks + 10)]
    (d / "verdicts.json").write_text(json.dumps(verdicts))
    (d / "agent.json").write_text(json.dumps({"tokens_in": 10000, "events": []}))
    (d / "hai.json").write_text(json.dumps({"prompt": "do it", "files": {"request.yaml": "a: 1\n" * 50}}))
    (d / "tools.json").write_text(json.dumps({"instructions": "rules", "tools": [
        {"name": "run_shell", "description": "Run.", "inputSchema": {"type": "object"}},
        {"name": "submit", "description": "Submit.", "inputSchema": {"type": "object"}}]}))
    faults = [{"time": 0.0, "step": s, "fault": f"f{s}", "kind": "link_down", "action": a, "detail": "r1 eth1 down"}
              for s in range(3, calls, 6) for a in ("inject", "clear")]
    now = datetime.now(UTC)
    violated = [v["id"] for v in verdicts[10:] if not v["ok"]]
    return RunRecord(campaign_id=CID, run_key=run_key(CID, setting, v), factor="ani", setting=setting,
                     task_class="change-set", variant=v, scenario_seed=v, fault_seed=v, density=2, fault_rate=0.3,
                     budget_steps=40, agent="openai", level="A0", status="done", task_pass=True, test_case_score=1.0,
                     test_cases_passed=10, test_cases_total=10, damage_free=not violated, violated_invariants=violated,
                     completion_mode="correct_submission", steps=calls, faults=faults, trajectory_path=str(traj),
                     started_at=now, finished_at=now)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=100)
    ap.add_argument("--calls", type=int, default=40)
    ap.add_argument("--checks", type=int, default=500)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="anibench-bench-") as tmp:
        root = Path(tmp)
        with CampaignStore(root / "db.sqlite") as store:
            store.create_campaign(CID, {"factor": "ani", "ani": ["A0", "A3-T"]})
            for i in range(args.runs):
                setting, v = ("A0", "A3-T")[i % 2], i // 2
                rec = write_run(root / "runs", setting, v, args.calls, args.checks, damaged=setting == "A0")
                store.plan(CID, [rec.run_key])
                store.mark_running(rec.run_key)
                store.save_result(rec)
            rep = build_report(store, CID)
            t0 = time.perf_counter()
            base = to_html(rep, trajectories=False)
            t_base = time.perf_counter() - t0
            t0 = time.perf_counter()
            full = to_html(rep)
            t_full = time.perf_counter() - t0
            print(f"{args.runs} runs x {args.calls} calls, {args.checks} damage checks each")
            print(f"page without trajectory pages: {t_base:.2f} s, {len(base) / 1e6:.2f} MB (baseline: plots + tables)")
            print(f"page with trajectory pages:    {t_full:.2f} s, {len(full) / 1e6:.2f} MB "
                  f"(x{t_full / t_base:.1f} time, +{(len(full) - len(base)) / args.runs / 1e3:.0f} kB per run)")
            for fmt in ("sft", "preference", "jsonl"):
                t0 = time.perf_counter()
                s = export(store, CID, fmt, root / f"{fmt}.jsonl")
                size = (root / f"{fmt}.jsonl").stat().st_size
                print(f"export {fmt:10s}: {time.perf_counter() - t0:.2f} s, {s.written} lines, {size / 1e6:.1f} MB")


if __name__ == "__main__":
    main()
