"""The ``harness`` command line (typer). One module per subcommand group."""

from __future__ import annotations

import typer

from harness.cli import campaign as campaign_cli
from harness.cli import demo as demo_cli
from harness.cli import export as export_cli
from harness.cli import lab as lab_cli
from harness.cli import report as report_cli
from harness.cli import scenario as scenario_cli
from harness.cli import serve as serve_cli

app = typer.Typer(
    name="harness",
    help="anibench: benchmark network-management AI agents on a real SRv6 brownfield.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
app.add_typer(lab_cli.app, name="lab")
app.add_typer(scenario_cli.app, name="scenario")
app.command("demo")(demo_cli.demo)
app.command("serve")(serve_cli.serve)
app.command("mcp-config")(serve_cli.mcp_config)
app.command("report")(report_cli.report)
app.command("export")(export_cli.export)
app.command("campaign", cls=campaign_cli.CampaignCommand)(campaign_cli.campaign)
app.add_typer(campaign_cli.task_app, name="task")


def main() -> None:
    """Console-script entry point."""
    from harness.cli.common import configure_logging

    configure_logging()
    app()
