"""Per-token advantages, computed at learn time on the packed batch (``learner.advantage``).

The outcome estimators (:mod:`rljax.learner.advantages`) give each response one number from
its reward alone, on the host. The estimators here need what only the learner has at step
time, so the learner computes them on its mesh, once per batch, before its updates:

- ``reinforce_plus_plus``: the reward minus ``kl_reward`` times the per-token KL to the
  reference (k1, ``log pi_behav - log pi_ref``), returns discounted by gamma, whitened over the
  batch's trained tokens (:func:`reinforce_pp_advantages`).
- ``gae``: generalised advantage estimation (Schulman et al. 2016) from a critic's values at
  learn time, with gamma and lambda (:func:`gae_advantages`); the returns are the critic's
  targets.
- ``opd``: on-policy distillation, the teacher's log-prob of each sampled token minus the
  student's (behaviour) one: the negative per-token reverse KL (:func:`opd_advantages`).

Arrays are the packed batch's ``[..., T]`` (any leading shape: micro-batches, rows), with
position t about target token t+1 (:mod:`rljax.learner.batch`). Several sequences share a row,
told apart by ``segment_ids``: every scan below restarts at a segment's end, so no reward or
value crosses from one sequence to another. Inside a sequence, positions off ``mask`` (the
prompt, a conversation's env tokens) are skipped: the running return, the next value and the
running GAE pass through them unchanged, as verl's ``core_algos`` does for observation tokens.
The definitions follow verl's ``compute_gae_advantage_return``,
``compute_reinforce_plus_plus_outcome_advantage`` and ``masked_whiten``; tests compare them
on packed batches (tests/learner/test_advantages_verl.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp


def masked_whiten(x: jax.Array, mask: jax.Array, eps: float = 1e-8) -> jax.Array:
    """``(x - mean) / sqrt(var + eps)`` over the positions on ``mask``, the whole array at once
    (every micro-batch and row: the batch's tokens); the variance is the unbiased one (n - 1),
    as verl's ``masked_whiten``. Off ``mask`` the result is 0."""
    m = mask.astype(jnp.float32)
    n = jnp.maximum(m.sum(), 1.0)
    mean = (x * m).sum() / n
    var = ((x - mean) ** 2 * m).sum() / n * (n / jnp.maximum(n - 1.0, 1.0))
    return (x - mean) * jax.lax.rsqrt(var + eps) * m


def _segment_ends(segment_ids: jax.Array) -> jax.Array:
    """True where position t is its segment's last (the next position holds another segment,
    or the row ends): a reverse scan restarts there."""
    nxt = jnp.concatenate([segment_ids[..., 1:], jnp.full_like(segment_ids[..., :1], -1)], -1)
    return segment_ids != nxt


def _reverse_scan(step: Callable[..., Any], carry: Any, *xs: jax.Array) -> jax.Array:
    """``step(carry, *x_t) -> (carry, y_t)`` from the last position to the first; ``xs`` are
    [..., T] and so is the result (the scan runs over T, vectorised over the rest)."""
    moved = [jnp.moveaxis(x, -1, 0) for x in xs]
    _, ys = jax.lax.scan(lambda c, x: step(c, *x), carry, moved, reverse=True)
    return jnp.moveaxis(ys, 0, -1)


def discounted_returns(
    rewards: jax.Array, mask: jax.Array, segment_ids: jax.Array, gamma: float
) -> jax.Array:
    """``G_t = r_t + gamma * G_next`` over each sequence's trained positions, G_next the return
    of the next trained position of the same sequence (0 after its last); 0 off ``mask``."""
    m = mask.astype(jnp.float32)
    ends = _segment_ends(segment_ids)

    def step(running: jax.Array, r: jax.Array, m_t: jax.Array, end: jax.Array) -> Any:
        running = jnp.where(end, 0.0, running)
        new = r + gamma * running
        return jnp.where(m_t > 0, new, running), new * m_t

    return _reverse_scan(step, jnp.zeros(rewards.shape[:-1]), rewards, m, ends)


def gae(
    rewards: jax.Array,
    values: jax.Array,
    mask: jax.Array,
    segment_ids: jax.Array,
    gamma: float,
    lam: float,
) -> tuple[jax.Array, jax.Array]:
    """GAE's raw advantages and returns ``A + V``, each [..., T]:
    ``delta_t = r_t + gamma V_next - V_t``, ``A_t = delta_t + gamma lam A_next``, where "next"
    is the next trained position of the same sequence (V_next = A_next = 0 after its last)."""
    m = mask.astype(jnp.float32)
    ends = _segment_ends(segment_ids)

    def step(carry: Any, r: jax.Array, v: jax.Array, m_t: jax.Array, end: jax.Array) -> Any:
        next_value, last = (jnp.where(end, 0.0, c) for c in carry)
        delta = r + gamma * next_value - v
        new = delta + gamma * lam * last
        on = m_t > 0
        return (jnp.where(on, v, next_value), jnp.where(on, new, last)), new * m_t

    zeros = jnp.zeros(rewards.shape[:-1])
    advantages = _reverse_scan(step, (zeros, zeros), rewards, values, m, ends)
    return advantages, (advantages + values) * m


def gae_advantages(
    rewards: jax.Array,
    values: jax.Array,
    mask: jax.Array,
    segment_ids: jax.Array,
    gamma: float,
    lam: float,
) -> tuple[jax.Array, jax.Array]:
    """``gae``: GAE's advantages whitened over the batch's trained tokens, and its returns (the
    critic's targets, not whitened), as verl's ``compute_gae_advantage_return``."""
    advantages, returns = gae(rewards, values, mask, segment_ids, gamma, lam)
    return masked_whiten(advantages, mask), returns


def reinforce_pp_advantages(
    rewards: jax.Array,
    mask: jax.Array,
    segment_ids: jax.Array,
    gamma: float,
    kl: jax.Array | None = None,
    kl_reward: float = 0.0,
) -> tuple[jax.Array, jax.Array]:
    """``reinforce_plus_plus``: per-token rewards ``r_t - kl_reward * kl_t`` (``kl`` the k1
    estimate ``log pi_behav - log pi_ref`` per token; None: no penalty), their discounted
    returns, whitened over the batch's trained tokens; (advantages, returns)."""
    m = mask.astype(jnp.float32)
    if kl is not None and kl_reward:
        rewards = rewards - kl_reward * kl * m
    returns = discounted_returns(rewards, m, segment_ids, gamma)
    return masked_whiten(returns, m), returns


def opd_advantages(
    teacher_logprobs: jax.Array, student_logprobs: jax.Array, mask: jax.Array
) -> jax.Array:
    """``opd``: ``log pi_teacher(y_t) - log pi_student(y_t)`` on the trained tokens, the student's
    being the behaviour policy's (the sampler's, the tokens' own distribution); 0 elsewhere. Its
    expectation over the student's samples is minus the reverse KL, so the policy gradient with
    it moves the student toward the teacher where the student puts its mass."""
    return (teacher_logprobs - student_logprobs) * mask.astype(jnp.float32)
