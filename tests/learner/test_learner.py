"""Packing, sampler/learner parity, PPO epochs against a fixed proximal policy, the logged rate."""

import jax
import numpy as np
import pytest

from rljax.config import ConfigError, LearnerConfig
from rljax.engine.sampler import Request, Sampler
from rljax.learner.batch import TrainSequence, pack_batch
from rljax.learner.learner import Learner, check_divisible
from rljax.learner.optimizer import make_optimizer
from rljax.models.sharding import make_mesh
from rljax.testing.engines import tiny_engine


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
        tiny.state,
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
        tiny.state,
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


def test_learning_rate_schedules():
    def rates(**kw):
        _, schedule = make_optimizer(LearnerConfig(learning_rate=1.0, **kw))
        return [round(float(schedule(i)), 3) for i in (0, 5, 10, 60, 110, 200)]

    assert rates() == [1.0] * 6
    assert rates(warmup_steps=10) == [0.0, 0.5, 1.0, 1.0, 1.0, 1.0]
    # Cosine decay to 0 over decay_steps, after the warmup when there is one.
    assert rates(decay_steps=100) == [1.0, 0.994, 0.976, 0.345, 0.0, 0.0]
    assert rates(warmup_steps=10, decay_steps=100) == [0.0, 0.5, 1.0, 0.5, 0.0, 0.0]


def _on_policy_learner(cfg: LearnerConfig, **kw):
    """A learner on 2 devices and a batch whose behaviour log-probs are its own (staleness 0)."""
    tiny = tiny_engine()
    mesh = make_mesh(jax.devices()[:2], {"fsdp": 2, "tensor": 1})
    learner = Learner(cfg, tiny.graphdef, tiny.state, mesh, **kw)
    seqs = [
        TrainSequence([1, 3, 5, 7, 9, 11], 2, advantage=1.0),
        TrainSequence([1, 4, 8, 12, 2], 1, advantage=-1.0),
        TrainSequence([2, 6, 10, 3], 2, advantage=1.0),
        TrainSequence([5, 7, 2, 9, 4, 6], 3, advantage=-1.0),
    ]
    batch = pack_batch(seqs, row_len=16, micro_batches=cfg.micro_batches, row_multiple=learner.dp)
    batch.arrays["old_logprobs"] = learner.token_logprobs(batch) * batch.arrays["mask"]
    return learner, batch


@pytest.mark.parametrize(
    "overrides",
    [{"loss": "decoupled_ppo"}, {"loss": "grpo", "truncated_is": 2.0}],
    ids=["decoupled_ppo", "grpo_tis"],
)
def test_ppo_epochs_clip_against_the_policy_before_the_step(overrides):
    """pi_prox is computed once, before the epochs: later epochs clip, and pi_prox / pi_behav
    stays 1 on on-policy data. Recomputed each epoch, the ratio was 1 and nothing clipped."""
    cfg = LearnerConfig(group_size=2, batch_groups=2, ppo_epochs=4, learning_rate=0.05, **overrides)
    learner, batch = _on_policy_learner(cfg)
    metrics = learner.step(batch)  # those of the last (fourth) epoch
    assert metrics["clip_frac"] > 0.0
    assert abs(metrics["ratio"] - 1.0) > 1e-3
    assert metrics["is_weight"] == pytest.approx(1.0, abs=1e-4)
    assert learner.version == 1


def test_logged_learning_rate_is_the_rate_the_optimiser_applied():
    """A learner whose version is ahead of its optimiser (a warm start, a resume onto a fresh
    optimiser) logs the rate its update used, not schedule(version).

    Adam's first update moves every parameter with a gradient by lr * g / (|g| + eps), so the
    largest move measures the rate applied.
    """
    cfg = LearnerConfig(group_size=2, batch_groups=2, learning_rate=0.01, decay_steps=4)
    learner, batch = _on_policy_learner(cfg, loss="sft", version=3)
    before = jax.device_get(learner.params)
    metrics = learner.step(batch)
    after = jax.device_get(learner.params)
    moved = max(
        float(np.max(np.abs(a - b)))
        for a, b in zip(jax.tree.leaves(after), jax.tree.leaves(before), strict=True)
    )
    assert moved == pytest.approx(0.01, rel=1e-3)
    assert metrics["learning_rate"] == pytest.approx(moved, rel=1e-3)


def test_logged_learning_rate_counts_every_epoch():
    cfg = LearnerConfig(
        group_size=2, batch_groups=2, ppo_epochs=3, learning_rate=1.0, warmup_steps=4
    )
    learner, batch = _on_policy_learner(cfg, loss="sft")
    _, schedule = make_optimizer(cfg)
    # Updates 0, 1, 2 ran; the last one applied schedule(2) = 0.5 (schedule(version 0) = 0).
    assert learner.step(batch)["learning_rate"] == pytest.approx(float(schedule(2)))
    assert learner.step(batch)["learning_rate"] == pytest.approx(float(schedule(5)))
