"""Evaluation as papers report it: pass@k, maj@k and paired comparisons (estimators.py)."""

from rljax.eval.estimators import (
    PairedDifference,
    Summary,
    maj_at_k,
    mcnemar_exact,
    paired_bootstrap,
    pass_at_k,
    pass_at_k_curve,
    summarize,
)

__all__ = [
    "PairedDifference",
    "Summary",
    "maj_at_k",
    "mcnemar_exact",
    "paired_bootstrap",
    "pass_at_k",
    "pass_at_k_curve",
    "summarize",
]
