"""The harness: task classes, agents (scripted, noisy, openai against a stand-in endpoint,
external command), runs, campaigns with resume, and the command line."""

from __future__ import annotations

import json
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness.campaign import make_spec, run_campaign
from harness.errors import AnibenchError
from harness.run import RunSpec, execute_run
from harness.store import CampaignStore, RunStatus
from harness.tasks import PROMPTS, SITE_TASK_CLASSES, apply_changes, make_variant
from substrate.scenario import build, load_manifest
from tests.conftest import REPO
from tests.fake_openai import FakeOpenAI

MANIFEST = REPO / "tests" / "data" / "small-campaign.yaml"
HARNESS = [sys.executable, "-m", "harness.cli"]


def ani_spec(level: str, agent: str, *, run_dir: Path, k: int = 0, **kw: object) -> RunSpec:
    """A run of campaign ``t`` whose controlled factor is the ANI level (density 1)."""
    return RunSpec(campaign_id="t", run_key=f"t/{level}/{k}", factor="ani", setting=level, level=level, agent=agent,
                   density=1, run_dir=run_dir, **kw)  # type: ignore[arg-type]


# -- task classes (pure) --------------------------------------------------------------------


@pytest.mark.parametrize("task_class", SITE_TASK_CLASSES)
def test_variants_are_deterministic_and_worded_identically(task_class: str) -> None:
    m = load_manifest(MANIFEST)
    a = make_variant(task_class, build(m, seed=7), 0)
    b = make_variant(task_class, build(m, seed=7), 0)
    c = make_variant(task_class, build(m, seed=8), 1)
    assert a == b
    assert a.prompt == c.prompt == PROMPTS[task_class]
    assert set(a.files) == set(c.files) == {"request.yaml", "sites.csv", "design.md"}
    assert a.files["request.yaml"] != c.files["request.yaml"]
    assert a.test_cases and a.damage_checks
    # hidden test cases never appear in what the agent gets
    blob = a.prompt + "".join(a.files.values())
    assert not any(tc.id in blob for tc in a.test_cases)


def test_change_set_is_two_additions_two_moves_one_removal_on_one_tenant() -> None:
    sc = build(load_manifest(MANIFEST), seed=7)
    v = make_variant("change-set", sc, 0)
    ch = v.changes
    assert (len(ch.add), len(ch.move), len(ch.remove)) == (2, 2, 1)
    after = apply_changes(sc, ch)
    t = after.tenant(ch.tenant)
    ids = {s.id for s in t.sites}
    assert ch.remove[0] not in ids and {a.site for a in ch.add} <= ids
    for m in ch.move:
        s = next(x for x in t.sites if x.id == m.site)
        assert (s.pe, s.pe_if, s.ce) == (m.pe, m.pe_interface, m.ce)
    # the moved sites' old CEs are unplugged and the new ones configured by the setup
    assert sum(1 for st in v.setup if st.argv[-1] == "down") == 2
    # test cases cover the changed sites; damage checks include other tenants' services
    assert any(m.site in tc.id for m in ch.move for tc in v.test_cases)
    assert any(tc.id.startswith("task/removed/") for tc in v.test_cases)
    assert any(d.service.startswith("l3vpn/") and d.service != f"l3vpn/{ch.tenant}" for d in v.damage_checks)


