"""Unit tests of harness.stats against published values, each also recomputed independently."""

from __future__ import annotations

import math

import pytest
from scipy.stats import beta, binom, norm

from harness.stats import clopper_pearson, mcnemar_exact, rule_of_three, wilson

Z = norm.ppf(0.975)


def cp_reference(k: int, n: int, alpha: float = 0.05) -> tuple[float, float]:
    """Clopper-Pearson from its definition: beta quantiles (Clopper and Pearson 1934)."""
    lo = 0.0 if k == 0 else beta.ppf(alpha / 2, k, n - k + 1)
    hi = 1.0 if k == n else beta.ppf(1 - alpha / 2, k + 1, n - k)
    return lo, hi


def wilson_reference(k: int, n: int) -> tuple[float, float]:
    """Wilson (1927) score interval, closed form."""
    p = k / n
    centre = (p + Z * Z / (2 * n)) / (1 + Z * Z / n)
    half = Z / (1 + Z * Z / n) * math.sqrt(p * (1 - p) / n + Z * Z / (4 * n * n))
    return centre - half, centre + half


# Worked examples of Newcombe (1998), "Two-sided confidence intervals for the single proportion:
# comparison of seven methods", Stat. Med. 17:857-872: method 3 (Wilson score) and method 5
# (Clopper-Pearson), 95%, four decimals.
NEWCOMBE = [
    # k, n, Wilson, Clopper-Pearson
    (81, 263, (0.2553, 0.3662), (0.2527, 0.3676)),
    (15, 148, (0.0624, 0.1605), (0.0578, 0.1617)),
    (0, 20, (0.0, 0.1611), (0.0, 0.1684)),
    (1, 29, (0.0061, 0.1718), (0.0009, 0.1776)),
]


@pytest.mark.parametrize(("k", "n", "w", "cp"), NEWCOMBE)
def test_newcombe_published_examples(k: int, n: int, w: tuple[float, float], cp: tuple[float, float]) -> None:
    assert wilson(k, n) == pytest.approx(w, abs=5e-5)
    assert clopper_pearson(k, n) == pytest.approx(cp, abs=5e-5)


def test_values_of_the_brief_and_their_closed_forms() -> None:
    # Wilson 0/10: upper z^2/(n+z^2); 6/6: lower n/(n+z^2).
    assert wilson(0, 10)[1] == pytest.approx(0.2775, abs=5e-5)
    assert wilson(0, 10)[1] == pytest.approx(Z * Z / (10 + Z * Z))
    assert wilson(6, 6)[0] == pytest.approx(0.6097, abs=5e-5)
    assert wilson(6, 6)[0] == pytest.approx(6 / (6 + Z * Z))
    # Clopper-Pearson 0/10 upper: 1 - (alpha/2)^(1/n).
    assert clopper_pearson(0, 10)[1] == pytest.approx(0.3085, abs=5e-5)
    assert clopper_pearson(0, 10)[1] == pytest.approx(1 - 0.025 ** (1 / 10))


@pytest.mark.parametrize(("k", "n"), [(0, 1), (1, 1), (0, 6), (6, 6), (3, 7), (1, 29), (81, 263), (50, 50)])
def test_match_independent_computation(k: int, n: int) -> None:
    assert clopper_pearson(k, n) == pytest.approx(cp_reference(k, n), abs=1e-9)
    assert wilson(k, n) == pytest.approx(wilson_reference(k, n), abs=1e-9)


def test_alpha_and_ordering() -> None:
    lo90, hi90 = clopper_pearson(3, 20, alpha=0.10)
    lo95, hi95 = clopper_pearson(3, 20)
    assert lo95 < lo90 < 3 / 20 < hi90 < hi95
    assert clopper_pearson(3, 20, alpha=0.10) == pytest.approx(cp_reference(3, 20, alpha=0.10))


def test_empty_cell_is_vacuous_and_bad_input_raises() -> None:
    assert wilson(0, 0) == (0.0, 1.0)
    assert clopper_pearson(0, 0) == (0.0, 1.0)
    for bad in [(-1, 5), (6, 5), (0, -1)]:
        with pytest.raises(ValueError):
            wilson(*bad)
    with pytest.raises(ValueError):
        clopper_pearson(1, 2, alpha=0.0)


def test_rule_of_three() -> None:
    # Draft section 9: damage-free rate 1.00 over S runs bounds the damage probability below 3/S.
    assert rule_of_three(30) == pytest.approx(0.1)
    assert rule_of_three(100) == pytest.approx(0.03)
    # close to the one-sided exact 95% bound 1 - 0.05^(1/n) for large n, and above it
    exact = 1 - 0.05 ** (1 / 300)
    assert exact < rule_of_three(300) < exact * 1.01
    assert rule_of_three(2) == 1.0  # capped: a probability bound above one is vacuous
    with pytest.raises(ValueError):
        rule_of_three(0)


def test_mcnemar_draft_section_7_1_example() -> None:
    # Draft 7.1: A0 completed 0 of 6 paired variants, A3-T 6 of 6 -> exact McNemar p = 0.031.
    r = mcnemar_exact([(False, True)] * 6)
    assert r.table == ((0, 0), (6, 0))
    assert (r.b, r.c, r.discordant, r.n_pairs) == (0, 6, 6, 6)
    assert r.pvalue == pytest.approx(2 * 0.5**6) == pytest.approx(0.03125)
    assert round(r.pvalue, 3) == 0.031


def test_mcnemar_uses_only_discordant_pairs() -> None:
    pairs = [(True, True)] * 5 + [(False, False)] * 4 + [(True, False)] * 2 + [(False, True)] * 7
    r = mcnemar_exact(pairs)
    assert r.table == ((5, 2), (7, 4)) and (r.b, r.c) == (2, 7)
    assert r.pvalue == pytest.approx(min(1.0, 2 * binom.cdf(2, 9, 0.5)))
    # concordant pairs do not change the p-value
    assert mcnemar_exact(pairs + [(True, True)] * 50).pvalue == pytest.approx(r.pvalue)
    # symmetric in the direction of the difference
    assert mcnemar_exact([(b, a) for a, b in pairs]).pvalue == pytest.approx(r.pvalue)


def test_mcnemar_without_discordant_pairs() -> None:
    assert mcnemar_exact([(True, True), (False, False)]).pvalue == 1.0
    assert mcnemar_exact([]).n_pairs == 0
    assert mcnemar_exact([]).pvalue == 1.0
