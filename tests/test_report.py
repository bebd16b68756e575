"""Tests of harness.report and ``harness report`` on a store filled by hand (no lab)."""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console
from typer.testing import CliRunner

from harness.cli.report import app
from harness.report import build_report
from harness.store import CampaignStore, run_key
from tests.html_tree import parse
from tests.test_store import make_record

CID = "ani-pilot"


def save(store: CampaignStore, setting: str, variant: int, **kw: Any) -> None:
    key = run_key(CID, setting, variant)
    store.plan(CID, [key])
    store.mark_running(key)
    store.save_result(make_record(CID, setting, variant, **kw))


def save_failed(store: CampaignStore, setting: str, variant: int, error: str) -> None:
    """A run the harness could not complete."""
    save(store, setting, variant, status="failed", error=error, task_pass=None, test_case_score=None,
         damage_free=None, completion_mode=None)


FAIL = dict(task_pass=False, test_case_score=0.25, test_cases_passed=1, completion_mode="budget_hit",
            steps=40, tokens_in=300_000, tokens_out=75_000, wall_s=600.0)


@pytest.fixture
def db(tmp_path: Path) -> Path:
    """A store with the campaign of :func:`fill` and an empty campaign."""
    return fill(tmp_path / "results" / "anibench.sqlite")


def fill(path: Path) -> Path:
    """Draft 7.1: A0 completes 0 of 6 paired variants, A3-T 6 of 6, no damage; plus an A1 cell
    with two damaged runs, one harness failure (variant 5) and one run not finished yet."""
    with CampaignStore(path) as s:
        s.create_campaign(CID, {"factor": "ani", "settings": ["A0", "A3-T", "A1"], "variants": 6})
        s.create_campaign("other", {})
        for v in range(6):
            save(s, "A0", v, **FAIL, error_action_rate=0.5, repeat_action_rate=0.25)
            save(s, "A3-T", v, steps=3, tokens_in=40_000, tokens_out=2_000, wall_s=30.0 + v,
                 error_action_rate=0.0 if v else None)
        save(s, "A1", 0)
        save(s, "A1", 1, damage_free=False, violated_invariants=["t3.isolation"])
        save(s, "A1", 2, **FAIL)
        save(s, "A1", 3, **FAIL, damage_free=False, violated_invariants=["t1.ping", "t2.ping"])
        save(s, "A1", 4)
        save_failed(s, "A1", 5, "lab reset: r4 did not converge")
        s.plan(CID, [run_key(CID, "A1", 6)])
    return path


def test_cells(db: Path) -> None:
    with CampaignStore(db) as s:
        rep = build_report(s, CID)
    assert rep.factor == "ani" and rep.unfinished == 1
    a0, a3, a1 = rep.cells
    assert [c.setting for c in rep.cells] == ["A0", "A3-T", "A1"]
    assert (a0.n, a0.completion.k, a0.completion.rate) == (6, 0, 0.0)
    assert a0.completion.wilson == pytest.approx((0.0, 0.3903), abs=1e-4)  # z^2/(6+z^2)
    assert a0.completion.clopper_pearson[1] == pytest.approx(1 - 0.025 ** (1 / 6))
    assert (a3.completion.k, a3.completion.rate) == (6, 1.0)
    assert a3.completion.wilson[0] == pytest.approx(0.6097, abs=1e-4)
    # no damaged run: rule-of-three bound 3/6
    assert a0.damage_free.rate == a3.damage_free.rate == 1.0
    assert a0.damage_rule_of_three == a3.damage_rule_of_three == 0.5
    assert a0.outcome_labels == {"clean_success": 0, "dangerous_success": 0, "clean_failure": 6,
                                 "destructive_failure": 0}
    assert a0.completion_modes["budget_hit"] == 6 and a3.completion_modes["correct_submission"] == 6
    assert a3.cost["steps"] == {"mean": 3.0, "median": 3.0}
    assert a3.cost["tokens"]["mean"] == 42_000
    assert a3.cost["wall_s"] == {"mean": pytest.approx(32.5), "median": pytest.approx(32.5)}
    assert a3.mean_error_action_rate == 0.0 and a3.mean_repeat_action_rate is None
    assert a0.mean_test_case_score == 0.25 and a0.mean_error_action_rate == 0.5
    # the A1 cell: the failed run is apart, not an agent failure
    assert (a1.n, a1.failed, a1.completion.k, a1.damage_free.k) == (5, 1, 3, 3)
    assert a1.damage_rule_of_three is None
    assert a1.outcome_labels == {"clean_success": 2, "dangerous_success": 1, "clean_failure": 1,
                                 "destructive_failure": 1}
    assert [(f.run_key, f.error) for f in rep.failed_runs] == [("ani-pilot/A1/5", "lab reset: r4 did not converge")]


