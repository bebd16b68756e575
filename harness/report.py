"""The report of a campaign: per-cell rates with intervals, paired tests, cost; terminal, JSON, CSV.

A cell is one setting of the campaign's controlled factor. Per cell: completion rate (task pass)
and damage-free run rate with Wilson and Clopper-Pearson 95% intervals, the rule-of-three bound on
the damage probability when no run was damaged (draft section 4.7), outcome-label and
completion-mode counts, and the mean and median cost per run (draft 4.4: cost is a dependent
variable). Between every two settings: the exact McNemar test on discordant pairs, runs matched by
task-variant index (draft 4.5), for completion and for damage-free. Runs the harness could not
complete (status ``failed``) are listed apart and never counted as agent failures, so their
variant is unpaired in every comparison. Per run (:class:`RunSummary`): setting, variant, outcome,
test cases, violated invariants, steps, tokens, seconds, the budget it reached, the faults it met.

Every table is built once as data (:class:`TableData`: title, columns, rows of text or links) and
rendered by rich for the terminal and as HTML by :mod:`harness.report_html`; a new column or table
is one change in :meth:`Report.tables` or :func:`run_table`.
"""

from __future__ import annotations

import csv
import json
import re
import statistics
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from itertools import combinations
from pathlib import Path
from typing import Any, Literal

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from harness.agents.base import TOKEN_BUDGET_AGENTS
from harness.stats import McNemarResult, clopper_pearson, mcnemar_exact, rule_of_three, wilson
from harness.store import CampaignStore, CompletionMode, OutcomeLabel, RunRecord, RunStatus

__all__ = ["Cell", "Column", "FailedRun", "Link", "PairedTest", "Proportion", "Report", "RunSummary", "TableData",
           "build_report", "fixed_factors", "render_rich", "run_table"]

#: What the report shows for the tokens of an agent whose tokens the harness cannot count (an
#: external process): not a number, since 0 would read as "used none".
NOT_MEASURED = "not measured"


def tokens_of(r: RunRecord) -> int | None:
    """Prompt + completion tokens of a run, or None when the agent's tokens are not measured (an
    external ``command`` agent: the harness sees its tool calls, not its model's usage)."""
    return r.tokens_in + r.tokens_out if r.agent in TOKEN_BUDGET_AGENTS else None


#: Cost metrics per run: (name, how to read it from a record; None = not measured for that run).
COST_METRICS: dict[str, Any] = {
    "steps": lambda r: r.steps,
    "tokens": tokens_of,
    "wall_s": lambda r: r.wall_s,
    # A3-R, A4: the source of truth's reconcile attempts, drift events and reconciler restarts (None
    # at the other levels): in Cell.cost and the CSV, and in their own table (_reconcile_table)
    "reconciles": lambda r: r.reconciles,
    "drift_events": lambda r: r.drift_events,
    "supervisor_restarts": lambda r: r.supervisor_restarts,
}
#: The metrics of :data:`COST_METRICS` only a level with a reconciled source of truth has (A3-R,
#: A4), with their column names: shown in the report's "reconcile" table, for such levels only.
RECONCILE_METRICS: dict[str, str] = {"reconciles": "reconcile attempts", "drift_events": "drift events",
                                     "supervisor_restarts": "reconciler restarts"}


@dataclass(frozen=True)
class Proportion:
    """``k`` of ``n`` runs, with the observed rate and its 95% intervals (draft 4.7)."""

    k: int
    n: int
    rate: float | None
    """``k/n``; None for an empty cell."""
    wilson: tuple[float, float]
    clopper_pearson: tuple[float, float]

    @classmethod
    def of(cls, k: int, n: int) -> Proportion:
        """Compute the rate and both intervals (vacuous ``(0, 1)`` when ``n == 0``)."""
        return cls(k, n, k / n if n else None, wilson(k, n), clopper_pearson(k, n))


