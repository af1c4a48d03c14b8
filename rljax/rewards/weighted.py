"""A weighted sum of rewards (``reward.name='weighted'``, ``reward.weights``).

Each part is a verifier (per completion) or a batched reward ('model', 'judge'); the sum is a
batched verifier. A completion that one part fails on (it raised for that completion, or
returned an exception, NaN or a non-number in its place) fails as a whole: it gets that part's
failure, so the pool counts it once, by kind (an exception: ``raised``; NaN: ``nan``). A batched
part that raises fails the whole call, as it would alone.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Sequence
from typing import Any

# (name, weight, fn, batched): fn(completion, example) -> float, or batched
# fn(completions, examples) -> sequence of floats (or exceptions in a failed completion's place).
Part = tuple[str, float, Callable[..., Any], bool]


def _per_completion(fn, completions, examples) -> list[Any]:
    out: list[Any] = []
    for completion, example in zip(completions, examples, strict=True):
        try:
            out.append(fn(completion, example))
        except Exception as e:  # noqa: BLE001 - the part's failure of this completion alone
            out.append(e)
    return out


class WeightedReward:
    """``sum_k weight_k * reward_k(completion, example)`` over ``parts``, batched."""

    def __init__(self, parts: Sequence[Part]):
        if not parts:
            raise ValueError("a weighted reward needs at least one part")
        self.parts = tuple(parts)

    def __call__(self, completions: Sequence[str], examples: Sequence[dict]) -> list[Any]:
        n = len(completions)
        totals: list[Any] = [0.0] * n
        for name, weight, fn, batched in self.parts:
            if batched:
                values = fn(completions, examples)
            else:
                values = _per_completion(fn, completions, examples)
            if len(values) != n:
                raise ValueError(f"reward {name!r} gave {len(values)} rewards for {n} completions")
            for i, value in enumerate(values):
                if not isinstance(totals[i], float):
                    continue  # already failed by an earlier part
                if isinstance(value, Exception):
                    totals[i] = ValueError(f"reward {name!r}: {type(value).__name__}: {value}")
                elif not isinstance(value, numbers.Real):
                    totals[i] = TypeError(f"reward {name!r} returned {type(value).__name__}")
                elif math.isnan(value):
                    totals[i] = math.nan  # counted as 'nan', as the part alone would be
                else:
                    totals[i] += weight * float(value)
        return totals