def test_paired_mcnemar(db: Path) -> None:
    with CampaignStore(db) as s:
        rep = build_report(s, CID)
    tests = {(p.setting_a, p.setting_b, p.outcome): p for p in rep.paired}
    assert len(tests) == 6  # 3 pairs of settings x 2 outcomes
    t = tests["A0", "A3-T", "completion"]
    assert (t.test.n_pairs, t.test.b, t.test.c, t.excluded) == (6, 0, 6, 0)
    assert round(t.test.pvalue, 3) == 0.031  # the draft's p = 0.031
    assert tests["A0", "A3-T", "damage_free"].test.pvalue == 1.0
    # A1 has 5 done runs: its failed variant 5 leaves A0's variant 5 unpaired
    t = tests["A0", "A1", "completion"]
    assert (t.test.n_pairs, t.excluded) == (5, 1)
    assert t.test.table == ((0, 0), (3, 2))
    d = tests["A3-T", "A1", "damage_free"]
    assert d.test.table == ((3, 2), (0, 0)) and d.test.pvalue == pytest.approx(0.5)


def test_json_and_csv(db: Path, tmp_path: Path) -> None:
    with CampaignStore(db) as s:
        rep = build_report(s, CID)
    data = json.loads(rep.to_json())
    assert data["campaign_id"] == CID and data["spec"]["variants"] == 6
    assert data["cells"][1]["completion"]["wilson"][0] == pytest.approx(0.6097, abs=1e-4)
    assert data["paired"][0]["test"]["pvalue"] == pytest.approx(0.03125)
    assert data["cells"][0]["completion"]["rate"] == 0.0
    cells_path, paired_path, runs_path = rep.to_csv(tmp_path / "out" / "cells.csv")
    assert paired_path == tmp_path / "out" / "cells_paired.csv"
    rows = list(csv.DictReader(cells_path.read_text().splitlines()))
    assert [r["setting"] for r in rows] == ["A0", "A3-T", "A1"]
    assert rows[1]["completion_k"] == "6" and rows[1]["damage_rule_of_three"] == "0.5"
    assert rows[2]["label_dangerous_success"] == "1" and rows[2]["failed"] == "1"
    assert float(rows[0]["completion_cp_hi"]) == pytest.approx(1 - 0.025 ** (1 / 6))
    paired = list(csv.DictReader(paired_path.read_text().splitlines()))
    assert len(paired) == 6 and float(paired[0]["pvalue"]) == pytest.approx(0.03125)
    runs = list(csv.DictReader(runs_path.read_text().splitlines()))
    assert len(runs) == 18 and runs_path == tmp_path / "out" / "cells_runs.csv"
    a1 = {r["variant"]: r for r in runs if r["setting"] == "A1"}
    assert a1["3"]["violated_invariants"] == "t1.ping t2.ping" and a1["3"]["outcome_label"] == "destructive_failure"
    assert a1["5"]["status"] == "failed" and a1["0"]["tokens"] == "1200"