@dataclass(frozen=True)
class Cell:
    """The runs of one factor setting that the harness completed (status ``done``)."""

    setting: str
    n: int
    failed: int
    """Runs of this setting that the harness could not complete (not in ``n``)."""
    agent_errors: int
    """Runs in ``n`` whose agent ended with an error of its own (``RunRecord.agent_error``: a process
    that exited non-zero or crashed, an endpoint that kept failing): counted in the rates as what the
    agent system did, and here apart, so a crash is not read as an agent that chose to do nothing."""
    completion: Proportion
    damage_free: Proportion
    damage_rule_of_three: float | None
    """Approximate 95% upper bound on the damage probability (3/n) when no run was damaged."""
    outcome_labels: dict[str, int]
    completion_modes: dict[str, int]
    cost: dict[str, dict[str, float | None]]
    """Per metric of :data:`COST_METRICS`: ``{"mean": ..., "median": ...}`` over the runs where it is
    measured (None when it is measured in none: tokens of an external agent)."""
    mean_test_case_score: float | None
    mean_config_f1: float | None
    """Mean configuration F1 over the runs where it is measured (templates: harness.config_f1)."""
    mean_error_action_rate: float | None
    """Mean over the runs where the rate is defined (runs with configuration/validation actions)."""
    mean_repeat_action_rate: float | None
    reconcile_totals: dict[str, int] = field(default_factory=dict)
    """Per metric of :data:`RECONCILE_METRICS` measured in at least one run of the cell,
    ``<metric>_runs`` (how many runs have it) and ``<metric>_total`` (its sum over them), e.g.
    ``{"reconciles_runs": 2, "reconciles_total": 8}``; empty at a level without a source of truth."""

    def flat(self) -> dict[str, Any]:
        """One CSV row."""
        row: dict[str, Any] = {"setting": self.setting, "n": self.n, "failed": self.failed,
                               "agent_errors": self.agent_errors}
        for name, p in (("completion", self.completion), ("damage_free", self.damage_free)):
            row |= {f"{name}_k": p.k, f"{name}_rate": p.rate,
                    f"{name}_wilson_lo": p.wilson[0], f"{name}_wilson_hi": p.wilson[1],
                    f"{name}_cp_lo": p.clopper_pearson[0], f"{name}_cp_hi": p.clopper_pearson[1]}
        row["damage_rule_of_three"] = self.damage_rule_of_three
        row |= {f"label_{k}": v for k, v in self.outcome_labels.items()}
        row |= {f"mode_{k}": v for k, v in self.completion_modes.items()}
        row |= {f"{m}_{s}": v for m, d in self.cost.items() for s, v in d.items()}
        row |= {"mean_test_case_score": self.mean_test_case_score, "mean_config_f1": self.mean_config_f1,
                "mean_error_action_rate": self.mean_error_action_rate,
                "mean_repeat_action_rate": self.mean_repeat_action_rate}
        return row


@dataclass(frozen=True)
class PairedTest:
    """Exact McNemar test of one outcome between two settings, pairs matched by variant index."""

    setting_a: str
    setting_b: str
    outcome: str
    """``completion`` (task pass) or ``damage_free``."""
    test: McNemarResult
    excluded: int
    """Done runs of either setting whose variant has no done run in the other (left out)."""

    def flat(self) -> dict[str, Any]:
        """One CSV row."""
        (both, a_only), (b_only, neither) = self.test.table
        return {"setting_a": self.setting_a, "setting_b": self.setting_b, "outcome": self.outcome,
                "n_pairs": self.test.n_pairs, "both": both, "a_only": a_only, "b_only": b_only,
                "neither": neither, "pvalue": self.test.pvalue, "excluded": self.excluded}


@dataclass(frozen=True)
class FaultParity:
    """The faults each run of one variant met: ``KIND@STEP TARGET`` per injection, in order."""

    variant: int
    same: bool
    """Every done run of the variant met the same faults (kind, target and step)."""
    met: dict[str, list[str]]
    """Setting -> the faults its run met."""


def _fault_list(r: RunRecord) -> list[str]:
    out = []
    for f in r.faults:
        if f.get("action") == "inject":
            target = ",".join(f"{k}={v}" for k, v in sorted((f.get("target") or {}).items()))
            out.append(f"{f.get('kind')}@{f.get('step')}" + (f" {target}" if target else ""))
    return out


