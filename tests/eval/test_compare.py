"""Two evaluations compared pairwise (rljax/eval/compare.py: what `rljax eval --compare` writes
to comparison.json and prints), against figures computed here from the definitions."""

from __future__ import annotations

import math

import numpy as np
import pytest

from rljax.eval import compare
from rljax.eval.problems import Problem, Sample

K = 4
# Problem by problem: (correct samples of a, of b) out of K, and whether each evaluation's
# majority answer is a right one. Twelve problems: b solves more, some problems both solve or
# both miss, and one problem a solves that b does not (so both discordant counts are nonzero).
COUNTS = [(0, 2), (0, 3), (1, 4), (0, 1), (2, 2), (4, 4), (0, 0), (3, 0), (1, 3), (0, 2),
          (2, 4), (0, 4)]  # fmt: skip


def _samples(correct: int, prefix: str) -> list[Sample]:
    """K samples, the first ``correct`` right: right ones answer "42", wrong ones each a
    different answer, so "42" has the most votes or ties for them, and a tie goes to the first
    sample: maj@k is right exactly when some sample is."""
    return [
        Sample(
            text=f"{prefix}{i}",
            answer="42" if i < correct else f"wrong{i}",
            score=1.0 if i < correct else 0.0,
            correct=i < correct,
            tokens=10 + i,
            truncated=False,
        )
        for i in range(K)
    ]


def _evaluations() -> tuple[list[Problem], list[Problem]]:
    a, b = [], []
    for i, (ca, cb) in enumerate(COUNTS):
        example = {"prompt": f"problem {i}", "answer": "42"}
        a.append(Problem(i, example, _samples(ca, "a")))
        b.append(Problem(i, example, _samples(cb, "b")))
    return a, b


def _pass_at(c: int, j: int) -> float:
    """pass@j of K samples, c right, by its definition: 1 - C(K - c, j) / C(K, j)."""
    return 1.0 - math.comb(K - c, j) / math.comb(K, j)


def _mcnemar(a: list[bool], b: list[bool]) -> float:
    """McNemar's exact two-sided p: the discordant problems as a Binomial(m, 1/2)."""
    only_a = sum(x and not y for x, y in zip(a, b, strict=True))
    only_b = sum(y and not x for x, y in zip(a, b, strict=True))
    m = only_a + only_b
    tail = sum(math.comb(m, i) for i in range(min(only_a, only_b) + 1)) / 2**m
    return min(1.0, 2 * tail)


def test_each_figure_is_the_paired_difference_b_minus_a():
    a, b = _evaluations()
    diff = compare.compare(a, b, K)
    assert (diff["problems"], diff["k"]) == (len(COUNTS), K)
    # Length figures are not compared; every score figure is.
    assert set(diff) == {"problems", "k", "avg@k", "pass@1", "pass@2", "pass@4", "maj@k"}
    want = {
        "avg@k": [(cb - ca) / K for ca, cb in COUNTS],
        **{
            f"pass@{j}": [_pass_at(cb, j) - _pass_at(ca, j) for ca, cb in COUNTS]
            for j in (1, 2, 4)
        },
        "maj@k": [float(cb >= 1) - float(ca >= 1) for ca, cb in COUNTS],
    }
    for name, per_problem in want.items():
        row = diff[name]
        assert row["mean"] == pytest.approx(np.mean(per_problem)), name
        assert row["low"] <= row["mean"] <= row["high"], name
        assert row["mean"] > 0 and 0 < row["p_bootstrap"] <= 1, name
    # McNemar on the binary figures only: "some sample solved it" (pass@K) and maj@k.
    solved = ([ca > 0 for ca, _ in COUNTS], [cb > 0 for _, cb in COUNTS])
    assert diff[f"pass@{K}"]["p_mcnemar"] == pytest.approx(_mcnemar(*solved))
    assert diff["maj@k"]["p_mcnemar"] == pytest.approx(_mcnemar(*solved))
    assert _mcnemar(*solved) == pytest.approx(2 * 7 / 2**6)  # discordant: 5 for b, 1 for a
    assert all("p_mcnemar" not in diff[n] for n in ("avg@k", "pass@1", "pass@2"))


def test_the_interval_is_paired_not_two_independent_samples():
    """b = a + one more right sample on every problem a does not fully solve: the difference
    is nearly constant across problems, so its paired interval is far narrower than the
    spread of either evaluation alone."""
    a, _ = _evaluations()
    b = [Problem(p.index, p.example, _samples(min(K, p.correct + 1), "b")) for p in a]
    row = compare.compare(a, b, K)["avg@k"]
    per_problem_a = [p.correct / K for p in a]
    assert row["high"] - row["low"] < 0.5 * np.std(per_problem_a)
    assert row["low"] > 0


def test_different_problems_are_refused_with_the_fix():
    a, b = _evaluations()
    b[3] = Problem(3, {"prompt": "another problem", "answer": "42"}, b[3].samples)
    with pytest.raises(ValueError, match=r"hold different problems; evaluate both with the same"):
        compare.compare(a, b, K)


def test_the_difference_table_prints_points_intervals_and_both_tests():
    a, b = _evaluations()
    diff = compare.compare(a, b, K)
    lines = compare.difference_table(diff, ("base", "tuned")).splitlines()
    assert lines[0] == f"tuned - base (paired, {len(COUNTS)} problems):"
    by_name = {line.split()[0]: line for line in lines[1:]}
    assert set(by_name) == {"avg@k", "pass@1", "pass@2", "pass@4", "maj@k"}
    avg = diff["avg@k"]
    assert f"{100 * avg['mean']:+.1f} points" in by_name["avg@k"]
    assert f"[{100 * avg['low']:+.1f}, {100 * avg['high']:+.1f}]" in by_name["avg@k"]
    assert "(McNemar)" in by_name["maj@k"] and "(McNemar)" in by_name[f"pass@{K}"]
    assert "(McNemar)" not in by_name["avg@k"]
    # A p-value at the bootstrap's floor is shown as a bound, not as a value.
    floored = {**diff, "avg@k": {**avg, "p_bootstrap": compare.RESAMPLES_FLOOR}}
    line = compare.difference_table(floored, ("a", "b")).splitlines()[1]
    assert f"p < {compare.RESAMPLES_FLOOR:.0e} (bootstrap)" in line


def test_the_pass_at_k_plot_is_a_png(tmp_path):
    pytest.importorskip("matplotlib")
    from rljax.eval.problems import summary

    a, b = _evaluations()
    path = tmp_path / compare.PLOT_FILE
    assert compare.plot_pass_at_k({"a": summary(a, K), "b": summary(b, K)}, str(path))
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
