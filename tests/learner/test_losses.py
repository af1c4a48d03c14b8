"""Losses against hand-computed values: the PPO clip, dual clip, KL, and the proximal policy."""

import math

import jax
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


# GSPO's cases, eps_low 0.2 / eps_high 0.28 (log 0.8 = -0.223, log 1.28 = 0.247). Each
# sequence: its row, its segment, the positions of its trained tokens, their log-ratios
# log pi/pi_old, and its advantage.
_GSPO_SEQS = [
    # mean 0.267: s = 1.306 > 1.28 with A > 0, the whole sequence is clipped; per token only
    # the first (e^0.4 = 1.49) would be
    (0, 1, [2, 3, 4], [0.4, 0.2, 0.2], 1.0),
    # mean -0.2: s = 0.819 inside the band; per token the first (e^-0.6 = 0.55, A < 0) would
    # be clipped
    (0, 2, [6, 7], [-0.6, 0.2], -0.5),
    # an env token at position 3 (mask 0) inside the response; mean -0.25: s = 0.779 < 0.8
    # with A < 0, clipped
    (1, 1, [1, 2, 4, 5], [-0.5, -0.3, -0.2, 0.0], -1.5),
    # mean -0.3: s = 0.741 < 0.8 with A > 0, outside the band on the side the min keeps
    (1, 2, [7, 8], [-0.3, -0.3], 2.0),
    # mean 0.3: s = 1.350 > 1.28 with A < 0, outside the band on the side the min keeps
    (2, 1, [1, 2, 3], [0.3, 0.5, 0.1], -1.0),
]
# The segment of every position (0: padding); positions not listed above are prompt, env or
# padding tokens, whose log-ratio is set to 3.0 (garbage the sequence ratio must not see).
_GSPO_SEGMENTS = [
    [1, 1, 1, 1, 1, 2, 2, 2, 0, 0],
    [1, 1, 1, 1, 1, 1, 2, 2, 2, 0],
    [1, 1, 1, 1, 0, 0, 0, 0, 0, 0],
]


def _gspo_inputs():
    segments = np.asarray(_GSPO_SEGMENTS, np.int32)
    old = -1.0 - 0.1 * np.arange(segments.size, dtype=np.float32).reshape(segments.shape)
    log_ratio = np.full(segments.shape, 3.0, np.float32)
    mask, adv, weights = (np.zeros(segments.shape, np.float32) for _ in range(3))
    for row, seg, at, lr, a in _GSPO_SEQS:
        assert (segments[row, at] == seg).all()
        log_ratio[row, at], mask[row, at], adv[row, segments[row] == seg] = lr, 1.0, a
        # rljax's seq_mean_token_mean weights (rljax.learner.batch): 1 / (G |y_i|)
        weights[row, at] = 1.0 / (len(_GSPO_SEQS) * len(at))
    x = losses.LossInputs(
        logprobs=jnp.asarray(old + log_ratio),
        old_logprobs=jnp.asarray(old),
        advantages=jnp.asarray(adv),
        mask=jnp.asarray(mask),
        entropy=jnp.zeros(segments.shape),
        segment_ids=jnp.asarray(segments),
        versions=jnp.zeros(segments.shape, jnp.int32),
        learner_version=jnp.int32(0),
    )
    return x, weights


def _gspo_by_hand(eps_low, eps_high):
    """GSPO (Zheng et al. 2025, eq. 5-7) per sequence: s_i = exp(mean_t log pi/pi_old) over its
    response tokens, the objective min(s_i A_i, clip(s_i, 1 - eps_low, 1 + eps_high) A_i),
    whether the clip binds, and d objective / d log pi_t = s_i A_i / |y_i| for each of its
    tokens, 0 when the clip binds."""
    out = []
    for _, _, _, lr, a in _GSPO_SEQS:
        s = math.exp(sum(lr) / len(lr))
        clipped = (a > 0 and s > 1 + eps_high) or (a < 0 and s < 1 - eps_low)
        objective = (min(max(s, 1 - eps_low), 1 + eps_high) if clipped else s) * a
        out.append((s, objective, clipped, 0.0 if clipped else s * a / len(lr)))
    return out