def _fault_parity(done: dict[str, dict[int, RunRecord]]) -> list[FaultParity]:
    variants = sorted({v for runs in done.values() for v in runs})
    out = []
    for v in variants:
        met = {s: _fault_list(runs[v]) for s, runs in done.items() if v in runs}
        if len(met) > 1:
            out.append(FaultParity(v, len({tuple(x) for x in met.values()}) == 1, met))
    return out


def _order_effect(records: list[RunRecord]) -> list[PairedTest]:
    """First vs second run of each variant (by ``run_position``), per outcome."""
    by_variant: dict[int, dict[int, RunRecord]] = {}
    for r in records:
        if r.status is RunStatus.done and r.run_position is not None:
            by_variant.setdefault(r.variant, {})[r.run_position] = r
    common = sorted(v for v, runs in by_variant.items() if 0 in runs and 1 in runs)
    if not common:
        return []
    excluded = len(by_variant) - len(common)
    tests = []
    for outcome, attr in (("completion", "task_pass"), ("damage_free", "damage_free")):
        pairs = [(bool(getattr(by_variant[v][0], attr)), bool(getattr(by_variant[v][1], attr))) for v in common]
        tests.append(PairedTest("first run", "second run", outcome, mcnemar_exact(pairs), excluded))
    return tests


@dataclass(frozen=True)
class FailedRun:
    """A run the harness could not complete (reported apart, not an agent failure)."""

    run_key: str
    setting: str
    variant: int
    error: str


@dataclass(frozen=True)
class RunSummary:
    """One run as the report lists it (done or failed)."""

    run_key: str
    setting: str
    variant: int
    status: str
    """``done``, or ``failed`` when the harness could not complete the run."""
    outcome_label: str | None
    completion_mode: str | None
    test_cases_passed: int | None
    test_cases_total: int | None
    violated_invariants: list[str]
    steps: int
    tokens: int | None
    """Prompt + completion tokens; None when the agent's tokens are not measured (an external agent)."""
    wall_s: float
    budget_exhausted: str | None
    """``steps`` or ``tokens`` when the run reached that budget."""
    faults: list[str]
    """Kinds of the faults injected during the run, in order (the faults it met)."""
    fault_events: list[dict[str, Any]]
    """The fault injector's log of the run (injections and clearings, with their step)."""
    level: str | None
    ablations: list[str]
    agent: str
    model: str | None
    mode: str | None
    agent_stop: str | None
    trajectory_path: str | None
    error: str | None
    agent_error: str | None = None
    """The agent's own failure (it crashed, exited non-zero, its endpoint kept failing); None otherwise."""
    agent_exit_status: int | None = None
    agent_log: str | None = None

    @classmethod
    def of(cls, r: RunRecord) -> RunSummary:
        """The summary of a stored run record."""
        return cls(
            run_key=r.run_key, setting=r.setting, variant=r.variant, status=r.status.value,
            outcome_label=r.outcome_label.value if r.outcome_label else None,
            completion_mode=r.completion_mode.value if r.completion_mode else None,
            test_cases_passed=r.test_cases_passed, test_cases_total=r.test_cases_total,
            violated_invariants=list(r.violated_invariants), steps=r.steps, tokens=tokens_of(r),
            wall_s=r.wall_s, budget_exhausted=r.budget_exhausted,
            faults=[str(f.get("kind")) for f in r.faults if f.get("action") == "inject"],
            fault_events=[dict(f) for f in r.faults], level=r.level,
            ablations=list(r.ablations), agent=r.agent, model=r.model, mode=r.mode, agent_stop=r.agent_stop,
            trajectory_path=r.trajectory_path, error=r.error, agent_error=r.agent_error,
            agent_exit_status=r.agent_exit_status, agent_log=r.agent_log,
        )

    def flat(self) -> dict[str, Any]:
        """One CSV row."""
        row = asdict(self)
        del row["fault_events"]
        row["violated_invariants"] = " ".join(self.violated_invariants)
        row["ablations"] = "+".join(self.ablations)
        row["faults"] = " ".join(self.faults)
        return row


