"""``harness demo``: the main job on the embedded default substrate, end to end, in one command --
two small real campaigns (A0 against A3-T, change-set task) on the 25-router brownfield, one
with the competent scripted operator and one with the noisy one, then their reports."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from harness.cli.common import DataplaneOption, err, friendly_errors, out, use_dataplane


@friendly_errors
def demo(
    ani: Annotated[str, typer.Option(help="ANI levels to compare.")] = "A0,A3-T",
    task: Annotated[str, typer.Option(help="Task class.")] = "change-set",
    variants: Annotated[int, typer.Option(min=1, help="Task variants per campaign.")] = 3,
    density: Annotated[int, typer.Option(min=1, help="State density.")] = 2,
    faults: Annotated[float, typer.Option(min=0, max=1, help="Fault rate lambda (faults per agent step).")] = 0.0,
    db: Annotated[Path, typer.Option(help="Results database.")] = Path("results/demo.sqlite"),
    dataplane: DataplaneOption = None,
) -> None:
    """Run two small campaigns (scripted and noisy agents; A0 vs A3-T by default) and print the reports."""
    from harness.campaign import make_spec, run_campaign, summary_line
    from harness.cli.campaign import DEFAULT_MANIFEST, _dataplane, _manifest_path
    from harness.report import build_report
    from harness.report_html import to_html
    from harness.store import CampaignStore
    from substrate.features import check_root_and_tools

    use_dataplane(dataplane)
    check_root_and_tools()
    db.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    stamp = f"{int(time.time())}-{os.getpid() % 1000}"
    pages: list[Path] = []
    with CampaignStore(db) as store:
        for agent in ("scripted", "noisy"):
            spec = make_spec(ani=ani.split(","), agent=[agent], model=[None], task=task, variants=variants,
                             manifest=_manifest_path(DEFAULT_MANIFEST), seed=7, density=density, fault_rate=faults,
                             budget_steps=60, wall_cap_s=300, agent_options={}, campaign_id=f"demo-{agent}-{stamp}",
                             dataplane=_dataplane("local"))
            out.rule(f"campaign {spec.campaign_id}: {agent} agent, {' vs '.join(spec.settings)}, {task} x {variants}")

            def on_run(_key: str, rec) -> None:  # noqa: ANN001
                if rec is not None:
                    err.print(escape(summary_line(rec)), highlight=False)

            with err.status("running..."):
                run_campaign(spec, store, results_dir=db.parent / "runs", on_run=on_run)
            rep = build_report(store, spec.campaign_id)
            out.print(rep)
            page = db.parent / f"{spec.campaign_id}.html"
            page.write_text(to_html(rep), encoding="utf-8")
            pages.append(page)
    out.print(f"demo done in {time.monotonic() - t0:.0f} s; results in {db} (harness report CAMPAIGN --db {db}); "
              f"HTML reports: {', '.join(map(str, pages))}",
              highlight=False)
