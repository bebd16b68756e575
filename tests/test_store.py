"""Tests of harness.store: the run record, the outcome helpers, the SQLite store and its crash safety."""

from __future__ import annotations

import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from harness.store import (
    DB_VERSION,
    RECORD_VERSION,
    CampaignSpecMismatch,
    CampaignStore,
    CompletionMode,
    OutcomeLabel,
    RunRecord,
    RunStateError,
    StoreError,
    UnknownCampaign,
    completion_mode,
    outcome_label,
    run_key,
)

REPO = Path(__file__).resolve().parents[1]
SPEC = {"factor": "ani", "settings": ["A0", "A3-T"], "variants": 3, "budget_steps": 40}
T0 = datetime(2026, 1, 1, tzinfo=UTC)


def make_record(campaign_id: str, setting: str, variant: int, **kw: Any) -> RunRecord:
    """A valid done record (clean success unless overridden)."""
    fields: dict[str, Any] = dict(
        campaign_id=campaign_id, run_key=run_key(campaign_id, setting, variant), factor="ani", setting=setting,
        task_class="change_set", variant=variant, scenario_seed=100 + variant, fault_seed=200 + variant,
        density=20, fault_rate=0.0, budget_steps=40, agent="scripted", model=None, status="done",
        task_pass=True, test_case_score=1.0, test_cases_passed=4, test_cases_total=4, damage_free=True,
        completion_mode="correct_submission", steps=3, tokens_in=1000, tokens_out=200, wall_s=12.0,
        started_at=T0, finished_at=T0)
    fields.update(kw)
    return RunRecord(**fields)


# --- pure helpers -----------------------------------------------------------------------------


def test_outcome_label_draft_4_7() -> None:
    assert outcome_label(True, True) is OutcomeLabel.clean_success
    assert outcome_label(True, False) is OutcomeLabel.dangerous_success
    assert outcome_label(False, True) is OutcomeLabel.clean_failure
    assert outcome_label(False, False) is OutcomeLabel.destructive_failure


@pytest.mark.parametrize(("submitted", "config", "budget", "passed", "mode"), [
    # early submission comes first, even if the task happens to pass
    (True, False, False, True, CompletionMode.early_submission),
    (True, False, True, False, CompletionMode.early_submission),
    # budget reached without a submit, whether or not anything was configured
    (False, True, True, False, CompletionMode.budget_hit),
    (False, False, True, False, CompletionMode.budget_hit),
    (False, True, True, True, CompletionMode.budget_hit),
    # a submit that also used the last step is a submission, not an interaction-limit hit
    (True, True, True, True, CompletionMode.correct_submission),
    (True, True, False, True, CompletionMode.correct_submission),
    (True, True, False, False, CompletionMode.error_submission),
    # ended otherwise: wall-clock cap, agent crash
    (False, True, False, False, CompletionMode.no_submission),
    (False, False, False, False, CompletionMode.no_submission),
])
def test_completion_mode_precedence(submitted: bool, config: bool, budget: bool, passed: bool,
                                    mode: CompletionMode) -> None:
    assert completion_mode(submitted=submitted, config_attempted=config, budget_hit=budget, task_pass=passed) is mode


def test_run_key_is_deterministic() -> None:
    assert run_key("c1", "A3-T", 4) == run_key("c1", "A3-T", 4) == "c1/A3-T/4"
    assert len({run_key("c", s, v) for s in ("A0", "A1") for v in range(3)}) == 6


# --- the record -------------------------------------------------------------------------------


def test_record_derives_label_and_round_trips() -> None:
    r = make_record("c", "A0", 0, task_pass=False, test_case_score=0.5, test_cases_passed=2,
                    damage_free=False, violated_invariants=["tenant7.ping.site2"],
                    completion_mode="budget_hit", faults=[{"kind": "link_down", "at_s": 3.5}])
    assert r.outcome_label is OutcomeLabel.destructive_failure
    assert RunRecord.model_validate_json(r.model_dump_json()) == r
    assert r.schema_version == RECORD_VERSION