def test_empty_campaign_and_rich_rendering(db: Path) -> None:
    with CampaignStore(db) as s:
        empty = build_report(s, "other")
        rep = build_report(s, CID)
    assert empty.cells == [] and empty.paired == [] and json.loads(empty.to_json())["unfinished"] == 0
    console = Console(record=True, width=220)
    console.print(rep)
    text = console.export_text()
    for needle in ("Completion and damage-free run rate", "[0.00, 0.39]", "0.031", "lab reset: r4",
                   "exact McNemar", "0.500", "1 failed (harness)"):
        assert needle in text
    console.print(empty)


runner = CliRunner()


def test_cli_report_writes_files(db: Path, tmp_path: Path) -> None:
    j, c = tmp_path / "r.json", tmp_path / "r.csv"
    res = runner.invoke(app, [CID, "--db", str(db), "--json", str(j), "--csv", str(c)])
    assert res.exit_code == 0, res.output
    assert "0.031" in res.output
    assert json.loads(j.read_text())["campaign_id"] == CID
    assert c.exists() and (tmp_path / "r_paired.csv").exists()


def test_cli_unknown_campaign_and_missing_store(db: Path, tmp_path: Path) -> None:
    res = runner.invoke(app, ["nope", "--db", str(db)])
    assert res.exit_code == 1
    assert "unknown campaign 'nope'; known campaigns: ani-pilot, other" in " ".join(res.output.split())
    missing = tmp_path / "none.sqlite"
    res = runner.invoke(app, [CID, "--db", str(missing)])
    assert res.exit_code == 1 and "no results store" in res.output
    assert not missing.exists()


def test_html_page_plots_the_rates_with_their_wilson_intervals(db: Path, tmp_path: Path) -> None:
    from html.parser import HTMLParser

    from harness.report_html import OUTCOME_COLOURS, figures, to_html

    with CampaignStore(db) as s:
        rep = build_report(s, CID)
        empty = build_report(s, "other")
    figs = figures(rep)
    rates = figs["rates"].axes[0]
    assert [t.get_text() for t in rates.get_xticklabels()] == ["A0\nn=6", "A3-T\nn=6", "A1\nn=5"]
    completion, damage_free = rates.containers  # one errorbar series per rate
    ys = list(completion.lines[0].get_ydata())
    assert ys == [0.0, 1.0, 0.6]
    # the error bars span exactly the Wilson intervals of the cells
    segments = completion.lines[2][0].get_segments()
    spans = [(round(seg[0][1], 4), round(seg[1][1], 4)) for seg in segments]
    assert spans == [tuple(round(x, 4) for x in c.completion.wilson) for c in rep.cells]
    assert list(damage_free.lines[0].get_ydata()) == [1.0, 1.0, 0.6]
    # stacked outcome bars: A1 has 2 clean successes, 1 dangerous, 1 clean and 1 destructive failure
    bars = figs["outcomes"].axes[0].patches
    a1 = [p.get_height() for p in bars[2::3]]
    assert a1 == [2, 1, 1, 1] and len(bars) == 3 * len(OUTCOME_COLOURS)

    page = to_html(rep)
    parser = HTMLParser()
    parser.feed(page)  # well-formed enough for a parser; self-contained: no script, no remote URL
    assert page.count("<svg") == 2 and "<script" not in page
    assert not re.search(r'(src|href)="https?:', page)
    for needle in ("anibench campaign ani-pilot", "exact McNemar", "lab reset: r4", "&quot;variants&quot;: 6"):
        assert needle in page
    # real HTML tables, the terminal's and one row per run, each run linked to its trajectory page
    root = parse(page)
    assert "<pre style" not in page and not any(pre.find("table") for pre in root.find("pre"))
    ids = [t.attrs.get("id") for t in root.find("table") if t.attrs.get("id")]
    assert ids == ["rates", "labels", "cost", "paired", "failed", "runs"]
    (rates,) = root.find("table", id="rates")
    assert [td.all_text() for td in rates.find("tr")[1].find("td")][:6] == ["A0", "6", "0", "0/6", "0.00", "[0.00, 0.39]"]
    (runs,) = root.find("table", id="runs")
    rows = runs.find("tbody")[0].find("tr")
    assert len(rows) == 18
    a1_3 = [td.all_text() for td in rows[15].find("td")]
    assert a1_3[:6] == ["A1", "v3", "destructive failure", "1/4", "t1.ping, t2.ping", "40"]
    failed = [td.all_text() for td in rows[17].find("td")]
    assert (failed[2], failed[4]) == ("harness failure", "lab reset: r4 did not converge")
    href = rows[0].find("a")[0].attrs["href"]
    (page_a0,) = root.find("section", id=href[1:])
    assert "Not available: trajectory (the run recorded none)" in page_a0.all_text()
    assert "No run is done yet" in to_html(empty) and figures(empty) == {}

    out = tmp_path / "page" / "r.html"
    res = runner.invoke(app, [CID, "--db", str(db), "--html", str(out)])
    assert res.exit_code == 0, res.output
    assert out.read_text(encoding="utf-8").startswith("<!DOCTYPE html>")


