"""The critic of ``learner.advantage='gae'``: a value model trained beside the policy.

The critic is a decoder of the policy's architecture (the policy's graph, its own weights)
with a scalar value head on the final hidden state: ``V_t = h_t . w + b``, the value of the
state that predicts target t+1, aligned with the policy's log-probs (:mod:`rljax.learner.batch`).
It trains on the learner mesh with its own AdamW and PPO's clipped value loss

    L_V = 1/2 max((V - R)^2, (clip(V, V_old - c, V_old + c) - R)^2)

(R the returns GAE gave, V_old the values the batch was scored with, c ``value_clip``),
aggregated over the batch's trained tokens with the policy loss's weights. With LoRA the
critic is the policy's frozen base plus adapters of its own and the head: the base is shared,
so the critic costs its adapters, its head and their optimiser state.

:class:`Critic` holds no arrays. Its state, ``{"trainable": {"decoder", "head"}, "opt"}``,
rides in the learner's optimiser state (``Learner.opt_state["critic"]``), so every path that
carries the learner's state (checkpoint and resume, a resize, a pod's save) carries the critic
too, bitwise.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from rljax.config import CriticConfig, LearnerConfig
from rljax.learner.gradients import Gradients
from rljax.learner.optimizer import make_optimizer, optimizer_shardings
from rljax.models import lora


def critic_optimizer(cfg: CriticConfig, learner: LearnerConfig) -> optax.GradientTransformation:
    """The critic's AdamW: the learner's moments, the critic's constant rate, clip and decay."""
    own = dataclasses.replace(
        learner,
        learning_rate=cfg.learning_rate,
        warmup_steps=0,
        decay_steps=0,
        grad_clip=cfg.grad_clip,
        weight_decay=cfg.weight_decay,
    )
    return make_optimizer(own)[0]


