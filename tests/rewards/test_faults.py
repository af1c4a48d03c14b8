"""Reward faults by kind: raised, timeout, NaN, inf, wrong type and (batched) wrong count are
each counted, and a failed completion scores 0.0 or NaN as ``on_failure`` says."""

import math
import threading

import numpy as np
import pytest

from rljax.rewards.pool import FAILURE_KINDS, RewardPool, failure_metrics

RELEASE = threading.Event()  # hung verifier calls return once the test module is done


@pytest.fixture(scope="module", autouse=True)
def _release_hung_calls():
    yield
    RELEASE.set()


# completion -> what the per-completion verifier does with it (None: a good 1.0).
BEHAVIOUR = {
    "raise": "raised",
    "hang": "timeout",
    "nan": "nan",
    "inf": "inf",
    "-inf": "inf",
    "str": "type",
    "none": "type",
    "list": "type",
    "ok": None,
    "np": None,
}


def verifier(completion: str, example: dict) -> object:
    if completion == "raise":
        raise KeyError("answer")
    if completion == "hang":
        RELEASE.wait(60)
        return 1.0
    return {
        "nan": math.nan,
        "inf": math.inf,
        "-inf": -math.inf,
        "str": "1.0",
        "none": None,
        "list": [1.0],
        "ok": 1.0,
        "np": np.float32(1.0),
    }[completion]


@pytest.mark.parametrize("on_failure", ["zero", "drop"])
def test_every_kind_is_counted_and_scored_as_configured(on_failure):
    completions = list(BEHAVIOUR)
    with RewardPool(verifier, num_workers=3, timeout_s=1.0, on_failure=on_failure) as pool:
        rewards = pool.score(completions, [{}] * len(completions))
        stats = pool.stats
    failed = [kind is not None for kind in BEHAVIOUR.values()]
    np.testing.assert_array_equal(np.isnan(rewards), np.array(failed) & (on_failure == "drop"))
    np.testing.assert_array_equal(
        np.nan_to_num(rewards, nan=-1.0),
        [(-1.0 if on_failure == "drop" else 0.0) if f else 1.0 for f in failed],
    )
    assert stats.by_kind() == {"raised": 1, "timeout": 1, "nan": 1, "inf": 2, "type": 3, "count": 0}
    assert stats.calls == len(completions) and stats.failures == sum(failed)
    assert stats.errors == 4  # raised + type (+ count): the pre-kinds counter, kept


def batched_verifier(completions: list, examples: list) -> object:
    """Misbehaves as the first completion of the batch asks; else one reward per completion."""
    head = completions[0]
    n = len(completions)
    if head == "raise":
        raise RuntimeError("batched verifier bug")
    if head == "hang":
        RELEASE.wait(60)
    return {
        "short": [1.0] * (n - 1),
        "long": [1.0] * (n + 1),
        "str": "1,1,1",
        "none": None,
        "dict": {i: 1.0 for i in range(n)},
        "elements": [1.0, math.nan, "x", math.inf][:n],
        "exception": [1.0, ValueError("no 'Score: <number>' in the verdict"), 1.0, 1.0][:n],
        "array": np.ones(n, np.float32),
    }.get(head, [1.0] * n)


@pytest.mark.parametrize(
    "head, kinds",
    [
        ("ok", {}),
        ("array", {}),
        ("raise", {"raised": 4}),
        ("hang", {"timeout": 4}),
        ("short", {"count": 4}),
        ("long", {"count": 4}),
        ("str", {"type": 4}),
        ("none", {"type": 4}),
        ("dict", {"type": 4}),
        ("elements", {"nan": 1, "type": 1, "inf": 1}),
        ("exception", {"raised": 1}),  # one completion fails, not the batch
    ],
)
def test_batched_verifier_faults(head, kinds):
    completions = [head, "b", "c", "d"]
    with RewardPool(batched_verifier, timeout_s=1.0, batched=True, on_failure="drop") as pool:
        rewards = pool.score(completions, [{}] * 4)
        stats = pool.stats
    assert stats.by_kind() == {k: kinds.get(k, 0) for k in FAILURE_KINDS}
    assert stats.calls == 4
    assert int(np.isnan(rewards).sum()) == sum(kinds.values())
    assert np.all(rewards[~np.isnan(rewards)] == 1.0)
    if kinds:
        assert stats.last_error
    if head == "exception":
        assert stats.last_error == "ValueError: no 'Score: <number>' in the verdict"
        assert np.isnan(rewards[1]) and not np.isnan(rewards[[0, 2, 3]]).any()


def test_batched_verifier_gets_one_call_per_submit():
    calls = []

    def fn(completions, examples):
        calls.append(list(completions))
        return [float(len(c)) for c in completions]

    with RewardPool(fn, batched=True) as pool:
        np.testing.assert_array_equal(pool.score(["a", "bb", "ccc"], [{}] * 3), [1.0, 2.0, 3.0])
        assert pool.score([], []).shape == (0,)
    assert calls == [["a", "bb", "ccc"]]


def test_failure_metrics_keys():
    assert failure_metrics({"nan": 2, "timeout": 1}) == {
        "reward_errors": 3,
        "reward_errors/raised": 0,
        "reward_errors/timeout": 1,
        "reward_errors/nan": 2,
        "reward_errors/inf": 0,
        "reward_errors/type": 0,
        "reward_errors/count": 0,
    }
    with pytest.raises(ValueError, match=r"unknown reward failure kinds \['oops'\]; use"):
        failure_metrics({"oops": 1})