@dataclass(frozen=True)
class Report:
    """The report of one campaign; render it with rich, or write it as JSON or CSV."""

    campaign_id: str
    spec: dict[str, Any]
    factor: str | None
    cells: list[Cell]
    paired: list[PairedTest]
    failed_runs: list[FailedRun]
    unfinished: int
    """Planned runs not finished yet (pending or running)."""
    notes: list[str] = field(default_factory=list)
    runs: list[RunSummary] = field(default_factory=list)
    """Every finished run (done and failed), in planned order."""
    fixed: dict[str, str] = field(default_factory=dict)
    """The factors held fixed (draft 4.2), name -> value, from the campaign spec."""
    order_effect: list[PairedTest] = field(default_factory=list)
    """Order effect (issue 19): exact McNemar test between the first and the second run of each
    variant (whatever their settings; the order is counterbalanced), per outcome. Empty when the
    records do not say their position."""
    fault_parity: list[FaultParity] = field(default_factory=list)
    """Per variant: whether its runs met the same faults (faults are drawn per agent step, so
    runs of different lengths meet different ones)."""

    def to_dict(self) -> dict[str, Any]:
        """The report as plain data (JSON-ready: no NaN, tuples as lists)."""
        return asdict(self)

    def to_json(self, indent: int | None = 2) -> str:
        """The report as JSON."""
        return json.dumps(self.to_dict(), indent=indent, allow_nan=False)

    def to_csv(self, path: str | Path) -> tuple[Path, Path, Path]:
        """Write one row per cell to ``path``, the paired tests to ``<stem>_paired<suffix>`` and one
        row per run to ``<stem>_runs<suffix>``.

        Returns:
            The three paths written.

        Raises:
            OSError: A file cannot be written.
        """
        path = Path(path)
        paired_path, runs_path = csv_companions(path)
        for p, rows, header in ((path, [c.flat() for c in self.cells], _CELL_HEADER),
                                (paired_path, [t.flat() for t in self.paired], _PAIRED_HEADER),
                                (runs_path, [r.flat() for r in self.runs], _RUN_HEADER)):
            p.parent.mkdir(parents=True, exist_ok=True)
            with p.open("w", newline="") as f:
                w = csv.DictWriter(f, fieldnames=list(rows[0]) if rows else header)
                w.writeheader()
                w.writerows(rows)
        return path, paired_path, runs_path

    @property
    def headline(self) -> str:
        """One line: campaign, factor, how many runs are done, failed and unfinished."""
        done = sum(c.n for c in self.cells)
        agent_errors = sum(c.agent_errors for c in self.cells)
        return (f"campaign {self.campaign_id} — factor {self.factor or '?'}: {done} runs done"
                + (f" ({agent_errors} ended with an agent error)" if agent_errors else "")
                + f", {len(self.failed_runs)} failed (harness), {self.unfinished} not finished")

    @property
    def fixed_line(self) -> str:
        """The factors held fixed, in one line (empty when the spec does not say)."""
        return "held fixed: " + "; ".join(f"{k} {v}" for k, v in self.fixed.items()) if self.fixed else ""

    def tables(self) -> list[TableData]:
        """The summary tables, in order: rates, labels and modes, cost, the reconciled source of truth
        (when a level has one), paired tests, order effect, faults met, failed runs."""
        out = [_outcome_table(self.cells), _label_table(self.cells), _cost_table(self.cells)]
        if (rec := _reconcile_table(self.cells)) is not None:  # only a level with a source of truth has it
            out.append(rec)
        if self.paired:
            out.append(_paired_table(self.paired))
        if self.order_effect:
            t = _paired_table(self.order_effect)
            out.append(TableData("order", "Order effect: exact McNemar test, first vs second run of each variant "
                                 "(settings in counterbalanced order)", t.columns, t.rows))
        if any(x for f in self.fault_parity for x in f.met.values()):  # shown once any run met a fault
            out.append(TableData("faults", "Faults met by the paired runs of each variant (kind@step target)",
                                 [Column("variant"), Column("same faults", "left"), Column("faults met per setting", "left")],
                                 [[str(f.variant), "yes" if f.same else "NO",
                                   "; ".join(f"{s}: {', '.join(x) or 'none'}" for s, x in f.met.items())]
                                  for f in self.fault_parity]))
        if self.failed_runs:
            out.append(TableData("failed", "Failed runs (harness could not complete them; not agent failures)",
                                 [Column("run", "left"), Column("setting", "left"), Column("variant"),
                                  Column("error", "left")],
                                 [[f.run_key, f.setting, str(f.variant), f.error] for f in self.failed_runs]))
        return out

    def __rich__(self) -> RenderableType:
        parts: list[RenderableType] = [Text(self.headline)]
        if self.fixed:
            parts.append(Text(self.fixed_line))
        parts += [render_rich(t) for t in self.tables()]
        parts += [Text(n, style="yellow") for n in self.notes]
        return Group(*parts)