def test_every_field_is_described() -> None:
    props = RunRecord.model_json_schema()["properties"]
    assert not [name for name, p in props.items() if not p.get("description")]


@pytest.mark.parametrize(("kw", "match"), [
    ({"status": "failed"}, "error text"),
    ({"task_pass": None}, "needs task_pass"),
    ({"completion_mode": None}, "needs completion_mode"),
    ({"outcome_label": "dangerous_success"}, "contradicts"),
    ({"damage_free": True, "violated_invariants": ["x"]}, "damage_free"),
    ({"damage_free": False}, "damage_free"),
    ({"test_cases_passed": 5}, "test_cases_passed"),
    ({"completion_mode": "error_submission"}, "contradicts"),
    ({"test_case_score": 1.5}, "less than or equal"),
    ({"unknown_field": 1}, "Extra inputs"),
])
def test_record_rejects_inconsistent_values(kw: dict[str, Any], match: str) -> None:
    with pytest.raises(ValidationError, match=match):
        make_record("c", "A0", 0, **kw)


def test_failed_record_may_lack_outcomes() -> None:
    r = make_record("c", "A0", 0, status="failed", error="lab reset failed: r3 did not converge",
                    task_pass=None, test_case_score=None, damage_free=None, completion_mode=None)
    assert r.outcome_label is None


# --- the store --------------------------------------------------------------------------------


@pytest.fixture
def store(tmp_path: Path):
    with CampaignStore(tmp_path / "sub" / "results.sqlite") as s:
        yield s


def keys(cid: str, variants: int = 3) -> list[str]:
    return [run_key(cid, s, v) for v in range(variants) for s in ("A0", "A3-T")]


def test_durability_pragmas(store: CampaignStore) -> None:
    assert store._db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert store._db.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL


def test_campaign_spec_reuse(store: CampaignStore) -> None:
    assert store.create_campaign("c1", SPEC) is True
    assert store.create_campaign("c1", dict(reversed(list(SPEC.items())))) is False  # resume, key order free
    with pytest.raises(CampaignSpecMismatch, match="different spec"):
        store.create_campaign("c1", {**SPEC, "variants": 4})
    store.create_campaign("c0", {})
    assert store.campaigns() == ["c1", "c0"]
    assert store.campaign_spec("c1") == SPEC
    with pytest.raises(UnknownCampaign, match="known campaigns: c1, c0") as e:
        store.runs("nope")
    assert e.value.known == ["c1", "c0"]


def test_plan_is_idempotent_and_ordered(store: CampaignStore) -> None:
    store.create_campaign("c1", SPEC)
    assert store.plan("c1", keys("c1")) == 6
    assert store.plan("c1", keys("c1", variants=4)) == 2  # resume with a larger plan adds only the new
    assert store.pending_runs("c1") == keys("c1", variants=4)
    assert store.next_pending("c1") == "c1/A0/0"
    store.create_campaign("c2", SPEC)
    with pytest.raises(RunStateError, match="belongs to campaign 'c1'"):
        store.plan("c2", ["c1/A0/0"])
    assert store.pending_runs("c2") == []  # the failed plan was rolled back
    with pytest.raises(UnknownCampaign):
        store.plan("nope", ["x"])


