"""The report of a campaign: per-cell rates with intervals, paired tests, cost; terminal, JSON, CSV.

A cell is one setting of the campaign's controlled factor. Per cell: completion rate (task pass)
and damage-free run rate with Wilson and Clopper-Pearson 95% intervals, the rule-of-three bound on
the damage probability when no run was damaged (draft section 4.7), outcome-label and
completion-mode counts, and the mean and median cost per run (draft 4.4: cost is a dependent
variable). Between every two settings: the exact McNemar test on discordant pairs, runs matched by
task-variant index (draft 4.5), for completion and for damage-free. Runs the harness could not
complete (status ``failed``) are listed apart and never counted as agent failures, so their
variant is unpaired in every comparison.
"""

from __future__ import annotations

import csv
import json
import statistics
from dataclasses import asdict, dataclass, field
from itertools import combinations
from pathlib import Path
from typing import Any

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from harness.stats import McNemarResult, clopper_pearson, mcnemar_exact, rule_of_three, wilson
from harness.store import CampaignStore, CompletionMode, OutcomeLabel, RunRecord, RunStatus

__all__ = ["Cell", "FailedRun", "PairedTest", "Proportion", "Report", "build_report"]

#: Cost metrics per run: (name, how to read it from a record).
COST_METRICS: dict[str, Any] = {
    "steps": lambda r: r.steps,
    "tokens": lambda r: r.tokens_in + r.tokens_out,
    "wall_s": lambda r: r.wall_s,
}


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
    completion: Proportion
    damage_free: Proportion
    damage_rule_of_three: float | None
    """Approximate 95% upper bound on the damage probability (3/n) when no run was damaged."""
    outcome_labels: dict[str, int]
    completion_modes: dict[str, int]
    cost: dict[str, dict[str, float | None]]
    """Per metric of :data:`COST_METRICS`: ``{"mean": ..., "median": ...}``."""
    mean_test_case_score: float | None
    mean_error_action_rate: float | None
    """Mean over the runs where the rate is defined (runs with configuration/validation actions)."""
    mean_repeat_action_rate: float | None

    def flat(self) -> dict[str, Any]:
        """One CSV row."""
        row: dict[str, Any] = {"setting": self.setting, "n": self.n, "failed": self.failed}
        for name, p in (("completion", self.completion), ("damage_free", self.damage_free)):
            row |= {f"{name}_k": p.k, f"{name}_rate": p.rate,
                    f"{name}_wilson_lo": p.wilson[0], f"{name}_wilson_hi": p.wilson[1],
                    f"{name}_cp_lo": p.clopper_pearson[0], f"{name}_cp_hi": p.clopper_pearson[1]}
        row["damage_rule_of_three"] = self.damage_rule_of_three
        row |= {f"label_{k}": v for k, v in self.outcome_labels.items()}
        row |= {f"mode_{k}": v for k, v in self.completion_modes.items()}
        row |= {f"{m}_{s}": v for m, d in self.cost.items() for s, v in d.items()}
        row |= {"mean_test_case_score": self.mean_test_case_score,
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
class FailedRun:
    """A run the harness could not complete (reported apart, not an agent failure)."""

    run_key: str
    setting: str
    variant: int
    error: str


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

    def to_dict(self) -> dict[str, Any]:
        """The report as plain data (JSON-ready: no NaN, tuples as lists)."""
        return asdict(self)

    def to_json(self, indent: int | None = 2) -> str:
        """The report as JSON."""
        return json.dumps(self.to_dict(), indent=indent, allow_nan=False)

    def to_csv(self, path: str | Path) -> tuple[Path, Path]:
        """Write one row per cell to ``path`` and the paired tests to ``<stem>_paired<suffix>``.

        Returns:
            The two paths written.

        Raises:
            OSError: A file cannot be written.
        """
        path = Path(path)
        paired_path = path.with_name(f"{path.stem}_paired{path.suffix or '.csv'}")
        for p, rows, header in ((path, [c.flat() for c in self.cells], _CELL_HEADER),
                                (paired_path, [t.flat() for t in self.paired], _PAIRED_HEADER)):
            p.parent.mkdir(parents=True, exist_ok=True)
            with p.open("w", newline="") as f:
                w = csv.DictWriter(f, fieldnames=list(rows[0]) if rows else header)
                w.writeheader()
                w.writerows(rows)
        return path, paired_path

    def __rich__(self) -> RenderableType:
        done = sum(c.n for c in self.cells)
        head = Text(f"campaign {self.campaign_id} — factor {self.factor or '?'}: {done} runs done, "
                    f"{len(self.failed_runs)} failed (harness), {self.unfinished} not finished")
        parts: list[RenderableType] = [head, _outcome_table(self.cells), _label_table(self.cells),
                                       _cost_table(self.cells)]
        if self.paired:
            parts.append(_paired_table(self.paired))
        if self.failed_runs:
            t = Table(title="Failed runs (harness could not complete them; not agent failures)")
            for col in ("run", "setting", "variant", "error"):
                t.add_column(col)
            for f in self.failed_runs:
                t.add_row(f.run_key, f.setting, str(f.variant), f.error)
            parts.append(t)
        parts += [Text(n, style="yellow") for n in self.notes]
        return Group(*parts)


_CELL_HEADER = ["setting", "n", "failed"]
_PAIRED_HEADER = ["setting_a", "setting_b", "outcome", "n_pairs", "both", "a_only", "b_only", "neither",
                  "pvalue", "excluded"]


def _mean(values: list[float]) -> float | None:
    return statistics.fmean(values) if values else None


def _cell(setting: str, done: list[RunRecord], failed: int) -> Cell:
    n = len(done)
    damaged = sum(1 for r in done if not r.damage_free)
    return Cell(
        setting=setting,
        n=n,
        failed=failed,
        completion=Proportion.of(sum(1 for r in done if r.task_pass), n),
        damage_free=Proportion.of(n - damaged, n),
        damage_rule_of_three=rule_of_three(n) if n and not damaged else None,
        outcome_labels={lab.value: sum(1 for r in done if r.outcome_label is lab) for lab in OutcomeLabel},
        completion_modes={m.value: sum(1 for r in done if r.completion_mode is m) for m in CompletionMode},
        cost={name: {"mean": _mean([get(r) for r in done]),
                     "median": statistics.median([get(r) for r in done]) if done else None}
              for name, get in COST_METRICS.items()},
        mean_test_case_score=_mean([r.test_case_score for r in done if r.test_case_score is not None]),
        mean_error_action_rate=_mean([r.error_action_rate for r in done if r.error_action_rate is not None]),
        mean_repeat_action_rate=_mean([r.repeat_action_rate for r in done if r.repeat_action_rate is not None]),
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
    spec = store.campaign_spec(campaign_id)
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
    return Report(campaign_id, spec, factors[0] if factors else spec.get("factor"), cells,
                  _paired(settings, done), failed, unfinished, notes)


# --- rich tables ---------------------------------------------------------------------------------

def _f(x: float | None, digits: int = 2) -> str:
    return "–" if x is None else f"{x:.{digits}f}"


def _num(x: float | None, metric: str) -> str:
    return "–" if x is None else f"{x:,.0f}" if metric == "tokens" else f"{x:.1f}"


def _ci(ci: tuple[float, float]) -> str:
    return f"[{ci[0]:.2f}, {ci[1]:.2f}]"


def _outcome_table(cells: list[Cell]) -> Table:
    t = Table(title="Completion and damage-free run rate (95% intervals)")
    for col in ("setting", "n", "completion", "rate", "Wilson", "Clopper-Pearson",
                "damage-free", "rate", "Wilson", "Clopper-Pearson", "P(damage) ≤ (3/n)"):
        t.add_column(col, justify="left" if col == "setting" else "right")
    for c in cells:
        cp, dp = c.completion, c.damage_free
        t.add_row(c.setting, str(c.n), f"{cp.k}/{cp.n}", _f(cp.rate), _ci(cp.wilson), _ci(cp.clopper_pearson),
                  f"{dp.k}/{dp.n}", _f(dp.rate), _ci(dp.wilson), _ci(dp.clopper_pearson),
                  _f(c.damage_rule_of_three, 3))
    return t


def _label_table(cells: list[Cell]) -> Table:
    t = Table(title="Outcome labels and completion modes (runs)")
    t.add_column("setting")
    for name in [*(lab.value for lab in OutcomeLabel), *(m.value for m in CompletionMode)]:
        t.add_column(name.replace("_", " "), justify="right")
    for c in cells:
        t.add_row(c.setting, *map(str, c.outcome_labels.values()), *map(str, c.completion_modes.values()))
    return t


def _cost_table(cells: list[Cell]) -> Table:
    t = Table(title="Cost and process metrics per run (mean / median)")
    for col in ("setting", "steps", "tokens", "wall s", "test-case score", "error-action", "repeat-action"):
        t.add_column(col, justify="left" if col == "setting" else "right")
    for c in cells:
        mm = [f"{_num(c.cost[m]['mean'], m)} / {_num(c.cost[m]['median'], m)}" for m in COST_METRICS]
        t.add_row(c.setting, *mm, _f(c.mean_test_case_score), _f(c.mean_error_action_rate),
                  _f(c.mean_repeat_action_rate))
    return t


def _paired_table(paired: list[PairedTest]) -> Table:
    t = Table(title="Paired comparisons: exact McNemar test on discordant pairs (matched by variant)")
    for col in ("A", "B", "outcome", "pairs", "A only", "B only", "p (two-sided)", "unpaired runs excluded"):
        t.add_column(col, justify="left" if col in ("A", "B", "outcome") else "right")
    for p in paired:
        t.add_row(p.setting_a, p.setting_b, p.outcome.replace("_", "-"), str(p.test.n_pairs), str(p.test.b),
                  str(p.test.c), f"{p.test.pvalue:.3f}", str(p.excluded))
    return t