def test_cli_bad_output_paths_fail_before_printing(db: Path, tmp_path: Path) -> None:
    (tmp_path / "dir").mkdir()
    (tmp_path / "file").write_text("x")
    for args, needle in ((["--html", "/proc/nonexistent-dir/r.html"], "cannot write --html /proc/nonexistent-dir/r.html"),
                         (["--csv", str(tmp_path / "dir") + "/"], f"cannot write --csv {tmp_path / 'dir'}: is a directory"),
                         (["--json", str(tmp_path / "file" / "r.json")], f"cannot write --json {tmp_path / 'file' / 'r.json'}"),
                         (["--json", str(tmp_path / "ok.json"), "--csv", str(tmp_path / "dir" / "sub")], None)):
        res = runner.invoke(app, [CID, "--db", str(db), *args])
        if needle is None:
            assert res.exit_code == 0 and "0.031" in res.output, res.output
            continue
        assert res.exit_code == 1 and "0.031" not in res.output, (args, res.output)
        assert needle in " ".join(res.output.split()) and res.output.count("error:") == 1, (args, res.output)
    assert json.loads((tmp_path / "ok.json").read_text())["campaign_id"] == CID
    assert sorted(p.name for p in (tmp_path / "dir").iterdir()) == ["sub", "sub_paired.csv", "sub_runs.csv"]


def test_html_plots_cells_whose_interval_has_float_noise(tmp_path: Path) -> None:
    """7 of 7 runs passing: statsmodels' Wilson upper bound is 1 - 1e-16, below the rate; the
    page used to fail (matplotlib refuses a negative error bar)."""
    from harness.report_html import figures, to_html
    from harness.stats import wilson

    assert wilson(7, 7)[1] < 1.0 and wilson(0, 7)[0] > 0.0  # the noise this guards against
    with CampaignStore(tmp_path / "db.sqlite") as s:
        s.create_campaign(CID, {})
        for v in range(7):
            save(s, "A3-T", v)
            save(s, "A0", v, **FAIL)
        rep = build_report(s, CID)
    assert set(figures(rep)) == {"rates", "outcomes"} and "<svg" in to_html(rep)


def test_html_plots_settings_as_written_even_with_dollar_signs(tmp_path: Path) -> None:
    """A setting is free text when the model is the factor; matplotlib read ``$...$`` in a tick
    label as mathtext, so ``gpt$\\foo$`` failed the whole page (ValueError) and ``$x$`` was drawn
    as a formula."""
    from harness.report_html import figures, to_html

    names = ["gpt$\\foo$", "a$$b", "m$x$"]
    with CampaignStore(tmp_path / "db.sqlite") as s:
        s.create_campaign(CID, {"factor": "model"})
        for name in names:
            save(s, name, 0)
        rep = build_report(s, CID)
    figs = figures(rep)
    assert [t.get_text() for t in figs["outcomes"].axes[0].get_xticklabels()] == names
    assert [t.get_text().split("\n")[0] for t in figs["rates"].axes[0].get_xticklabels()] == names
    assert to_html(rep).count("<svg") == 2