def test_run_lifecycle_exactly_once(store: CampaignStore) -> None:
    store.create_campaign("c1", SPEC)
    store.plan("c1", keys("c1", 1))
    with pytest.raises(RunStateError, match="not running"):
        store.save_result(make_record("c1", "A0", 0))  # never started
    store.mark_running("c1/A0/0")
    with pytest.raises(RunStateError, match="running, not pending"):
        store.mark_running("c1/A0/0")
    assert store.next_pending("c1") == "c1/A3-T/0"
    store.save_result(make_record("c1", "A0", 0))
    with pytest.raises(RunStateError, match="done, not running"):
        store.save_result(make_record("c1", "A0", 0))
    with pytest.raises(RunStateError, match="done, not pending"):
        store.mark_running("c1/A0/0")
    with pytest.raises(RunStateError, match="unknown"):
        store.mark_running("c1/A9/0")
    store.mark_running("c1/A3-T/0")
    failed = make_record("c1", "A3-T", 0, status="failed", error="observer timed out",
                         task_pass=None, test_case_score=None, damage_free=None, completion_mode=None)
    store.save_result(failed)
    assert store.recover("c1") == []  # failed runs are not retried by recover
    assert store.next_pending("c1") is None
    assert [r.status.value for r in store.runs("c1")] == ["done", "failed"]
    assert [(r.status, r.attempts) for r in store.rows("c1")] == [("done", 1), ("failed", 1)]


def test_save_checks_the_campaign(store: CampaignStore) -> None:
    store.create_campaign("c1", SPEC)
    store.create_campaign("c2", SPEC)
    store.plan("c1", ["c1/A0/0"])
    store.mark_running("c1/A0/0")
    with pytest.raises(RunStateError):
        store.save_result(make_record("c2", "A0", 0, run_key="c1/A0/0"))


def test_recover_and_reopen(tmp_path: Path) -> None:
    db = tmp_path / "r.sqlite"
    with CampaignStore(db) as s:
        s.create_campaign("c1", SPEC)
        s.create_campaign("c2", SPEC)
        s.plan("c1", keys("c1", 1))
        s.plan("c2", keys("c2", 1))
        s.mark_running("c1/A0/0")
        s.mark_running("c2/A0/0")
    with CampaignStore(db) as s:
        assert s.recover("c1") == ["c1/A0/0"]
        assert s.pending_runs("c2") == ["c2/A3-T/0"]
        assert s.recover() == ["c2/A0/0"]
        assert s.next_pending() == "c1/A0/0"
        assert s.rows("c1")[0].attempts == 1


#: The layout and a record exactly as anibench wrote them before store version 2 (issue 21).
V1_LAYOUT = (
    "CREATE TABLE campaigns (campaign_id TEXT PRIMARY KEY, spec TEXT NOT NULL, created_at TEXT NOT NULL)",
    "CREATE TABLE runs (seq INTEGER PRIMARY KEY, run_key TEXT NOT NULL UNIQUE, campaign_id TEXT NOT NULL "
    "REFERENCES campaigns(campaign_id), status TEXT NOT NULL CHECK (status IN ('pending', 'running', 'done', "
    "'failed')), attempts INTEGER NOT NULL DEFAULT 0, record TEXT, updated_at TEXT NOT NULL)",
    "CREATE INDEX runs_by_status ON runs (campaign_id, status, seq)",
    "PRAGMA user_version = 1",
)
V1_RECORD = (
    '{"schema_version":1,"campaign_id":"old","run_key":"old/A0/0","factor":"ani","setting":"A0","task_class":'
    '"onboarding","variant":0,"scenario_seed":7,"fault_seed":7000,"density":1.0,"fault_rate":0.0,"budget_steps":40,'
    '"agent":"scripted","model":null,"status":"done","error":null,"task_pass":true,"test_case_score":1.0,'
    '"test_cases_passed":3,"test_cases_total":3,"damage_free":true,"violated_invariants":[],"outcome_label":'
    '"clean_success","completion_mode":"correct_submission","steps":4,"tokens_in":0,"tokens_out":0,"wall_s":9.5,'
    '"reset_s":1.0,"agent_s":3.0,"observe_s":5.5,"error_action_rate":0.0,"repeat_action_rate":0.0,"faults":[],'
    '"trajectory_path":null,"started_at":"2026-01-01T00:00:00Z","finished_at":"2026-01-01T00:00:10Z"}'
)