def csv_companions(path: Path) -> tuple[Path, Path]:
    """The paths :meth:`Report.to_csv` writes beside ``path``: paired tests, and runs."""
    suffix = path.suffix or ".csv"
    return path.with_name(f"{path.stem}_paired{suffix}"), path.with_name(f"{path.stem}_runs{suffix}")


_CELL_HEADER = ["setting", "n", "failed"]
_PAIRED_HEADER = ["setting_a", "setting_b", "outcome", "n_pairs", "both", "a_only", "b_only", "neither",
                  "pvalue", "excluded"]
_RUN_HEADER = ["run_key", "setting", "variant", "status"]


# --- tables as data ------------------------------------------------------------------------------

@dataclass(frozen=True)
class Column:
    """A table column: its header and alignment."""

    name: str
    align: Literal["left", "right"] = "right"


@dataclass(frozen=True)
class Link:
    """A cell that links somewhere (HTML); rich shows the text."""

    text: str
    href: str

    def __str__(self) -> str:
        return self.text


@dataclass(frozen=True)
class TableData:
    """A table as data: rendered by :func:`render_rich` and by :mod:`harness.report_html`."""

    key: str
    """Short id (HTML ``id`` of the table)."""
    title: str
    columns: list[Column]
    rows: list[list[str | Link]]


def render_rich(t: TableData) -> Table:
    """A rich table of ``t`` (links shown as their text)."""
    table = Table(title=t.title)
    for c in t.columns:
        table.add_column(c.name, justify=c.align)
    for row in t.rows:  # cells are text (a setting, an error message), never rich markup
        table.add_row(*(Text(str(v)) for v in row))
    return table


def _mean(values: list[float]) -> float | None:
    return statistics.fmean(values) if values else None


def _measured(get: Callable[[RunRecord], float | None], done: list[RunRecord]) -> list[float]:
    return [v for v in (get(r) for r in done) if v is not None]


def _cell(setting: str, done: list[RunRecord], failed: int) -> Cell:
    n = len(done)
    damaged = sum(1 for r in done if not r.damage_free)
    return Cell(
        setting=setting,
        n=n,
        failed=failed,
        agent_errors=sum(1 for r in done if r.agent_error),
        completion=Proportion.of(sum(1 for r in done if r.task_pass), n),
        damage_free=Proportion.of(n - damaged, n),
        damage_rule_of_three=rule_of_three(n) if n and not damaged else None,
        outcome_labels={lab.value: sum(1 for r in done if r.outcome_label is lab) for lab in OutcomeLabel},
        completion_modes={m.value: sum(1 for r in done if r.completion_mode is m) for m in CompletionMode},
        cost={name: {"mean": _mean(_measured(get, done)),
                     "median": statistics.median(_measured(get, done)) if _measured(get, done) else None}
              for name, get in COST_METRICS.items()},
        mean_test_case_score=_mean([r.test_case_score for r in done if r.test_case_score is not None]),
        mean_config_f1=_mean([r.config_f1 for r in done if r.config_f1 is not None]),
        mean_error_action_rate=_mean([r.error_action_rate for r in done if r.error_action_rate is not None]),
        mean_repeat_action_rate=_mean([r.repeat_action_rate for r in done if r.repeat_action_rate is not None]),
        reconcile_totals={f"{name}_{k}": v for name in RECONCILE_METRICS if (got := _measured(COST_METRICS[name], done))
                          for k, v in (("runs", len(got)), ("total", int(sum(got))))},
    )