@pytest.mark.parametrize("task_class", SITE_TASK_CLASSES)
def test_checks_are_split_by_structure_not_by_substrings(task_class: str) -> None:
    """Found by an audit: CE c1 matched c10-c19 and a reused (overlapping) address matched other
    tenants' checks, so damage to another tenant became a failed test case instead of damage.
    On the 25-router brownfield (CE numbers past 10, overlapping tenants): every test case is
    the task tenant's, and every baseline fact not about a changed site stays a damage check."""
    sc = build(load_manifest(REPO / "manifests" / "srv6-brownfield.yaml"), seed=7, density=2)
    for variant in range(2):
        v = make_variant(task_class, sc, variant)
        own = f"l3vpn/{v.changes.tenant}"
        # ... or an isolation check between a changed site and another tenant (issue 19: both
        # directions, so the other tenant's check that nothing of its site arrives at the new one)
        changed_ces = {a.ce for a in v.changes.add} | {m.ce for m in v.changes.move}
        # ... or a router's whole state the change re-renders (its rule or SID set, its nftables
        # tables, its hairpin NAT: issue 36), which holds other tenants' parts too
        base = {i.id: i for i in sc.invariants}
        assert [t.id for t in v.test_cases if not t.id.startswith(("task/", own, f"firewall/{v.changes.tenant}/"))
                and not (t.kind == "isolated" and {t.params.get("dst_node"), t.params.get("src")} & changed_ces)
                and not (t.id.startswith(("device/", "floating_ip/hairpin/")) and base.get(t.id) != t)] == []
        changed = set(v.changes.remove) | {m.site for m in v.changes.move} | {a.site for a in v.changes.add}
        tested, damaged = {t.id for t in v.test_cases}, {d.id for d in v.damage_checks}
        assert not tested & damaged
        for inv in sc.invariants:  # a baseline fact is a test case or a damage check, or about a changed site
            about_changed = any(f"{c}->" in inv.id or f">{c}/" in inv.id or f"/{c}-x-" in inv.id
                                or inv.id.endswith((f"-x-{c}", f"-x-{c}/4", f"/pe_address/{c}")) for c in changed)  # fmt: skip
            assert inv.id in damaged or inv.id in tested or about_changed or inv.kind == "sid_bound", inv.id
        gone = [x for x in v.changes.remove]
        if gone:
            removed = [t for t in v.test_cases if t.id.startswith(f"task/removed/{gone[0]}/from/")]
            assert {t.params["family"] for t in removed} == {4, 6}
            assert len(removed) >= len(sc.tenant(v.changes.tenant).sites) - 1
            clean = [t for t in v.test_cases if t.id.startswith(f"task/removed/{gone[0]}/clean/")]
            assert {t.params["node"] for t in clean} >= {s.pe for s in sc.tenant(v.changes.tenant).sites}


def test_a_moved_site_never_lands_where_another_tenant_attaches_its_prefix() -> None:
    """A change-set move onto a PE where another tenant attaches the same (reused) prefix cannot be
    met without breaking that tenant (the prefix's connected route lives in the PE's main table):
    A3-T refuses it and A0 does it with damage. Seen in `harness demo` (seed 7, density 2, the
    8-class manifest): t1s10 moved to r16, where t2s1 attaches fd10:0:0:9::/64. Across seeds and
    densities, no move is drawn onto such a PE (the old draw made 2 of 72)."""
    m = load_manifest(REPO / "manifests" / "srv6-brownfield.yaml")
    moves = 0
    for seed in (3, 7, 11):
        for density in (1, 2):
            sc = build(m, seed=seed, density=density)
            for v in range(6):
                ch = make_variant("change-set", sc, v).changes
                sites = {s.id: s for s in sc.tenant(ch.tenant).sites}
                for mv in ch.move:
                    s, moves = sites[mv.site], moves + 1
                    clash = [o.id for o in sc.all_sites() if o.pe == mv.pe and o.id != s.id
                             and (o.prefix6 == s.prefix6 or (s.prefix4 and o.prefix4 == s.prefix4))]
                    assert not clash, (seed, density, v, mv, clash)
    assert moves == 72


def test_unknown_task_class_and_impossible_variants_are_refused() -> None:
    sc = build(load_manifest(MANIFEST), seed=7)
    with pytest.raises(AnibenchError, match="unknown task class 'migrate'"):
        make_variant("migrate", sc, 0)
    bare = sc.model_copy(update={"spares": []})
    with pytest.raises(AnibenchError, match="spare attachment circuit"):
        make_variant("onboarding", bare, 0)


def test_campaign_options_are_validated() -> None:
    kw = dict(agent=["scripted"], model=[None], task="onboarding", variants=1, manifest=str(MANIFEST), seed=7,
              density=1, fault_rate=0.0, budget_steps=40, wall_cap_s=60, agent_options={})
    with pytest.raises(AnibenchError, match="unknown ANI level 'A9'"):
        make_spec(ani=["A9"], **kw)
    with pytest.raises(AnibenchError, match="one controlled factor at a time"):
        make_spec(ani=["A0", "A1"], **{**kw, "agent": ["scripted", "noisy"]})
    with pytest.raises(AnibenchError, match="unknown agent 'gpt'"):
        make_spec(ani=["A0"], **{**kw, "agent": ["gpt"]})
    spec = make_spec(ani=["a0", "A1"], **kw)
    assert spec.factor == "ani" and spec.settings == ["A0", "A1"]


# -- runs and campaigns on a real lab ------------------------------------------------------


