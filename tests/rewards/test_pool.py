"""Tests for RewardPool: failures become 0.0 and counters, never crashes."""

import math
import os
import threading
import time

import numpy as np
import pytest

from rljax.rewards import verifiers
from rljax.rewards.pool import RewardPool

EXAMPLES = [{"answer": str(i)} for i in range(6)]


def flaky(completion, example):
    """Module-level verifier (picklable) that misbehaves on request."""
    if completion == "raise":
        raise RuntimeError("verifier bug")
    if completion == "hang":
        time.sleep(60)
    if completion == "nan":
        return math.nan
    if completion == "inf":
        return -math.inf
    if completion == "str":
        return "1.0"
    if completion == "die":
        os._exit(3)
    return verifiers.exact_match(completion, example)


def test_thread_mode_scores_and_counts_failures():
    completions = ["0", "raise", "2", "nan", "str", "9"]
    with RewardPool(flaky, num_workers=2, timeout_s=5.0) as pool:
        rewards = pool.score(completions, EXAMPLES)
        stats = pool.stats
    assert rewards.dtype == np.float32
    np.testing.assert_array_equal(rewards, [1.0, 0.0, 1.0, 0.0, 0.0, 0.0])
    assert (stats.calls, stats.errors, stats.nans, stats.timeouts) == (6, 2, 1, 0)
    assert stats.failures == 3
    # Workers finish in any order, so the last failure is any one of the three.
    assert stats.last_error in {
        "RuntimeError: verifier bug",
        "verifier returned nan",
        "verifier returned str, not a float",
    }


def test_thread_mode_hang_times_out_and_capacity_is_replaced():
    release = threading.Event()

    def blocking(completion, example):
        if completion == "hang":
            release.wait(30)
        return 1.0

    pool = RewardPool(blocking, num_workers=1, timeout_s=0.5)
    try:
        rewards = pool.score(["hang", "a", "hang", "b"], EXAMPLES[:4])
        np.testing.assert_array_equal(rewards, [0.0, 1.0, 0.0, 1.0])
        assert pool.stats.timeouts == 2 and pool.stats.abandoned == 2
        assert "timeout_s=0.5" in pool.stats.last_error
    finally:
        release.set()
        pool.close()


def test_submit_is_async_and_inf_counts_as_inf():
    with RewardPool(flaky, num_workers=2) as pool:
        future = pool.submit(["1", "inf"], EXAMPLES[1:3])
        np.testing.assert_array_equal(future.result(timeout=10), [1.0, 0.0])
        assert (pool.stats.infs, pool.stats.nans) == (1, 0)
        assert pool.submit([], []).result().shape == (0,)


def test_process_mode_survives_raise_hang_and_death():
    completions = ["0", "raise", "hang", "3", "die", "5"]
    with RewardPool(flaky, num_workers=2, timeout_s=1.0, mode="process") as pool:
        rewards = pool.score(completions, EXAMPLES)
        np.testing.assert_array_equal(rewards, [1.0, 0.0, 0.0, 1.0, 0.0, 1.0])
        stats = pool.stats
        assert (stats.errors, stats.timeouts) == (2, 1)
        assert stats.restarts == 2  # The hung child is killed; the dead one is replaced.
        # The replacement workers still score correctly.
        np.testing.assert_array_equal(pool.score(["1", "x"], EXAMPLES[1:3]), [1.0, 0.0])


def test_process_mode_rejects_unpicklable_verifier():
    with pytest.raises(ValueError, match="needs a picklable verifier.*use mode='thread'"):
        RewardPool(lambda c, e: 1.0, mode="process")


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"num_workers": 0}, "num_workers=0 must be a positive int"),
        ({"timeout_s": 0}, "timeout_s=0 must be a positive number"),
        ({"mode": "fork"}, "mode='fork' is not supported; use one of ['thread', 'process']"),
        ({"on_failure": "skip"}, "on_failure='skip' is not supported; use one of ['zero', 'drop']"),
        ({"batched": 1}, "batched=1 must be True or False"),
    ],
)
def test_bad_arguments(kwargs, message):
    with pytest.raises(ValueError) as info:
        RewardPool(flaky, **kwargs)
    assert message in str(info.value)


def test_bad_calls():
    pool = RewardPool(flaky)
    with pytest.raises(ValueError, match="Got 2 completions but 1 examples"):
        pool.score(["a", "b"], EXAMPLES[:1])
    with pytest.raises(TypeError, match="got a single str"):
        pool.score("a", EXAMPLES[:1])
    pool.close()
    pool.close()
    with pytest.raises(RuntimeError, match="RewardPool is closed"):
        pool.score(["a"], EXAMPLES[:1])


def test_broken_worker_scores_zero_and_recovers():
    class FlakyStartPool(RewardPool):
        starts = 0

        def _make_runner(self):
            FlakyStartPool.starts += 1
            if FlakyStartPool.starts == 1:
                raise OSError("cannot start worker")
            return super()._make_runner()

    with FlakyStartPool(flaky, num_workers=1) as pool:
        np.testing.assert_array_equal(pool.score(["0", "1"], EXAMPLES[:2]), [0.0, 1.0])
        assert pool.stats.errors == 1
        assert "reward worker failed: OSError: cannot start worker" in pool.stats.last_error
