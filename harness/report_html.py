"""The report of a campaign as one self-contained HTML page with plots and a trajectory page per run
(DESIGN.md: "report as terminal tables and files (CSV/JSON, HTML with plots)").

The page holds, in order:

- the campaign's headline and the factors held fixed;
- two plots drawn with matplotlib as inline SVG: ``rates`` (completion and damage-free run rate per
  setting with the Wilson 95% interval as error bars, draft section 4.7) and ``outcomes`` (the
  outcome labels per setting as stacked bars, draft section 4.6);
- the report's tables as HTML tables (the same :class:`harness.report.TableData` the terminal
  shows), then the per-run table, each run's variant linking to its trajectory page;
- one trajectory page per run, in the same file: a ``<section class="run">`` shown when its
  address is the target (``report.html#run-A1-v0``; CSS ``:target``, no script). It says why the
  run ended as it did, then lists the request, every tool call with its arguments and an excerpt
  of its result, the fault injections and the agent's own events (plans, malformed calls, its
  stop) interleaved at the step where they happened (:func:`harness.runfiles.timeline`), and the
  verdicts: every test case, every violated baseline invariant with its evidence (a run the
  harness could not complete checked none: its page says so, with the harness error);
- the campaign's specification as JSON, so the page alone says what was run.

No script, no remote resource: the file can be mailed, archived and opened offline. Trajectory
pages read each run's files from its directory (``RunRecord.trajectory_path``); a run whose files
are gone says so on its page.
"""

from __future__ import annotations

import html
import io
import json
import re
from typing import Any

from matplotlib.figure import Figure

from harness.report import NOT_MEASURED, Link, Report, RunSummary, TableData, agent_error_line, run_table
from harness.runfiles import RunFiles, load_run_files, timeline

__all__ = ["OUTCOME_COLOURS", "figures", "run_anchor", "to_html", "trajectory_section"]

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

#: Characters of a tool result (or error) shown on a trajectory page; the trajectory file has the rest.
RESULT_EXCERPT = 800
#: Characters of a call's arguments (as indented JSON) shown.
ARGUMENTS_EXCERPT = 1500
#: Characters of one piece of verdict evidence shown.
EVIDENCE_EXCERPT = 600
#: Lines of any excerpt shown.
EXCERPT_LINES = 24

_CSS = """
body{font-family:sans-serif;max-width:1400px;margin:1em auto;padding:0 1em;color:#222}
table{border-collapse:collapse;margin:0.5em 0 1.5em;font-size:13px}
caption{text-align:left;font-weight:bold;padding:0.3em 0}
th,td{border:1px solid #ccc;padding:3px 6px;vertical-align:top}
th{background:#f2f2f2}
td.r{text-align:right;white-space:nowrap}
pre{margin:0;white-space:pre-wrap;word-break:break-word;font-size:12px;max-width:900px}
section.run{display:none;border-top:3px solid #0072B2;margin-top:2em}
section.run:target{display:block}
body:has(section.run:target)>:not(section.run:target){display:none}
tr.fault td{background:#fff3e0}
tr.agent td{background:#eef4fb}
tr.error td.what{color:#b00020;font-weight:bold}
span.fail{color:#b00020;font-weight:bold}
span.pass{color:#007a55;font-weight:bold}
p.why{font-size:15px}
""".strip()


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
        # statsmodels' Wilson bounds carry float noise (7/7 gives hi = 1 - 1e-16): a bar below the
        # point would be negative, which matplotlib refuses
        err = [[max(0.0, p.rate - p.wilson[0]) for p in props], [max(0.0, p.wilson[1] - p.rate) for p in props]]
        ax.errorbar(xs, ys, yerr=err, fmt="o", capsize=4, color=colour, label=f"{label}, Wilson 95% CI")
    # settings are free text (a model's name): never read as mathtext ("$...$")
    ax.set_xticks(range(len(cells)), [f"{c.setting}\nn={c.n}" for c in cells], parse_math=False)
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
        ax.bar(range(len(cells)), counts, width=0.5, bottom=bottom, color=colour, label=label.replace("_", " "))
        bottom = [b + k for b, k in zip(bottom, counts, strict=True)]
    ax.set_xticks(range(len(cells)), names, parse_math=False)
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


