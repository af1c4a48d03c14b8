"""pass@k, maj@k and paired comparisons over per-problem samples.

Per problem, ``n`` completions were sampled and ``c`` of them are correct.

- **pass@k** (Chen et al. 2021, "Evaluating Large Language Models Trained on Code"): the
  probability that at least one of ``k`` completions drawn without replacement from the ``n``
  is correct, ``1 - C(n - c, k) / C(n, k)``, an unbiased estimate of the pass@k of the model.
  The binomials overflow a float for n in the hundreds, so it is computed as the product
  ``1 - prod_{i = n - c + 1}^{n} (1 - k / i)`` (each factor in [0, 1]: no overflow, and no
  cancellation where the answer is small). pass@1 is ``c / n``, the mean accuracy over the
  samples ("avg@n").
- **maj@k**: the majority answer of the first ``k`` samples is correct (majority voting,
  "self-consistency"; Wang et al. 2022). Answers are the task's extracted final answers;
  unparsable ones (``None``) never win, and ties go to the answer seen first.
- A figure over problems is their mean, with the standard error of that mean across problems
  (``std / sqrt(P)``, ddof 1): the problems are the sample, the k draws within one are not.
- Two checkpoints evaluated on the **same** problems are compared paired: the difference's
  confidence interval by a paired bootstrap over problems, and, for one binary outcome per
  problem (greedy accuracy), McNemar's exact test on the discordant pairs. Two independent
  binomials would overstate the noise (the same problems are easy for both) and the evidence.
"""

from __future__ import annotations

import dataclasses
import math
from collections import Counter
from collections.abc import Hashable, Sequence

import numpy as np
import numpy.typing as npt


def _check_counts(n: int, c: int, k: int) -> None:
    if n < 1:
        raise ValueError(f"pass@k needs at least one sample per problem (n = {n})")
    if not 0 <= c <= n:
        raise ValueError(f"the correct count c = {c} must lie in [0, n = {n}]")
    if not 1 <= k <= n:
        raise ValueError(
            f"pass@k with k = {k} needs 1 <= k <= n = {n}: sample at least k completions per "
            "problem (eval.k)"
        )


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased pass@k of one problem with ``c`` of ``n`` samples correct."""
    _check_counts(n, c, k)
    if n - c < k:  # every k-subset holds a correct sample
        return 1.0
    # C(n-c, k) / C(n, k) = prod_{i=n-c+1}^{n} (1 - k / i)
    i = np.arange(n - c + 1, n + 1, dtype=np.float64)
    return float(1.0 - np.prod(1.0 - k / i))


def powers_of_two(k: int) -> list[int]:
    """1, 2, 4, ... up to ``k``, and ``k`` itself when it is not a power of two."""
    out = [1 << i for i in range(k.bit_length()) if (1 << i) <= k]
    return out if out[-1] == k else [*out, k]


@dataclasses.dataclass(frozen=True)
class Summary:
    """A figure's mean over problems and the standard error of that mean."""

    mean: float
    stderr: float
    problems: int


def summarize(values: Sequence[float] | npt.NDArray) -> Summary:
    """The mean of per-problem values and its standard error across problems."""
    x = np.asarray(values, dtype=np.float64)
    if x.size == 0:
        raise ValueError("no problems to summarise")
    stderr = float(x.std(ddof=1) / math.sqrt(x.size)) if x.size > 1 else float("nan")
    return Summary(float(x.mean()), stderr, int(x.size))


def pass_at_k_curve(
    counts: Sequence[tuple[int, int]], ks: Sequence[int] | None = None
) -> dict[int, Summary]:
    """pass@k over problems for each k (default: powers of two up to the smallest n).

    ``counts`` holds each problem's (n, c).
    """
    if not counts:
        raise ValueError("no problems to evaluate")
    n_min = min(n for n, _ in counts)
    ks = list(ks) if ks is not None else powers_of_two(n_min)
    return {k: summarize([pass_at_k(n, c, k) for n, c in counts]) for k in ks}


def maj_at_k(answers: Sequence[Hashable | None], correct: Sequence[bool], k: int) -> bool:
    """Whether the majority answer of the first ``k`` samples is a correct one.

    ``answers[i]`` is sample i's extracted answer (None: unparsable) and ``correct[i]`` whether
    it is right. A problem with no parsable answer among the first k is wrong.
    """
    if len(answers) != len(correct):
        raise ValueError(f"{len(answers)} answers but {len(correct)} correctness flags")
    _check_counts(len(answers), 0, k)
    votes = Counter(a for a in answers[:k] if a is not None)
    if not votes:
        return False
    top = max(votes.values())
    # The first sample holding a most-voted answer: ties go to the answer seen first.
    first = next(i for i, a in enumerate(answers[:k]) if a is not None and votes[a] == top)
    return bool(correct[first])


@dataclasses.dataclass(frozen=True)
class PairedDifference:
    """``b - a`` over the same problems: its mean, a bootstrap interval and a p-value."""

    mean: float
    low: float
    high: float
    p_value: float
    problems: int


def paired_bootstrap(
    a: Sequence[float] | npt.NDArray,
    b: Sequence[float] | npt.NDArray,
    *,
    resamples: int = 10_000,
    confidence: float = 0.95,
    seed: int = 0,
) -> PairedDifference:
    """The mean of ``b - a`` per problem, with a percentile interval from resampling problems.

    The p-value is two-sided, of "no difference": twice the share of resampled means on the
    far side of zero (at least 1 / resamples), the usual paired-bootstrap test.
    """
    x, y = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if x.shape != y.shape or x.ndim != 1 or x.size == 0:
        raise ValueError(
            f"a paired comparison needs the same problems in both: got {x.shape} and {y.shape}"
        )
    d = y - x
    rng = np.random.default_rng(seed)
    means = d[rng.integers(0, d.size, size=(resamples, d.size))].mean(axis=1)
    tail = (1.0 - confidence) / 2
    low, high = np.quantile(means, [tail, 1.0 - tail])
    far = min(np.mean(means <= 0.0), np.mean(means >= 0.0))
    p = 1.0 if d.mean() == 0.0 else min(1.0, max(2.0 * far, 1.0 / resamples))
    return PairedDifference(float(d.mean()), float(low), float(high), float(p), int(d.size))


def mcnemar_exact(a: Sequence[bool] | npt.NDArray, b: Sequence[bool] | npt.NDArray) -> float:
    """McNemar's exact two-sided p-value of two binary outcomes on the same problems.

    Only the discordant problems count (right in one, wrong in the other): under "no
    difference" each is equally likely either way, a Binomial(discordant, 1/2).
    """
    if len(a) != len(b):
        raise ValueError(f"a paired comparison needs the same problems: {len(a)} and {len(b)}")
    only_a = sum(bool(x) and not bool(y) for x, y in zip(a, b, strict=True))
    only_b = sum(bool(y) and not bool(x) for x, y in zip(a, b, strict=True))
    m = only_a + only_b
    if m == 0:
        return 1.0
    tail = sum(math.comb(m, i) for i in range(min(only_a, only_b) + 1)) / 2**m
    return min(1.0, 2.0 * tail)