def test_a_version_1_store_is_migrated_in_place_and_its_runs_still_read(tmp_path: Path) -> None:
    db = tmp_path / "v1.sqlite"
    con = sqlite3.connect(db)
    for statement in V1_LAYOUT:
        con.execute(statement)
    con.execute("INSERT INTO campaigns VALUES ('old', '{\"factor\":\"ani\"}', '2026-01-01')")
    con.execute("INSERT INTO runs (run_key, campaign_id, status, attempts, record, updated_at) "
                "VALUES ('old/A0/0', 'old', 'done', 1, ?, '2026-01-01')", (V1_RECORD,))
    con.execute("INSERT INTO runs (run_key, campaign_id, status, updated_at) VALUES ('old/A0/1', 'old', 'pending', 'x')")
    con.commit()
    con.close()
    with CampaignStore(db) as s:
        (rec,) = s.runs("old")
        assert rec.schema_version == 1 and rec.level is None and rec.ablations == [] and rec.mode is None
        assert rec.budget_tokens is None and rec.budget_exhausted is None
        assert s.pending_runs("old") == ["old/A0/1"]  # the campaign resumes where it was
        s.mark_running("old/A0/1")
        s.save_result(make_record("old", "A0", 1, level="A0", mode=None))
        assert [r.schema_version for r in s.runs("old")] == [1, RECORD_VERSION]
    con = sqlite3.connect(db)
    assert con.execute("PRAGMA user_version").fetchone()[0] == DB_VERSION
    con.close()


def test_a_version_3_store_gets_the_reconcile_columns_filled_from_its_records(tmp_path: Path) -> None:
    """Store version 4 (issue 13) adds reconciles, drift_events and supervisor_restarts as columns:
    a version-3 file is migrated in place, its stored A3-R/A4 runs' counts copied from their
    records (supervisor_restarts NULL: schema-3 records lack it), other levels' NULL; a run saved
    after writes all three."""
    from harness.store import _MIGRATIONS

    db = tmp_path / "v3.sqlite"
    con = sqlite3.connect(db)
    for step in (1, 2, 3):
        for statement in _MIGRATIONS[step]:
            con.execute(statement)
    con.execute("PRAGMA user_version = 3")
    con.execute("INSERT INTO campaigns VALUES ('old', '{\"factor\":\"ani\"}', '2026-01-01')")
    v3 = make_record("old", "A4", 0, reconciles=6, drift_events=2).model_dump(mode="json", exclude={"supervisor_restarts"})
    con.execute("INSERT INTO runs (run_key, campaign_id, status, attempts, record, updated_at) "
                "VALUES ('old/A4/0', 'old', 'done', 1, ?, 'x')", (json.dumps({**v3, "schema_version": 3}),))
    con.execute("INSERT INTO runs (run_key, campaign_id, status, attempts, record, updated_at) VALUES "
                "('old/A1/0', 'old', 'done', 1, ?, 'x')", (make_record("old", "A1", 0).model_dump_json(),))
    con.execute("INSERT INTO runs (run_key, campaign_id, status, updated_at) VALUES ('old/A4/1', 'old', 'pending', 'x')")
    con.commit()
    con.close()
    with CampaignStore(db) as s:
        assert [(r.schema_version, r.reconciles, r.supervisor_restarts) for r in s.runs("old")] == [
            (3, 6, None), (RECORD_VERSION, None, None)]
        s.mark_running("old/A4/1")
        s.save_result(make_record("old", "A4", 1, reconciles=4, drift_events=0, supervisor_restarts=1))
    con = sqlite3.connect(db)
    assert con.execute("PRAGMA user_version").fetchone()[0] == DB_VERSION
    got = con.execute("SELECT run_key, reconciles, drift_events, supervisor_restarts FROM runs ORDER BY seq").fetchall()
    con.close()
    assert got == [("old/A4/0", 6, 2, None), ("old/A1/0", None, None, None), ("old/A4/1", 4, 0, 1)], got