def test_terminal_tables_print_text_as_written(tmp_path: Path) -> None:
    """Cells are text, not rich markup: a failed run's error ``[/usr/lib/frr/zebra] ...`` made
    ``harness report`` fail (MarkupError), and ``[r9]`` in it vanished from the table."""
    with CampaignStore(tmp_path / "db.sqlite") as s:
        s.create_campaign(CID, {"factor": "model"})
        save(s, "m[bold]", 0)
        save_failed(s, "m[bold]", 1, "[/usr/lib/frr/zebra] died on [r9]")
        rep = build_report(s, CID)
    console = Console(record=True, width=220)
    console.print(rep)
    text = console.export_text()
    assert "[/usr/lib/frr/zebra] died on [r9]" in text and "m[bold]" in text


def test_a_report_never_shows_the_secrets_of_the_campaign_spec(tmp_path: Path) -> None:
    """``--agent-opt api_key=...`` is part of the stored spec, and the HTML page and the JSON
    report -- made to be shared -- printed it."""
    from harness.report_html import to_html

    with CampaignStore(tmp_path / "db.sqlite") as s:
        s.create_campaign(CID, {"factor": "ani", "agent_options": {
            "api_key": "sk-SECRET1", "base_url": "https://user:SECRET2@llm.example/v1", "auth_token": "SECRET3",
            "model": "m"}})
        save(s, "A0", 0)
        rep = build_report(s, CID)
        assert s.campaign_spec(CID)["agent_options"]["api_key"] == "sk-SECRET1"  # the store keeps what was given
    for text in (to_html(rep), rep.to_json()):
        assert "SECRET" not in text and "(redacted)" in text and "llm.example" in text


def test_reconciles_and_drift_events_are_reported_for_reconciled_levels(tmp_path) -> None:
    """A3-R/A4 runs carry their reconcile attempts, drift events and reconciler restarts; the text
    and HTML reports show them per level in their own table, which has a row only for a level that
    has them, and which a campaign without such a level does not have (issue 13)."""
    from harness.report_html import to_html
    from tests.test_issue_11 import _campaign_of
    from tests.test_store import make_record

    recs = [make_record("t", "A4", 0, reconciles=3, drift_events=1, supervisor_restarts=0),
            make_record("t", "A4", 1, reconciles=5, drift_events=0, supervisor_restarts=2),
            make_record("t", "A3-R", 0, reconciles=7, drift_events=2),  # a record before schema 4: no restarts
            make_record("t", "A1", 0), make_record("t", "A1", 1)]
    store, rep = _campaign_of(tmp_path, recs)
    cells = {c.setting: c for c in rep.cells}
    assert cells["A4"].cost["reconciles"] == {"mean": 4.0, "median": 4.0}
    assert cells["A4"].cost["drift_events"] == {"mean": 0.5, "median": 0.5}
    assert cells["A4"].cost["supervisor_restarts"] == {"mean": 1.0, "median": 1.0}
    assert cells["A4"].reconcile_totals == {"reconciles_runs": 2, "reconciles_total": 8, "drift_events_runs": 2,
                                            "drift_events_total": 1, "supervisor_restarts_runs": 2, "supervisor_restarts_total": 2}
    assert cells["A1"].cost["reconciles"] == {"mean": None, "median": None} and cells["A1"].reconcile_totals == {}
    assert cells["A4"].flat()["reconciles_mean"] == 4.0 and cells["A4"].flat()["supervisor_restarts_mean"] == 1.0
    cost = next(t for t in rep.tables() if t.key == "cost")
    assert not [c.name for c in cost.columns if "reconcil" in c.name or "drift" in c.name]
    table = next(t for t in rep.tables() if t.key == "reconcile")
    heads = [c.name for c in table.columns]
    assert heads == ["setting", "runs", "reconcile attempts", "attempts total", "drift events", "events total",
                     "reconciler restarts", "restarts total"], heads
    rows = {row[0]: row for row in table.rows}
    assert set(rows) == {"A4", "A3-R"}  # only the levels that have them
    assert rows["A4"] == ["A4", "2", "4.0 / 4.0", "8", "0.5 / 0.5", "1", "1.0 / 1.0", "2"], rows["A4"]
    assert rows["A3-R"] == ["A3-R", "1", "7.0 / 7.0", "7", "2.0 / 2.0", "2", "–", "–"], rows["A3-R"]
    console = Console(record=True, width=220)
    console.print(rep)
    text = console.export_text()
    assert "Reconciled source of truth" in text and "reconciler restarts" in text
    page = to_html(rep)
    html_table = page[page.index('<table id="reconcile">'):]
    html_table = html_table[:html_table.index("</table>")]
    assert "<td>A4</td>" in html_table and "<td>A3-R</td>" in html_table and "<td>A1</td>" not in html_table
    assert '<td class="r">8</td>' in html_table
    store.close()
    # a campaign without a reconciled level: no such table, in either report
    store, rep = _campaign_of(tmp_path / "plain", [make_record("t", "A1", 0), make_record("t", "A0", 0)])
    assert "reconcile" not in [t.key for t in rep.tables()]
    console = Console(record=True, width=220)
    console.print(rep)
    assert "Reconciled source of truth" not in console.export_text() and 'id="reconcile"' not in to_html(rep)
    store.close()