def _paired(settings: list[str], done: dict[str, dict[int, RunRecord]]) -> list[PairedTest]:
    tests = []
    for a, b in combinations(settings, 2):
        va, vb = done[a], done[b]
        common = sorted(va.keys() & vb.keys())
        excluded = len(va.keys() ^ vb.keys())
        for outcome in ("completion", "damage_free"):
            attr = "task_pass" if outcome == "completion" else "damage_free"
            pairs = [(bool(getattr(va[v], attr)), bool(getattr(vb[v], attr))) for v in common]
            tests.append(PairedTest(a, b, outcome, mcnemar_exact(pairs), excluded))
    return tests


#: Agent options whose value is a secret (matched in the option's name, any case).
SECRET_OPTIONS = re.compile(r"key|token|secret|password|passwd|credential", re.IGNORECASE)
#: What a secret is shown as.
REDACTED = "(redacted)"


def redacted(spec: dict[str, Any]) -> dict[str, Any]:
    """A campaign spec as a report may show it: the values of secret agent options (``api_key``,
    :data:`SECRET_OPTIONS`) and the password of a URL's user information replaced by
    :data:`REDACTED` -- a report is made to be shared, the store keeps the spec as given."""
    options = spec.get("agent_options")
    if not isinstance(options, dict):
        return spec
    shown = {}
    for k, v in options.items():
        if SECRET_OPTIONS.search(str(k)):
            v = REDACTED
        elif isinstance(v, str):
            v = re.sub(r"(://[^/@:\s]*:)[^/@\s]*@", rf"\1{REDACTED}@", v)
        shown[k] = v
    return {**spec, "agent_options": shown}


def build_report(store: CampaignStore, campaign_id: str) -> Report:
    """Build the report of a campaign from the results store.

    Args:
        store: The results store.
        campaign_id: The campaign.

    Returns:
        The report; settings appear in the order of their first planned run.

    Raises:
        UnknownCampaign: No such campaign (the error lists the known ones).
    """
    spec = redacted(store.campaign_spec(campaign_id))
    records = store.runs(campaign_id)
    unfinished = sum(1 for r in store.rows(campaign_id) if r.status in ("pending", "running"))
    settings = list(dict.fromkeys(r.setting for r in records))
    done: dict[str, dict[int, RunRecord]] = {s: {} for s in settings}
    failed: list[FailedRun] = []
    for r in records:
        if r.status is RunStatus.done:
            done[r.setting][r.variant] = r
        else:
            failed.append(FailedRun(r.run_key, r.setting, r.variant, r.error or ""))
    cells = [_cell(s, list(done[s].values()), sum(1 for f in failed if f.setting == s)) for s in settings]
    factors = sorted({r.factor for r in records})
    notes = [f"runs of this campaign name several factors: {', '.join(factors)}"] if len(factors) > 1 else []
    if any(c.agent_errors for c in cells):
        notes.append(AGENT_ERROR_NOTE)
    return Report(campaign_id, spec, factors[0] if factors else spec.get("factor"), cells,
                  _paired(settings, done), failed, unfinished, notes, runs=[RunSummary.of(r) for r in records],
                  fixed=fixed_factors(spec), order_effect=_order_effect(records), fault_parity=_fault_parity(done))


#: The report's note when some runs ended with an agent error (README "Campaigns").
AGENT_ERROR_NOTE = (
    "agent errors: runs whose agent crashed, exited with an error or lost its endpoint are counted in the rates as "
    "what the agent system did (a failure; any damage it left counts), and apart in the 'agent errors' column; the "
    "runs table marks them and names the agent's log.")


