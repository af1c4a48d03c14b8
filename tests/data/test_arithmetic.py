"""Tests for the synthetic arithmetic task."""

import json
import os
import random
import subprocess
import sys

import pytest

from rljax.data.arithmetic import ArithmeticTask, careless_sum


def _check_example(example):
    prompt = example["prompt"]
    assert prompt.endswith("=")
    body = prompt[:-1]
    for op in "+-*":
        if op in body:
            a, b = body.split(op)
            expected = {"+": int(a) + int(b), "-": int(a) - int(b), "*": int(a) * int(b)}[op]
            assert example["answer"] == str(expected)
            return op
    raise AssertionError(f"no operator in {prompt!r}")


@pytest.mark.parametrize("ops", ["+", "-", "*", "+-*"])
def test_answers_are_correct_and_ids_stable(ops):
    task = ArithmeticTask(num_digits=2, ops=ops, train_size=200, heldout_size=50, seed=3)
    train, heldout = task.splits()
    assert len(train) == 200 and len(heldout) == 50
    seen_ops = {_check_example(e) for e in train + heldout}
    assert seen_ops <= set(ops)
    for example in train[:20]:
        assert task.problem(example["id"]) == example


def test_splits_are_disjoint_and_seeded():
    task = ArithmeticTask(num_digits=1, ops="+-", train_size=150, heldout_size=50, seed=1)
    train, heldout = task.splits()
    train_ids = {e["id"] for e in train}
    heldout_ids = {e["id"] for e in heldout}
    assert len(train_ids) == 150 and len(heldout_ids) == 50
    assert not train_ids & heldout_ids
    assert task.splits() == (train, heldout)
    other = ArithmeticTask(num_digits=1, ops="+-", train_size=150, heldout_size=50, seed=2)
    assert other.train() != train


def test_dense_request_uses_whole_space():
    task = ArithmeticTask(num_digits=1, ops="*", train_size=90, heldout_size=10, seed=0)
    train, heldout = task.splits()
    assert {e["id"] for e in train + heldout} == set(range(100))


def test_identical_across_processes():
    code = (
        "import json; from rljax.data.arithmetic import ArithmeticTask;"
        "t = ArithmeticTask(num_digits=3, ops='+*', train_size=40, heldout_size=10, seed=7);"
        "print(json.dumps(t.splits()))"
    )
    outputs = []
    for hash_seed in ("1", "2"):
        env = dict(os.environ, PYTHONHASHSEED=hash_seed)
        result = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
        )
        outputs.append(json.loads(result.stdout))
    local = ArithmeticTask(num_digits=3, ops="+*", train_size=40, heldout_size=10, seed=7)
    assert outputs[0] == outputs[1] == json.loads(json.dumps(local.splits()))


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"num_digits": 0}, "num_digits=0 is out of range"),
        ({"num_digits": 10}, "num_digits=10 is out of range"),
        ({"ops": "/"}, "unsupported operator(s) ['/']"),
        ({"ops": ""}, "must be a non-empty string"),
        ({"ops": "++"}, "repeats an operator"),
        ({"train_size": -1}, "train_size=-1 must be a non-negative int"),
        ({"num_digits": 1, "train_size": 90, "heldout_size": 20}, "exceeds the 100 distinct"),
    ],
)
def test_bad_arguments(kwargs, message):
    with pytest.raises(ValueError, match=None) as info:
        ArithmeticTask(**kwargs)
    assert message in str(info.value)


def test_problem_id_out_of_range():
    with pytest.raises(ValueError, match="problem_id=400 is out of range"):
        ArithmeticTask(num_digits=1, ops="+-*", train_size=1, heldout_size=1).problem(400)


def test_careless_sum_is_exact_without_slips():
    for a in range(0, 1000, 37):
        for b in range(0, 1000, 53):
            assert careless_sum(f"{a}+{b}=", 0.0, random.Random(0)) == str(a + b)


def test_careless_sum_drops_each_carry_independently():
    rng = random.Random(0)
    # 37+85: units carry and tens carry; every combination of dropped carries is possible.
    counts = {}
    for _ in range(4000):
        answer = careless_sum("37+85=", 0.6, rng)
        counts[answer] = counts.get(answer, 0) + 1
    assert set(counts) == {"122", "112", "22", "12"}
    assert abs(counts["122"] / 4000 - 0.4 * 0.4) < 0.03  # both carries kept
    assert abs(counts["12"] / 4000 - 0.6 * 0.6) < 0.03  # both dropped
    assert abs(counts["22"] / 4000 - 0.4 * 0.6) < 0.03  # units carry kept, tens carry dropped
    # No carry, nothing to drop; a dropped carry never leaves a leading zero.
    assert careless_sum("12+34=", 0.99, rng) == "46"
    assert careless_sum("50+50=", 0.999999, rng) == "0"


def test_careless_sum_rejects_other_prompts():
    with pytest.raises(ValueError, match="like '37\\+45='"):
        careless_sum("37-45=", 0.5, random.Random(0))