def _e(x: object) -> str:
    return html.escape(str(x), quote=True)


def _cut(text: str, limit: int, lines: int = EXCERPT_LINES) -> str:
    """``text`` cut to ``limit`` characters and ``lines`` lines, saying how much is left out."""
    kept = "\n".join(text.split("\n")[:lines])[:limit]
    return text if kept == text else f"{kept}\n[... {len(text) - len(kept)} more characters in the file]"


def table_html(t: TableData) -> str:
    """One :class:`~harness.report.TableData` as an HTML table (``id`` = its key)."""
    head = "".join(f'<th scope="col">{_e(c.name)}</th>' for c in t.columns)
    rows = []
    for row in t.rows:
        cells = []
        for col, v in zip(t.columns, row, strict=True):
            text = f'<a href="{_e(v.href)}">{_e(v.text)}</a>' if isinstance(v, Link) else _e(v)
            cells.append(f'<td class="r">{text}</td>' if col.align == "right" else f"<td>{text}</td>")
        rows.append("<tr>" + "".join(cells) + "</tr>")
    return (f'<table id="{_e(t.key)}"><caption>{_e(t.title)}</caption><thead><tr>{head}</tr></thead>'
            f'<tbody>{"".join(rows)}</tbody></table>')


def run_anchor(run: RunSummary) -> str:
    """The HTML id of a run's trajectory page: ``run-<setting>-v<variant>``, other characters as ``_``."""
    return "run-" + re.sub(r"[^A-Za-z0-9_.-]", "_", f"{run.setting}-v{run.variant}")


def _kv(rows: list[tuple[str, str]]) -> str:
    body = "".join(f'<tr><th scope="row">{_e(k)}</th><td>{_e(v)}</td></tr>' for k, v in rows)
    return f'<table class="kv"><tbody>{body}</tbody></table>'


def _why(run: RunSummary, files: RunFiles, tests: list[dict[str, Any]]) -> str:
    """One paragraph: the outcome and what made it."""
    if run.status != "done":
        return f"The harness could not complete this run: {run.error or '?'}"
    parts = [f"{(run.outcome_label or '?').replace('_', ' ')}:"]
    failed = [v["id"] for v in tests if not v.get("ok")]
    if run.test_cases_total is not None:
        parts.append(f"{run.test_cases_passed} of {run.test_cases_total} test cases passed"
                     + (f" (failed: {', '.join(failed[:4])}{', ...' if len(failed) > 4 else ''})" if failed else "")
                     + ";")
    parts.append(f"{len(run.violated_invariants)} baseline invariant(s) violated"
                 + (f" ({', '.join(run.violated_invariants[:4])}{', ...' if len(run.violated_invariants) > 4 else ''})"
                    if run.violated_invariants else "") + ";")
    parts.append(f"completion mode {(run.completion_mode or '?').replace('_', ' ')}"
                 + (f" (the {run.budget_exhausted} budget was reached)" if run.budget_exhausted else "") + ";")
    if run.agent_stop:
        parts.append(f"the agent stopped: {run.agent_stop};")
    if files.agent.get("error"):
        parts.append(f"agent error: {files.agent['error']};")
    parts.append(f"faults met: {', '.join(run.faults)}." if run.faults else "no fault injected.")
    return " ".join(parts)


def _call_row(c: dict[str, Any], anchor: str) -> str:
    error = bool(c.get("is_error"))
    status = "refused (" + str(c["refused"]) + ")" if c.get("refused") else "error" if error else "ok"
    args = c.get("arguments")
    args_text = args if isinstance(args, str) else json.dumps(args, indent=1, ensure_ascii=False, default=str)
    result = c.get("error") if c.get("tool_error") or c.get("error") else c.get("result")
    rejected = c.get("rejected") or []
    extra = f"\nrejected: {'; '.join(map(str, rejected))}" if rejected else ""
    return (f'<tr class="call{" error" if error else ""}" id="{_e(anchor)}-step-{_e(c.get("seq"))}">'
            f'<td class="r">{_e(c.get("seq"))}</td><td class="what">{_e(c.get("tool"))}<br>'
            f'<small>{_e(c.get("kind"))}, {_e(status)}, {float(c.get("duration_s") or 0):.2f} s</small></td>'
            f'<td><pre>{_e(_cut(args_text, ARGUMENTS_EXCERPT))}</pre></td>'
            f'<td><pre>{_e(_cut(str(result or "") + extra, RESULT_EXCERPT))}</pre></td></tr>')


