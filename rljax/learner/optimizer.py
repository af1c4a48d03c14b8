"""The learner's optimiser: AdamW with its learning-rate schedule, the rate it applied, and
where its state lives on the learner mesh.

Built once per :class:`~rljax.learner.learner.Learner` (:func:`make_optimizer`); the
checkpoint and a resize place a restored or moved optimiser state with
:func:`optimizer_shardings`, the same placement the learner's train step compiles for.
"""

from __future__ import annotations

from typing import Any

import jax
import optax

from rljax.config import LearnerConfig

# Only the rate is injected (kept in the optimiser state); the rest stay Python constants.
_STATIC_ADAMW_ARGS = ("b1", "b2", "eps", "eps_root", "weight_decay")


def make_optimizer(
    cfg: LearnerConfig, learning_rate: float | None = None
) -> tuple[optax.GradientTransformation, optax.Schedule]:
    """AdamW with linear warmup, optional cosine decay, and global-norm clipping.

    The rate goes through ``optax.inject_hyperparams``, so the optimiser state holds the rate
    its last update applied (:func:`applied_learning_rate`): the schedule runs on the
    optimiser's own update count, which after a resume, a warm start or ``ppo_epochs > 1`` is
    not the learner's version.
    """
    lr = cfg.learning_rate if learning_rate is None else learning_rate
    if cfg.decay_steps:
        start = 0.0 if cfg.warmup_steps else lr
        end = cfg.warmup_steps + cfg.decay_steps
        schedule = optax.warmup_cosine_decay_schedule(start, lr, cfg.warmup_steps, end)
    elif cfg.warmup_steps:
        schedule = optax.linear_schedule(0.0, lr, cfg.warmup_steps)
    else:
        schedule = optax.constant_schedule(lr)
    parts = [optax.clip_by_global_norm(cfg.grad_clip)] if cfg.grad_clip > 0 else []
    adamw = optax.inject_hyperparams(optax.adamw, static_args=_STATIC_ADAMW_ARGS)
    parts.append(adamw(schedule, b1=cfg.b1, b2=cfg.b2, weight_decay=cfg.weight_decay))
    return optax.chain(*parts), schedule


def applied_learning_rate(opt_state: Any) -> jax.Array:
    """The learning rate the optimiser's last update applied (read from its state)."""
    return optax.tree_utils.tree_get(opt_state, "hyperparams")["learning_rate"]


def optimizer_shardings(
    tx: optax.GradientTransformation, params: Any, param_shardings: Any, replicated: Any
) -> Any:
    """Moment buffers follow their parameter's sharding; step counts are replicated.

    Explicit, because a sharding left to propagation differs between the first and later
    steps and the train step would compile twice.
    """
    by_path = {
        jax.tree_util.keystr(path): s
        for path, s in jax.tree_util.tree_flatten_with_path(param_shardings)[0]
    }

    def pick(path: tuple, leaf: jax.ShapeDtypeStruct) -> Any:
        # Optimiser leaves end in '.value' (the nnx Variable); parameter paths do not.
        key = jax.tree_util.keystr(path).removesuffix(".value")
        matches = [s for p, s in by_path.items() if key.endswith(p)]
        return matches[0] if matches and leaf.ndim else replicated

    return jax.tree_util.tree_map_with_path(pick, jax.eval_shape(tx.init, params))
