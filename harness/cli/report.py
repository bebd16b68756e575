"""``harness report``: the statistics of a campaign from the results store (terminal, JSON, CSV, HTML)."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Annotated

import typer

from harness.cli.common import check_writable, err, fail, friendly_errors, out

app = typer.Typer(help="Report a campaign from the results store.", no_args_is_help=True, add_completion=False)

DEFAULT_DB = Path("results/anibench.sqlite")


@app.command("report")
@friendly_errors
def report(
    campaign: Annotated[str, typer.Argument(help="Campaign id.")],
    db: Annotated[Path, typer.Option("--db", envvar="ANIBENCH_DB", help="Results store (SQLite).")] = DEFAULT_DB,
    json_out: Annotated[Path | None, typer.Option("--json", help="Also write the report as JSON here.")] = None,
    csv_out: Annotated[Path | None, typer.Option(
        "--csv", help="Also write one row per cell here, the paired tests beside it (<name>_paired.csv) and one "
        "row per run (<name>_runs.csv).")] = None,
    html_out: Annotated[Path | None, typer.Option(
        "--html", help="Also write a self-contained HTML page here: plots of the rates with their "
        "95% intervals and of the outcome labels, the tables, one row per run linking to its trajectory page "
        "(tool calls, faults and verdicts), the campaign specification.")] = None,
) -> None:
    """Report a campaign: per-setting rates with intervals, outcomes, cost, paired McNemar tests, runs.

    Prints the report; ``--json``, ``--csv`` and ``--html`` also write it to files.

    Completion and damage-free run rates with Wilson and Clopper-Pearson 95% intervals, outcome
    labels, completion modes, cost per run, and exact McNemar tests between every two settings.
    """
    from harness.report import build_report
    from harness.store import CampaignStore

    if not db.is_file():
        fail(f"no results store at {db} (run a campaign first, or pass --db)")
    from harness.report import csv_companions

    targets = [("--json", json_out), ("--html", html_out), ("--csv", csv_out)]
    if csv_out:
        targets += [("--csv", p) for p in csv_companions(csv_out)]
    for option, path in targets:
        if path is not None:
            check_writable(option, path)
    try:
        with CampaignStore(db) as store:
            rep = build_report(store, campaign)
    except sqlite3.DatabaseError as e:
        fail(f"{db} is not a readable results store: {e}")
    out.print(rep)
    if json_out:
        json_out.parent.mkdir(parents=True, exist_ok=True)
        json_out.write_text(rep.to_json() + "\n")
        err.print(f"wrote {json_out}", highlight=False, markup=False)
    if csv_out:
        cells, paired, runs = rep.to_csv(csv_out)
        err.print(f"wrote {cells}, {paired} and {runs}", highlight=False, markup=False)
    if html_out:
        from harness.report_html import to_html

        html_out.parent.mkdir(parents=True, exist_ok=True)
        html_out.write_text(to_html(rep), encoding="utf-8")
        err.print(f"wrote {html_out}", highlight=False, markup=False)
