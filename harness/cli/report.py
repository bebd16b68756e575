"""``harness report``: the statistics of a campaign from the results store (terminal, JSON, CSV, HTML)."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Annotated

import typer

from harness.cli.common import err, fail, friendly_errors, out

app = typer.Typer(help="Report a campaign from the results store.", no_args_is_help=True, add_completion=False)

DEFAULT_DB = Path("results/anibench.sqlite")


def _check_writable(option: str, path: Path) -> None:
    """Exit with one line unless ``path`` can be written (its directory is created if missing),
    so that a bad output path fails before the report is printed rather than after."""
    import os

    try:
        if path.is_dir():
            raise IsADirectoryError(21, "is a directory; give a file name")
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.exists():
            with path.open("a"):
                pass
        else:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            os.close(fd)
            path.unlink()
    except OSError as e:
        fail(f"cannot write {option} {path}: {e.strerror or e}")


@app.command("report")
@friendly_errors
def report(
    campaign: Annotated[str, typer.Argument(help="Campaign id.")],
    db: Annotated[Path, typer.Option("--db", envvar="ANIBENCH_DB", help="Results store (SQLite).")] = DEFAULT_DB,
    json_out: Annotated[Path | None, typer.Option("--json", help="Also write the report as JSON here.")] = None,
    csv_out: Annotated[Path | None, typer.Option(
        "--csv", help="Also write one row per cell here, and the paired tests beside it (<name>_paired.csv).")] = None,
    html_out: Annotated[Path | None, typer.Option(
        "--html", help="Also write a self-contained HTML page here: plots of the rates with their "
        "95% intervals and of the outcome labels, the tables, the campaign specification.")] = None,
) -> None:
    """Report a campaign: per-setting rates with intervals, outcomes, cost, paired McNemar tests.

    Prints the report; ``--json``, ``--csv`` and ``--html`` also write it to files.

    Completion and damage-free run rates with Wilson and Clopper-Pearson 95% intervals, outcome
    labels, completion modes, cost per run, and exact McNemar tests between every two settings.
    """
    from harness.report import build_report
    from harness.store import CampaignStore

    if not db.is_file():
        fail(f"no results store at {db} (run a campaign first, or pass --db)")
    targets = [("--json", json_out), ("--html", html_out), ("--csv", csv_out)]
    if csv_out:
        targets.append(("--csv", csv_out.with_name(f"{csv_out.stem}_paired{csv_out.suffix or '.csv'}")))
    for option, path in targets:
        if path is not None:
            _check_writable(option, path)
    try:
        with CampaignStore(db) as store:
            rep = build_report(store, campaign)
    except sqlite3.DatabaseError as e:
        fail(f"{db} is not a readable results store: {e}")
    out.print(rep)
    if json_out:
        json_out.parent.mkdir(parents=True, exist_ok=True)
        json_out.write_text(rep.to_json() + "\n")
        err.print(f"wrote {json_out}", highlight=False)
    if csv_out:
        cells, paired = rep.to_csv(csv_out)
        err.print(f"wrote {cells} and {paired}", highlight=False)
    if html_out:
        from harness.report_html import to_html

        html_out.parent.mkdir(parents=True, exist_ok=True)
        html_out.write_text(to_html(rep), encoding="utf-8")
        err.print(f"wrote {html_out}", highlight=False)
