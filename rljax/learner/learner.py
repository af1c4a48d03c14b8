"""The learner: a sharded, jit-compiled train step with micro-batching on the learner mesh.

``Learner.step(batch)`` takes a packed :class:`~rljax.learner.batch.TrainBatch`, scans over its
micro-batches accumulating gradients, then applies one optax AdamW update
(:mod:`rljax.learner.optimizer`; ``ppo_epochs`` of them, on the same batch; the proximal
log-probs of decoupled PPO / truncated IS are computed once, before the first, so the clip
bounds the drift of every epoch). Parameters and optimiser state live in their learner
shardings (FSDP over 'fsdp', tensor parallel over 'tensor'); the batch's rows are split over
the data-parallel axis.

The loss and its gradients are :class:`~rljax.learner.gradients.Gradients`, which holds no
arrays: the learner owns the params and optimiser state and compiles it on its mesh. Log-probs
of the target tokens come from :func:`rljax.kernels.fused_logprobs`, which never materialises
the [tokens, vocab] logits. They are computed at the sampler's temperature so the importance
ratio against the behaviour log-probs is exact (see rljax.engine.sampling).

Trainer-on-RollPool (:mod:`rljax.runtime.lending`): ``step(batch, loan)`` takes the gradients of
the last ``loan.micro_batches`` micro-batches on other chips with the current params
(:meth:`Learner.lent_grads`), moves them back (``device_put``) and sums them into the update;
the learner stays the only optimiser and version authority, and the step equals the unlent one
within float tolerance.

The same forward pass gives the train-inference mismatch, logged every step: the gap between
these log-probs and the sampler's (``mismatch/*``, :data:`MISMATCH_FRESH` restricted to the
tokens the learner's own version sampled, where only the two programs and their precisions
differ; see docs/runtime.md).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from rljax.config import ConfigError, CriticConfig, LearnerConfig
from rljax.learner.batch import TrainBatch, TrainSequence, pack_batch
from rljax.learner.gradients import Gradients
from rljax.learner.loan import GradLoan, LentGrads, LentSteps
from rljax.learner.losses import Loss, get_loss
from rljax.learner.optimizer import applied_learning_rate, make_optimizer, optimizer_shardings
from rljax.learner.roles import Roles, Teacher
from rljax.learner.routing import RouterTraining
from rljax.learner.step_metrics import MISMATCH_FRESH as MISMATCH_FRESH
from rljax.learner.step_metrics import device_metrics, host_metrics
from rljax.models import lora
from rljax.models.sharding import (
    LEARNER_RULES,
    ShardingRules,
    axis_size,
    state_shardings,
    with_shardings,
)


def _hidden_size(params: nnx.State) -> int:
    """D, the width of the final hidden states (the final norm's)."""
    return int(jax.tree.leaves(params["final_norm"])[0].shape[-1])


def data_parallel_size(mesh: Mesh, rules: ShardingRules) -> int:
    """How many ways the learner splits a batch's rows."""
    return axis_size(mesh, rules.rules["batch"])


def check_divisible(key: str, batch: int, dp: int) -> None:
    """A batch of ``batch`` sequences must split evenly over ``dp`` data-parallel devices."""
    if batch % dp:
        raise ConfigError(
            f"config key '{key}' gives a batch of {batch} sequences, not divisible over the "
            f"{dp} data-parallel learner devices; use a multiple of {dp} or shrink the learner "
            "mesh"
        )


class Learner:
    """Owns the policy's params and optimiser state on the learner mesh.

    With LoRA adapters in the params (:mod:`rljax.models.lora`), only the adapters are
    trained: gradients and optimiser state exist for them alone, the base weights pass
    through every step untouched, and the KL reference is the base (adapters off), so
    ``ref_params`` is not kept.

    The per-token estimators (``cfg.advantage`` reinforce_plus_plus, gae, opd) score each batch
    on this mesh before the updates (:class:`~rljax.learner.scoring.BatchScoring`). With a
    ``critic`` (gae) the learner trains it beside the policy, every update, and
    ``opt_state`` is ``{"policy": the policy's optimiser state, "critic": the critic's
    params and optimiser state}`` (:mod:`rljax.learner.critic`); a ``teacher`` (opd: its graph
    and params) is frozen and placed like the reference, or stays on a mesh of its own.
    """

    def __init__(
        self,
        cfg: LearnerConfig,
        graphdef: nnx.GraphDef,
        params: nnx.State,
        mesh: Mesh,
        *,
        rules: ShardingRules = LEARNER_RULES,
        loss: str | Loss | None = None,
        learning_rate: float | None = None,
        temperature: float = 1.0,
        ref_params: nnx.State | None = None,
        kernel_impl: str = "auto",
        version: int = 0,
        opt_state: Any = None,
        seed: int = 0,
        router: RouterTraining | None = None,
        critic: CriticConfig | None = None,
        critic_init: nnx.State | None = None,
        teacher: Teacher | None = None,
    ):
        self.router = router
        self._configure(cfg, graphdef, mesh, rules, loss, learning_rate, temperature)
        self.lora = lora.has_adapters(params)
        self.gradients = self._gradients(kernel_impl, seed)
        self.roles = Roles(
            cfg, self.gradients, critic=critic, hidden_size=_hidden_size(params), teacher=teacher
        )
        self.critic = self.roles.critic
        self.version = version
        self.param_shardings = state_shardings(params, mesh, rules)
        # Copies: the train step donates its params, which must not free a caller's arrays.
        self.params = jax.device_put(params, self.param_shardings, may_alias=False)
        self.ref_params = None
        if ref_params is not None and cfg.needs_reference and not self.lora:
            self.ref_params = jax.device_put(ref_params, self.param_shardings, may_alias=False)
        if opt_state is None:  # a fresh run; a resumed one passes its restored state
            opt_state = self._initial_opt_state(critic_init)
        self.opt_state = jax.device_put(opt_state, self._opt_shardings())
        self._build_step()

    def restart_critic(self) -> None:
        """A fresh critic from the policy's current params (after a warm start moved them)."""
        assert self.critic is not None
        init = jax.jit(self.critic.initial, out_shardings=self._critic_shardings())
        self.opt_state = dict(self.opt_state, critic=init(self.params))

    def _initial_opt_state(self, critic_init: nnx.State | None) -> Any:
        """A fresh optimiser state (with a critic's, initialised from ``critic_init``, default
        the policy's params), on its shardings."""
        policy = jax.jit(self.tx.init, out_shardings=self._opt_shardings(policy=True))
        state = policy(self.trainable(self.params))
        if self.critic is None:
            return state
        decoder = self.params if critic_init is None else critic_init
        init = jax.jit(self.critic.initial, out_shardings=self._critic_shardings())
        return self.roles.with_critic(state, init(decoder))

    def _configure(
        self,
        cfg: LearnerConfig,
        graphdef: nnx.GraphDef,
        mesh: Mesh,
        rules: ShardingRules,
        loss: str | Loss | None,
        learning_rate: float | None,
        temperature: float,
    ) -> None:
        """Everything but the arrays: shared by the constructor and :meth:`abstract`."""
        self.cfg = cfg
        self.loss = get_loss(loss or cfg.loss, cfg)
        self.mesh = mesh
        self.rules = rules
        self.graphdef = graphdef
        self.temperature = temperature if temperature > 0 else 1.0
        self.dp = data_parallel_size(mesh, rules)
        self.tx, self.schedule = make_optimizer(cfg, learning_rate)
        self._replicated = NamedSharding(mesh, PartitionSpec())
        self._batch_sharding = NamedSharding(mesh, PartitionSpec(None, rules.axes(mesh, "batch")))

    def _gradients(self, kernel_impl: str, seed: int) -> Gradients:
        """The loss and its gradients on the learner mesh (``self.lora`` set first)."""
        return Gradients(
            cfg=self.cfg,
            graphdef=self.graphdef,
            mesh=self.mesh,
            rules=self.rules,
            loss=self.loss,
            temperature=self.temperature,
            kernel_impl=kernel_impl,
            lora=self.lora,
            seed=seed,  # LoRA dropout's masks: from (seed, version, micro-batch)
            router=self.router,
        )

    def trainable(self, tree: Any) -> Any:
        """The part of a params-shaped ``tree`` that trains: the adapters with LoRA, else all."""
        return self.gradients.trainable(tree)

    def _opt_shardings(self, *, policy: bool = False) -> Any:
        """The optimiser state's shardings (``policy``: the policy's part alone)."""
        own = optimizer_shardings(
            self.tx,
            self.trainable(self.params),
            self.trainable(self.param_shardings),
            self._replicated,
        )
        if policy:
            return own
        return self.roles.opt_shardings(own, self.params, self.param_shardings, self._replicated)

    def _critic_shardings(self) -> Any:
        return self.roles.critic_shardings(self.params, self.param_shardings, self._replicated)

    def _build_step(self) -> None:
        self._step_fn = jax.jit(
            self._train_step,
            donate_argnums=(0, 1),
            out_shardings=(self.param_shardings, self._opt_shardings(), self._replicated),
        )

    @classmethod
    def abstract(
        cls,
        cfg: LearnerConfig,
        graphdef: nnx.GraphDef,
        params: nnx.State,
        mesh: Mesh,
        *,
        rules: ShardingRules = LEARNER_RULES,
        loss: str | Loss | None = None,
        temperature: float = 1.0,
        kernel_impl: str = "auto",
        router: RouterTraining | None = None,
        critic: CriticConfig | None = None,
    ) -> Learner:
        """A learner whose state is ``jax.ShapeDtypeStruct``s: nothing is allocated.

        ``params`` is an abstract params state (``nnx.eval_shape`` of the model). The result
        holds abstract params, optimiser state (and reference params when ``cfg.beta > 0``)
        carrying their learner shardings; it can :meth:`lower_step` for a memory plan or an
        ahead-of-time compile, but not :meth:`step`.
        """
        self = cls.__new__(cls)
        self.router = router
        self._configure(cfg, graphdef, mesh, rules, loss, None, temperature)
        self.lora = lora.has_adapters(params)
        self.gradients = self._gradients(kernel_impl, 0)
        self.roles = Roles(
            cfg, self.gradients, critic=critic, hidden_size=_hidden_size(params), teacher=None
        )
        self.critic = self.roles.critic
        self.version = 0
        self.param_shardings = state_shardings(params, mesh, rules)
        self.params = with_shardings(params, self.param_shardings)
        self.ref_params = self.params if cfg.needs_reference and not self.lora else None
        opt_state = jax.eval_shape(self.tx.init, self.trainable(self.params))
        if self.critic is not None:
            critic = jax.eval_shape(self.critic.initial, params)
            opt_state = self.roles.with_critic(opt_state, critic)
        self.opt_state = with_shardings(opt_state, self._opt_shardings())
        self._build_step()
        return self

    def batch_shape(self, batch_sequences: int, row_len: int) -> tuple[int, int, int]:
        """[micro_batches, rows, row_len] of the largest batch ``batch_sequences`` can pack to.

        The worst case puts each sequence in a row of its own; rows are then padded like
        :func:`rljax.learner.batch.pack_batch` does, to micro_batches x dp x a power of two.
        """
        multiple = self.cfg.micro_batches * self.dp
        units = -(-batch_sequences // multiple)
        rows = multiple * (1 << (units - 1).bit_length())
        return (self.cfg.micro_batches, rows // self.cfg.micro_batches, row_len)

    def lower_step(self, batch_shape: tuple[int, int, int]) -> jax.stages.Lowered:
        """The train step lowered for a batch of ``[micro_batches, rows, row_len]``.

        Works on a real or an :meth:`abstract` learner; ``.compile().memory_analysis()`` on the
        result gives the step's per-device bytes.
        """
        # The field names and dtypes pack_batch produces, read off a one-sequence batch (with
        # routes, as a mixture-of-experts model's sampler records them).
        routes = [[0] * self.router.route_width] if self.router else ()
        example = pack_batch([TrainSequence([0, 0], 1, routes=routes)], row_len=2).arrays
        if self._needs_proximal:
            example["prox_logprobs"] = example["old_logprobs"]
        if self.critic is not None:  # what scoring adds for the critic's loss
            example |= {"values": example["rewards"], "returns": example["rewards"]}
        batch = {
            name: jax.ShapeDtypeStruct(
                (*batch_shape, *a.shape[3:]), a.dtype, sharding=self._batch_sharding
            )
            for name, a in example.items()
        }
        version = jax.ShapeDtypeStruct((), jnp.int32, sharding=self._replicated)
        return self._step_fn.lower(self.params, self.opt_state, self.ref_params, batch, version)

    def _train_step(
        self, params: Any, opt_state: Any, ref_params: Any, batch: Any, version: jax.Array
    ) -> tuple[Any, Any, dict]:
        critic_metrics: dict[str, jax.Array] = {}
        if self.critic is not None:  # the base it reads (LoRA) is the same before and after
            opt_state, critic_metrics = self.roles.critic_update(params, opt_state, batch)
        grads, loss, sums = self.gradients.accumulate(params, ref_params, batch, version)
        params, opt_state, metrics = self._finish(params, opt_state, grads, loss, sums)
        return params, opt_state, metrics | critic_metrics

    def _apply_parts(self, params: Any, opt_state: Any, parts: tuple) -> tuple[Any, Any, dict]:
        """The update from gradient parts (own and lent micro-batches), summed in order."""
        grads, loss, sums = jax.tree.map(lambda *xs: functools.reduce(jnp.add, xs), *parts)
        return self._finish(params, opt_state, grads, loss, sums)

    def _finish(
        self, params: Any, opt_state: Any, grads: Any, loss: jax.Array, sums: dict
    ) -> tuple[Any, Any, dict]:
        """Clip, update and the step's metrics, from the summed gradients and sums (a critic's
        state passes through)."""
        train = self.trainable(params)
        full, opt_state = opt_state, self.roles.policy_opt(opt_state)
        updates, opt_state = self.tx.update(grads, opt_state, train)
        train = optax.apply_updates(train, updates)
        # With LoRA the base passes through: donated and returned unchanged, it is not copied.
        params = lora.join(lora.split_adapters(params)[1], train) if self.lora else train
        metrics = device_metrics(sums, self.router)
        metrics.update(
            loss=loss,
            grad_norm=optax.tree.norm(grads),
            learning_rate=applied_learning_rate(opt_state),
        )
        if self.critic is not None:  # its state passes through
            opt_state = dict(full, policy=opt_state)
        return params, opt_state, metrics

    @property
    def _needs_proximal(self) -> bool:
        """Whether the step reads pi_prox's log-probs from the batch.

        Only with several epochs: in a single update the params the gradients are taken at
        are pi_prox's, so the loss reads them off the current log-probs for free.
        """
        return (
            self.cfg.ppo_epochs > 1
            and self.cfg.proximal == "recompute"
            and self.loss.needs_proximal(self.cfg)
        )

    def step(self, batch: TrainBatch, loan: GradLoan | None = None) -> dict[str, float]:
        """``ppo_epochs`` optimiser updates on ``batch``; the version advances by one.

        The proximal policy is the params before the first update: its log-probs are computed
        once, here, and every epoch clips against them. Metrics are those of the last update
        (its ratio and clip fraction show the drift; ``learning_rate`` is the rate it applied),
        except the ``mismatch/*`` ones: the first update's, taken at the version that sampled.

        With a ``loan``, every epoch computes the gradients of the last ``loan.micro_batches``
        micro-batches on ``loan.devices`` and sums them into its update (Trainer-on-RollPool).
        """
        arrays = jax.device_put(batch.arrays, self._batch_sharding)
        extra: dict[str, jax.Array] = {}
        if self.roles.scoring is not None:
            critic = None if self.critic is None else self.opt_state["critic"]
            arrays, extra = self._score_fn(
                self.params, critic, self.ref_params, *self.roles.scoring_args(arrays)
            )
        if self._needs_proximal:
            arrays = dict(arrays, prox_logprobs=self._logprob_fn(self.params, arrays))
        if self.router and self.router.measures_now(self.version) and "routes" in arrays:
            extra |= self._replay_effect_fn(self.params, arrays)
        first = None
        for _ in range(self.cfg.ppo_epochs):
            version = jnp.int32(self.version)
            if self.critic is not None and self.version < self.critic.cfg.warmup_steps:
                # the critic's warm-up: the policy stands still
                self.opt_state, metrics = self._critic_step_fn(self.params, self.opt_state, arrays)
            elif loan is None:
                self.params, self.opt_state, metrics = self._step_fn(
                    self.params, self.opt_state, self.ref_params, arrays, version
                )
            else:
                metrics = self._lent_update(arrays, version, loan)
            first = metrics if first is None else first
        assert first is not None  # ppo_epochs >= 1
        metrics = host_metrics(metrics | extra, first)
        self.version += 1
        return metrics

    def _lent_update(self, arrays: dict, version: jax.Array, loan: GradLoan) -> dict:
        """One update whose last ``loan.micro_batches`` micro-batches run on the lent chips."""
        parts = self._lent.parts(self.params, self.ref_params, arrays, version, loan)
        self.params, self.opt_state, metrics = self._apply_fn(
            self.params, self.opt_state, tuple(parts)
        )
        if self.critic is not None:  # the critic's gradients are not lent
            self.opt_state, critic_metrics = self._critic_step_fn(
                self.params, self.opt_state, arrays
            )
            metrics |= critic_metrics
        return metrics

    def lent_grads(self, devices: Sequence[jax.Device]) -> LentGrads:
        """The gradient half of this learner's step compiled on ``devices`` (chips outside its
        mesh, the sampler's), built once per set of devices."""
        return self._lent.grads(self.params, devices)

    @functools.cached_property
    def _lent(self) -> LentSteps:
        return LentSteps(self.gradients, self.trainable(self.param_shardings), self._replicated)

    @functools.cached_property
    def _apply_fn(self) -> Any:
        return jax.jit(
            self._apply_parts,
            donate_argnums=(0, 1),
            out_shardings=(self.param_shardings, self._opt_shardings(), self._replicated),
        )

    @functools.cached_property
    def _critic_step_fn(self) -> Any:
        """The critic's update alone (its warm-up, or beside a lent policy update), one jit."""
        return jax.jit(
            self.roles.critic_update,
            donate_argnums=(1,),
            out_shardings=(self._opt_shardings(), self._replicated),
        )

    @functools.cached_property
    def _score_fn(self) -> Any:
        """The per-token estimator's scoring of a batch (rljax.learner.scoring), one jit."""
        assert self.roles.scoring is not None
        return jax.jit(
            self.roles.scoring.__call__, out_shardings=(self._batch_sharding, self._replicated)
        )

    @functools.cached_property
    def _replay_effect_fn(self) -> Any:
        """Replay on: :meth:`Gradients.batch_replay_effect` on the batch before the update."""
        return jax.jit(self.gradients.batch_replay_effect, out_shardings=self._replicated)

    @functools.cached_property
    def _logprob_fn(self) -> Any:
        """Log-probs of every target of a [micro_batches, rows, row_len] batch, one jit."""
        return jax.jit(self.gradients.batch_logprobs, out_shardings=self._batch_sharding)

    def token_logprobs(self, batch: TrainBatch) -> np.ndarray:
        """The current policy's log-probs of every target, shaped like ``batch.arrays``."""
        arrays = jax.device_put(batch.arrays, self._batch_sharding)
        return np.asarray(jax.device_get(self._logprob_fn(self.params, arrays)))

    @property
    def saved_params(self) -> Any:
        """The params a checkpoint writes: the adapters alone with LoRA (the base is the
        run's ``init``, never written again), else all."""
        return self.trainable(self.params)

    def state_dict(self) -> dict[str, Any]:
        """The pieces a checkpoint saves."""
        return {"params": self.saved_params, "opt_state": self.opt_state, "version": self.version}

    def load_state(self, params: Any, opt_state: Any, version: int) -> None:
        """Continue from a checkpoint's state, restored onto this learner's shardings: what
        :meth:`state_dict` saved (with LoRA the adapters alone, joined here to this learner's
        base, which a checkpoint never holds)."""
        if self.lora:
            params = lora.join(lora.split_adapters(self.params)[1], params)
        self.params, self.opt_state, self.version = params, opt_state, version

    def take_state(self, source: Learner, *, params: bool = True) -> None:
        """Continue from ``source`` (a learner on another mesh): its optimiser state, version,
        params and reference params, each resharded with ``jax.device_put``. ``params=False``
        when this learner was just built from ``source``'s params (its constructor copied them
        and the reference). ``source`` then lets go of its arrays, so the chips it leaves are
        free for the sampler."""
        if params:
            self.params = jax.device_put(source.params, self.param_shardings, may_alias=False)
            if source.ref_params is not None:
                self.ref_params = jax.device_put(
                    source.ref_params, self.param_shardings, may_alias=False
                )
            if source.roles.teacher_params is not None:
                self.roles.place_teacher(source.roles.teacher_params)
        # The same shardings the train step was compiled for, so its jit cache still hits.
        self.opt_state = jax.device_put(source.opt_state, self._opt_shardings(), may_alias=False)
        self.version = source.version
        jax.block_until_ready((self.params, self.opt_state, self.ref_params))
        source.release(reference=True)

    def release(self, *, reference: bool = False) -> None:
        """Drop the params and optimiser state (a pod host changing role frees its memory; the
        state lives on in the checkpoint the resize restores), and with ``reference`` the
        reference and teacher params too (a move hands them to the learner on the new mesh; a
        pod host keeps them for the cached learner a restore reuses)."""
        self.params = self.opt_state = None
        if reference:
            self.ref_params = self.roles.teacher_params = None