def test_refuses_a_newer_store(tmp_path: Path) -> None:
    db = tmp_path / "new.sqlite"
    con = sqlite3.connect(db)
    con.execute("PRAGMA user_version = 99")
    con.close()
    with pytest.raises(StoreError, match="store version 99"):
        CampaignStore(db)


# --- crash safety: a real process, SIGKILLed mid-campaign ---------------------------------------

RUNNER = r"""
import os, sys, time
from datetime import UTC, datetime
from harness.store import CampaignStore, RunRecord, run_key

db, cid, variants, stop_after, log = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
spec = {"factor": "ani", "settings": ["A0", "A3-T"], "variants": variants}
now = datetime.now(UTC)
with CampaignStore(db) as s, open(log, "a", buffering=1) as out:
    s.create_campaign(cid, spec)
    s.plan(cid, [run_key(cid, st, v) for v in range(variants) for st in ("A0", "A3-T")])
    s.recover(cid)
    print("started", flush=True)
    saved = 0
    while (key := s.next_pending(cid)) is not None:
        s.mark_running(key)
        out.write(f"start {key}\n")
        if saved == stop_after:
            print("ready", flush=True)
            time.sleep(600)
        _, setting, variant = key.split("/")
        s.save_result(RunRecord(
            campaign_id=cid, run_key=key, factor="ani", setting=setting, task_class="t", variant=int(variant),
            scenario_seed=1, fault_seed=2, density=1, fault_rate=0, budget_steps=40, agent=f"pid{os.getpid()}",
            status="done", task_pass=setting == "A3-T", test_case_score=1.0 if setting == "A3-T" else 0.0,
            damage_free=True, completion_mode="correct_submission" if setting == "A3-T" else "budget_hit",
            started_at=now, finished_at=now))
        out.write(f"done {key}\n")
        saved += 1
print("finished", flush=True)
"""


def runner(db: Path, cid: str, variants: int, stop_after: int, log: Path) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.Popen([sys.executable, "-c", RUNNER, str(db), cid, str(variants), str(stop_after), str(log)],
                            stdout=subprocess.PIPE, text=True, cwd=REPO, env=env)


def kill(proc: subprocess.Popen[str]) -> None:
    assert proc.poll() is None, "the runner finished before it could be killed"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    assert proc.stdout is not None
    proc.stdout.close()
    assert proc.returncode == -signal.SIGKILL


def finish(db: Path, cid: str, variants: int, log: Path) -> None:
    proc = runner(db, cid, variants, -1, log)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0 and out.split() == ["started", "finished"]


def log_lines(log: Path, verb: str) -> list[str]:
    return [line.split()[1] for line in log.read_text().splitlines() if line.startswith(verb + " ")]


def test_sigkill_mid_run_then_resume_exactly_once(tmp_path: Path) -> None:
    db, log, cid = tmp_path / "c.sqlite", tmp_path / "log", "crash"
    proc = runner(db, cid, 5, 4, log)  # saves 4 results, starts the 5th, then is killed
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "started"
    assert proc.stdout.readline().strip() == "ready"
    kill(proc)
    interrupted = "crash/A0/2"
    with CampaignStore(db) as s:
        assert [r.status for r in s.rows(cid)][:5] == ["done"] * 4 + ["running"]
        assert len(s.runs(cid)) == 4
    finish(db, cid, 5, log)
    with CampaignStore(db) as s:
        rows = s.rows(cid)
        records = s.runs(cid)
    keys_all = [run_key(cid, st, v) for v in range(5) for st in ("A0", "A3-T")]
    assert [r.run_key for r in rows] == keys_all and {r.status for r in rows} == {"done"}
    assert {r.run_key: r.attempts for r in rows} == {k: 2 if k == interrupted else 1 for k in keys_all}
    assert sorted(log_lines(log, "done")) == sorted(keys_all)  # every run completed exactly once
    assert log_lines(log, "start").count(interrupted) == 2  # the interrupted run was redone once
    assert sorted(r.run_key for r in records) == sorted(keys_all)
    first, second = {r.agent for r in records[:4]}, {r.agent for r in records[4:]}
    assert len(first) == len(second) == 1 and first != second  # 4 kept from the killed process


