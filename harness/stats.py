"""Statistics of a campaign: interval estimates of proportions and paired tests (pure functions).

The IETF framework draft (draft-salsano-nmrg-nmaa-benchmarking-framework, section 4.7) asks for
interval methods valid near zero (Wilson, Clopper-Pearson), the rule of three to bound a cell with
zero damaged runs, and tests on discordant pairs (McNemar) for paired comparisons (section 4.5).
Every computation is delegated to statsmodels; nothing here re-implements a formula that the
library has.

Convention for an empty cell (``n == 0``): the intervals are the vacuous ``(0.0, 1.0)`` -- no run,
no information about the proportion -- instead of NaN, so that a report can print them and JSON can
hold them. statsmodels itself divides by zero there.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from statsmodels.stats.contingency_tables import mcnemar
from statsmodels.stats.proportion import proportion_confint

__all__ = ["McNemarResult", "clopper_pearson", "mcnemar_exact", "rule_of_three", "wilson"]


def _check(k: int, n: int, alpha: float) -> None:
    if n < 0 or k < 0 or k > n:
        raise ValueError(f"need 0 <= k <= n, got k={k}, n={n}")
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha must be in (0, 1), got {alpha}")


def _confint(k: int, n: int, alpha: float, method: str) -> tuple[float, float]:
    _check(k, n, alpha)
    if n == 0:
        return (0.0, 1.0)
    lo, hi = proportion_confint(k, n, alpha=alpha, method=method)
    return (float(lo), float(hi))


def wilson(k: int, n: int, alpha: float = 0.05) -> tuple[float, float]:
    """Wilson score interval for a binomial proportion ``k/n``.

    Source: Wilson (1927), JASA 22:209-212; method 3 of Newcombe (1998), Stat. Med. 17:857-872;
    computed by statsmodels ``proportion_confint(method="wilson")``. Named in draft section 4.7.

    Args:
        k: Number of successes (0 <= k <= n).
        n: Number of trials.
        alpha: Significance level; the interval has confidence ``1 - alpha``.

    Returns:
        ``(lo, hi)``; ``(0.0, 1.0)`` when ``n == 0`` (the vacuous interval).

    Raises:
        ValueError: ``k`` or ``n`` out of range, or ``alpha`` not in (0, 1).
    """
    return _confint(k, n, alpha, "wilson")


def clopper_pearson(k: int, n: int, alpha: float = 0.05) -> tuple[float, float]:
    """Clopper-Pearson ("exact", beta-quantile) interval for a binomial proportion ``k/n``.

    Source: Clopper and Pearson (1934), Biometrika 26:404-413; method 5 of Newcombe (1998);
    computed by statsmodels ``proportion_confint(method="beta")``. Named in draft section 4.7.

    Args:
        k: Number of successes (0 <= k <= n).
        n: Number of trials.
        alpha: Significance level; the interval has confidence at least ``1 - alpha``.

    Returns:
        ``(lo, hi)``; ``(0.0, 1.0)`` when ``n == 0`` (the vacuous interval).

    Raises:
        ValueError: ``k`` or ``n`` out of range, or ``alpha`` not in (0, 1).
    """
    return _confint(k, n, alpha, "beta")


def rule_of_three(n: int) -> float:
    """Approximate 95% upper bound on an event probability after 0 events in ``n`` runs: ``3/n``.

    Source: draft section 4.7 ("zero damaged runs out of S give an approximate 95% upper bound of
    3/S") and section 9; Hanley and Lippman-Hand (1983), "If nothing goes wrong, is everything all
    right?", JAMA 249:1743-1745. It approximates the one-sided exact bound ``1 - 0.05**(1/n)``
    (``-ln 0.05 = 2.996``) and is good for n of about 30 and more; for small n it is conservative.
    The value is capped at 1.0, since a probability bound above one says nothing more.

    Args:
        n: Number of runs, all free of the event (e.g. all damage-free runs).

    Returns:
        ``min(1.0, 3/n)``.

    Raises:
        ValueError: ``n < 1`` (no runs bound nothing).
    """
    if n < 1:
        raise ValueError(f"the rule of three needs at least one run, got n={n}")
    return min(1.0, 3.0 / n)


@dataclass(frozen=True)
class McNemarResult:
    """The exact McNemar test of one paired comparison of two settings A and B.

    Attributes:
        table: The 2x2 table ``[[both pass, A only], [B only, neither]]`` (rows: A pass / A fail;
            columns: B pass / B fail).
        b: Discordant pairs where A passed and B failed.
        c: Discordant pairs where A failed and B passed.
        n_pairs: Number of pairs (the sum of the table).
        pvalue: Exact two-sided p-value (binomial test of ``b`` in ``b + c`` at 1/2); 1.0 when
            there is no discordant pair.
    """

    table: tuple[tuple[int, int], tuple[int, int]]
    b: int
    c: int
    n_pairs: int
    pvalue: float

    @property
    def discordant(self) -> int:
        """Number of discordant pairs, ``b + c``: the only pairs the test uses."""
        return self.b + self.c


def mcnemar_exact(pairs: Iterable[tuple[bool, bool]]) -> McNemarResult:
    """Exact McNemar test on paired binary outcomes (one pair per task variant).

    Source: McNemar (1947), Psychometrika 12:153-157, in its exact (binomial) form; computed by
    statsmodels ``mcnemar(table, exact=True)``. Draft section 4.5 (paired runs) and 4.7 (tests on
    discordant pairs); the draft's section 7.1 example, A0 0/6 against A3-T 6/6, gives p = 0.031.

    Args:
        pairs: ``(outcome_a, outcome_b)`` per task variant, e.g. task pass at A0 and at A3-T.

    Returns:
        The table, the discordant counts and the exact two-sided p-value.
    """
    t = [[0, 0], [0, 0]]
    for a, b in pairs:
        t[0 if a else 1][0 if b else 1] += 1
    pvalue = float(mcnemar(t, exact=True).pvalue)
    return McNemarResult(
        table=((t[0][0], t[0][1]), (t[1][0], t[1][1])),
        b=t[0][1],
        c=t[1][0],
        n_pairs=sum(map(sum, t)),
        pvalue=min(1.0, pvalue),
    )