@pytest.mark.lab
@pytest.mark.parametrize("level", ["A0", "A1", "A2", "A3-T"])
@pytest.mark.parametrize("task_class", SITE_TASK_CLASSES)
def test_scripted_reference_solution_passes_without_damage(campaign_lab, tmp_path, level: str, task_class: str) -> None:
    lab, sc = campaign_lab
    v = make_variant(task_class, sc, 0)
    spec = ani_spec(level, "scripted", run_dir=tmp_path)
    rec, verdicts = execute_run(lab, spec, v)
    assert rec.task_pass, [x.id for x in verdicts if not x.ok]
    assert rec.damage_free and rec.completion_mode.value == "correct_submission"
    assert rec.steps >= 3 and rec.test_cases_total == len(v.test_cases)
    calls = [json.loads(x) for x in (tmp_path / "trajectory.jsonl").read_text().splitlines()]
    assert calls[-1]["tool"] == "submit"


@pytest.mark.lab
@pytest.mark.parametrize("level", ["A0", "A2"])
def test_noisy_operator_causes_detected_damage_or_failure(campaign_lab, tmp_path, level: str) -> None:
    lab, sc = campaign_lab
    v = make_variant("change-set", sc, 0)
    spec = ani_spec(level, "noisy", agent_options={"rate": "1.0"}, run_dir=tmp_path)
    rec, _ = execute_run(lab, spec, v)
    assert not (rec.task_pass and rec.damage_free)
    assert rec.outcome_label.value in ("clean_failure", "destructive_failure", "dangerous_success")


@pytest.mark.lab
def test_faults_are_injected_at_steps_and_cleared(campaign_lab, tmp_path) -> None:
    lab, sc = campaign_lab
    v = make_variant("onboarding", sc, 0).model_copy(update={"fault_seed": 3})
    spec = ani_spec("A1", "scripted", fault_rate=1.0, budget_steps=10, run_dir=tmp_path)
    rec, _ = execute_run(lab, spec, v)
    injected = [f for f in rec.faults if f["action"] == "inject"]
    cleared = {f["fault"] for f in rec.faults if f["action"] in ("clear", "error")}
    assert injected and {f["fault"] for f in injected} <= cleared
    assert all(f["step"] >= 1 for f in injected)


@pytest.mark.lab
def test_openai_agent_against_a_stand_in_endpoint(campaign_lab, tmp_path) -> None:
    lab, sc = campaign_lab
    v = make_variant("onboarding", sc, 0)
    turns = [
        [("list_devices", {})],
        [("run_shell", {"device": "r1", "command": "ip -6 route show table main | head -3"})],
        [("run_shell", "{not json")],  # a malformed call: told to the model, never sent to the server
        "I have looked around.",
        [("submit", {})],
    ]
    with FakeOpenAI(turns) as fake:
        spec = RunSpec(campaign_id="t", run_key="t/A0/0", factor="model", setting="fake-model", level="A0", agent="openai",
                       agent_options={"model": "fake-model", "base_url": fake.url, "api_key": "k"}, density=1,
                       run_dir=tmp_path)
        rec, _ = execute_run(lab, spec, v)
    calls = [json.loads(x) for x in (tmp_path / "trajectory.jsonl").read_text().splitlines()]
    assert [c["tool"] for c in calls] == ["list_devices", "run_shell", "submit"]
    assert rec.tokens_in > 0 and rec.tokens_out > 0 and rec.model == "fake-model"
    assert rec.completion_mode.value == "early_submission"  # it read but configured nothing
    first = fake.requests[0]
    assert {t["function"]["name"] for t in first["tools"]} >= {"run_shell", "list_devices", "submit"}
    assert "request.yaml" in first["messages"][1]["content"]


def run_a0_turns(lab, v, turns, run_dir):  # noqa: ANN001, ANN201
    """One A0 run of variant ``v`` whose agent is the openai adapter replaying ``turns`` from the
    stand-in endpoint (the model API is the only thing stood in for)."""
    with FakeOpenAI(turns) as fake:
        spec = ani_spec("A0", "openai", agent_options={"model": "m", "base_url": fake.url, "api_key": "k"}, run_dir=run_dir)
        return execute_run(lab, spec, v)


