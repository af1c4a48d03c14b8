"""Length-aware batch packing (pure policy: plain ints in, index lists out).

The learner trains on rows of ``row_len`` tokens that hold several sequences each, told apart by
segment ids, instead of padding every sequence to the longest one. Two decisions live here:

1. ``pack_sequences``: which sequences share a row (first-fit decreasing bin packing).
2. ``balance_microbatches``: which rows share a micro-batch, so that every micro-batch has the
   same number of rows (one compiled shape) and close token counts (no straggler step)::

       lengths [700, 300, 512, 200, 100, 90]
         --pack_sequences(row_len=1024)-->  rows [[0, 1], [2, 3, 4, 5]]  (1000, 902 tokens)
         + two padding rows (0 tokens)      rows_token_counts [1000, 902, 0, 0]
         --balance_microbatches(num_micro=2)-->  [[0, 3], [1, 2]]  (1000, 902 tokens)

Both return indices into their input, so the caller keeps owning the token arrays.
"""

from __future__ import annotations

from collections.abc import Sequence


def _check_count(name: str, value: object, minimum: int, fix: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name}={value!r} is invalid: {fix}")


def pack_sequences(lengths: Sequence[int], *, row_len: int) -> list[list[int]]:
    """Packs sequences into rows of at most ``row_len`` tokens, first-fit decreasing.

    Sequences are placed longest first (ties: lower index first), each into the first row
    with room; FFD uses at most 11/9 OPT + 6/9 rows. Deterministic for a given input.

    Args:
      lengths: token count of each sequence (prompt plus response), each in [1, row_len].
      row_len: tokens per packed row.

    Returns:
      Rows in creation order; each row lists sequence indices in ascending order. Every index
      appears exactly once.
    """
    _check_count("row_len", row_len, 1, "use an int >= 1 (tokens per packed row)")
    for i, n in enumerate(lengths):
        _check_count(f"lengths[{i}]", n, 1, "lengths must be ints >= 1; drop empty sequences")
        if n > row_len:
            raise ValueError(
                f"sequence {i} has {n} tokens > row_len={row_len}; raise row_len or truncate it"
            )
    rows: list[list[int]] = []
    room: list[int] = []
    for i in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        n = lengths[i]
        for r, free in enumerate(room):
            if n <= free:
                rows[r].append(i)
                room[r] -= n
                break
        else:
            rows.append([i])
            room.append(row_len - n)
    return [sorted(row) for row in rows]


def balance_microbatches(rows_token_counts: Sequence[int], num_micro: int) -> list[list[int]]:
    """Splits rows into ``num_micro`` micro-batches of equal row count and balanced tokens.

    Rows are dealt in rounds of ``num_micro``, heaviest first: each round gives its heaviest
    row to the currently lightest micro-batch. Every micro-batch takes one row per round, so
    the token spread between micro-batches is at most the largest row's count. Pairwise swaps
    between the heaviest and lightest micro-batch then narrow it further.

    Padding rows: the row count must be a multiple of ``num_micro`` so that every micro-batch
    has the same shape; the caller appends all-padding rows (token count 0) to get there.

    Args:
      rows_token_counts: real (non-padding) tokens of each row, ints >= 0.
      num_micro: number of micro-batches, between 1 and the number of rows.

    Returns:
      ``num_micro`` lists of row indices (ascending), each of length
      ``len(rows_token_counts) // num_micro``; every row appears exactly once.
    """
    counts = list(rows_token_counts)
    _check_count("num_micro", num_micro, 1, "use an int >= 1 (micro-batches per step)")
    for i, n in enumerate(counts):
        _check_count(f"rows_token_counts[{i}]", n, 0, "token counts must be ints >= 0")
    if num_micro > len(counts):
        raise ValueError(
            f"num_micro={num_micro} is larger than the number of rows {len(counts)}; "
            "lower num_micro or add padding rows (token count 0)"
        )
    if len(counts) % num_micro:
        missing = num_micro - len(counts) % num_micro
        raise ValueError(
            f"{len(counts)} rows do not split evenly into num_micro={num_micro}; "
            f"append {missing} padding rows (token count 0)"
        )
    order = sorted(range(len(counts)), key=lambda i: (-counts[i], i))
    micro: list[list[int]] = [[] for _ in range(num_micro)]
    load = [0] * num_micro
    for start in range(0, len(order), num_micro):
        lightest_first = sorted(range(num_micro), key=lambda m: (load[m], m))
        for row, m in zip(order[start : start + num_micro], lightest_first, strict=True):
            micro[m].append(row)
            load[m] += counts[row]
    _refine_by_swaps(micro, load, counts)
    return [sorted(rows) for rows in micro]


def _refine_by_swaps(micro: list[list[int]], load: list[int], counts: list[int]) -> None:
    """Swaps one row between the heaviest and lightest micro-batch while that narrows them.

    A swap moving ``d`` tokens with ``0 < d < heavy - light`` leaves both loads strictly inside
    the old [light, heavy] range, so the overall spread never grows and the sum of squared
    loads strictly falls: the loop terminates. The cap bounds the cost on large inputs.
    """
    for _ in range(4 * len(counts)):
        heavy = max(range(len(load)), key=lambda m: (load[m], -m))
        light = min(range(len(load)), key=lambda m: (load[m], m))
        gap = load[heavy] - load[light]
        best = None  # (distance of the new gap from 0, index in heavy, index in light)
        for a, ra in enumerate(micro[heavy]):
            for b, rb in enumerate(micro[light]):
                d = counts[ra] - counts[rb]
                if 0 < d < gap and (best is None or abs(gap - 2 * d) < best[0]):
                    best = (abs(gap - 2 * d), a, b)
        if best is None:
            return
        _, a, b = best
        ra, rb = micro[heavy][a], micro[light][b]
        micro[heavy][a], micro[light][b] = rb, ra
        d = counts[ra] - counts[rb]
        load[heavy] -= d
        load[light] += d
