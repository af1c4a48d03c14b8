"""Two evaluations of the same problems, compared pairwise, and their pass@k curves drawn.

The same problems evaluated twice are one sample of problems, not two: each figure's
difference is taken problem by problem (b - a) and judged by a paired bootstrap over problems;
the binary figures (maj@k, and pass@k at k = n: "some sample solved it") also get McNemar's
exact test, which counts only the problems one checkpoint solves and the other does not.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rljax import io
from rljax.eval.estimators import mcnemar_exact, paired_bootstrap, powers_of_two
from rljax.eval.problems import Problem, per_problem

PLOT_FILE = "pass_at_k.png"
DIFFERENCE_FILE = "comparison.json"
RESAMPLES = 10_000
RESAMPLES_FLOOR = 1.0 / RESAMPLES  # the smallest p-value RESAMPLES resamples can show


def _same_problems(a: Sequence[Problem], b: Sequence[Problem]) -> None:
    ids_a = [p.example.get("prompt") for p in a]
    ids_b = [p.example.get("prompt") for p in b]
    if ids_a != ids_b:
        raise ValueError(
            "the two evaluations hold different problems; evaluate both with the same config "
            "(data.*, seed, eval_examples) so they pair"
        )


def compare(a: Sequence[Problem], b: Sequence[Problem], k: int) -> dict[str, Any]:
    """Each figure's paired difference b - a: ``{"mean", "low", "high", "p_bootstrap"}``, and
    ``p_mcnemar`` for the binary ones."""
    _same_problems(a, b)
    fa, fb = per_problem(a, k), per_problem(b, k)
    out: dict[str, Any] = {"problems": len(a), "k": k}
    for name in fa:
        if name in ("tokens", "truncated"):
            continue
        d = paired_bootstrap(fa[name], fb[name], resamples=RESAMPLES)
        row: dict[str, Any] = {
            "mean": d.mean,
            "low": d.low,
            "high": d.high,
            "p_bootstrap": d.p_value,
        }
        if name == "maj@k" or name == f"pass@{k}":
            row["p_mcnemar"] = mcnemar_exact(fa[name] > 0.5, fb[name] > 0.5)
        out[name] = row
    return out


def difference_table(diff: dict[str, Any], names: tuple[str, str]) -> str:
    """One line per figure: the paired difference in points with its 95% interval and
    p-values."""
    lines = [f"{names[1]} - {names[0]} (paired, {diff['problems']} problems):"]
    for name, row in diff.items():
        if not isinstance(row, dict):
            continue
        p = row["p_bootstrap"]  # never below 1 / resamples: shown as "<" there
        shown = f"< {RESAMPLES_FLOOR:.0e}" if p <= RESAMPLES_FLOOR else f"= {p:.3g}"
        text = (
            f"  {name:<10} {100 * row['mean']:+.1f} points "
            f"[{100 * row['low']:+.1f}, {100 * row['high']:+.1f}]  p {shown} (bootstrap)"
        )
        if "p_mcnemar" in row:
            text += f", = {row['p_mcnemar']:.3g} (McNemar)"
        lines.append(text)
    return "\n".join(lines)


def plot_pass_at_k(summaries: dict[str, dict[str, Any]], path: str) -> bool:
    """The pass@k curves of ``summaries`` (name -> summary) on one log2-k plot, with one
    standard error as bars; False (and nothing written) without matplotlib."""
    try:
        import matplotlib
    except ImportError:
        return False
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 4))
    for name, s in summaries.items():
        ks = powers_of_two(int(s["k"]))
        means = [100 * s[f"pass@{j}"]["mean"] for j in ks]
        errs = [100 * _finite(s[f"pass@{j}"]["se"]) for j in ks]
        ax.errorbar(ks, means, yerr=errs, marker="o", capsize=3, label=name)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("k (samples per problem)")
    ax.set_ylabel("pass@k (%)")
    first = next(iter(summaries.values()))
    ax.set_title(f"pass@k over {first['problems']} problems (± 1 s.e.)")
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    with io.path(path).open("wb") as f:
        fig.savefig(f, format="png", dpi=120)
    plt.close(fig)
    return True


def _finite(x: float) -> float:
    return 0.0 if x != x else x  # one problem: no standard error
