"""The learner's side of a mixture-of-experts model: rollout routing replay, the router losses
and the routing metrics (docs/moe.md).

**Replay.** The sampler records the experts each model token was routed to when it was fed
(:mod:`rljax.engine.samples`); the packed batch carries them as ``routes`` [rows, row_len, Lm*k]
at the input token's position, -1 where nothing is forced (:mod:`rljax.learner.batch`). With
``moe.router_replay='rollout'`` every forward that computes log-probs (current, proximal,
reference) forces them: :func:`forced_routes` gives the Decoder's ``routes=(ids, forced)``.

**Losses.** The model's load-balancing loss and z-loss (``MoEStats`` of the loss's forward)
join the policy loss, weighed by ``model.router_aux_loss_coef`` and ``model.router_z_loss_coef``;
each micro-batch adds 1 / ``learner.micro_batches`` of its own, so a batch adds the mean.

**Metrics** (per step): ``moe/aux_loss``, ``moe/z_loss`` (mean over micro-batches);
``moe/load_max_over_mean`` (tokens of the busiest expert over the mean per expert, mean over
MoE layers) and ``moe/load_max_over_mean/layer_{i}`` for the model's layer i; and
``moe/router_disagreement`` (over ``moe/routed_pairs`` pairs): the fraction of (fed response
token, MoE layer) pairs whose
learner top-k set, unforced, differs from the sampler's recorded set. With replay off the loss's
own forward measures it every step; with replay on (that forward is forced) an extra unforced
forward does, every ``moe.disagreement_every`` steps, and then also reports what replay changes
on that batch (:func:`replay_effect_sums`): ``moe/abs_logp_forced`` and ``moe/abs_logp_unforced``
(the log-prob mismatch with and without the forced routes), the same over the
``moe/flipped_tokens`` whose routes the unforced forward changed (``.../flipped``).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp

from rljax.config import ModelConfig, MoEConfig
from rljax.models.moe import moe_layers

# The sums a micro-batch adds for the step's routing metrics (RouterTraining.metrics reads them).
AUX, Z, LOAD, COUNT = "moe/aux_loss", "moe/z_loss", "moe/load", "moe/micro_batches"
DIFFER, PAIRS = "moe/differ_pairs", "moe/routed_pairs"
DISAGREEMENT = "moe/router_disagreement"
# What replay changes, measured with the disagreement (replay on): the sampled-token log-prob
# mismatch of the forced forward and of an unforced one, over all tokens and the flipped ones.
TOKENS, FLIPPED = "moe/replay_tokens", "moe/flipped_tokens"
GAP_FORCED, GAP_FREE = "moe/abs_logp_forced", "moe/abs_logp_unforced"
FLIPPED_SUFFIX = "/flipped"
LOAD_RATIO = "moe/load_max_over_mean"


@dataclasses.dataclass(frozen=True)
class RouterTraining:
    """What the learner does for a mixture-of-experts model (None for a dense one).

    Attributes:
      layers: the model's MoE layer indices (Lm of them).
      experts_per_token: k.
      replay: force the sampler's recorded routes (moe.router_replay == 'rollout').
      aux_loss_coef: the load-balancing loss's weight in the loss.
      z_loss_coef: the router z-loss's weight.
      disagreement_every: with replay, every this many steps an extra unforced forward measures
        the router disagreement; 0: never.
    """

    layers: tuple[int, ...]
    experts_per_token: int
    replay: bool = False
    aux_loss_coef: float = 0.0
    z_loss_coef: float = 0.0
    disagreement_every: int = 0

    @property
    def route_width(self) -> int:
        """Lm * k: one token's flat routes."""
        return len(self.layers) * self.experts_per_token

    def measures_now(self, version: int) -> bool:
        """Whether the step at ``version`` runs the extra unforced forward (replay on)."""
        every = self.disagreement_every
        return self.replay and every > 0 and version % every == 0

    def loss(self, stats: Any, micro_batches: int) -> jax.Array:
        """A micro-batch's share of the router losses, from its forward's ``MoEStats``."""
        terms = self.aux_loss_coef * stats.aux_loss + self.z_loss_coef * stats.z_loss
        return terms / micro_batches

    def sums(self, stats: Any, mb: dict[str, jax.Array]) -> dict[str, jax.Array]:
        """A micro-batch's metric sums from its loss's forward; the disagreement with the
        recorded routes only when that forward chose its experts itself (replay off)."""
        out = {AUX: stats.aux_loss, Z: stats.z_loss, LOAD: stats.load, COUNT: jnp.float32(1.0)}
        if not self.replay and "routes" in mb:
            out[DIFFER], out[PAIRS] = disagreement(stats.routes, mb["routes"])
        return out

    def metrics(self, sums: dict[str, jax.Array]) -> dict[str, jax.Array]:
        """The step's routing metrics from its summed :meth:`sums` (taken out of ``sums``)."""
        count = jnp.maximum(sums.pop(COUNT), 1.0)
        load = sums.pop(LOAD)  # [Lm, E], summed over micro-batches
        ratio = load.max(-1) / jnp.maximum(load.mean(-1), 1e-9)
        out = {AUX: sums.pop(AUX) / count, Z: sums.pop(Z) / count, LOAD_RATIO: ratio.mean()}
        out |= {f"{LOAD_RATIO}/layer_{i}": ratio[n] for n, i in enumerate(self.layers)}
        if DIFFER in sums:
            pairs = sums.pop(PAIRS)
            out[DISAGREEMENT] = sums.pop(DIFFER) / jnp.maximum(pairs, 1.0)
            out[PAIRS] = pairs  # what it is over: 0 pairs means nothing was recorded
        return out


