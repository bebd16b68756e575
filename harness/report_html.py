"""The report of a campaign as one self-contained HTML page with plots (DESIGN.md: "report as
terminal tables and files (CSV/JSON, HTML with plots)").

The page holds the same tables as the terminal report (rendered by rich, inline styles), and two
plots drawn with matplotlib as inline SVG (no script, no network access needed to view it):

- ``rates``: completion and damage-free run rate per setting, with the Wilson 95% interval as
  error bars (draft section 4.7), the number of runs under each setting;
- ``outcomes``: the outcome labels per setting as stacked bars (clean success, dangerous success,
  clean failure, destructive failure; draft section 4.6).

The campaign's specification follows as JSON, so the page alone says what was run.
"""

from __future__ import annotations

import html
import io
import json

from matplotlib.figure import Figure
from rich.console import Console

from harness.report import Report

__all__ = ["OUTCOME_COLOURS", "figures", "to_html"]

#: Outcome label -> colour of its bar segment (colour-blind-safe Okabe-Ito palette).
OUTCOME_COLOURS: dict[str, str] = {
    "clean_success": "#009E73",
    "dangerous_success": "#E69F00",
    "clean_failure": "#56B4E9",
    "destructive_failure": "#D55E00",
}

#: Rate -> (label, colour) for the rates plot.
RATES: dict[str, tuple[str, str]] = {
    "completion": ("completion (task pass)", "#0072B2"),
    "damage_free": ("damage-free run", "#009E73"),
}


def figures(rep: Report) -> dict[str, Figure]:
    """The report's plots, by name (``rates``, ``outcomes``); empty when no run is done.

    Returns:
        matplotlib figures (not attached to pyplot, so nothing is shown or kept globally). In
        ``rates``, each rate is one errorbar series whose points are the observed rates and whose
        error bars span the Wilson 95% interval; settings without done runs are left out.
    """
    cells = [c for c in rep.cells if c.n]
    if not cells:
        return {}
    names = [c.setting for c in cells]
    width = max(7.0, 1.2 * len(cells) + 2.0)  # inches; the legends need 7

    rates = Figure(figsize=(width, 3.6), layout="constrained")
    ax = rates.add_subplot()
    for i, (attr, (label, colour)) in enumerate(RATES.items()):
        xs = [k + (i - 0.5) * 0.22 for k in range(len(cells))]
        props = [getattr(c, attr) for c in cells]
        ys = [p.rate for p in props]
        err = [[p.rate - p.wilson[0] for p in props], [p.wilson[1] - p.rate for p in props]]
        ax.errorbar(xs, ys, yerr=err, fmt="o", capsize=4, color=colour, label=f"{label}, Wilson 95% CI")
    ax.set_xticks(range(len(cells)), [f"{c.setting}\nn={c.n}" for c in cells])
    ax.set_xlim(-0.6, len(cells) - 0.4)
    ax.set_ylim(-0.05, 1.05)
    ax.set_ylabel("rate")
    ax.set_xlabel(rep.factor or "setting")
    ax.grid(axis="y", alpha=0.3)
    ax.legend(loc="lower center", bbox_to_anchor=(0.5, 1.0), ncol=1, frameon=False, fontsize="small")

    outcomes = Figure(figsize=(width, 3.6), layout="constrained")
    ax = outcomes.add_subplot()
    bottom = [0] * len(cells)
    for label, colour in OUTCOME_COLOURS.items():
        counts = [c.outcome_labels.get(label, 0) for c in cells]
        ax.bar(names, counts, width=0.5, bottom=bottom, color=colour, label=label.replace("_", " "))
        bottom = [b + k for b, k in zip(bottom, counts, strict=True)]
    ax.set_ylabel("runs")
    ax.set_xlabel(rep.factor or "setting")
    ax.yaxis.get_major_locator().set_params(integer=True)
    ax.legend(loc="lower center", bbox_to_anchor=(0.5, 1.0), ncol=2, frameon=False, fontsize="small")
    return {"rates": rates, "outcomes": outcomes}


def _svg(fig: Figure) -> str:
    buf = io.StringIO()
    fig.savefig(buf, format="svg", metadata={"Date": None})  # same report, same bytes
    text = buf.getvalue()
    return text[text.index("<svg"):]  # drop the XML prolog and DOCTYPE: the SVG is inline


def to_html(rep: Report) -> str:
    """The whole page: title, plots, the terminal report's tables, the campaign specification.

    Returns:
        A complete HTML5 document (UTF-8), self-contained.
    """
    console = Console(record=True, width=200, file=io.StringIO(), color_system="truecolor")
    console.print(rep)
    tables = console.export_html(inline_styles=True, code_format="<pre style=\"font-size:13px\">{code}</pre>")
    plots = "\n".join(f'<figure id="{name}">{_svg(fig)}</figure>' for name, fig in figures(rep).items())
    title = html.escape(f"anibench campaign {rep.campaign_id}")
    spec = html.escape(json.dumps(rep.spec, indent=2, sort_keys=True, default=str))
    return (
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
        f"<title>{title}</title></head>\n<body style=\"font-family:sans-serif;max-width:1400px\">\n"
        f"<h1>{title}</h1>\n<h2>Rates and outcomes</h2>\n{plots or '<p>No run is done yet.</p>'}\n"
        f"<h2>Tables</h2>\n{tables}\n<h2>Campaign specification</h2>\n<pre>{spec}</pre>\n</body></html>\n"
    )