@pytest.mark.lab
def test_processes_an_agent_leaves_running_are_killed_when_its_call_returns(campaign_lab, tmp_path) -> None:
    """A delayed change (a background job that acts after submit) must neither escape the verdict
    nor reach into the next run: the A0 server kills it when the call that started it returns
    (its node's per-command cgroup, issue 17) and says so in the call's result; the run's own
    sweep (leftover/NODE damage) then finds nothing."""
    lab, sc = campaign_lab
    v = make_variant("onboarding", sc, 0)
    bomb = "nohup sh -c 'sleep 4; ip -6 route flush table main proto isis' >/dev/null 2>&1 &"
    turns = [[("run_shell", {"device": "r2", "command": bomb})], [("submit", {})]]
    rec, verdicts = run_a0_turns(lab, v, turns, tmp_path)
    call = json.loads((tmp_path / "trajectory.jsonl").read_text().splitlines()[0])
    killed = [k.split()[0] for k in json.loads(call["result"])["killed_leftovers"]]
    assert killed and set(killed) <= {"bash", "nohup", "sh", "sleep"}, killed  # wherever the job had got to
    assert json.loads((tmp_path / "agent.json").read_text())["leftover_processes"] == []
    assert not any(x.startswith("leftover/") for x in rec.violated_invariants)
    # the job never ran (every real damage check passes), and nothing is left to run it later:
    # r2 holds its init, its FRR daemons and the listing shell only
    assert all(vd.ok for vd in verdicts[len(v.test_cases):])
    comms = lab.sh("r2", 'for d in /proc/[0-9]*; do read -r c < "$d/comm"; echo "$c"; done').stdout.split()
    assert sorted(comms) == sorted(["sleep", "bash", *lab.state("r2").daemons]), comms  # init is `sleep infinity`


@pytest.mark.lab
def test_decommissioning_by_unplugging_the_circuit_is_not_a_pass(campaign_lab, tmp_path) -> None:
    """Found by an audit: downing the removed site's attachment circuit made every test case
    pass while its rule, routes and SIDs stayed in service. The clean-up is a test case now."""
    lab, sc = campaign_lab
    v = make_variant("decommissioning", sc, 0)
    gone = sc.site(v.changes.remove[0])
    turns = [[("run_shell", {"device": gone.pe, "command": f"ip link set {gone.pe_if} down"})], [("submit", {})]]
    rec, verdicts = run_a0_turns(lab, v, turns, tmp_path)
    failed = {vd.id for vd in verdicts[: len(v.test_cases)] if not vd.ok}
    assert not rec.task_pass and f"task/removed/{gone.id}/clean/{gone.pe}" in failed, failed
    assert all(vd.ok for vd in verdicts if vd.id.startswith(f"task/removed/{gone.id}/from/"))  # unreachable: yes


@pytest.mark.lab
def test_external_command_agent_is_recorded_by_the_server_and_capped(campaign_lab, tmp_path) -> None:
    lab, sc = campaign_lab
    v = make_variant("onboarding", sc, 0)
    tpl = f"{sys.executable} {REPO / 'tests' / 'fake_cli_agent.py'} {{mcp_config}}"
    spec = ani_spec("A1", "command", agent_options={"template": tpl}, run_dir=tmp_path / "ok")
    rec, _ = execute_run(lab, spec, v)
    assert rec.completion_mode.value == "early_submission" and rec.steps == 2
    spec = ani_spec("A1", "command", agent_options={"template": tpl + " --hang"}, wall_cap_s=8, run_dir=tmp_path / "hang", k=1)
    t0 = time.monotonic()
    rec, _ = execute_run(lab, spec, v)
    assert time.monotonic() - t0 < 60
    assert rec.completion_mode.value == "no_submission" and rec.status is RunStatus.done
    assert "killed at the wall-clock cap" in (tmp_path / "hang" / "agent.json").read_text()


@pytest.mark.lab
def test_command_agent_with_a_relative_results_dir(campaign_lab, tmp_path, monkeypatch) -> None:
    """The agent runs in <run>/files/: every path it is given (template, mcp.json) is absolute, so it
    finds its configuration and the server records where the harness reads."""
    lab, sc = campaign_lab
    v = make_variant("onboarding", sc, 0)
    monkeypatch.chdir(tmp_path)
    rel = Path("results/runs/rel/A1/v0")
    tpl = f"{sys.executable} {REPO / 'tests' / 'fake_cli_agent.py'} {{mcp_config}}"
    spec = ani_spec("A1", "command", agent_options={"template": tpl}, run_dir=rel)
    rec, _ = execute_run(lab, spec, v)
    run_dir = tmp_path / rel
    assert rec.steps == 2 and rec.completion_mode.value == "early_submission", (run_dir / "agent.log").read_text()
    calls = [json.loads(x) for x in (run_dir / "trajectory.jsonl").read_text().splitlines()]
    assert [c["tool"] for c in calls] == ["get_topology", "submit"]
    assert not list((run_dir / "files").rglob("trajectory.jsonl"))
    args = json.loads((run_dir / "mcp.json").read_text())["mcpServers"]["anibench"]["args"]
    assert args[args.index("--trajectory") + 1] == str(run_dir / "trajectory.jsonl")


