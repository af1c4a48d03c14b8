"""Tests for the grain prompt pipelines."""

import json

import pytest

from rljax.data.arithmetic import ArithmeticTask
from rljax.data.pipeline import process_shard, prompt_dataset, prompt_iterator

EXAMPLES = ArithmeticTask(num_digits=2, train_size=50, heldout_size=0, seed=0).train()


def _ids(batch):
    return [example["id"] for example in batch]


def test_each_epoch_is_a_permutation_and_epochs_differ():
    ds = prompt_dataset(EXAMPLES, seed=1, num_epochs=2)
    ids = [example["id"] for example in ds]
    first, second = ids[:50], ids[50:]
    assert sorted(first) == sorted(second) == sorted(e["id"] for e in EXAMPLES)
    assert first != second
    assert first != [e["id"] for e in EXAMPLES]


def test_no_shuffle_keeps_order():
    ds = prompt_dataset(EXAMPLES, seed=0, shuffle=False, num_epochs=1)
    assert list(ds) == EXAMPLES


def test_elements_are_copies():
    ds = prompt_dataset(EXAMPLES, seed=0, shuffle=False, num_epochs=1)
    ds[0]["prompt"] = "mutated"
    assert ds[0]["prompt"] == EXAMPLES[0]["prompt"] != "mutated"


def test_restored_iterator_continues_exactly():
    it = prompt_iterator(EXAMPLES, batch_size=8, seed=3)
    for _ in range(5):  # Past the first epoch boundary (50 examples).
        next(it)
    state = json.loads(json.dumps(it.get_state()))  # Survives a JSON checkpoint.
    expected = [_ids(next(it)) for _ in range(10)]

    restored = prompt_iterator(EXAMPLES, batch_size=8, seed=3)
    restored.set_state(state)
    assert [_ids(next(restored)) for _ in range(10)] == expected


def test_same_seed_same_stream_different_seed_different_stream():
    a = prompt_iterator(EXAMPLES, batch_size=8, seed=3)
    b = prompt_iterator(EXAMPLES, batch_size=8, seed=3)
    c = prompt_iterator(EXAMPLES, batch_size=8, seed=4)
    batches_a = [_ids(next(a)) for _ in range(4)]
    assert batches_a == [_ids(next(b)) for _ in range(4)]
    assert batches_a != [_ids(next(c)) for _ in range(4)]


def test_shards_are_disjoint_equal_and_cover():
    shard_ids = []
    for index in range(3):
        it = prompt_iterator(
            EXAMPLES, batch_size=4, seed=0, shard_index=index, shard_count=3, num_epochs=1
        )
        shard_ids.append([i for batch in it for i in _ids(batch)])
    assert [len(ids) for ids in shard_ids] == [16, 16, 16]  # 50 // 3; two dropped.
    union = set().union(*map(set, shard_ids))
    assert len(union) == 48 and union <= {e["id"] for e in EXAMPLES}


def test_finite_epochs_and_drop_remainder():
    it = prompt_iterator(EXAMPLES, batch_size=8, seed=0, num_epochs=1)
    assert [len(b) for b in it] == [8] * 6 + [2]
    it = prompt_iterator(EXAMPLES, batch_size=8, seed=0, num_epochs=1, drop_remainder=True)
    assert [len(b) for b in it] == [8] * 6


def test_process_shard_single_host():
    assert process_shard() == (0, 1)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"batch_size": 0}, "batch_size=0 must be an int >= 1"),
        ({"shard_index": 2, "shard_count": 2}, "shard_index=2 must be < shard_count=2"),
        ({"shard_count": 51}, "50 examples cannot fill 51 shards"),
        ({"num_epochs": 0}, "num_epochs=0 must be an int >= 1"),
        ({"seed": -1}, "seed=-1 must be an int >= 0"),
    ],
)
def test_bad_arguments(kwargs, message):
    args = {"batch_size": 4, "seed": 0} | kwargs
    with pytest.raises(ValueError) as info:
        prompt_iterator(EXAMPLES, **args)
    assert message in str(info.value)


def test_examples_must_be_a_sequence():
    with pytest.raises(TypeError, match="examples must be a sequence of example dicts"):
        prompt_dataset({"id": 0}, seed=0)