def router_training(model: ModelConfig, moe: MoEConfig) -> RouterTraining | None:
    """The learner's settings for ``model`` under ``moe``; None for a dense model."""
    if not model.num_experts:
        return None
    return RouterTraining(
        layers=moe_layers(model),
        experts_per_token=model.num_experts_per_tok,
        replay=moe.router_replay == "rollout",
        aux_loss_coef=model.router_aux_loss_coef,
        z_loss_coef=model.router_z_loss_coef,
        disagreement_every=moe.disagreement_every,
    )


def forced_routes(routes_btw: jax.Array, k: int) -> tuple[jax.Array, jax.Array]:
    """The Decoder's ``routes``: (ids [B, T, Lm, k], forced [B, T]) from the batch's flat
    routes, forced where recorded (not -1)."""
    b, t, w = routes_btw.shape
    return routes_btw.reshape(b, t, w // k, k), routes_btw[..., 0] >= 0


def replay_effect_sums(
    forced_logp: jax.Array,
    free_logp: jax.Array,
    used_btlk: jax.Array,
    mb: dict[str, jax.Array],
) -> dict[str, jax.Array]:
    """A micro-batch's sums for what replay changes (replay on, before the update): the router
    disagreement of the unforced forward (experts ``used_btlk``), and the log-prob mismatch
    against the sampler's log-probs of the forced forward (``forced_logp``, the loss's) and of
    the unforced one (``free_logp``, what replay off would have trained on), over every
    response token and over the flipped ones: those whose own position's expert set differs
    from the recorded one in some MoE layer. Same batch, same params: a paired comparison."""
    differ, on = _differ(used_btlk, mb["routes"])
    mask = mb["mask"]
    flipped = mask * jnp.any(differ > 0, -1)
    gap_forced = jnp.abs(forced_logp - mb["old_logprobs"]) * mask
    gap_free = jnp.abs(free_logp - mb["old_logprobs"]) * mask
    return {
        DIFFER: jnp.sum(differ),
        PAIRS: jnp.sum(on) * differ.shape[-1],
        TOKENS: jnp.sum(mask),
        FLIPPED: jnp.sum(flipped),
        GAP_FORCED: jnp.sum(gap_forced),
        GAP_FREE: jnp.sum(gap_free),
        GAP_FORCED + FLIPPED_SUFFIX: jnp.sum(gap_forced * flipped),
        GAP_FREE + FLIPPED_SUFFIX: jnp.sum(gap_free * flipped),
    }


def replay_effect_metrics(sums: dict[str, jax.Array]) -> dict[str, jax.Array]:
    """The step's metrics from :func:`replay_effect_sums` summed over its micro-batches."""
    tokens, flipped = jnp.maximum(sums[TOKENS], 1.0), sums[FLIPPED]
    out = {
        DISAGREEMENT: sums[DIFFER] / jnp.maximum(sums[PAIRS], 1.0),
        PAIRS: sums[PAIRS],
        FLIPPED: flipped,
        GAP_FORCED: sums[GAP_FORCED] / tokens,
        GAP_FREE: sums[GAP_FREE] / tokens,
    }
    for key in (GAP_FORCED, GAP_FREE):  # nan where no token flipped: nothing to compare
        total = sums[key + FLIPPED_SUFFIX]
        out[key + FLIPPED_SUFFIX] = jnp.where(
            flipped > 0, total / jnp.maximum(flipped, 1.0), jnp.nan
        )
    return out


def _differ(used_btlk: jax.Array, recorded_btw: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(differ [B, T, Lm]: the learner's expert set differs from the recorded one, as sets;
    on [B, T]: 1 where routes were recorded)."""
    b, t, lm, k = used_btlk.shape
    recorded = recorded_btw.reshape(b, t, lm, k)
    on = (recorded_btw[..., 0] >= 0).astype(jnp.float32)
    differ = jnp.any(jnp.sort(used_btlk, -1) != jnp.sort(recorded, -1), axis=-1)
    return differ * on[..., None], on


def disagreement(used_btlk: jax.Array, recorded_btw: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(pairs whose expert sets differ, pairs compared) over the (position, MoE layer) pairs
    with recorded routes: the learner's experts ``used`` against the sampler's, as sets."""
    differ, on = _differ(used_btlk, recorded_btw)
    return jnp.sum(differ), jnp.sum(on) * differ.shape[-1]