@pytest.mark.lab
def test_campaign_pairs_runs_and_reports(tmp_path) -> None:
    spec = make_spec(ani=["A0", "A1"], agent=["scripted"], model=[None], task="onboarding", variants=2,
                     manifest=str(MANIFEST), seed=7, density=1, fault_rate=0.0, budget_steps=40, wall_cap_s=120,
                     agent_options={})
    with CampaignStore(tmp_path / "db.sqlite") as store:
        recs = run_campaign(spec, store, results_dir=tmp_path / "runs")
        assert len(recs) == 4 and all(r.status is RunStatus.done for r in recs)
        assert {(r.setting, r.variant) for r in recs} == {("A0", 0), ("A1", 0), ("A0", 1), ("A1", 1)}
        # paired: same scenario and fault seed for a variant in every setting
        for v in (0, 1):
            pair = [r for r in recs if r.variant == v]
            assert len({(r.scenario_seed, r.fault_seed) for r in pair}) == 1
        # determinism (issue 19): each record's input digests are those the specification alone
        # gives (tests/test_issue_19.py: the same in another process with another hash seed)
        from harness.campaign import planned_digests

        for v in (0, 1):
            want = planned_digests(spec, v)
            assert set(want) == {"scenario", "fault_schedule", "task_variant"}
            assert all(r.input_digests == want for r in recs if r.variant == v)
        from harness.report import build_report

        rep = build_report(store, spec.campaign_id)
        assert json.loads(rep.to_json())
        with pytest.raises(AnibenchError, match="exists in the store"):
            run_campaign(spec, store, results_dir=tmp_path / "runs")
        assert run_campaign(spec, store, results_dir=tmp_path / "runs", resume=True) == []


def wait_for_done_runs(db: Path, n: int, bound_s: float = 180.0) -> bool:
    """Poll the campaign database until ``n`` runs are done (bounded)."""
    deadline = time.monotonic() + bound_s
    while time.monotonic() < deadline:
        if db.exists():
            with sqlite3.connect(db) as c:
                try:
                    if c.execute("select count(*) from runs where status='done'").fetchone()[0] >= n:
                        return True
                except sqlite3.OperationalError:
                    pass
        time.sleep(0.2)
    return False


def small_campaign_argv(tmp_path: Path, db: Path, task: str, cid: str) -> list[str]:
    """``harness campaign`` of A0 vs A1, one variant of ``task`` (two runs), on the small manifest."""
    return [*HARNESS, "campaign", "--ani", "A0,A1", "--task", task, "--variants", "1", "--manifest", str(MANIFEST),
            "--density", "1", "--db", str(db), "--results", str(tmp_path / "runs"), "--id", cid, "--no-report"]


