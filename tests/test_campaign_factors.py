"""Controlled factors of a campaign (issue 21): the agent mode as a factor like the level, the
agent and the model; ablations as settings of their own (``--ani A1,A1+blocklist``); the token
budget; and campaigns stored before these existed keep their id, run keys and spec (resume)."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from harness.ablations import ABLATIONS, parse_ani_setting
from harness.campaign import CampaignSpec, make_spec, run_campaign
from harness.errors import AnibenchError
from harness.report import build_report, fixed_factors
from harness.store import CampaignStore, RunStatus
from tests.conftest import REPO
from tests.fake_openai import FakeOpenAI

MANIFEST = REPO / "tests" / "data" / "small-campaign.yaml"
KW = dict(agent=["scripted"], model=[None], task="onboarding", variants=1, manifest=str(MANIFEST), seed=7, density=1,
          fault_rate=0.0, budget_steps=40, wall_cap_s=60, agent_options={})


def test_ablations_are_written_after_their_level() -> None:
    assert parse_ani_setting("a1+blocklist") == ("A1", ("blocklist",)) and str(parse_ani_setting("A1+blocklist")) == \
        "A1+blocklist"
    assert parse_ani_setting("A1+blocklist").server_config() == {"blocklist": True}
    assert parse_ani_setting("A1+blocklist").serve_args() == ["--blocklist"]
    for text, needle in (("A0+blocklist", "ablation 'blocklist' applies to A1 only, not A0"),
                         ("A1+guard", "unknown ablation 'guard' in 'A1+guard'; known: blocklist (on A1)"),
                         ("A1+blocklist+blocklist", "names an ablation twice"),
                         ("A7+blocklist", "unknown ANI level 'A7'")):
        with pytest.raises(AnibenchError, match=re.escape(needle)):
            parse_ani_setting(text)
    assert set(ABLATIONS) == {"blocklist"}


def test_an_ablation_is_a_setting_of_the_ani_factor() -> None:
    spec = make_spec(ani=["A1", "a1+blocklist"], **KW)
    assert spec.factor == "ani" and spec.settings == ["A1", "A1+blocklist"]
    s = spec.setting_values("A1+blocklist")
    assert (s.level, s.ablations, s.agent) == ("A1", ("blocklist",), "scripted")
    with pytest.raises(AnibenchError, match="lists a value twice"):
        make_spec(ani=["A1+blocklist", "a1+blocklist"], **KW)


def test_the_mode_is_one_controlled_factor_among_the_others() -> None:
    kw = {**KW, "agent": ["openai"], "model": ["m"]}
    spec = make_spec(ani=["A1"], mode=["single-turn", "React", "planner-executor-norecovery"], **kw)
    assert spec.factor == "mode" and spec.settings == ["single-turn", "react", "planner-executor-norecovery"]
    fixed = fixed_factors(spec.model_dump(mode="json"))
    assert list(fixed.items())[:3] == [("ANI", "A1"), ("agent", "openai"), ("model", "m")] and "mode" not in fixed
    s = spec.setting_values("react")
    assert (s.level, s.agent, s.model, s.mode) == ("A1", "openai", "m", "react")
    for extra, needle in (({"ani": ["A0", "A1"]}, "one controlled factor at a time; ani and mode have several values"),
                          ({"mode": ["react", "swarm"]}, "unknown agent mode 'swarm'"),
                          ({"mode": ["react", "react"]}, "--mode lists a value twice"),
                          ({"agent": ["scripted"], "model": [None]}, "--mode is for the model-driven agent (openai)")):
        with pytest.raises(AnibenchError, match=re.escape(needle)):
            make_spec(**{"ani": ["A1"], "mode": ["single-turn", "react"], **kw, **extra})
    with pytest.raises(AnibenchError, match="give the agent mode with --mode"):
        make_spec(ani=["A1"], **{**kw, "agent_options": {"mode": "react"}})


def test_the_token_budget_is_for_agents_whose_tokens_are_known() -> None:
    assert make_spec(ani=["A1"], budget_tokens=5000, **KW).budget_tokens == 5000
    with pytest.raises(AnibenchError, match="the command agent's tokens are not measured"):
        make_spec(ani=["A1"], budget_tokens=5000, **{**KW, "agent": ["command"]})
    with pytest.raises(AnibenchError, match="--budget-tokens >= 1"):
        make_spec(ani=["A1"], budget_tokens=0, **KW)


#: A campaign spec exactly as anibench stored it before modes and token budgets existed.
V1_SPEC = {"campaign_id": "c", "factor": "ani", "ani": ["A0", "A3-T"], "agent": ["scripted"], "model": [None],
           "task": "onboarding", "variants": 6, "manifest": "/m.yaml", "manifest_digest": "d", "seed": 7, "density": 2,
           "fault_rate": 0.0, "budget_steps": 40, "wall_cap_s": 600.0, "agent_options": {}}


def test_a_campaign_stored_before_modes_keeps_its_spec_id_and_run_keys() -> None:
    spec = CampaignSpec.model_validate(V1_SPEC)
    # the stored form and the id's digest are byte for byte the old ones: --resume finds the campaign
    assert spec.model_dump(mode="json") == V1_SPEC
    assert json.loads(spec.model_dump_json()) == V1_SPEC and list(json.loads(spec.model_dump_json())) == list(V1_SPEC)
    assert spec.settings == ["A0", "A3-T"] and spec.mode == [None] and spec.budget_tokens is None
    with_mode = CampaignSpec.model_validate({**V1_SPEC, "agent": ["openai"], "mode": ["react"], "budget_tokens": 9})
    assert with_mode.model_dump()["mode"] == ["react"] and with_mode.model_dump()["budget_tokens"] == 9


@pytest.mark.lab
def test_blocklist_ablation_runs_as_its_own_paired_setting(tmp_path) -> None:
    spec = make_spec(ani=["A1", "A1+blocklist"], **KW)
    with CampaignStore(tmp_path / "db.sqlite") as store:
        recs = run_campaign(spec, store, results_dir=tmp_path / "runs")
        recs.sort(key=lambda r: spec.settings.index(r.setting))  # they ran in counterbalanced order
        assert [(r.setting, r.level, r.ablations) for r in recs] == [("A1", "A1", []), ("A1+blocklist", "A1", ["blocklist"])]
        assert all(r.status is RunStatus.done and r.task_pass for r in recs), [r.error for r in recs]
        assert len({(r.scenario_seed, r.fault_seed, r.variant) for r in recs}) == 1  # paired
        rep = build_report(store, spec.campaign_id)
    assert [c.setting for c in rep.cells] == ["A1", "A1+blocklist"]
    assert [p.setting_b for p in rep.paired] == ["A1+blocklist"] * 2
    # the blocklist was in force in the ablated run only (the server says so to the agent)
    told = {r.setting: json.loads((tmp_path / "runs" / spec.campaign_id / r.setting / "v0" / "tools.json").read_text())
            ["instructions"] for r in recs}
    assert "blocklist" in told["A1+blocklist"] and "blocklist" not in told["A1"]


@pytest.mark.lab
def test_mode_campaign_from_the_command_line(tmp_path) -> None:
    """``harness campaign --mode react,single-turn-norecovery --budget-tokens N``: one run per mode
    on the same variant, the mode and the token budget in each run record and in the report."""
    db = tmp_path / "db.sqlite"
    # the runs are sequential: the stand-in endpoint serves the first run's reply (two steps), then
    # the second's (one step), whichever setting the counterbalanced order runs first
    with FakeOpenAI([[("list_devices", {}), ("submit", {})], [("submit", {})]]) as fake:
        r = subprocess.run([sys.executable, "-m", "harness.cli", "campaign", "--ani", "A0", "--task", "onboarding",
                            "--variants", "1", "--manifest", str(MANIFEST), "--density", "1", "--agent", "openai",
                            "--model", "m", "--mode", "react,single-turn-norecovery", "--budget-tokens", "100000",
                            "--agent-opt", f"base_url={fake.url}", "--agent-opt", "api_key=k", "--db", str(db),
                            "--results", str(tmp_path / "runs"), "--id", "modes"],
                           cwd=REPO, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "held fixed: ANI A0; agent openai; model m" in " ".join(r.stdout.split())
    with CampaignStore(db) as store:
        recs = store.runs("modes")
    assert [(x.factor, x.setting, x.mode, x.budget_tokens) for x in recs] == [
        ("mode", "react", "react", 100000), ("mode", "single-turn-norecovery", "single-turn-norecovery", 100000)]
    assert [x.steps for x in sorted(recs, key=lambda x: x.run_position)] == [2, 1]
    assert all(x.agent_stop == "submitted" for x in recs)


def test_a_campaign_is_never_resumed_on_another_data_plane(tmp_path) -> None:
    """Issue 34: the data plane is part of a campaign's spec (absent from kernel ones, so campaigns
    stored before keep their ids); --resume on the other data plane is refused in one line."""
    from harness.campaign import plan_campaign

    kernel = make_spec(ani=["A0", "A1"], campaign_id="dp", dataplane="kernel", **KW)
    assert "dataplane" not in kernel.model_dump(mode="json")
    ebpf = make_spec(ani=["A0", "A1"], campaign_id="dp", dataplane="ebpf", **KW)
    assert ebpf.model_dump(mode="json")["dataplane"] == "ebpf"
    assert make_spec(ani=["A0", "A1"], dataplane="ebpf", **KW).campaign_id != make_spec(ani=["A0", "A1"], dataplane="kernel",
                                                                                      **KW).campaign_id  # fmt: skip
    with CampaignStore(tmp_path / "s.sqlite") as store:
        plan_campaign(kernel, store, resume=False)
        with pytest.raises(AnibenchError, match=r"ran on the kernel data plane, this one would run on ebpf: runs are never "
                                                 r"paired across data planes \(--dataplane kernel\)"):
            plan_campaign(ebpf, store, resume=True)
        plan_campaign(kernel, store, resume=True)  # the same data plane resumes
