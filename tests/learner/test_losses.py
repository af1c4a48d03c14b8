"""Losses against hand-computed values: the PPO clip, dual clip, KL, and the proximal policy."""

import math

import jax.numpy as jnp
import numpy as np
import pytest

from rljax.config import ConfigError, LearnerConfig
from rljax.learner import losses


def _inputs(logp, old, adv, *, ref=None, versions=None, learner_version=0, prox=None):
    logp = jnp.asarray([logp], jnp.float32)
    extra = {} if prox is None else {"prox_logprobs": jnp.asarray([prox], jnp.float32)}
    return losses.LossInputs(
        logprobs=logp,
        old_logprobs=jnp.asarray([old], jnp.float32),
        advantages=jnp.asarray([adv], jnp.float32),
        mask=jnp.ones_like(logp),
        entropy=jnp.zeros_like(logp),
        segment_ids=jnp.ones_like(logp, jnp.int32),
        versions=jnp.asarray([versions or [0] * logp.shape[1]], jnp.int32),
        learner_version=jnp.int32(learner_version),
        ref_logprobs=None if ref is None else jnp.asarray([ref], jnp.float32),
        **extra,
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
    assert "dual_clip_frac" not in metrics  # off by default


def test_dual_clip_bounds_negative_advantages_by_hand():
    cfg = LearnerConfig(clip_ratio_c=3.0)
    # ratios e^1.5=4.48 and e^0.5=1.65 with A<0: PPO's loss is -r*A (the ratio is unbounded
    # above), the dual clip caps it at -c*A = 3*|A|. A>0 is never dual-clipped.
    logp = [1.5, 0.5, 1.5]
    adv = [-2.0, -2.0, 1.0]
    per_token, metrics = losses.grpo(_inputs(logp, [0.0] * 3, adv), cfg)
    np.testing.assert_allclose(per_token[0], [3.0 * 2.0, math.exp(0.5) * 2.0, -1.28], rtol=1e-5)
    np.testing.assert_array_equal(metrics["dual_clip_frac"][0], [1.0, 0.0, 0.0])
    unbounded, _ = losses.grpo(_inputs(logp, [0.0] * 3, adv), LearnerConfig())
    assert float(unbounded[0, 0]) == pytest.approx(math.exp(1.5) * 2.0, rel=1e-5)


@pytest.mark.parametrize("c", [0.5, 1.0, -3.0, float("inf")])
def test_clip_ratio_c_must_exceed_one(c):
    with pytest.raises(ConfigError, match="learner.clip_ratio_c") as exc:
        LearnerConfig(clip_ratio_c=c)
    assert "\n" not in str(exc.value)


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


def test_decoupled_ppo_clips_against_the_given_proximal_log_probs():
    cfg = LearnerConfig(loss="decoupled_ppo")
    # pi_prox fixed at -1.0 (computed before the epochs); the current policy drifted to -0.5:
    # ratio e^0.5 = 1.65 is clipped at 1.28; w = pi_prox / pi_behav = e^(-1 - -1.2).
    x = _inputs([-0.5], [-1.2], [1.0], prox=[-1.0])
    per_token, metrics = losses.decoupled_ppo(x, cfg)
    w = math.exp(0.2)
    assert float(metrics["ratio"][0, 0]) == pytest.approx(math.exp(0.5), rel=1e-5)
    assert float(metrics["clip_frac"][0, 0]) == 1.0
    assert float(per_token[0, 0]) == pytest.approx(-w * 1.28, rel=1e-5)


@pytest.mark.parametrize(
    ("staleness", "alpha"),
    [(0, 0.0), (1, 1 / 2), (2, 2 / 3), (4, 4 / 5)],
)
def test_loglinear_proximal_sits_at_the_learner_version(staleness, alpha):
    """pi_prox is version V (the params before the step), between v_b and the trained V + 1.

    log pi linear in the version: alpha = (V - v_b) / (V + 1 - v_b). At staleness 1 it is
    halfway, not the behaviour policy (the old off-by-one put pi_prox at V - 1).
    """
    cfg = LearnerConfig(loss="decoupled_ppo", proximal="loglinear")
    behaviour, current = -2.0, -1.0
    x = _inputs([current], [behaviour], [1.0], versions=[7 - staleness], learner_version=7)
    _, metrics = losses.decoupled_ppo(x, cfg)
    prox = behaviour + alpha * (current - behaviour)
    assert float(metrics["is_weight"][0, 0]) == pytest.approx(math.exp(prox - behaviour), rel=1e-5)
    assert float(metrics["ratio"][0, 0]) == pytest.approx(math.exp(current - prox), rel=1e-5)
    assert float(losses.loglinear_alpha(jnp.int32(7 - staleness), jnp.int32(7))) == (
        pytest.approx(alpha)
    )


def test_losses_declare_when_they_read_the_proximal_policy():
    plain, tis = LearnerConfig(), LearnerConfig(truncated_is=2.0)
    assert losses.get_loss("decoupled_ppo").needs_proximal(plain)
    for name in ("grpo", "dapo", "dr_grpo"):
        assert not losses.get_loss(name).needs_proximal(plain)
        assert losses.get_loss(name).needs_proximal(tis)
    for name in ("gspo", "sft"):
        assert not losses.get_loss(name).needs_proximal(tis)
    with pytest.raises(ValueError, match="Loss.proximal='sometimes'"):
        losses.Loss(losses.grpo, proximal="sometimes")


def test_unknown_loss_lists_registered_ones():
    with pytest.raises(ValueError, match="registered: .*grpo"):
        losses.get_loss("ppo2")