def test_gspo_clips_one_length_normalised_ratio_per_sequence_by_hand():
    """Five sequences of 2 to 4 tokens, packed two to a row beside prompts, an env token and
    padding: the per-token loss is -min(s_i A_i, clip(s_i) A_i) on every token of sequence i,
    and with rljax's seq_mean_token_mean weights the loss is GSPO's -1/G sum_i of it."""
    cfg = LearnerConfig(loss="gspo", epsilon_low=0.2, epsilon_high=0.28)
    x, weights = _gspo_inputs()
    per_token, metrics = losses.gspo(x, cfg)
    by_hand = _gspo_by_hand(0.2, 0.28)
    assert [c for _, _, c, _ in by_hand] == [True, False, True, False, False]
    for (row, _, at, _, _), (s, objective, clipped, _) in zip(_GSPO_SEQS, by_hand, strict=True):
        np.testing.assert_allclose(metrics["ratio"][row, at], s, rtol=1e-5)
        np.testing.assert_allclose(per_token[row, at], -objective, rtol=1e-5)
        np.testing.assert_array_equal(metrics["clip_frac"][row, at], float(clipped))
    # the per-token PPO ratio clips other tokens: GRPO on the same inputs
    _, token_level = losses.grpo(x, cfg)
    assert token_level["clip_frac"][0, 2] == 1.0 and token_level["clip_frac"][0, 3] == 0.0
    assert token_level["clip_frac"][0, 6] == 1.0
    want = -sum(objective for _, objective, _, _ in by_hand) / len(_GSPO_SEQS)
    got = jnp.sum(per_token * weights * x.mask)
    assert float(got) == pytest.approx(want, rel=1e-5)


def test_gspo_gradient_is_the_sequence_ratio_spread_over_its_tokens():
    """d loss / d log pi_t = -s_i A_i / (G |y_i|) on each token of an unclipped sequence and 0
    on a clipped one, against the hand formula and a central finite difference; prompt, env
    and padding tokens get no gradient."""
    cfg = LearnerConfig(loss="gspo", epsilon_low=0.2, epsilon_high=0.28)
    x, weights = _gspo_inputs()

    def loss(logprobs):
        per_token, _ = losses.gspo(x.replace(logprobs=logprobs), cfg)
        return jnp.sum(per_token * weights * x.mask)

    grad = np.asarray(jax.grad(loss)(x.logprobs))
    want = np.zeros_like(grad)
    for (row, _, at, _, _), (_, _, _, d) in zip(_GSPO_SEQS, _gspo_by_hand(0.2, 0.28), strict=True):
        want[row, at] = -d / len(_GSPO_SEQS)
    np.testing.assert_allclose(grad, want, rtol=1e-4, atol=1e-6)
    h = 1e-2  # float32: a larger step; the loss is smooth within 0.01 of every case here
    for row, _, at, _, _ in _GSPO_SEQS:
        bump = jnp.zeros_like(x.logprobs).at[row, at[0]].set(h)
        fd = (loss(x.logprobs + bump) - loss(x.logprobs - bump)) / (2 * h)
        assert float(fd) == pytest.approx(want[row, at[0]], rel=2e-2, abs=1e-5)


def test_gspo_keeps_each_tokens_own_advantage():
    """With per-token advantages (gae, opd, reinforce_plus_plus), GSPO-token (Zheng et al.
    2025, eq. 13): d loss / d log pi_t = -s_i A_t w_t on an unclipped sequence, each token its
    own A_t. Differentiating s_i itself gives every token the sequence's mean advantage."""
    cfg = LearnerConfig(loss="gspo", epsilon_low=0.2, epsilon_high=0.28)
    x, weights = _gspo_inputs()
    adv = np.asarray(x.advantages).copy()
    for row, _, at, _, _ in _GSPO_SEQS:
        adv[row, at] = np.linspace(-1.0, 2.0, len(at))
    x = x.replace(advantages=jnp.asarray(adv))

    def loss(logprobs):
        per_token, _ = losses.gspo(x.replace(logprobs=logprobs), cfg)
        return jnp.sum(per_token * weights * x.mask)

    grad = np.asarray(jax.grad(loss)(x.logprobs))
    for row, _, at, lr, _ in _GSPO_SEQS:
        s = math.exp(sum(lr) / len(lr))
        # a token's objective is min(s A_t, clip(s) A_t): the clip binds per token's sign
        kept = [(a > 0 and s <= 1.28) or (a < 0 and s >= 0.8) or a == 0 for a in adv[row, at]]
        want = np.where(kept, -s * adv[row, at] * weights[row, at], 0.0)
        np.testing.assert_allclose(grad[row, at], want, rtol=1e-5, atol=1e-7)
    assert np.ptp(grad[0, [6, 7]]) > 0.1  # an unclipped sequence's tokens differ
