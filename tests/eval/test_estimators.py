"""pass@k, maj@k and the paired tests against direct references (rljax/eval/estimators.py)."""

from __future__ import annotations

import itertools
import math
from fractions import Fraction

import numpy as np
import pytest

from rljax.eval import (
    maj_at_k,
    mcnemar_exact,
    paired_bootstrap,
    pass_at_k,
    pass_at_k_curve,
    summarize,
)
from rljax.eval.estimators import powers_of_two


def combinatorial(n: int, c: int, k: int) -> Fraction:
    """pass@k by its definition, exactly: 1 - C(n - c, k) / C(n, k)."""
    return 1 - Fraction(math.comb(n - c, k), math.comb(n, k))


def enumerated(n: int, c: int, k: int) -> Fraction:
    """The share of k-subsets of n samples (c correct) holding a correct one, by listing them."""
    samples = [True] * c + [False] * (n - c)
    subsets = list(itertools.combinations(range(n), k))
    return Fraction(sum(any(samples[i] for i in s) for s in subsets), len(subsets))


def binomial_quantile(n: int, p: float, q: float) -> int:
    """The smallest x with P(Binomial(n, p) <= x) >= q."""
    cdf = 0.0
    for x in range(n + 1):
        cdf += math.comb(n, x) * p**x * (1 - p) ** (n - x)
        if cdf >= q:
            return x
    return n


@pytest.mark.parametrize("n", range(1, 9))
def test_pass_at_k_equals_the_enumerated_reference_on_every_small_case(n):
    for c in range(n + 1):
        for k in range(1, n + 1):
            want = enumerated(n, c, k)
            assert pass_at_k(n, c, k) == pytest.approx(float(want), abs=1e-12), (n, c, k)


def test_pass_at_k_edges():
    assert pass_at_k(16, 0, 1) == 0.0 and pass_at_k(16, 0, 16) == 0.0  # c = 0
    assert pass_at_k(16, 16, 1) == 1.0 and pass_at_k(16, 16, 16) == 1.0  # c = n
    assert pass_at_k(16, 1, 16) == 1.0  # k = n: the one correct sample is always drawn
    assert pass_at_k(16, 5, 1) == pytest.approx(5 / 16)  # pass@1 is the mean accuracy


@pytest.mark.parametrize("c", [0, 1, 2, 17, 512, 1000, 1023, 1024])
def test_pass_at_k_is_finite_and_exact_for_n_1024(c):
    for k in (1, 2, 8, 64, 512, 1024):
        got = pass_at_k(1024, c, k)
        assert math.isfinite(got)
        assert got == pytest.approx(float(combinatorial(1024, c, k)), rel=1e-12, abs=1e-300)


def test_pass_at_k_refuses_impossible_counts():
    with pytest.raises(ValueError, match=r"1 <= k <= n"):
        pass_at_k(4, 1, 0)
    with pytest.raises(ValueError, match=r"1 <= k <= n"):
        pass_at_k(4, 1, 5)
    with pytest.raises(ValueError, match=r"c = 5"):
        pass_at_k(4, 5, 1)


def test_the_curve_is_over_powers_of_two_with_a_standard_error_across_problems():
    assert powers_of_two(16) == [1, 2, 4, 8, 16]
    assert powers_of_two(12) == [1, 2, 4, 8, 12]
    counts = [(4, 0), (4, 1), (4, 4)]
    curve = pass_at_k_curve(counts)
    assert list(curve) == [1, 2, 4]
    per_problem = [float(combinatorial(4, c, 2)) for _, c in counts]  # 0, 1/2, 1
    assert curve[2].mean == pytest.approx(np.mean(per_problem))
    assert curve[2].stderr == pytest.approx(np.std(per_problem, ddof=1) / math.sqrt(3))
    assert curve[2].problems == 3


def test_maj_at_k_votes_over_the_first_k_parsable_answers():
    answers = ["7", "8", "8", None, "7", "7"]
    correct = [a == "7" for a in answers]
    assert not maj_at_k(answers, correct, 3)  # 8 wins 2 to 1
    assert maj_at_k(answers, correct, 6)  # 7 wins 3 to 2
    assert maj_at_k(answers, correct, 1)
    assert not maj_at_k(["8", "7"], [False, True], 2)  # a tie goes to the answer seen first
    assert not maj_at_k([None, None], [False, False], 2)  # nothing parsable: wrong


def test_a_paired_bootstrap_sees_a_consistent_small_gain_that_independent_errors_would_not():
    rng = np.random.default_rng(0)
    difficulty = rng.uniform(0, 1, size=200)
    a = (difficulty > 0.5).astype(float)
    b = a.copy()
    b[np.flatnonzero(a == 0)[:12]] = 1.0  # b also solves 12 problems a missed, loses none
    d = paired_bootstrap(a, b, resamples=4000, seed=1)
    assert d.mean == pytest.approx(12 / 200)
    assert 0 < d.low <= d.mean <= d.high
    # A resample's gain is Binomial(200, 12/200) / 200: the 95% interval runs between its
    # 2.5% and 97.5% quantiles (6 and 19; a 90% interval would give 7 and 18).
    assert (d.low, d.high) == (
        binomial_quantile(200, 0.06, 0.025) / 200,
        binomial_quantile(200, 0.06, 0.975) / 200,
    )
    assert d.p_value < 0.01
    # Two independent binomial intervals of ~0.5 accuracy on 200 problems overlap widely.
    independent_se = math.sqrt(2 * 0.5 * 0.5 / 200)
    assert d.mean < 2 * independent_se
    same = paired_bootstrap(a, a)
    assert same.mean == 0.0 and same.p_value == 1.0
    # 3 gains and 1 loss: the p-value is two-sided, twice the resamples' share at or below 0.
    c = a.copy()
    c[np.flatnonzero(a == 0)[:3]] = 1.0
    c[np.flatnonzero(a == 1)[:1]] = 0.0
    at_most_zero = sum(
        math.comb(200, i) * math.comb(200 - i, j) * 0.015**i * 0.005**j * 0.98 ** (200 - i - j)
        for i in range(201)
        for j in range(i, 201 - i)
    )  # P(gains <= losses) with gains, losses ~ Multinomial(200; 3/200, 1/200): 0.224
    assert paired_bootstrap(a, c, resamples=4000).p_value == pytest.approx(
        2 * at_most_zero, abs=0.05
    )


def test_mcnemar_exact_counts_only_the_discordant_problems():
    # 10 discordant, all for b: p = 2 * (1/2)^10.
    a = [False] * 10 + [True] * 50 + [False] * 40
    b = [True] * 10 + [True] * 50 + [False] * 40
    assert mcnemar_exact(a, b) == pytest.approx(2 / 2**10)
    assert mcnemar_exact(a, a) == 1.0
    # 3 against 5 of 8 discordant: two-sided binomial tail.
    a2 = [True] * 3 + [False] * 5
    b2 = [False] * 3 + [True] * 5
    want = 2 * sum(math.comb(8, i) for i in range(4)) / 2**8
    assert mcnemar_exact(a2, b2) == pytest.approx(want)


def test_summaries_refuse_nothing_and_mismatched_pairs():
    with pytest.raises(ValueError, match="no problems"):
        summarize([])
    with pytest.raises(ValueError, match="same problems"):
        paired_bootstrap([1.0, 0.0], [1.0])