def _fault_row(f: dict[str, Any], _anchor: str) -> str:
    step = f.get("step")
    when = f"before step {step}" if isinstance(step, int) else "at the end of the run"
    return (f'<tr class="fault"><td class="r">{_e(step if step is not None else "")}</td>'
            f'<td class="what">fault {_e(f.get("action"))}<br><small>{_e(f.get("kind"))} {_e(f.get("fault"))}</small></td>'
            f'<td colspan="2">{_e(when)}: {_e(f.get("detail") or "")}</td></tr>')


def _agent_row(e: dict[str, Any], _anchor: str) -> str:
    return (f'<tr class="agent"><td class="r">{_e(e.get("step", ""))}</td>'
            f'<td class="what">agent: {_e(e.get("kind"))}</td>'
            f'<td colspan="2"><pre>{_e(_cut(str(e.get("text") or ""), RESULT_EXCERPT))}</pre></td></tr>')


def _verdict_rows(verdicts: list[dict[str, Any]], *, only_failed: bool) -> str:
    rows = []
    for v in verdicts:
        if only_failed and v.get("ok"):
            continue
        mark = '<span class="pass">pass</span>' if v.get("ok") else '<span class="fail">FAIL</span>'
        evidence = ""
        if not v.get("ok"):
            evidence = "\n\n".join(
                f"{ev.get('node', '')}$ {ev.get('command', '')}  (exit {ev.get('exit_code')})\n"
                f"{_cut(str(ev.get('output') or ''), EVIDENCE_EXCERPT)}" for ev in v.get("evidence") or [])
        rows.append(f'<tr class="verdict"><td>{mark}</td><td>{_e(v.get("id"))}</td><td>{_e(v.get("detail") or "")}</td>'
                    f'<td><pre>{_e(evidence)}</pre></td></tr>')
    return "".join(rows)


