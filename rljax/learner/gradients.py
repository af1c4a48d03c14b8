"""The loss and its gradients on one mesh: what a train step computes before its update.

:class:`Gradients` is the forward pass (log-probs and entropy of the target tokens through
:func:`rljax.kernels.fused_logprobs`), the loss of one micro-batch and the gradients summed over
a batch's micro-batches (a scan), for one mesh. It holds no arrays: the
:class:`~rljax.learner.learner.Learner` owns the params and the optimiser and compiles these
functions on its mesh; :meth:`Gradients.on` gives the same computation on another mesh, which
is how a step's micro-batches are lent to chips outside the learner's
(:class:`~rljax.learner.loan.LentGrads`).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from rljax.config import LearnerConfig
from rljax.kernels.fused_logprobs import (
    sharded_token_logprobs_and_entropy,
    token_logprobs_and_entropy,
)
from rljax.learner.losses import Loss, LossInputs, train_inference_mismatch
from rljax.learner.routing import (
    RouterTraining,
    forced_routes,
    replay_effect_metrics,
    replay_effect_sums,
)
from rljax.models import lora
from rljax.models.sharding import ShardingRules, kernel_mesh_axes


# eq=False: hashed by identity, as jax.jit hashes the bound methods it compiles.
@dataclasses.dataclass(frozen=True, eq=False)
class Gradients:
    """The forward pass, a micro-batch's loss and a batch's gradients on ``mesh``.

    Attributes:
      cfg: the learner's config (loss knobs, ``remat``, ``layer_unroll``, ``beta``).
      graphdef: the model's graph; the params are passed to each call.
      mesh: the mesh the computation is sharded over.
      rules: logical axis -> mesh axes.
      loss: the registered loss.
      temperature: the sampler's, so the importance ratio against its log-probs is exact.
      kernel_impl: the fused log-prob kernel's implementation.
      lora: whether the params carry LoRA adapters (then only they train, and the KL reference
        is the base with the adapters off).
      seed: LoRA dropout's masks come from (seed, version, micro-batch index).
      router: a mixture-of-experts model's routing replay, router losses and metrics
        (:mod:`rljax.learner.routing`); None for a dense model.
    """

    cfg: LearnerConfig
    graphdef: nnx.GraphDef
    mesh: Mesh
    rules: ShardingRules
    loss: Loss
    temperature: float
    kernel_impl: str
    lora: bool
    seed: int
    router: RouterTraining | None = None

    def on(self, mesh: Mesh) -> Gradients:
        """The same computation on another mesh (lent chips)."""
        return dataclasses.replace(self, mesh=mesh)

    @property
    def replicated(self) -> NamedSharding:
        """A value every device of the mesh holds whole (the loss, the metric sums)."""
        return NamedSharding(self.mesh, PartitionSpec())

    @property
    def batch_sharding(self) -> NamedSharding:
        """A [micro_batches, rows, ...] batch: its rows split over the 'batch' axes."""
        return NamedSharding(self.mesh, PartitionSpec(None, self.rules.axes(self.mesh, "batch")))

    def trainable(self, tree: Any) -> Any:
        """The part of a params-shaped ``tree`` that trains: the adapters with LoRA, else all."""
        return lora.split_adapters(tree)[0] if self.lora else tree

    def token_stats(
        self,
        params: nnx.State,
        mb: dict[str, jax.Array],
        *,
        adapters: bool = True,
        dropout_key: jax.Array | None = None,
    ) -> tuple[jax.Array, jax.Array]:
        """Log-prob and entropy of each row position's target token, [R, T] each
        (``adapters=False``: the base model's, of LoRA-adapted params; ``dropout_key``: with
        LoRA dropout, as the training loss takes them). With routing replay, the batch's
        recorded routes are forced (:mod:`rljax.learner.routing`)."""
        logp, ent, _ = self.forward(params, mb, adapters=adapters, dropout_key=dropout_key)
        return logp, ent

    def _hidden(
        self,
        model: Any,
        mb: dict[str, jax.Array],
        *,
        adapters: bool = True,
        dropout_key: jax.Array | None = None,
        force: bool = True,
        stats: bool = False,
    ) -> tuple[jax.Array, Any]:
        """The decoder's final hidden states [R, T, D] of a micro-batch and, with ``stats`` (a
        mixture-of-experts model), its ``MoEStats``; ``force``: the recorded routes under
        routing replay."""
        kw: dict[str, Any] = {}
        router = self.router
        if router is not None:
            kw["moe_stats"] = stats
            if force and router.replay and "routes" in mb:
                kw["routes"] = forced_routes(mb["routes"], router.experts_per_token)
        out = model(
            mb["tokens"],
            mb["positions"],
            mb["segment_ids"],
            impl=self.kernel_impl,
            sharding=(self.mesh, self.rules),
            remat=self.cfg.remat,
            unroll=self.cfg.layer_unroll,
            adapters=adapters,
            dropout_key=dropout_key,
            **kw,
        )
        return (out[0], out[1]) if kw.get("moe_stats") else (out, None)

    def replay_effect(self, params: nnx.State, mb: dict[str, jax.Array]) -> dict[str, jax.Array]:
        """A micro-batch's sums of :func:`rljax.learner.routing.replay_effect_sums`: an unforced
        forward's experts against the recorded routes, and the sampled tokens' log-prob mismatch
        of the forced forward and of that unforced one."""
        forced_logp, _, _ = self.forward(params, mb)
        free_logp, _, stats = self.forward(params, mb, force=False, stats=True)
        return replay_effect_sums(forced_logp, free_logp, stats.routes, mb)

    def batch_replay_effect(
        self, params: nnx.State, batch: dict[str, jax.Array]
    ) -> dict[str, jax.Array]:
        """:meth:`replay_effect` over a [micro_batches, ...] batch, as the metrics of
        :func:`rljax.learner.routing.replay_effect_metrics`: the router disagreement of an
        unforced forward, and the log-prob mismatch with and without the forced routes."""
        sums = jax.lax.map(lambda mb: self.replay_effect(params, mb), batch)
        return replay_effect_metrics({k: v.sum() for k, v in sums.items()})

    def batch_logprobs(self, params: nnx.State, batch: dict[str, jax.Array]) -> jax.Array:
        """Log-probs of every target of a [micro_batches, rows, row_len] batch."""
        return jax.lax.map(lambda mb: self.token_stats(params, mb)[0], batch)

    def forward(
        self,
        params: nnx.State,
        mb: dict[str, jax.Array],
        *,
        adapters: bool = True,
        dropout_key: jax.Array | None = None,
        stats: bool = False,
        force: bool = True,
    ) -> tuple[jax.Array, jax.Array, Any]:
        """:meth:`token_stats` and, with ``stats`` (a mixture-of-experts model), the forward's
        ``MoEStats`` (else None); ``force=False``: the router chooses even under replay."""
        model = nnx.merge(self.graphdef, params)
        sharding = (self.mesh, self.rules)
        hidden, moe_stats = self._hidden(
            model, mb, adapters=adapters, dropout_key=dropout_key, force=force, stats=stats
        )
        r, t, d = hidden.shape
        unembed = model.unembed_dv
        args = (hidden.reshape(r * t, d), unembed, mb["targets"].reshape(r * t))
        kw: dict[str, Any] = dict(temperature=self.temperature, impl=self.kernel_impl)
        if model.cfg.final_logit_softcapping is not None:  # Gemma 2's cap, before temperature
            kw["softcap"] = model.cfg.final_logit_softcapping
        # Rows are split over the 'batch' axes, so the flattened tokens are too; the vocabulary
        # is split over the 'vocab' axes when they divide it (vocab-parallel combine).
        split = kernel_mesh_axes(
            sharding, self.kernel_impl, (("batch", r * t), ("vocab", unembed.shape[1]))
        )
        if split is None:
            logp, ent = token_logprobs_and_entropy(*args, **kw)
        else:
            mesh, (batch_axes, vocab_axis) = split
            logp, ent = sharded_token_logprobs_and_entropy(
                mesh, batch_axes, *args, vocab_axis=vocab_axis, **kw
            )
        return logp.reshape(r, t), ent.reshape(r, t), moe_stats

    def micro_loss(
        self,
        params: nnx.State,
        ref_params: nnx.State | None,
        mb: dict[str, jax.Array],
        version: jax.Array,
        index: jax.Array | int = 0,
    ) -> tuple[jax.Array, dict[str, jax.Array]]:
        """The loss of micro-batch ``index`` of the step at ``version``, and its metric sums."""
        key = jax.random.fold_in(jax.random.fold_in(jax.random.key(self.seed), version), index)
        router = self.router
        logp, entropy, stats = self.forward(params, mb, dropout_key=key, stats=router is not None)
        ref = None
        if ref_params is not None:
            ref = jax.lax.stop_gradient(self.token_stats(ref_params, mb)[0])
        elif self.lora and self.cfg.beta > 0:  # the reference is the base: adapters off
            ref = jax.lax.stop_gradient(self.token_stats(params, mb, adapters=False)[0])
        x = LossInputs(
            logprobs=logp,
            old_logprobs=mb["old_logprobs"],
            advantages=mb["advantages"],
            mask=mb["mask"],
            entropy=jax.lax.stop_gradient(entropy),
            segment_ids=mb["segment_ids"],
            versions=mb["versions"],
            learner_version=version,
            ref_logprobs=ref,
            prox_logprobs=mb.get("prox_logprobs"),
        )
        per_token, metrics = self.loss.fn(x, self.cfg)
        loss = jnp.sum(per_token * mb["weights"] * mb["mask"])
        sums = {k: jnp.sum(v * mb["mask"]) for k, v in metrics.items()}
        sums["tokens"] = jnp.sum(mb["mask"])
        if router is not None:
            loss = loss + router.loss(stats, self.cfg.micro_batches)
            sums |= router.sums(stats, mb)
        if self.loss.sampled:
            fresh = mb["mask"] * (mb["versions"] == version)
            for k, v in train_inference_mismatch(logp, mb["old_logprobs"], mb["mask"]).items():
                sums[f"mismatch/{k}"] = jnp.sum(v * mb["mask"])
                sums[f"mismatch/{k}_fresh"] = jnp.sum(v * fresh)
            sums["fresh_tokens"] = jnp.sum(fresh)
        return loss, sums

    def accumulate(
        self,
        params: nnx.State,
        ref_params: nnx.State | None,
        batch: dict[str, jax.Array],
        version: jax.Array,
        offset: jax.Array | int = 0,
    ) -> tuple[Any, jax.Array, dict[str, jax.Array]]:
        """Gradients (of the trainable params), loss and metric sums over a
        [micro_batches, ...] batch (a scan); ``offset``: the step's index of its first
        micro-batch (a lent share's is not 0)."""
        frozen: Any = lora.split_adapters(params)[1] if self.lora else None

        def micro_loss(train: Any, mb: dict[str, jax.Array], index: jax.Array) -> Any:
            full = lora.join(frozen, train) if self.lora else train
            return self.micro_loss(full, ref_params, mb, version, index)

        grad_fn = jax.value_and_grad(micro_loss, has_aux=True)

        def micro(carry: Any, xs: Any) -> tuple[Any, None]:
            grads, loss, sums = carry
            mb, index = xs
            (mb_loss, mb_sums), mb_grads = grad_fn(self.trainable(params), mb, index)
            grads = jax.tree.map(jnp.add, grads, mb_grads)
            return (grads, loss + mb_loss, jax.tree.map(jnp.add, sums, mb_sums)), None

        first = jax.tree.map(lambda x: x[0], batch)
        sums0 = jax.eval_shape(lambda: self.micro_loss(params, ref_params, first, version)[1])
        zeros = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), sums0)
        init = (jax.tree.map(jnp.zeros_like, self.trainable(params)), jnp.float32(0.0), zeros)
        m = jax.tree.leaves(batch)[0].shape[0]
        (grads, loss, sums), _ = jax.lax.scan(micro, init, (batch, offset + jnp.arange(m)))
        return grads, loss, sums
