"""reward.name='weighted': the weighted sum of named rewards, each completion failing alone."""

from __future__ import annotations

import math
import pickle

import jax
import numpy as np
import pytest
from rljax.configs import arith_tiny

from rljax.config import ConfigError, DataConfig, RewardConfig, replace
from rljax.models.classifier import save_classifier
from rljax.models.sharding import SAMPLER_RULES, make_mesh
from rljax.models.tokenizer import Tokenizer
from rljax.models.transformer import init_sharded
from rljax.rewards import verifiers
from rljax.rewards.model import RewardContext, build_model_reward
from rljax.rewards.pool import FAILURE_KINDS, RewardPool
from rljax.rewards.registry import build_reward
from rljax.rewards.weighted import WeightedReward
from rljax.runtime.run import Run
from rljax.testing import TINY_MODEL

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


def test_a_run_scores_with_a_weighted_reward_model(tmp_path):
    """rljax.Run builds reward.name='weighted' with a reward model and its pool calls it
    batched, on the prompts the policy saw."""
    mesh = make_mesh(jax.devices()[:1], {"data": 1, "tensor": 1})
    params = init_sharded(TINY_MODEL, mesh, SAMPLER_RULES, 0)[1]
    score = jax.random.normal(jax.random.key(0), (TINY_MODEL.hidden_size,))
    save_classifier(tmp_path / "rm", TINY_MODEL, params, score, pad_token_id=0)
    changes = {
        "reward.name": "weighted",
        "reward.weights": {"exact_match": 1.0, "model": 0.5},
        "reward.model.path": str(tmp_path / "rm"),
        "reward.timeout_s": 600.0,
    }
    cfg = replace(arith_tiny.recipe("small"), **changes)
    run = Run(cfg, str(tmp_path / "run"))
    try:
        examples = run.train_examples[:2]
        completions = [examples[0]["answer"], "1"]
        rewards = run.reward_pool().score(completions, examples)
    finally:
        run.close()
    context = RewardContext(run.tokenizer, cfg.data, cfg.sampling.max_seq_len)
    alone = build_model_reward(cfg.reward.model, context)(completions, examples)
    assert examples[1]["answer"] != "1"
    np.testing.assert_allclose(rewards, [1.0 + 0.5 * alone[0], 0.5 * alone[1]], rtol=1e-5)