def trajectory_section(run: RunSummary, files: RunFiles | None = None) -> str:
    """A run's trajectory page (see the module docstring).

    Args:
        run: the run.
        files: its files (default: read from its directory).

    Returns:
        One ``<section class="run" id=...>`` element.
    """
    files = files if files is not None else load_run_files(run.trajectory_path)
    n_tests = run.test_cases_total or 0
    tests, damage = files.verdicts[:n_tests], files.verdicts[n_tests:]
    anchor = run_anchor(run)
    facts = [("run", run.run_key), ("setting", run.setting), ("variant", str(run.variant)),
             ("level", "+".join([run.level or "?", *run.ablations])), ("agent", run.agent),
             ("model", run.model or "–"), ("mode", run.mode or "–"),
             ("outcome", (run.outcome_label or run.status).replace("_", " ")),
             ("test cases", f"{run.test_cases_passed}/{run.test_cases_total}" if run.test_cases_total is not None else "–"),
             ("steps", str(run.steps)), ("tokens", NOT_MEASURED if run.tokens is None else f"{run.tokens:,}"), ("seconds", f"{run.wall_s:.1f}"),
             ("trajectory file", run.trajectory_path or "–")]
    if files.mistakes is not None:  # the noisy agent's record of the mistakes it made
        facts.append(("mistakes file", str(files.mistakes)))
    if run.agent_error:
        facts.insert(8, ("agent error", agent_error_line(run, "")[2:]))
    parts = [f'<section class="run" id="{_e(anchor)}"><h2>Run {_e(run.run_key)}</h2>',
             '<p><a href="#runs">back to the runs</a></p>', f'<p class="why">{_e(_why(run, files, tests))}</p>',
             _kv(facts)]
    if files.missing:
        parts.append(f"<p>Not available: {_e('; '.join(files.missing))}</p>")
    if files.hai:
        req = str(files.hai.get("prompt", "")) + "".join(
            f"\n\n--- {name} ---\n{text}" for name, text in (files.hai.get("files") or {}).items())
        parts.append(f"<details><summary>The request (HAI prompt and files)</summary><pre>{_e(req)}</pre></details>")
    entries = timeline(files.calls, run.fault_events, files.agent.get("events") or [])
    parts.append('<h3>Trajectory</h3><table class="timeline"><thead><tr><th scope="col">step</th>'
                 '<th scope="col">what</th><th scope="col">arguments</th><th scope="col">result (excerpt)</th>'
                 "</tr></thead><tbody>")
    render = {"call": _call_row, "fault": _fault_row, "agent": _agent_row}
    parts += [render[e.kind](e.data, anchor) for e in entries]
    if not entries:
        parts.append('<tr><td colspan="4">no tool call recorded</td></tr>')
    parts.append("</tbody></table>")
    head = '<thead><tr><th scope="col">verdict</th><th scope="col">check</th><th scope="col">detail</th>' \
           '<th scope="col">evidence</th></tr></thead>'
    if run.test_cases_total is None:  # no verdict: the harness failed before checking (or an old record)
        first = (run.error or "?").split("\n")[0]  # the paragraph above has all of it
        cause = f" (harness error: {first[:160]}{'...' if len(first) > 160 else ''})" if run.status != "done" else ""
        parts.append(f"<h3>Test cases: not checked{_e(cause)}</h3>")
    else:
        parts.append(f'<h3>Test cases ({run.test_cases_passed}/{run.test_cases_total} passed)</h3>'
                     f'<table class="verdicts tests">{head}<tbody>{_verdict_rows(tests, only_failed=False)}</tbody></table>')
    violated_checks = _verdict_rows(damage, only_failed=True)
    others = [v for v in run.violated_invariants if v not in {d.get("id") for d in damage}]
    extra = "".join(f'<tr class="verdict"><td><span class="fail">FAIL</span></td><td>{_e(v)}</td>'
                    f"<td>processes the agent left running in the node (killed before observing)</td><td></td></tr>"
                    for v in others)
    passed = sum(1 for d in damage if d.get("ok"))
    counts = (f"{len(run.violated_invariants)} violated, {passed} passed" if run.status == "done" or damage
              or run.violated_invariants else "not checked")
    parts.append(f"<h3>Damage checks: {counts}</h3>"
                 f'<table class="verdicts damage">{head}<tbody>{violated_checks}{extra}</tbody></table></section>')
    return "".join(parts)


def to_html(rep: Report, *, trajectories: bool = True) -> str:
    """The whole page: title, plots, tables, runs, trajectory pages, the campaign specification.

    Args:
        rep: the report.
        trajectories: include a trajectory page per run (read from the runs' directories).

    Returns:
        A complete HTML5 document (UTF-8), self-contained.
    """
    plots = "\n".join(f'<figure id="{name}">{_svg(fig)}</figure>' for name, fig in figures(rep).items())
    title = _e(f"anibench campaign {rep.campaign_id}")
    spec = _e(json.dumps(rep.spec, indent=2, sort_keys=True, default=str))
    tables = "\n".join(table_html(t) for t in rep.tables())
    notes = "".join(f"<p><strong>{_e(n)}</strong></p>" for n in rep.notes)
    runs = table_html(run_table(rep, (lambda r: "#" + run_anchor(r)) if trajectories else (lambda _r: None)))
    pages = "\n".join(trajectory_section(r) for r in rep.runs) if trajectories else ""
    return (
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
        f"<title>{title}</title><style>{_CSS}</style></head>\n<body>\n"
        f"<h1>{title}</h1>\n<p>{_e(rep.headline)}</p>\n<p>{_e(rep.fixed_line)}</p>{notes}\n"
        f"<h2>Rates and outcomes</h2>\n{plots or '<p>No run is done yet.</p>'}\n"
        f"<h2>Tables</h2>\n{tables}\n<h2>Runs</h2>\n{runs}\n{pages}\n"
        f"<h2>Campaign specification</h2>\n<pre>{spec}</pre>\n</body></html>\n"
    )