def test_the_page_of_a_harness_failure_says_its_test_cases_were_not_checked() -> None:
    """A run the harness could not complete has no verdict: its page said "Test cases (None/None
    passed)" and "Damage checks: 0 violated, 0 passed" (new-user finding, issue 34); it says that
    neither was checked, and the harness error."""
    from harness.report import RunSummary
    from harness.report_html import trajectory_section
    from harness.runfiles import RunFiles

    failed = RunSummary.of(make_record(CID, "A1", 5, status="failed", error="lab reset: r4 did not converge\nmore",
                                       task_pass=None, test_case_score=None, test_cases_passed=None,
                                       test_cases_total=None, damage_free=None, completion_mode=None))
    heads = [h.all_text() for h in parse(trajectory_section(failed, RunFiles(None))).find("h3")]
    assert "Test cases: not checked (harness error: lab reset: r4 did not converge)" in heads, heads
    assert "Damage checks: not checked" in heads and not [h for h in heads if "None" in h], heads
    done = RunSummary.of(make_record(CID, "A1", 0, test_cases_passed=3))
    heads = [h.all_text() for h in parse(trajectory_section(done, RunFiles(None))).find("h3")]
    assert "Test cases (3/4 passed)" in heads and "Damage checks: 0 violated, 0 passed" in heads, heads



def test_the_page_of_a_run_links_the_noisy_agents_mistakes_file_when_it_has_one(tmp_path: Path) -> None:
    """The noisy agent's ``mistakes.json`` was not on its run's page (new-user finding, issue 34):
    it is listed with the run's trajectory file; a run without one neither lists it nor calls it missing."""
    from harness.report import RunSummary
    from harness.report_html import trajectory_section

    def facts(run_dir: Path) -> tuple[dict[str, str], str]:
        (run_dir / "trajectory.jsonl").write_text("")
        run = RunSummary.of(make_record(CID, "A1", 0, agent="noisy", trajectory_path=str(run_dir / "trajectory.jsonl")))
        page = parse(trajectory_section(run))
        kv = page.find("table", cls="kv")[0]
        return {tr.find("th")[0].all_text(): tr.find("td")[0].all_text() for tr in kv.find("tr")}, page.all_text()

    (clean := tmp_path / "clean").mkdir()
    rows, text = facts(clean)
    assert "mistakes file" not in rows and "mistakes.json" not in text, rows
    (noisy := tmp_path / "noisy").mkdir()
    (noisy / "mistakes.json").write_text('{"rate": 0.5, "kind": null, "inexpressible": {}, "made": []}')
    rows, _ = facts(noisy)
    assert rows["mistakes file"] == str(noisy / "mistakes.json")
    assert rows["trajectory file"] == str(noisy / "trajectory.jsonl")
