"""``harness export``: a campaign's trajectories as training data (SFT, preference pairs) or as
complete run records (JSONL); see :mod:`harness.export` for the formats."""

from __future__ import annotations

import sqlite3
from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer

from harness.cli.common import check_writable, err, fail, friendly_errors
from harness.cli.report import DEFAULT_DB


class Format(StrEnum):
    """Export formats."""

    sft = "sft"
    preference = "preference"
    jsonl = "jsonl"


def _csv(value: str | None) -> list[str]:
    return [x.strip() for x in (value or "").split(",") if x.strip()]


@friendly_errors
def export(
    campaign: Annotated[str, typer.Argument(help="Campaign id.")],
    fmt: Annotated[Format, typer.Option("--format", "-f", help="sft: clean successes in the OpenAI chat format "
                                        "with tool calls; preference: clean success vs failure or dangerous success "
                                        "on the same variant; jsonl: every run with its record, trajectory and "
                                        "verdicts.")],
    output: Annotated[Path, typer.Option("--output", "-o", help="File to write (JSON Lines).")],
    db: Annotated[Path, typer.Option("--db", envvar="ANIBENCH_DB", help="Results store (SQLite).")] = DEFAULT_DB,
    level: Annotated[str | None, typer.Option(help="Only these ANI levels or settings, comma-separated "
                                              "(A1 also matches A1+blocklist).")] = None,
    model: Annotated[str | None, typer.Option(help="Only these models, comma-separated.")] = None,
    mode: Annotated[str | None, typer.Option(help="Only these agent modes, comma-separated.")] = None,
    outcome: Annotated[str | None, typer.Option(
        help="Only these outcome labels, comma-separated: clean_success, dangerous_success, clean_failure, "
        "destructive_failure (preference: the rejected side).")] = None,
    metadata: Annotated[bool | None, typer.Option(
        "--metadata/--no-metadata", help="Add which run each line comes from (default: off for sft -- "
        "OpenAI's uploader refuses unknown keys -- and on for preference).")] = None,
) -> None:
    """Export a campaign's runs as training data or complete records (JSON Lines).

    The JSON Schema of each format is shipped in harness/schemas/ (export-FORMAT.schema.json).
    """
    from harness.export import ExportFilter
    from harness.export import export as run_export
    from harness.store import CampaignStore

    if not db.is_file():
        fail(f"no results store at {db} (run a campaign first, or pass --db)")
    keep = ExportFilter(levels=_csv(level), models=_csv(model), modes=_csv(mode), outcomes=_csv(outcome))
    check_writable("--output", output)
    try:
        with CampaignStore(db) as store:
            summary = run_export(store, campaign, fmt.value, output, keep, metadata=metadata)
    except sqlite3.DatabaseError as e:
        fail(f"{db} is not a readable results store: {e}")
    err.print(f"wrote {output}: {summary}", highlight=False, soft_wrap=True, markup=False)
