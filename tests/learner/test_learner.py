"""Advantages, losses against hand-computed values, packing, and sampler/learner parity."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rljax.config import ConfigError, LearnerConfig
from rljax.engine.sampler import Request, Sampler
from rljax.learner import losses
from rljax.learner.advantages import group_advantages
from rljax.learner.batch import TrainSequence, pack_batch
from rljax.learner.learner import Learner, check_divisible, make_optimizer
from rljax.models.sharding import make_mesh
from rljax.testing.engines import tiny_engine


def test_group_advantages_by_hand():
    adv = group_advantages(np.array([[1.0, 0.0, 0.0, 1.0], [2.0, 2.0, 2.0, 2.0]]))
    # mean 0.5, population std 0.5 -> +-1 (minus the eps in the denominator)
    np.testing.assert_allclose(adv[0], [1, -1, -1, 1], atol=1e-5)
    np.testing.assert_array_equal(adv[1], 0.0)
    np.testing.assert_allclose(group_advantages(np.array([[3.0, 1.0]]), scale=False), [[1.0, -1.0]])
    with pytest.raises(ValueError, match="G >= 2"):
        group_advantages(np.array([[1.0]]))


def _inputs(logp, old, adv, mask=None, ref=None):
    logp = jnp.asarray([logp], jnp.float32)
    return losses.LossInputs(
        logprobs=logp,
        old_logprobs=jnp.asarray([old], jnp.float32),
        advantages=jnp.asarray([adv], jnp.float32),
        mask=jnp.ones_like(logp) if mask is None else jnp.asarray([mask], jnp.float32),
        entropy=jnp.zeros_like(logp),
        segment_ids=jnp.ones_like(logp, jnp.int32),
        versions=jnp.zeros_like(logp, jnp.int32),
        learner_version=jnp.int32(0),
        ref_logprobs=None if ref is None else jnp.asarray([ref], jnp.float32),
    )


def test_grpo_clipped_loss_by_hand():
    cfg = LearnerConfig(epsilon_low=0.2, epsilon_high=0.28)
    # ratios: e^0.5=1.6487 (A>0: clipped at 1.28), e^-0.5=0.6065 (A<0: clipped at 0.8),
    #         1.0 (unclipped), e^0.1=1.1052 with A<0 (unclipped branch is the min)
    logp = [0.5, -0.5, 0.0, 0.1]
    adv = [1.0, -2.0, 0.5, -1.0]
    per_token, metrics = losses.grpo(_inputs(logp, [0.0] * 4, adv), cfg)
    want = [-1.28 * 1.0, 0.8 * 2.0, -0.5, math.exp(0.1) * 1.0]
    np.testing.assert_allclose(per_token[0], want, rtol=1e-5)
    np.testing.assert_array_equal(metrics["clip_frac"][0], [1.0, 1.0, 0.0, 0.0])


def test_k3_kl_by_hand_and_beta():
    cfg = LearnerConfig(beta=0.1)
    x = _inputs([-1.0], [-1.0], [0.0], ref=[-1.5])
    per_token, metrics = losses.grpo(x, cfg)
    d = -0.5
    kl = math.exp(d) - d - 1
    assert float(metrics["kl"][0, 0]) == pytest.approx(kl, rel=1e-5)
    assert float(per_token[0, 0]) == pytest.approx(0.1 * kl, rel=1e-5)


def test_decoupled_ppo_weights_by_behaviour_and_truncates():
    cfg = LearnerConfig(loss="decoupled_ppo", truncated_is=2.0)
    # prox = current = -1.0; behaviour -2.0 -> w = e^1 = 2.718 truncated to 2.0; ratio 1.
    per_token, metrics = losses.decoupled_ppo(_inputs([-1.0], [-2.0], [1.0]), cfg)
    assert float(metrics["is_weight"][0, 0]) == pytest.approx(2.0)
    assert float(per_token[0, 0]) == pytest.approx(-2.0)


def test_token_mean_aggregation_across_micro_batches():
    seqs = [
        TrainSequence([1, 2, 3, 4], 2, [-0.1, -0.2], 1.0),
        TrainSequence([1, 5, 6, 7, 8, 9], 1, [-0.1] * 5, -1.0),
    ]
    batch = pack_batch(seqs, row_len=8, micro_batches=2)
    a = batch.arrays
    assert a["tokens"].shape == (2, 1, 8)
    assert a["mask"].sum() == 7
    np.testing.assert_allclose(a["weights"][a["mask"] > 0], 1 / 7)
    # targets are the next tokens within a sequence, masked on response positions only
    flat_t = a["targets"].reshape(-1)
    flat_m = a["mask"].reshape(-1)
    assert sorted(flat_t[flat_m > 0].tolist()) == sorted([3, 4, 5, 6, 7, 8, 9])


def test_batch_not_divisible_over_devices_is_a_one_line_error():
    with pytest.raises(ConfigError) as exc:
        check_divisible("learner.batch_groups * learner.group_size", 12, 8)
    assert "not divisible over the 8 data-parallel learner devices" in str(exc.value)
    assert "\n" not in str(exc.value)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_sampler_logprobs_equal_learner_logprobs(temperature):
    """Importance weights are exp(learner - sampler): they must be 1 for the same params."""
    tiny = tiny_engine(temperature=temperature, max_concurrent_decodes=8)
    trajs = Sampler(tiny.engine, tiny.params).run(
        [Request([1, 4, 6, 2, 3], num_samples=4, seed=1), Request([5, 9], num_samples=4, seed=2)]
    )
    mesh = make_mesh(jax.devices()[:2], {"fsdp": 2, "tensor": 1})
    learner = Learner(
        LearnerConfig(group_size=4, batch_groups=2),
        tiny.graphdef,
        tiny.params,
        mesh,
        temperature=temperature,
    )
    seqs = [
        TrainSequence(t.prompt_tokens + t.response_tokens, len(t.prompt_tokens), t.logprobs)
        for t in trajs
    ]
    batch = pack_batch(seqs, row_len=tiny.engine.max_seq_len, row_multiple=learner.dp)
    recomputed = learner.token_logprobs(batch)
    mask = batch.arrays["mask"] > 0
    np.testing.assert_allclose(recomputed[mask], batch.arrays["old_logprobs"][mask], atol=2e-5)


def test_learner_step_reduces_sft_loss_and_advances_version():
    tiny = tiny_engine()
    mesh = make_mesh(jax.devices()[:4], {"fsdp": 2, "tensor": 2})
    learner = Learner(
        LearnerConfig(group_size=2, batch_groups=2, micro_batches=2, learning_rate=1e-2),
        tiny.graphdef,
        tiny.params,
        mesh,
        loss="sft",
    )
    seqs = [TrainSequence([1, 3, 5, 7, 9, 11], 2), TrainSequence([1, 4, 8, 12], 1)] * 2
    batch = pack_batch(seqs, row_len=16, micro_batches=2, row_multiple=learner.dp)
    first = learner.step(batch)["loss"]
    for _ in range(5):
        last = learner.step(batch)["loss"]
    assert learner.version == 6
    assert last < first
    wq = learner.params["wq"][...]
    assert wq.sharding.spec[1] == "fsdp"  # FSDP over the embedding dimension


def test_unknown_loss_lists_registered_ones():
    with pytest.raises(ValueError, match="registered: .*grpo"):
        losses.get_loss("ppo2")


def test_learning_rate_schedules():
    def rates(**kw):
        _, schedule = make_optimizer(LearnerConfig(learning_rate=1.0, **kw))
        return [round(float(schedule(i)), 3) for i in (0, 5, 10, 60, 110, 200)]

    assert rates() == [1.0] * 6
    assert rates(warmup_steps=10) == [0.0, 0.5, 1.0, 1.0, 1.0, 1.0]
    # Cosine decay to 0 over decay_steps, after the warmup when there is one.
    assert rates(decay_steps=100) == [1.0, 0.994, 0.976, 0.345, 0.0, 0.0]
    assert rates(warmup_steps=10, decay_steps=100) == [0.0, 0.5, 1.0, 0.5, 0.0, 0.0]