#: The factors of a campaign spec (harness.campaign.Factor) and how the report names them.
_FACTOR_NAMES = {"ani": "ANI", "agent": "agent", "model": "model", "mode": "mode"}


def fixed_factors(spec: dict[str, Any]) -> dict[str, str]:
    """What a campaign held fixed, from its stored spec: each factor other than the controlled one
    that has one value (a model or mode left to the agent is left out), then the budgets, the
    fault rate, the density, the task class and the SRv6 data plane; name -> value as the report shows them."""
    out: dict[str, str] = {}
    for f, name in _FACTOR_NAMES.items():
        vals = spec.get(f)
        if f != spec.get("factor") and isinstance(vals, list) and len(vals) == 1 and vals[0] is not None:
            out[name] = str(vals[0])
    for key, name in (("budget_steps", "step budget"), ("budget_tokens", "token budget"), ("fault_rate", "lambda"),
                      ("density", "density"), ("task", "task")):
        if spec.get(key) is not None:
            out[name] = str(spec[key])
    out["data plane"] = str(spec.get("dataplane", "kernel"))  # stored specs before it: the kernel's, the only one
    return out


# --- the tables ----------------------------------------------------------------------------------

def _f(x: float | None, digits: int = 2) -> str:
    return "–" if x is None else f"{x:.{digits}f}"


def _num(x: float | None, metric: str) -> str:
    if x is None:
        return NOT_MEASURED if metric == "tokens" else "–"
    return f"{x:,.0f}" if metric == "tokens" else f"{x:.1f}"


def _ci(ci: tuple[float, float]) -> str:
    return f"[{ci[0]:.2f}, {ci[1]:.2f}]"


def _cols(*names: str, left: tuple[str, ...] = ("setting",)) -> list[Column]:
    return [Column(n, "left" if n in left else "right") for n in names]


def _outcome_table(cells: list[Cell]) -> TableData:
    rows: list[list[str | Link]] = []
    for c in cells:
        cp, dp = c.completion, c.damage_free
        rows.append([c.setting, str(c.n), str(c.agent_errors), f"{cp.k}/{cp.n}", _f(cp.rate), _ci(cp.wilson),
                     _ci(cp.clopper_pearson),
                     f"{dp.k}/{dp.n}", _f(dp.rate), _ci(dp.wilson), _ci(dp.clopper_pearson),
                     _f(c.damage_rule_of_three, 3)])
    return TableData("rates", "Completion and damage-free run rate (95% intervals)",
                     _cols("setting", "n", "agent errors", "completion", "rate", "Wilson", "Clopper-Pearson",
                           "damage-free", "rate",
                           "Wilson", "Clopper-Pearson", "P(damage) ≤ (3/n)"), rows)


def _label_table(cells: list[Cell]) -> TableData:
    names = [*(lab.value for lab in OutcomeLabel), *(m.value for m in CompletionMode)]
    return TableData("labels", "Outcome labels and completion modes (runs)",
                     _cols("setting", *(n.replace("_", " ") for n in names)),
                     [[c.setting, *map(str, c.outcome_labels.values()), *map(str, c.completion_modes.values())]
                      for c in cells])


def _cost_table(cells: list[Cell]) -> TableData:
    rows: list[list[str | Link]] = []
    for c in cells:
        mm = [_mean_median(c, m) for m in COST_METRICS if m not in RECONCILE_METRICS]
        rows.append([c.setting, *mm, _f(c.mean_test_case_score), _f(c.mean_config_f1), _f(c.mean_error_action_rate),
                     _f(c.mean_repeat_action_rate)])
    return TableData("cost", "Cost and process metrics per run (mean / median)",
                     _cols("setting", "steps", "tokens", "wall s", "test-case score", "config F1", "error-action",
                           "repeat-action"), rows)


def _mean_median(c: Cell, m: str) -> str:
    v = f"{_num(c.cost[m]['mean'], m)} / {_num(c.cost[m]['median'], m)}"
    return NOT_MEASURED if v == f"{NOT_MEASURED} / {NOT_MEASURED}" else "–" if v == "– / –" else v


