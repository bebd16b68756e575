"""Trajectories people can use (issue 21): ``harness export`` in its three formats, validated
against the shipped JSON Schemas, and the HTML report's per-run table and trajectory pages, parsed
with an HTML parser -- on real runs of a real lab (a scripted clean success and a model-driven
failure under faults, on the same task variant)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from typer.testing import CliRunner

from harness.export import (
    ExportFilter,
    export,
    export_schemas,
    schema_file,
    shipped_schema,
)
from harness.report import build_report
from harness.report_html import to_html
from harness.run import RunSpec, execute_run
from harness.store import CampaignStore
from harness.tasks import make_variant
from tests.fake_openai import FakeOpenAI
from tests.html_tree import parse

CID = "x"


# -- two real runs of one variant --------------------------------------------------------------------

LIST = ("list_devices", {})
BAD = ("run_shell", {"device": "r99", "command": "true"})
GOOD = ("run_shell", {"device": "r1", "command": "ip -6 route show table main | head -2"})


@pytest.fixture(scope="module")
def store_with_runs(campaign_lab, tmp_path_factory) -> tuple[Path, dict[str, Any]]:
    """Campaign ``x`` (factor agent, level A0, onboarding variant 0): the scripted operator's clean
    success, and the openai agent (stand-in endpoint) under a fault at every step, doing nothing
    useful and failing one call."""
    lab, sc = campaign_lab
    tmp = tmp_path_factory.mktemp("export")
    v = make_variant("onboarding", sc, 0)
    db = tmp / "db.sqlite"
    recs = {}
    with CampaignStore(db) as store:
        store.create_campaign(CID, {"factor": "agent", "ani": ["A0"], "agent": ["scripted", "openai"], "variants": 1})
        with FakeOpenAI([[LIST], [BAD], [GOOD], [("submit", {})]]) as fake:
            for agent, opts, lam in (("scripted", {}, 0.0),
                                     ("openai", {"model": "m", "base_url": fake.url, "api_key": "k"}, 1.0)):
                key = f"{CID}/{agent}/0"
                spec = RunSpec(campaign_id=CID, run_key=key, factor="agent", setting=agent, level="A0", agent=agent,
                               agent_options=opts, density=1, fault_rate=lam, budget_steps=40,
                               run_dir=tmp / "runs" / agent / "v0")
                store.plan(CID, [key])
                store.mark_running(key)
                rec, verdicts = execute_run(lab, spec, v)
                store.save_result(rec)
                recs[agent] = (rec, verdicts)
    return db, recs


def read_lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in path.read_text().splitlines()]


def validate(fmt: str, doc: dict[str, Any]) -> None:
    jsonschema.Draft202012Validator(shipped_schema(fmt)).validate(doc)


def test_shipped_schemas_are_the_generated_ones_and_not_vacuous() -> None:
    here = Path(__file__).resolve().parents[1] / "harness" / "schemas"
    for name, schema in export_schemas().items():
        assert json.loads((here / schema_file(name)).read_text()) == schema, \
            f"{schema_file(name)} is stale: regenerate with python -m harness.export"
        jsonschema.Draft202012Validator.check_schema(schema)
    ok = {"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "u"},
                       {"role": "assistant", "content": "", "tool_calls": [
                           {"id": "c1", "type": "function", "function": {"name": "submit", "arguments": "{}"}}]}],
          "tools": [{"type": "function", "function": {"name": "submit", "description": "", "parameters": {}}}]}
    validate("sft", ok)
    for bad in ({**ok, "metadata_typo": 1}, {"tools": ok["tools"]},
                {**ok, "messages": [{"role": "tool", "content": "x"}]},
                {**ok, "messages": [{"role": "assistant", "tool_calls": []}]}):
        with pytest.raises(jsonschema.ValidationError):
            validate("sft", bad)


@pytest.mark.lab
def test_the_runs_are_what_the_export_and_the_report_need(store_with_runs) -> None:
    _, recs = store_with_runs
    scripted, _ = recs["scripted"]
    failing, verdicts = recs["openai"]
    assert scripted.outcome_label.value == "clean_success", scripted.violated_invariants
    assert not failing.task_pass and any(f["action"] == "inject" for f in failing.faults)
    assert any(not v.ok for v in verdicts[: failing.test_cases_total])


@pytest.mark.lab
def test_sft_export_is_the_clean_success_in_the_openai_chat_format(store_with_runs, tmp_path) -> None:
    db, recs = store_with_runs
    out = tmp_path / "sft.jsonl"
    with CampaignStore(db) as store:
        summary = export(store, CID, "sft", out)
    (line,) = read_lines(out)
    validate("sft", line)
    assert summary.written == 1 and summary.skipped == {"not a clean success": 1}
    assert set(line) == {"messages", "tools"}  # OpenAI's uploader refuses unknown keys
    msgs = line["messages"]
    assert [m["role"] for m in msgs[:2]] == ["system", "user"]
    assert "The network interface says:" in msgs[0]["content"] and "--- attached file: request.yaml ---" in msgs[1]["content"]
    calls = [json.loads(x) for x in Path(recs["scripted"][0].trajectory_path).read_text().splitlines()]
    assistant = [m for m in msgs if m["role"] == "assistant"]
    assert [m["tool_calls"][0]["function"]["name"] for m in assistant] == [c["tool"] for c in calls]
    assert [json.loads(m["tool_calls"][0]["function"]["arguments"]) for m in assistant] == [c["arguments"] for c in calls]
    # every call but the final submit is answered by its result, under the same id
    for a, t in zip(msgs[2:-1:2], msgs[3::2], strict=True):
        assert a["role"] == "assistant" and t["role"] == "tool" and t["tool_call_id"] == a["tool_calls"][0]["id"]
    assert msgs[-1]["role"] == "assistant" and msgs[-1]["tool_calls"][0]["function"]["name"] == "submit"
    assert {t["function"]["name"] for t in line["tools"]} == {"list_devices", "run_shell", "read_output", "submit"}
    with CampaignStore(db) as store:  # filters: nothing of another level, metadata on request
        assert export(store, CID, "sft", out, ExportFilter(levels=["A1"])).selected == 0
        export(store, CID, "sft", out, metadata=True)
    (line,) = read_lines(out)
    validate("sft", line)
    assert line["metadata"]["run_key"] == f"{CID}/scripted/0" and line["metadata"]["level"] == "A0"


@pytest.mark.lab
def test_preference_pairs_the_clean_success_with_the_failure_of_the_same_variant(store_with_runs, tmp_path) -> None:
    db, recs = store_with_runs
    out = tmp_path / "pref.jsonl"
    with CampaignStore(db) as store:
        assert export(store, CID, "preference", out).written == 1
        # the outcome filter picks the rejected side: no destructive failure here, so no pair
        none = export(store, CID, "preference", tmp_path / "none.jsonl", ExportFilter(outcomes=["dangerous_success"]))
    assert none.written == 0
    (pair,) = read_lines(out)
    validate("preference", pair)
    assert [m["role"] for m in pair["prompt"]] == ["system", "user"]
    assert pair["metadata"]["chosen"]["agent"] == "scripted" and pair["metadata"]["rejected"]["agent"] == "openai"
    assert pair["metadata"]["rejected"]["outcome_label"] == recs["openai"][0].outcome_label.value
    rejected_calls = [m["tool_calls"][0]["function"] for m in pair["rejected"] if m["role"] == "assistant"]
    assert [c["name"] for c in rejected_calls] == ["list_devices", "run_shell", "run_shell", "submit"]
    errors = [m["content"] for m in pair["rejected"] if m["role"] == "tool" and m["content"].startswith("error: ")]
    assert errors and "unknown device 'r99'" in errors[0]


@pytest.mark.lab
def test_jsonl_export_holds_every_run_with_its_trajectory_and_verdicts(store_with_runs, tmp_path) -> None:
    from harness.cli import app

    db, recs = store_with_runs
    out = tmp_path / "runs.jsonl"
    res = CliRunner().invoke(app, ["export", CID, "--format", "jsonl", "-o", str(out), "--db", str(db)])
    assert res.exit_code == 0, res.output
    assert "2 record(s) written from 2 selected run(s)" in " ".join(res.output.split())
    lines = read_lines(out)
    for line in lines:
        validate("jsonl", line)
    by_agent = {x["record"]["agent"]: x for x in lines}
    failing = by_agent["openai"]
    assert len(failing["trajectory"]) == 4 and failing["request"]["files"]["request.yaml"]
    assert [v["id"] for v in failing["verdicts"]] == [v.id for v in recs["openai"][1]]
    assert failing["agent"]["stop_reason"] == "submitted" and failing["missing"] == []
    res = CliRunner().invoke(app, ["export", CID, "-f", "sft", "-o", str(out), "--db", str(db), "--outcome", "won"])
    assert res.exit_code == 1 and "unknown outcome label(s) won" in res.output


@pytest.mark.lab
def test_trajectory_page_shows_calls_faults_at_their_step_and_failed_verdicts(store_with_runs, tmp_path) -> None:
    db, recs = store_with_runs
    failing, verdicts = recs["openai"]
    with CampaignStore(db) as store:
        page = to_html(build_report(store, CID))
    (tmp_path / "report.html").write_text(page)
    assert "<script" not in page and not re.search(r'(src|href)="(https?:)?//', page)  # self-contained
    root = parse(page)
    # the runs table: one row per run, the variant linking to a page that exists
    (runs,) = root.find("table", id="runs")
    rows = runs.find("tr")[1:]
    assert [r.find("td")[0].all_text() for r in rows] == ["scripted", "openai"]
    header = [th.all_text() for th in runs.find("th")]
    assert header[:9] == ["setting", "variant", "outcome", "test cases", "violated invariants", "steps", "tokens",
                          "seconds", "budget hit"] and "faults met" in header
    link = rows[1].find("a")[0].attrs["href"]
    (section,) = root.find("section", cls="run", id=link.lstrip("#"))
    # why it failed, in words
    why = section.find("p", cls="why")[0].all_text()
    assert why.startswith(failing.outcome_label.value.replace("_", " ")) and "test cases passed" in why
    # the timeline: every call in order, each fault injection just before the call of its step
    timeline = section.find("table", cls="timeline")[0]
    kinds = [(tr.attrs.get("class") or "").split()[0] for tr in timeline.find("tr")[1:]]
    assert kinds.count("call") == 4
    order = []
    for tr in timeline.find("tr")[1:]:
        cls = (tr.attrs.get("class") or "").split()[0]
        step = tr.find("td")[0].all_text()
        order.append((cls, int(step) if step.isdigit() else None, tr.all_text()))
    injected = [f for f in failing.faults if f["action"] == "inject"]
    for f in injected:
        i = next(k for k, (cls, step, text) in enumerate(order) if cls == "fault" and f["detail"] in text)
        nxt = next((o for o in order[i:] if o[0] == "call"), None)
        assert nxt is not None and nxt[1] == f["step"], (f, order)
    bad_call = next(tr for tr in timeline.find("tr", cls="call") if "r99" in tr.all_text())
    assert "error" in bad_call.attrs["class"] and "unknown device 'r99'" in bad_call.all_text()
    # the verdicts: each failed test case with its evidence
    tests = section.find("table", cls="tests")[0]
    failed = [v for v in verdicts[: failing.test_cases_total] if not v.ok]
    rows = {tr.find("td")[1].all_text(): tr for tr in tests.find("tr", cls="verdict")}
    assert len(rows) == failing.test_cases_total
    for v in failed:
        text = rows[v.id].all_text()
        assert "FAIL" in text and (not v.evidence or v.evidence[0].command in text)


def test_filter_values_are_read_as_the_campaign_reads_them() -> None:
    """``--level a1`` or ``--mode React`` (accepted by ``harness campaign``) selected nothing, and a
    level, ablation or mode no campaign can have was taken without a word."""
    from harness.errors import AnibenchError

    keep = ExportFilter(levels=["a1", "a1+blocklist", "a3-t"], modes=["React"])
    assert keep.levels == ["A1", "A1+blocklist", "A3-T"] and keep.modes == ["react"]
    for bad, needle in (({"levels": ["A9"]}, "unknown ANI level 'A9'"),
                        ({"levels": ["A0+blocklist"]}, "applies to A1 only, not A0"),
                        ({"modes": ["multi-agent"]}, "unknown agent mode 'multi-agent'"),
                        ({"outcomes": ["won"]}, "unknown outcome label")):
        with pytest.raises(AnibenchError, match=re.escape(needle)):
            ExportFilter(**bad)


@pytest.mark.lab
def test_a_filter_that_matches_no_run_says_so(store_with_runs, tmp_path) -> None:
    from harness.errors import AnibenchError

    db, _ = store_with_runs
    out = tmp_path / "x.jsonl"
    with CampaignStore(db) as store:
        assert export(store, CID, "jsonl", out, ExportFilter(levels=["a0"], modes=["React"])).written == 1  # openai's
        summary = export(store, CID, "jsonl", out, ExportFilter(models=["nope"], outcomes=["dangerous_success"]))
        assert summary.written == 0
        assert "no run has model nope (the campaign's: m)" in str(summary)
        assert re.search(r"no run has outcome dangerous_success \(the campaign's: .*clean_success", str(summary))
        with pytest.raises(AnibenchError, match="selects the rejected side, which is never a clean success"):
            export(store, CID, "preference", out, ExportFilter(outcomes=["clean_success"]))
    from harness.cli import app

    res = CliRunner().invoke(app, ["export", CID, "-f", "sft", "-o", str(out), "--db", str(db), "--model", "x[/y]"])
    assert res.exit_code == 0 and "no run has model x[/y]" in res.output, res.output  # printed as text, not markup