def wait_for_done(log: Path, n: int, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while len(log_lines(log, "done")) < n:
        assert time.monotonic() < deadline, f"runner did not reach {n} runs"
        time.sleep(0.001)


def test_sigkill_at_random_moments(tmp_path: Path) -> None:
    """Kill a fast runner (no agent: only store writes) at arbitrary points of its transactions."""
    db, log, cid, variants = tmp_path / "c.sqlite", tmp_path / "log", "stress", 1500
    rng = random.Random(6)
    thresholds = [200, 500, 900, 1300]  # of 3000 runs; each runner is killed after reaching one
    log.touch()
    for kills, n in enumerate(thresholds, start=1):
        proc = runner(db, cid, variants, -1, log)
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "started"
        wait_for_done(log, n)
        time.sleep(rng.uniform(0, 0.002))
        kill(proc)
        with CampaignStore(db) as s:
            status = {r.run_key: r.status for r in s.rows(cid)}
        done = {k for k, st in status.items() if st == "done"}
        logged = set(log_lines(log, "done"))
        assert logged <= done  # nothing reported complete was lost
        assert len(done - logged) <= kills  # at most the save that raced each kill
        assert list(status.values()).count("running") <= 1
    finish(db, cid, variants, log)
    with CampaignStore(db) as s:
        rows = s.rows(cid)
        records = s.runs(cid)
    assert len(rows) == len(records) == 2 * variants
    assert {r.status for r in rows} == {"done"}
    assert len({r.run_key for r in records}) == 2 * variants
    # each kill interrupts at most one run, which is redone once; nothing else runs twice
    assert all(1 <= r.attempts <= 2 for r in rows)
    assert sum(r.attempts for r in rows) <= 2 * variants + len(thresholds)
    assert len(log_lines(log, "done")) - len(set(log_lines(log, "done"))) == 0


def test_a_version_4_store_gets_the_dataplane_column_and_old_runs_read_as_kernel(tmp_path: Path) -> None:
    """Store version 5 (issue 34) adds ``dataplane``: runs stored before ran on the kernel's seg6,
    the only data plane there was; a run saved after writes its own."""
    from harness.store import _MIGRATIONS

    db = tmp_path / "v4.sqlite"
    con = sqlite3.connect(db)
    for step in (1, 2, 3, 4):
        for statement in _MIGRATIONS[step]:
            con.execute(statement)
    con.execute("PRAGMA user_version = 4")
    con.execute("INSERT INTO campaigns VALUES ('old', '{\"factor\":\"ani\"}', '2026-01-01')")
    v4 = make_record("old", "A0", 0).model_dump(mode="json", exclude={"dataplane"})
    con.execute("INSERT INTO runs (run_key, campaign_id, status, attempts, record, updated_at) "
                "VALUES ('old/A0/0', 'old', 'done', 1, ?, 'x')", (json.dumps({**v4, "schema_version": 4}),))
    con.execute("INSERT INTO runs (run_key, campaign_id, status, updated_at) VALUES ('old/A0/1', 'old', 'pending', 'x')")
    con.commit()
    con.close()
    with CampaignStore(db) as s:
        assert [(r.schema_version, r.dataplane) for r in s.runs("old")] == [(4, "kernel")]
        s.mark_running("old/A0/1")
        s.save_result(make_record("old", "A0", 1, dataplane="ebpf"))
    con = sqlite3.connect(db)
    got = con.execute("SELECT run_key, dataplane FROM runs ORDER BY seq").fetchall()
    con.close()
    assert got == [("old/A0/0", "kernel"), ("old/A0/1", "ebpf")], got