def _reconcile_table(cells: list[Cell]) -> TableData | None:
    """The reconciled source of truth's counts per level that has one (A3-R, A4): per metric of
    :data:`RECONCILE_METRICS`, mean / median per run and the total over the cell's runs; None when
    no cell has any (then the report has no such table)."""
    have = [c for c in cells if c.reconcile_totals]
    if not have:
        return None
    rows: list[list[str | Link]] = []
    for c in have:
        counted = max(c.reconcile_totals.get(f"{m}_runs", 0) for m in RECONCILE_METRICS)
        row: list[str | Link] = [c.setting, str(counted)]
        for m in RECONCILE_METRICS:
            total = c.reconcile_totals.get(f"{m}_total")
            row += [_mean_median(c, m), "–" if total is None else str(total)]
        rows.append(row)
    heads = [h for m, name in RECONCILE_METRICS.items() for h in (name, f"{name.split()[-1]} total")]
    return TableData("reconcile", "Reconciled source of truth (A3-R, A4): per run (mean / median) and in total",
                     _cols("setting", "runs", *heads), rows)


def _paired_table(paired: list[PairedTest]) -> TableData:
    return TableData("paired", "Paired comparisons: exact McNemar test on discordant pairs (matched by variant)",
                     _cols("A", "B", "outcome", "pairs", "A only", "B only", "p (two-sided)", "unpaired runs excluded",
                           left=("A", "B", "outcome")),
                     [[p.setting_a, p.setting_b, p.outcome.replace("_", "-"), str(p.test.n_pairs), str(p.test.b),
                       str(p.test.c), f"{p.test.pvalue:.3f}", str(p.excluded)] for p in paired])


def agent_error_line(r: RunSummary | RunRecord, label: str = "agent error") -> str:
    """The agent's error in one line with where its log is (empty when it reported none)."""
    if not r.agent_error:
        return ""
    return f"{label}: {r.agent_error[:160]}" + (f" (log: {r.agent_log})" if r.agent_log else "")


def _agent_stop(r: RunSummary) -> str:
    parts = [x for x in (r.agent_stop, agent_error_line(r)) if x]
    return "; ".join(parts) or "–"


def run_table(rep: Report, link: Callable[[RunSummary], str | None] = lambda _r: None) -> TableData:
    """One row per run: setting, variant, outcome label, test cases passed, violated invariants,
    steps, tokens, seconds, the budget it reached, the faults it met, why the agent stopped.

    Args:
        rep: the report.
        link: the address of a run's detail (its trajectory page), or None for no link.
    """
    rows: list[list[str | Link]] = []
    for r in rep.runs:
        href = link(r)
        label = (r.outcome_label or "").replace("_", " ") if r.status == "done" else "harness failure"
        if r.agent_error:
            label += ", agent error"
        tests = f"{r.test_cases_passed}/{r.test_cases_total}" if r.test_cases_total is not None else "–"
        violated = ", ".join(r.violated_invariants[:3]) + (f" (+{len(r.violated_invariants) - 3})"
                                                           if len(r.violated_invariants) > 3 else "")
        rows.append([r.setting, Link(f"v{r.variant}", href) if href else f"v{r.variant}", label, tests,
                     violated or ("–" if r.status == "done" else (r.error or "")[:120]), str(r.steps),
                     NOT_MEASURED if r.tokens is None else f"{r.tokens:,}", f"{r.wall_s:.1f}", r.budget_exhausted or "–",
                     ", ".join(r.faults) or "–", (r.completion_mode or "–").replace("_", " "), _agent_stop(r)])
    return TableData("runs", "Runs (one row per run; the variant links to its trajectory)",
                     _cols("setting", "variant", "outcome", "test cases", "violated invariants", "steps", "tokens",
                           "seconds", "budget hit", "faults met", "completion mode", "agent stop",
                           left=("setting", "variant", "outcome", "violated invariants", "faults met",
                                 "completion mode", "agent stop")), rows)
