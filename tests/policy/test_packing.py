"""rljax.policy.packing: first-fit-decreasing rows and balanced equal-row micro-batches."""

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rljax.policy.packing import balance_microbatches, pack_sequences


@st.composite
def _lengths_and_row_len(draw):
    row_len = draw(st.integers(1, 64))
    lengths = draw(st.lists(st.integers(1, row_len), max_size=40))
    return lengths, row_len


@settings(max_examples=200, deadline=None)
@given(case=_lengths_and_row_len())
def test_pack_sequences_places_every_sequence_once_within_row_len(case):
    lengths, row_len = case
    rows = pack_sequences(lengths, row_len=row_len)
    assert sorted(i for row in rows for i in row) == list(range(len(lengths)))
    loads = [sum(lengths[i] for i in row) for row in rows]
    assert all(load <= row_len for load in loads)
    assert all(row == sorted(row) and row for row in rows)
    # First fit never opens a row while an earlier one had room: any two rows overflow together.
    for a, b in itertools.combinations(loads, 2):
        assert a + b > row_len
    assert len(rows) >= -(-sum(lengths) // row_len)


def test_pack_sequences_is_first_fit_decreasing():
    # Longest first: 6 opens row 0, 5 opens row 1, 4 opens row 2, 3 and 2 fill rows 1 and 0.
    assert pack_sequences([2, 6, 3, 5, 4], row_len=8) == [[0, 1], [2, 3], [4]]
    assert pack_sequences([], row_len=4) == []
    assert pack_sequences([4, 4], row_len=4) == [[0], [1]]


@st.composite
def _rows_and_micro(draw):
    num_micro = draw(st.integers(1, 8))
    per_micro = draw(st.integers(1, 6))
    counts = draw(
        st.lists(
            st.integers(0, 1000), min_size=num_micro * per_micro, max_size=num_micro * per_micro
        )
    )
    return counts, num_micro


@settings(max_examples=200, deadline=None)
@given(case=_rows_and_micro())
def test_balance_microbatches_partitions_evenly_with_bounded_spread(case):
    counts, num_micro = case
    micro = balance_microbatches(counts, num_micro)
    assert len(micro) == num_micro
    assert sorted(i for m in micro for i in m) == list(range(len(counts)))
    assert {len(m) for m in micro} == {len(counts) // num_micro}
    loads = [sum(counts[i] for i in m) for m in micro]
    assert max(loads) - min(loads) <= max(counts)


@settings(max_examples=60, deadline=None)
@given(counts=st.lists(st.integers(0, 50), min_size=4, max_size=4))
def test_balance_two_micro_of_four_rows_is_optimal(counts):
    """Two micro-batches of two rows: the greedy plus swap reaches the brute-force optimum."""
    micro = balance_microbatches(counts, 2)
    spread = abs(sum(counts[i] for i in micro[0]) - sum(counts[i] for i in micro[1]))
    best = min(
        abs(sum(counts[i] for i in pair) * 2 - sum(counts))
        for pair in itertools.combinations(range(4), 2)
    )
    assert spread == best


def test_balance_beats_contiguous_split():
    counts = [900, 850, 100, 50, 800, 120]  # contiguous pairs would carry 1750 / 150 / 920
    micro = balance_microbatches(counts, 3)
    loads = sorted(sum(counts[i] for i in m) for m in micro)
    assert loads == [920, 950, 950]  # optimal: every other pairing spreads wider
    assert balance_microbatches([1000, 902, 0, 0], 2) == [[0, 3], [1, 2]]


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: pack_sequences([1], row_len=0), "row_len=0 is invalid: use an int >= 1"),
        (lambda: pack_sequences([3, 0], row_len=4), r"lengths\[1\]=0 is invalid: .*>= 1"),
        (
            lambda: pack_sequences([3, 2, 9], row_len=8),
            "sequence 2 has 9 tokens > row_len=8; raise row_len or truncate it",
        ),
        (lambda: balance_microbatches([1, 2], 0), "num_micro=0 is invalid: use an int >= 1"),
        (
            lambda: balance_microbatches([1, 2], 3),
            "num_micro=3 is larger than the number of rows 2; lower num_micro or add padding",
        ),
        (
            lambda: balance_microbatches([1, 2, 3], 2),
            r"3 rows do not split evenly into num_micro=2; append 1 padding rows \(token count 0\)",
        ),
        (
            lambda: balance_microbatches([1, -2], 1),
            r"rows_token_counts\[1\]=-2 is invalid: token counts must be ints >= 0",
        ),
    ],
)
def test_error_messages(call, message):
    with pytest.raises(ValueError, match=message):
        call()
