"""One evaluation's results, problem by problem, and the figures papers report from them.

Each problem holds its k samples: the text, the answer extracted from it, its score and
whether that counts as correct, its length in tokens and whether the length limit cut it. The
summary (:func:`summary`) gives, with a standard error across problems on each figure:

- ``avg@k``: pass@1 averaged over the k samples;
- ``pass@j`` for every power of two j up to k (the unbiased estimator, ``estimators.py``);
- ``maj@k``: whether the most common extracted answer among the k samples is a correct one;
- the mean response length and the fraction of responses cut at the length limit.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from rljax.eval.estimators import maj_at_k, pass_at_k, powers_of_two, summarize
from rljax.rewards.verifiers import extract_answer, parse_number

# A score above this counts as correct: a verifier's 1 (partial credit, a format bonus, is
# not a solve), a judge's verdict in [0, 1] above one half.
CORRECT_ABOVE = 0.5


def answer_key(text: str) -> str | None:
    """The final answer of ``text`` in a canonical form, so that equal answers vote together
    in maj@k: a number as its exact fraction (``"0.50"``, ``"1/2"`` and ``"\\frac{1}{2}"``
    agree), anything else without whitespace; None when the text has no answer."""
    answer = extract_answer(text)
    if answer is None:
        return None
    number = parse_number(answer)
    if number is not None:
        return str(number) if not isinstance(number, float) else repr(number)
    return "".join(answer.split()).strip("$").rstrip(".") or None


@dataclasses.dataclass
class Sample:
    text: str
    answer: str | None
    score: float
    correct: bool
    tokens: int
    truncated: bool


@dataclasses.dataclass
class Problem:
    """One problem and its k samples, in sample order."""

    index: int
    example: dict[str, Any]
    samples: list[Sample]

    @property
    def correct(self) -> int:
        return sum(s.correct for s in self.samples)

    def row(self) -> dict[str, Any]:
        """The problem's JSONL row."""
        return {
            "index": self.index,
            "id": self.example.get("id", self.index),
            "prompt": self.example.get("prompt"),
            "reference": self.example.get("answer"),
            "correct": self.correct,
            "samples": [dataclasses.asdict(s) for s in self.samples],
        }


def per_problem(problems: Sequence[Problem], k: int) -> dict[str, np.ndarray]:
    """Each figure's per-problem value (over the first ``k`` samples), problems in order: what
    the summary averages and what a paired comparison pairs."""
    if not problems:
        raise ValueError("no problems were evaluated; raise eval_examples or check data.*")
    ks = powers_of_two(k)
    out: dict[str, list[float]] = {"avg@k": [], **{f"pass@{j}": [] for j in ks}}
    out |= {"maj@k": [], "tokens": [], "truncated": []}
    for p in problems:
        samples = p.samples[:k]
        if len(samples) < k:
            raise ValueError(f"problem {p.index} has {len(samples)} samples, fewer than k = {k}")
        c = sum(s.correct for s in samples)
        out["avg@k"].append(c / k)
        for j in ks:
            out[f"pass@{j}"].append(pass_at_k(k, c, j))
        answers = [s.answer for s in samples]
        out["maj@k"].append(float(maj_at_k(answers, [s.correct for s in samples], k)))
        out["tokens"].append(float(np.mean([s.tokens for s in samples])))
        out["truncated"].append(float(np.mean([s.truncated for s in samples])))
    return {name: np.asarray(v) for name, v in out.items()}


def summary(problems: Sequence[Problem], k: int) -> dict[str, Any]:
    """The figures over ``problems``: each ``{"mean", "se"}`` (the standard error of the mean
    across problems), plus the counts."""
    figures = per_problem(problems, k)
    out: dict[str, Any] = {"problems": len(problems), "k": k}
    for name, values in figures.items():
        s = summarize(values)
        out[name] = {"mean": s.mean, "se": s.stderr}
    return out


def table(summaries: dict[str, dict[str, Any]]) -> str:
    """The summaries side by side, one row per figure, ``mean ± se``: what ``rljax eval``
    prints (one column per checkpoint)."""
    names = list(summaries)
    first = summaries[names[0]]
    rows = [k for k in first if isinstance(first[k], dict)]
    width = max(len(r) for r in rows)
    cells = [[_cell(summaries[n][r], r) for n in names] for r in rows]
    col = max([len(n) for n in names] + [len(c) for row in cells for c in row])
    lines = [" " * width + "  " + "  ".join(n.rjust(col) for n in names)]
    for r, row in zip(rows, cells, strict=True):
        lines.append(r.ljust(width) + "  " + "  ".join(c.rjust(col) for c in row))
    return "\n".join(lines)


def _cell(figure: dict[str, float], name: str) -> str:
    mean, se = figure["mean"], figure["se"]
    if name == "tokens":
        return f"{mean:.1f} ± {se:.1f}"
    if math.isnan(se):
        return f"{100 * mean:.1f}%"
    return f"{100 * mean:.1f} ± {100 * se:.1f}%"
