"""reward.name='weighted': the weighted sum of named rewards, each completion failing alone."""

from __future__ import annotations

import math
import pickle

import numpy as np
import pytest

from rljax.config import ConfigError, DataConfig, RewardConfig
from rljax.models.tokenizer import Tokenizer
from rljax.rewards import verifiers
from rljax.rewards.model import RewardContext
from rljax.rewards.pool import FAILURE_KINDS, RewardPool
from rljax.rewards.registry import build_reward
from rljax.rewards.weighted import WeightedReward

CONTEXT = RewardContext(Tokenizer.char_level(), DataConfig(), max_seq_len=16)


def lengths(completions, examples):
    """A batched part: the completion's length; fails 'bad' alone and NaNs 'nan'."""
    return [
        ValueError("no verdict") if c == "bad" else math.nan if c == "nan" else float(len(c))
        for c in completions
    ]


def test_sum_of_weighted_parts_and_each_completion_fails_alone():
    reward = WeightedReward(
        [("exact_match", 2.0, verifiers.exact_match, False), ("lengths", 0.5, lengths, True)]
    )
    completions = ["12", "3", "bad", "nan", "12"]
    examples = [{"answer": "12"}, {"answer": "4"}, {"answer": "1"}, {"answer": "1"}, {}]
    with RewardPool(reward, batched=True, on_failure="drop") as pool:
        rewards = pool.score(completions, examples)
        stats = pool.stats
    np.testing.assert_allclose(rewards[:2], [2.0 + 0.5 * 2, 0.5 * 1])
    assert np.isnan(rewards[2:]).all()
    # 'bad': lengths' exception; {}: exact_match's KeyError; 'nan' counted as nan.
    assert stats.by_kind() == {k: {"raised": 2, "nan": 1}.get(k, 0) for k in FAILURE_KINDS}


def test_build_reward_by_name_and_weights():
    fn, batched = build_reward(RewardConfig(name="exact_match"), CONTEXT)
    assert fn is verifiers.exact_match and not batched
    cfg = RewardConfig(name="weighted", weights={"exact_match": 0.25, "math_answer": 1.0})
    fn, batched = build_reward(cfg, CONTEXT)
    assert batched
    assert fn(["2", "x 2"], [{"answer": "2"}] * 2) == [1.25, 1.0]
    pickle.dumps(fn)  # verifiers alone: process mode can take it
    with pytest.raises(ConfigError, match="set config key 'reward.weights' to one of them"):
        build_reward(RewardConfig(name="weighted", weights={"f1": 1.0}), CONTEXT)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"weights": {"exact_match": 1.0}}, "goes with reward.name='weighted'"),
        ({"name": "weighted"}, "goes with reward.name='weighted'"),
        ({"name": "weighted", "weights": {"exact_match": 0.0}}, "at least one weight"),
        ({"name": "weighted", "weights": {"exact_match": math.inf}}, "'reward.weights.exact_ma"),
        ({"name": "weighted", "weights": {"weighted": 1.0}}, "other than 'weighted'"),
        ({"name": "weighted", "weights": {"model": 1.0}}, "'reward.model.path' = ''"),
    ],
)
def test_bad_weights_are_refused_in_one_line(kwargs, message):
    with pytest.raises(ConfigError, match=message) as info:
        RewardConfig(**kwargs)
    assert "\n" not in str(info.value)