# eq=False: hashed by identity, as jax.jit hashes the bound methods it compiles.
@dataclasses.dataclass(frozen=True, eq=False)
class Critic:
    """The value model's forward, loss and update on the learner's mesh.

    Attributes:
      cfg: the critic's section.
      gradients: the policy's forward (its graph, mesh, kernels, remat); the critic runs the
        same decoder on its own weights.
      tx: the critic's optimiser (:func:`critic_optimizer`).
      hidden_size: D, the value head's width.
    """

    cfg: CriticConfig
    gradients: Gradients
    tx: optax.GradientTransformation
    hidden_size: int

    @property
    def lora(self) -> bool:
        return self.gradients.lora

    def trainable_like(self, decoder: Any, head: Any) -> dict[str, Any]:
        """The critic's trainable tree from a policy-shaped ``decoder`` tree (params, their
        shardings or shapes: with LoRA its adapters alone) and ``head`` ({w_d, b} leaves)."""
        return {"decoder": self.gradients.trainable(decoder), "head": head}

    def initial(self, decoder: nnx.State) -> dict[str, Any]:
        """A fresh critic state from ``decoder`` (a policy-shaped params state: the policy's,
        or a checkpoint's): its trainable part and a zero head, and their optimiser state."""
        head = {"w_d": jnp.zeros((self.hidden_size,), jnp.float32), "b": jnp.zeros((), jnp.float32)}
        trainable = self.trainable_like(decoder, head)
        return {"trainable": trainable, "opt": self.tx.init(trainable)}

    def state_shardings(self, policy: nnx.State, shardings: nnx.State, replicated: Any) -> Any:
        """Where a critic state lives, given the policy's params (or their shapes) and their
        shardings: the decoder like the policy's params, the head and the step counts
        replicated, the moments like their parameters."""
        head = jax.ShapeDtypeStruct((self.hidden_size,), jnp.float32)
        shapes = self.trainable_like(
            policy, {"w_d": head, "b": jax.ShapeDtypeStruct((), jnp.float32)}
        )
        placed = self.trainable_like(shardings, {"w_d": replicated, "b": replicated})
        return {
            "trainable": placed,
            "opt": optimizer_shardings(self.tx, shapes, placed, replicated),
        }

    def _decoder(self, trainable: Any, policy_params: nnx.State) -> nnx.State:
        if self.lora:  # the policy's frozen base under the critic's adapters
            return lora.join(lora.split_adapters(policy_params)[1], trainable["decoder"])
        return trainable["decoder"]

    def values(
        self, trainable: Any, policy_params: nnx.State, mb: dict[str, jax.Array]
    ) -> jax.Array:
        """The values [R, T] of a micro-batch's positions (float32)."""
        g = self.gradients
        model = nnx.merge(g.graphdef, self._decoder(trainable, policy_params))
        hidden, _ = g._hidden(model, mb, force=False)
        head = trainable["head"]
        return jnp.einsum("rtd,d->rt", hidden.astype(jnp.float32), head["w_d"]) + head["b"]

    def micro_loss(
        self, trainable: Any, policy_params: nnx.State, mb: dict[str, jax.Array]
    ) -> tuple[jax.Array, dict[str, jax.Array]]:
        """The clipped value loss of a micro-batch (weighted like the policy loss) and its
        metric sums over trained tokens."""
        v = self.values(trainable, policy_params, mb)
        old, returns, mask = mb["values"], mb["returns"], mb["mask"]
        c = self.cfg.value_clip
        clipped = jnp.clip(v, old - c, old + c)  # exactly v inside the band
        unclipped_sq, clipped_sq = (v - returns) ** 2, (clipped - returns) ** 2
        per_token = 0.5 * jnp.maximum(unclipped_sq, clipped_sq)
        loss = jnp.sum(per_token * mb["weights"] * mask)
        sums = {
            "critic/value_loss": jnp.sum(per_token * mask),
            "critic/clip_frac": jnp.sum((clipped_sq > unclipped_sq) * mask),
            "critic/values": jnp.sum(jax.lax.stop_gradient(v) * mask),
        }
        return loss, sums

    def update(
        self, state: dict[str, Any], policy_params: nnx.State, batch: dict[str, jax.Array]
    ) -> tuple[dict[str, Any], dict[str, jax.Array]]:
        """One AdamW update of the critic on a [micro_batches, ...] batch holding ``values``
        and ``returns``: gradients summed over the micro-batches (a scan), then clipped."""
        grad_fn = jax.value_and_grad(self.micro_loss, has_aux=True)

        def micro(carry: Any, mb: dict[str, jax.Array]) -> tuple[Any, None]:
            grads, sums = carry
            (_, mb_sums), mb_grads = grad_fn(state["trainable"], policy_params, mb)
            return (
                jax.tree.map(jnp.add, grads, mb_grads),
                jax.tree.map(jnp.add, sums, mb_sums),
            ), None

        first = jax.tree.map(lambda x: x[0], batch)
        sums0 = jax.eval_shape(lambda: self.micro_loss(state["trainable"], policy_params, first)[1])
        init = (
            jax.tree.map(jnp.zeros_like, state["trainable"]),
            jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), sums0),
        )
        (grads, sums), _ = jax.lax.scan(micro, init, batch)
        updates, opt = self.tx.update(grads, state["opt"], state["trainable"])
        trainable = optax.apply_updates(state["trainable"], updates)
        tokens = jnp.maximum(jnp.sum(batch["mask"]), 1.0)
        metrics = {k: v / tokens for k, v in sums.items()}
        metrics["critic/grad_norm"] = optax.tree.norm(grads)
        return {"trainable": trainable, "opt": opt}, metrics


def explained_variance(returns: jax.Array, values: jax.Array, mask: jax.Array) -> jax.Array:
    """``1 - Var(R - V) / Var(R)`` over the trained tokens: 1 when the critic predicts the
    returns, 0 when it does no better than their mean (the classic critic health check)."""
    m = mask.astype(jnp.float32)
    n = jnp.maximum(m.sum(), 1.0)

    def var(x: jax.Array) -> jax.Array:
        mean = (x * m).sum() / n
        return ((x - mean) ** 2 * m).sum() / n

    return 1.0 - var(returns - values) / jnp.maximum(var(returns), 1e-8)