@pytest.mark.lab
@pytest.mark.slow
def test_crashed_campaign_resumes_without_losing_or_repeating_runs(tmp_path) -> None:
    db = tmp_path / "db.sqlite"
    argv = small_campaign_argv(tmp_path, db, "onboarding", "crash")
    p = subprocess.Popen(argv, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    assert wait_for_done_runs(db, 1), "no run finished"
    p.send_signal(signal.SIGKILL)  # a crash: no clean-up at all
    p.wait()
    subprocess.run([*HARNESS, "lab", "cleanup"], cwd=REPO, check=True, capture_output=True)
    r = subprocess.run([*argv, "--resume"], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    with CampaignStore(db) as store:
        rows = store.rows("crash")
        assert len(rows) == 2 and all(row.status == "done" for row in rows)
        # a run completed before the crash was not run again; the interrupted one ran twice at most
        assert sum(row.attempts for row in rows) <= 3
        assert len({rec.run_key for rec in store.runs("crash")}) == 2


@pytest.mark.lab
def test_cli_rejects_bad_options_in_one_line(tmp_path) -> None:
    base = [*HARNESS, "campaign", "--manifest", str(MANIFEST), "--db", str(tmp_path / "d.sqlite"), "--variants", "1"]
    for extra, needle in ((["--task", "migrate"], "unknown task class 'migrate'"),
                          (["--agent", "gpt"], "unknown agent 'gpt'"),
                          (["--ani", "A0,A7"], "unknown ANI level 'A7'"),
                          (["--agent", "openai", "--model", "m", "--agent-opt", "base_url=http://127.0.0.1:9/v1"],
                           "model endpoint unreachable")):
        r = subprocess.run([*base, *extra], cwd=REPO, capture_output=True, text=True, timeout=60)
        assert r.returncode == 1, r.stderr
        assert needle in r.stderr and r.stderr.count("error:") == 1, r.stderr


@pytest.mark.lab
def test_task_validate_and_campaign_refuse_the_same_bad_levels(tmp_path) -> None:
    validate = [*HARNESS, "task", "validate", "onboarding", "--manifest", str(MANIFEST), "--variants", "1"]
    camp = [*HARNESS, "campaign", "--task", "onboarding", "--manifest", str(MANIFEST), "--variants", "1",
            "--db", str(tmp_path / "d.sqlite"), "--results", str(tmp_path / "runs")]
    for ani, needle in (("A5", "unknown ANI level 'A5'; registered: A0, A1, A2, A3-T, A3-R, A4"), ("", "--ani needs at least one value"),
                        ("A0,A0", "--ani lists a value twice"), ("a0, A0", "--ani lists a value twice")):
        for base in (validate, camp):
            r = subprocess.run([*base, "--ani", ani], cwd=REPO, capture_output=True, text=True, timeout=60)
            assert r.returncode == 1 and r.stdout == "", (base[3], ani, r.stdout)
            assert r.stderr.strip() == f"error: {needle}", (base[3], ani, r.stderr)
    assert not (tmp_path / "d.sqlite").exists()


@pytest.mark.lab
@pytest.mark.slow
def test_ctrl_c_stops_cleanly_destroys_the_lab_and_resumes(tmp_path) -> None:
    db = tmp_path / "db.sqlite"
    argv = small_campaign_argv(tmp_path, db, "decommissioning", "intr")
    p = subprocess.Popen(argv, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert wait_for_done_runs(db, 1), "no run finished"
    p.send_signal(signal.SIGINT)
    _, err = p.communicate(timeout=120)
    assert p.returncode == 130 and "resume with the same options and --resume" in " ".join(err.split()), err[-1000:]
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert f"anibench-camp-{p.pid % 100000}-" not in netns  # its lab is gone, without harness lab cleanup
    r = subprocess.run([*argv, "--resume"], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    with CampaignStore(db) as store:
        assert [row.status for row in store.rows("intr")] == ["done"] * 2


@pytest.mark.lab
@pytest.mark.parametrize("task_class", SITE_TASK_CLASSES)
def test_an_agent_that_does_nothing_fails_cleanly(campaign_lab, tmp_path, task_class: str) -> None:
    """Doing nothing never counts as damage: what the customer changed (a moved site's old CE
    unplugged) is the task's to repair, so it is a test case, not a damage check."""
    lab, sc = campaign_lab
    v = make_variant(task_class, sc, 0)
    spec = ani_spec("A1", "command", agent_options={"template": "true"}, run_dir=tmp_path)
    rec, _ = execute_run(lab, spec, v)
    assert rec.outcome_label.value == "clean_failure", rec.violated_invariants
    assert rec.steps == 0 and rec.completion_mode.value == "no_submission"


@pytest.mark.lab
def test_an_agent_that_cannot_start_fails_the_run_not_the_agent(campaign_lab, tmp_path) -> None:
    from harness.run import RunFailed

    lab, sc = campaign_lab
    v = make_variant("onboarding", sc, 0)
    spec = ani_spec("A1", "command", agent_options={"template": "no-such-agent-binary {prompt}"}, run_dir=tmp_path)
    with pytest.raises(RunFailed, match="could not start the agent"):
        execute_run(lab, spec, v)
    from harness.agents.command import CommandAgent

    with pytest.raises(AnibenchError, match="'no-such-agent-binary' is not found"):
        CommandAgent(template="no-such-agent-binary {prompt}").preflight()
