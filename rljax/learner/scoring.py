"""What the learner scores a batch with before its updates, for the per-token estimators.

``learner.advantage`` in (reinforce_plus_plus, gae, opd) needs forwards only the learner can
run at step time: the reference policy's log-probs (reinforce_plus_plus's KL in the reward),
the critic's values (gae) or the teacher's log-probs (opd). :class:`BatchScoring` runs them
over the whole batch, once per step and before the ``ppo_epochs`` updates, and writes the
per-token ``advantages`` (and, with a critic, the ``values`` and ``returns`` its loss reads)
into the batch, with the step's metrics. The forwards are micro-batch by micro-batch
(``lax.map``), so scoring costs no more memory than a train step's forward; the advantages'
whitening is over the whole batch.

opd's teacher runs on the learner's mesh, or on a mesh of its own (``teacher.devices``):
:class:`TeacherMesh` runs the same forward there, before the scoring, and the scoring reads its
log-probs from the batch.

It holds no arrays: the learner passes its params, critic state, reference and teacher.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import Mesh

from rljax.config import LearnerConfig
from rljax.learner import token_advantages as ta
from rljax.learner.critic import Critic, explained_variance
from rljax.learner.gradients import Gradients
from rljax.models.sharding import SAMPLER_RULES, state_shardings

# The batch key of the teacher's log-probs when its own mesh computed them (TeacherMesh).
TEACHER_LOGPROBS = "teacher_logprobs"
_FORWARD_KEYS = ("tokens", "positions", "segment_ids", "targets")  # what the forward reads


@dataclasses.dataclass(frozen=True, eq=False)
class BatchScoring:
    """Per-token advantages of a batch at learn time (``cfg.advantage`` a token estimator).

    Attributes:
      cfg: the learner's section (advantage, gamma, lam, kl_reward).
      gradients: the policy's forward: the reference's log-probs (the base, with LoRA).
      critic: gae's value model; None otherwise.
      teacher: opd's teacher forward (its own graph, no LoRA, no routes); None otherwise.
    """

    cfg: LearnerConfig
    gradients: Gradients
    critic: Critic | None = None
    teacher: Gradients | None = None

    def _map(self, fn: Any, batch: dict[str, jax.Array]) -> jax.Array:
        return jax.lax.map(fn, batch)

    def _reference(
        self, params: nnx.State, ref_params: Any, batch: dict[str, jax.Array]
    ) -> jax.Array:
        g = self.gradients
        if ref_params is not None:
            return self._map(lambda mb: g.token_stats(ref_params, mb)[0], batch)
        # LoRA: the reference is the base, the adapters off
        return self._map(lambda mb: g.token_stats(params, mb, adapters=False)[0], batch)

    def __call__(
        self,
        params: nnx.State,
        critic_state: Any,
        ref_params: Any,
        teacher_params: Any,
        batch: dict[str, jax.Array],
    ) -> tuple[dict[str, jax.Array], dict[str, jax.Array]]:
        """``batch`` with its per-token ``advantages`` (and a critic's ``values`` and
        ``returns``), and the scoring's metrics. opd's ``teacher_params`` are the teacher's on
        this mesh, or None when the batch carries its log-probs (``TEACHER_LOGPROBS``, from
        :class:`TeacherMesh`), which the returned batch drops."""
        cfg, mask, seg = self.cfg, batch["mask"], batch["segment_ids"]
        out, metrics = dict(batch), {}
        if cfg.advantage == "reinforce_plus_plus":
            kl = None
            if cfg.kl_reward:
                kl = batch["old_logprobs"] - self._reference(params, ref_params, batch)
                metrics["kl_reward/k1"] = _mean(kl, mask)
            adv, _ = ta.reinforce_pp_advantages(
                batch["rewards"], mask, seg, cfg.gamma, kl, cfg.kl_reward
            )
        elif cfg.advantage == "gae":
            assert self.critic is not None, "gae scores with a critic"
            critic = self.critic
            values = self._map(
                lambda mb: critic.values(critic_state["trainable"], params, mb), batch
            )
            values = jax.lax.stop_gradient(values) * mask
            adv, returns = ta.gae_advantages(
                batch["rewards"], values, mask, seg, cfg.gamma, cfg.lam
            )
            out |= {"values": values, "returns": returns}
            metrics["critic/explained_var"] = explained_variance(returns, values, mask)
            metrics["critic/returns"] = _mean(returns, mask)
        elif cfg.advantage == "opd":
            assert self.teacher is not None, "opd scores with a teacher"
            if teacher_params is None:  # scored on the teacher's own mesh (TeacherMesh)
                logp = out.pop(TEACHER_LOGPROBS)
            else:
                logp = self.teacher.batch_logprobs(teacher_params, batch)
            adv = ta.opd_advantages(logp, batch["old_logprobs"], mask)
            metrics["opd/reverse_kl"] = -_mean(adv, mask)
        else:
            raise ValueError(f"{cfg.advantage!r} is not a per-token estimator")
        out["advantages"] = adv
        metrics["advantages/abs"] = _mean(jnp.abs(adv), mask)
        return out, metrics


class TeacherMesh:
    """opd's teacher on a mesh of its own (``teacher.devices``): its weights replicated over
    the mesh's 'data' axis (:data:`~rljax.models.sharding.SAMPLER_RULES`, as the reward model's),
    the batch's rows split over it.

    Calling it copies the forward's token arrays of a learner's batch to this mesh, runs the
    same forward :class:`BatchScoring` runs on the learner's mesh
    (:meth:`~rljax.learner.gradients.Gradients.batch_logprobs`: the fused log-prob kernel, no
    [T, V] logits) and copies the [micro_batches, rows, T] log-probs back onto the batch's
    sharding. Rows that the mesh's devices do not divide are padded here (and dropped after).
    """

    def __init__(self, teacher: Gradients, mesh: Mesh):
        self.gradients = dataclasses.replace(teacher.on(mesh), rules=SAMPLER_RULES)
        self.mesh = mesh
        self._fn = jax.jit(self._logprobs)

    def param_shardings(self, params: Any) -> Any:
        """Where the teacher's params (or their shapes) live on this mesh."""
        return state_shardings(params, self.mesh, self.gradients.rules)

    def _logprobs(self, params: nnx.State, batch: dict[str, jax.Array]) -> jax.Array:
        rows = batch["tokens"].shape[1]
        pad = ((0, 0), (0, -rows % self.mesh.size), (0, 0))
        batch = {k: jnp.pad(v, pad) for k, v in batch.items()}
        batch = jax.lax.with_sharding_constraint(batch, self.gradients.batch_sharding)
        return self.gradients.batch_logprobs(params, batch)[:, :rows]

    def __call__(self, params: nnx.State, arrays: dict[str, jax.Array]) -> jax.Array:
        """The teacher's log-prob of every target of the learner's batch ``arrays``, on their
        sharding."""
        mine = {k: arrays[k] for k in _FORWARD_KEYS}
        rows = mine["tokens"].shape[1]
        g = self.gradients
        to = g.batch_sharding if rows % self.mesh.size == 0 else g.replicated
        logp = self._fn(params, jax.device_put(mine, to))
        return jax.device_put(logp, arrays["mask"].sharding)


def _mean(x: jax.Array, mask: jax.Array) -> jax.Array:
    return jnp.sum(x * mask) / jnp.maximum(jnp.sum(mask), 1.0)
