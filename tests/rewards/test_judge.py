"""The judge: its verdict parser, and a judge model end to end through the RewardPool, where
each verdict without a score counts as one failed completion."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from rljax.config import DataConfig, JudgeConfig, ModelConfig
from rljax.models.hf import save_hf
from rljax.models.sharding import SAMPLER_RULES, make_mesh
from rljax.models.tokenizer import Tokenizer
from rljax.models.transformer import init_sharded
from rljax.rewards.judge import Judge, build_judge, parse_verdict
from rljax.rewards.model import RewardContext
from rljax.rewards.pool import FAILURE_KINDS, RewardPool

ALPHABET = "0123456789+=: Scorexy"
TOKENIZER = Tokenizer.char_level(ALPHABET)
MODEL = ModelConfig(
    family="llama",
    vocab_size=32,
    hidden_size=32,
    intermediate_size=64,
    num_layers=1,
    num_heads=4,
    num_kv_heads=2,
    head_dim=8,
    max_position_embeddings=64,
)
# The programmed judge answers a judge prompt ending in '1' with "Score: 7", and one ending in
# anything else with nothing (its next token is the end token).
VERDICT_AFTER_1 = "Score: 7"
CONTEXT = RewardContext(TOKENIZER, DataConfig(), max_seq_len=16)


@pytest.mark.parametrize(
    "verdict, reward",
    [
        ("Score: 7", 0.7),
        ("the answer is right.\nscore = 10", 1.0),
        ("**Score:** 2.5", 0.25),
        ("Score: 0", 0.0),
        ("Score: 9 ... on reflection, Score: 3", 0.3),  # the last score counts
    ],
)
def test_parser_reads_the_last_score(verdict, reward):
    assert parse_verdict(verdict, 10.0) == pytest.approx(reward)


@pytest.mark.parametrize(
    "verdict, message",
    [
        ("", "has no 'Score: <number>'"),
        ("looks right to me: 7/10", "has no 'Score: <number>'"),
        ("Score: high", "has no 'Score: <number>'"),
        ("Score: 11", "is outside [0, reward.judge.max_score=10]"),
        ("Score: -1", "is outside [0, reward.judge.max_score=10]"),
    ],
)
def test_parser_refuses_a_verdict_without_a_score_in_range(verdict, message):
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("*", r"\*")):
        parse_verdict(verdict, 10.0)


def programmed_params(mesh):
    """A judge whose next token depends on its last token alone (no attention or MLP output,
    one-hot embeddings): a lookup table that answers '1' with VERDICT_AFTER_1."""
    graphdef, params = init_sharded(MODEL, mesh, SAMPLER_RULES, 0)
    model = nnx.merge(graphdef, params)
    ids = [TOKENIZER.encode(c)[0] for c in "1" + VERDICT_AFTER_1]
    table = np.zeros((MODEL.hidden_size, MODEL.vocab_size), np.float32)
    table[:, TOKENIZER.eos_id] = 1.0  # every other token ends the verdict
    for a, b in zip(ids, ids[1:]):
        table[a, b] = 10.0
    table[ids[-1], TOKENIZER.eos_id] = 10.0
    model.embed[...] = jnp.eye(MODEL.vocab_size, MODEL.hidden_size)
    model.lm_head[...] = jnp.asarray(table)
    model.wo[...] = jnp.zeros_like(model.wo[...])
    model.w_down[...] = jnp.zeros_like(model.w_down[...])
    return nnx.state(model)


def judge_dir(tmp_path, params) -> str:
    path = str(tmp_path / "judge")
    save_hf(path, MODEL, params, tokenizer=TOKENIZER)
    return path


JUDGE = dict(
    template="{prompt} {response}",
    prompt_format="raw",
    max_new_tokens=10,
    max_prompt_length=16,
    batch_size=4,
)
JUDGE_CALL = dict(prompt_format="raw", max_score=10.0)


def test_judge_scores_through_the_pool_and_counts_each_unparsable_verdict(tmp_path):
    mesh = make_mesh(jax.devices()[:1], {"data": 1, "tensor": 1})
    path = judge_dir(tmp_path, programmed_params(mesh))
    judge = build_judge(JudgeConfig(path=path, **JUDGE), CONTEXT)
    completions = ["x1", "y2", "21", "xy", "1" * 20]  # the last: a prompt past 16 tokens
    examples = [{"prompt": "1+1=", "answer": "2"}] * len(completions)
    assert judge.verdicts(completions[:4], examples[:4]) == [VERDICT_AFTER_1, "", "Score: 7", ""]
    with RewardPool(judge, batched=True, timeout_s=600.0, on_failure="drop") as pool:
        rewards = pool.score(completions, examples)
        stats = pool.stats
    np.testing.assert_allclose(rewards[[0, 2]], [0.7, 0.7], rtol=1e-6)
    assert np.isnan(rewards[[1, 3, 4]]).all()  # failed alone, not the whole batch
    assert stats.by_kind() == {k: 3 if k == "raised" else 0 for k in FAILURE_KINDS}
    assert "reward.judge.max_prompt_length=16" in stats.last_error
    # A template slot the example cannot fill fails that completion alone.
    template = "{answer}{response}"
    answers = Judge(judge.engine, judge.sampler.params, TOKENIZER, template=template, **JUDGE_CALL)
    out = answers(["1", "1"], [{"prompt": "1+1=", "answer": "2"}, {"prompt": "1+1="}])
    assert out[0] == pytest.approx(0.7)
    assert isinstance(out[1], KeyError) and "needs the example's 'answer'" in str(out[1])


def test_a_random_judge_end_to_end_counts_its_failures(tmp_path):
    mesh = make_mesh(jax.devices()[:1], {"data": 1, "tensor": 1})
    path = judge_dir(tmp_path, init_sharded(MODEL, mesh, SAMPLER_RULES, 3)[1])
    judge = build_judge(JudgeConfig(path=path, **JUDGE), CONTEXT)
    completions = ["1", "22", "333", "x", "y", "Score", "12", "0"]
    examples = [{"prompt": "1+1=", "answer": "2"}] * len(completions)
    verdicts = judge.verdicts(completions, examples)
    assert all(isinstance(v, str) for v in verdicts)
    unparsable = 0
    for v in verdicts:
        try:
            parse_verdict(v, 10.0)
        except ValueError:
            unparsable += 1
    with RewardPool(judge, batched=True, timeout_s=600.0) as pool:
        rewards = pool.score(completions, examples)
        stats = pool.stats
    assert stats.calls == len(completions) and stats.raised == unparsable > 0
    assert stats.failures == unparsable and np.count_nonzero(rewards == 0.0) >= unparsable
