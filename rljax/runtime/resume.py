"""Checkpoint meta and resuming: what a run saves beside its arrays, and how it comes back.

A resumed run restores its learner onto an *abstract* state (shapes, dtypes and shardings from
the model's metadata), so the model is never initialised or loaded only to be overwritten; the
initial checkpoint is read again only for the reference model of a KL penalty (beta > 0).
"""

from __future__ import annotations

import dataclasses
import fnmatch
import json
import logging
from collections.abc import Callable
from typing import Any

import jax
from flax import nnx
from jax.sharding import Mesh

from rljax import io
from rljax.checkpoint import Checkpointer, CheckpointError
from rljax.config import ConfigError, ModelConfig, RunConfig, replace, to_config_dict
from rljax.learner.learner import Learner, check_divisible
from rljax.learner.losses import Loss
from rljax.learner.routing import router_training
from rljax.mesh.resize import MeshCache
from rljax.mesh.transfer import transfer
from rljax.models import lora
from rljax.models.loading import (
    abstract_params,
    initial_model_config,
    load_base_params,
    load_initial_params,
    load_tokenizer,
    resolve_init,
)
from rljax.policy.staleness import StalenessBuffer
from rljax.runtime.rollout import decode_group
from rljax.runtime.teacher import load_teacher

log = logging.getLogger(__name__)

# Config keys (fnmatch patterns) a resumed run may change. They say how long the run goes, how
# often it evaluates, where and how it writes, and how it lays out and runs its work (restores
# reshard onto any mesh, and the reallocator resizes mid-run anyway); none changes what is
# trained or how. Every other key must equal the checkpoint's, or the resume is refused.
RESUMABLE_KEYS = (
    "num_steps",
    "eval_every",
    "eval_examples",
    "eval.*",
    "kernel_impl",
    "checkpoint.*",
    "metrics.*",
    "mesh.*",
    "reallocator.*",
    "lending.*",
    "reward.timeout_s",
    "reward.num_workers",
    "reward.mode",
)


def can_resume(ckpt: Checkpointer | None) -> bool:
    """Whether ``ckpt`` holds a finalised step to resume from."""
    return ckpt is not None and ckpt.latest_step() is not None


def new_learner(cfg: RunConfig, mesh: Mesh, loss: Loss) -> Learner:
    """The learner of a fresh run, from ``cfg.init``."""
    model_cfg, graphdef, params = load_initial_params(cfg, mesh)
    critic_init = critic_weights(cfg, model_cfg, mesh)
    return make_learner(
        cfg, graphdef, params, mesh, loss, ref_params=params, critic_init=critic_init
    )


def critic_weights(cfg: RunConfig, model_cfg: ModelConfig, mesh: Mesh) -> nnx.State | None:
    """The critic's initial decoder when ``critic.init`` names a checkpoint (None: the policy's
    own weights); it must have the policy's architecture."""
    if not cfg.critic.enabled or cfg.critic.init == "policy":
        return None
    if cfg.lora.enabled:
        raise ConfigError(
            f"config key 'critic.init' = {cfg.critic.init!r} with lora.enabled: a LoRA critic "
            "shares the policy's frozen base; set critic.init='policy'"
        )
    own = replace(cfg, init=cfg.critic.init, tokenizer="char")
    with io.input_error("critic.init", cfg.critic.init):
        critic_cfg, _, params = load_base_params(own, mesh)
    if (
        dataclasses.replace(critic_cfg, dtype=model_cfg.dtype, param_dtype=model_cfg.param_dtype)
        != model_cfg
    ):
        raise ConfigError(
            f"config key 'critic.init' = {cfg.critic.init!r} is a {critic_cfg.family} model of "
            f"another shape than the policy's; the critic runs the policy's architecture: "
            "point it at a checkpoint of the policy's model, or use 'policy'"
        )
    return params


def abstract_learner(cfg: RunConfig, mesh: Mesh, loss: Loss) -> Learner:
    """The learner state's shapes, dtypes and shardings on ``mesh``: the restore target."""
    model_cfg = initial_model_config(cfg)
    graphdef, abstract = abstract_params(model_cfg, mesh, lora=cfg.lora)
    return Learner.abstract(
        cfg.learner,
        graphdef,
        abstract,
        mesh,
        loss=loss,
        kernel_impl=cfg.kernel_impl,
        router=router_training(model_cfg, cfg.moe),
        critic=cfg.critic if cfg.critic.enabled else None,
    )


def restore(
    ckpt: Checkpointer | None,
    cfg: RunConfig,
    abstract: Learner | None,
    *,
    check_meta: Callable[[dict[str, Any]], None] = lambda meta: None,
    layout: Any = None,
) -> Restored | None:
    """The newest good step of ``ckpt`` onto ``abstract``'s shardings; None with nothing saved.

    A changed config (and whatever ``check_meta`` refuses, a pod's shape) is refused with one
    line before any array is read. ``layout``: the shardings the state was saved with (a pod
    saves over every device of the pod), restored onto and then moved to ``abstract``'s: a
    collective over those devices, every process takes part.
    """
    if not can_resume(ckpt):
        return None
    assert ckpt is not None
    where = str(ckpt.directory)
    try:  # refuse a changed config before reading (or failing to read) any array
        newest = ckpt.read_meta()
        check_resume_config(newest, cfg, where=where)
        check_meta(newest)
    except CheckpointError as e:  # a damaged newest step: the fallback restore handles it
        log.warning("could not check the config of the newest checkpoint first: %s", e)
    assert abstract is not None
    state = (abstract.saved_params, abstract.opt_state)  # with LoRA, the adapters alone
    target = state if layout is None else jax.tree.map(_on, state, layout)
    params, opt_state, meta = ckpt.restore(
        abstract_params=target[0], abstract_opt_state=target[1], fallback=True
    )
    check_resume_config(meta, cfg, where=where)  # the step that loaded
    check_lora_base(meta, cfg, where=where)
    check_meta(meta)
    if layout is not None:
        params, opt_state = transfer((params, opt_state), jax.tree.map(_sharding, state))
    return Restored(params, opt_state, meta)


@dataclasses.dataclass
class Restored:
    """A checkpoint's learner state (on the learner mesh) and meta."""

    params: Any
    opt_state: Any
    meta: dict[str, Any]

    @property
    def version(self) -> int:
        return int(self.meta["version"])


def learner_for(
    cfg: RunConfig, mesh: Mesh, loss: Loss, restored: Restored | None, cache: MeshCache
) -> Learner:
    """The run's learner on ``mesh``: new, or the restored state (into the learner cached for
    ``mesh``, compiled already, when the run learned on it before)."""
    if restored is None:
        learner = new_learner(cfg, mesh, loss)
    elif (cached := cache.peek(mesh)) is not None:
        cached.load_state(restored.params, restored.opt_state, restored.version)
        learner = cached
    else:
        graphdef = abstract_params(initial_model_config(cfg), mesh, lora=cfg.lora)[0]
        params, ref = restored.params, None
        if cfg.lora.enabled:  # the base is read from init again, never from the checkpoint
            params = lora.join(load_base_params(cfg, mesh)[2], params)
        elif cfg.learner.needs_reference:
            ref = load_initial_params(cfg, mesh)[2]
        learner = make_learner(
            cfg,
            graphdef,
            params,
            mesh,
            loss,
            ref_params=ref,
            opt_state=restored.opt_state,
            version=restored.version,
        )
    cache.put(mesh, learner)
    check_divisible("learner.batch_groups * learner.group_size", cfg.learner.batch_size, learner.dp)
    if cfg.sft.steps:
        check_divisible("sft.batch_size", cfg.sft.batch_size, learner.dp)
    return learner


def lora_base(cfg: RunConfig) -> dict[str, Any]:
    """What a LoRA checkpoint records of its base (it holds the adapters alone): ``init`` and
    the bytes of its weight files, so a resume onto another base is refused; {} without LoRA."""
    if not cfg.lora.enabled:
        return {}
    if cfg.init == "random":
        return {"lora_base": {"init": "random", "seed": cfg.seed}}
    path = resolve_init(cfg.init)
    if io.is_file(path):
        files = [io.path(path)]
    else:
        files = [io.join(path, f) for f in io.listdir(path) if f.endswith(".safetensors")]
    return {"lora_base": {"init": cfg.init, "bytes": sum(f.stat().length for f in files)}}


def check_lora_base(meta: dict[str, Any], cfg: RunConfig, *, where: str = "") -> None:
    """Refuses, in one line, to put a LoRA checkpoint's adapters on another base."""
    saved = meta.get("lora_base")
    if saved is None or not cfg.lora.enabled:
        return
    now = lora_base(cfg)["lora_base"]
    if saved != now:
        raise ConfigError(
            f"the LoRA checkpoint in {where or 'the workdir'} adapts the base {saved}, but init "
            f"is now {now}; restore the base it was trained on, or use a new workdir"
        )


def _on(x: Any, sharding: Any) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding)


def _sharding(x: Any) -> Any:
    return x.sharding


def make_learner(
    cfg: RunConfig,
    graphdef: nnx.GraphDef,
    params: nnx.State,
    mesh: Mesh,
    loss: Loss,
    **kwargs: Any,
) -> Learner:
    """The RL learner of ``cfg`` on ``mesh`` (a mixture-of-experts model's with its routing
    replay, router losses and metrics, rljax.learner.routing)."""
    ref = kwargs.pop("ref_params", None)
    teacher = None
    if cfg.teacher.init:
        teacher = load_teacher(cfg, mesh, load_tokenizer(cfg))
    return Learner(
        cfg.learner,
        graphdef,
        params,
        mesh,
        loss=loss,
        temperature=cfg.sampling.temperature,
        ref_params=ref if cfg.learner.needs_reference else None,
        kernel_impl=cfg.kernel_impl,
        seed=cfg.seed,
        router=router_training(initial_model_config(cfg), cfg.moe),
        critic=cfg.critic if cfg.critic.enabled else None,
        teacher=teacher,
        **kwargs,
    )


def checkpoint_meta(
    *,
    version: int,
    data_state: Any,
    initial_accuracy: float,
    metrics_offset: int | None,
    extra: dict[str, Any] | None = None,
    config: RunConfig | None = None,
) -> dict[str, Any]:
    """The JSON meta of a checkpoint.

    ``data_state`` is the prompt stream's position (:mod:`rljax.runtime.prompts`), read at the
    same instant as
    anything in ``extra`` that depends on it (the driver's pending prompts). ``config``, the
    run's, is stored flat so a resume can name the keys that changed (:func:`check_resume_config`),
    with a LoRA run's record of its base (:func:`lora_base`).
    """
    return {
        **({"config": flat_config(config), **lora_base(config)} if config is not None else {}),
        "version": version,
        "data": data_state,
        "initial_accuracy": initial_accuracy,
        "metrics_offset": metrics_offset,
        **(extra or {}),
    }


def driver_state(
    meta: dict[str, Any] | None, cfg: RunConfig, *, version: int
) -> tuple[StalenessBuffer, list[Any], int]:
    """(buffer, prompts to re-dispatch, next request id) for the driver of a (resumed) run.

    Checkpoints before the one driver held the threaded driver's state under ``'async'``, and
    none for a synchronous run; those resume with an empty buffer at their version.
    """
    state = (meta or {}).get("driver") or (meta or {}).get("async")
    if state:
        buffer = StalenessBuffer.from_state_dict(state["buffer"], decode=decode_group)
        return buffer, state["pending"], state["next_request_id"]
    b = cfg.learner.batch_groups
    empty = {
        "batch_groups": b,
        "max_staleness": cfg.buffer.max_staleness,
        "overprovision": cfg.buffer.overprovision,
        "version": version,
        "accepted": version * b,
        "discarded": 0,
        "buffers": [],
    }
    return StalenessBuffer.from_state_dict(empty), [], 0


def driver_counters(meta: dict[str, Any] | None) -> dict[str, int]:
    """The driver's running counts (``dispatched``, ...) saved in ``meta``; none before
    checkpoints held them."""
    return dict(((meta or {}).get("driver") or {}).get("counters") or {})


def flat_config(cfg: RunConfig) -> dict[str, Any]:
    """``{'learner.learning_rate': 1e-05, ...}``: every key of ``cfg``, JSON-safe."""
    out: dict[str, Any] = {}

    def visit(prefix: str, value: Any) -> None:
        if isinstance(value, dict):
            for k, v in value.items():
                visit(f"{prefix}{k}.", v)
        else:
            out[prefix[:-1]] = value

    visit("", json.loads(json.dumps(to_config_dict(cfg).to_dict(), allow_nan=True)))
    return out


def resumable(key: str) -> bool:
    """Whether config ``key`` may differ from the checkpoint's on resume (RESUMABLE_KEYS)."""
    return any(fnmatch.fnmatchcase(key, pattern) for pattern in RESUMABLE_KEYS)


def check_resume_config(meta: dict[str, Any], cfg: RunConfig, *, where: str = "") -> None:
    """Refuses, with one line naming the keys, to resume ``meta``'s checkpoint with a config
    that differs outside :data:`RESUMABLE_KEYS`.

    A key the checkpoint lacks (saved by an older rljax) is compared with its default; a key
    the config lacks (removed since) is ignored. A checkpoint saved without its config (before
    rljax stored it) is resumed with a warning.
    """
    saved = meta.get("config")
    if not isinstance(saved, dict):
        log.warning("checkpoint %s holds no run config; resuming without checking it", where)
        return
    current, defaults = flat_config(cfg), flat_config(RunConfig())
    changed = []
    for key, value in current.items():
        before = saved.get(key, defaults.get(key))
        if not resumable(key) and before != value:
            changed.append(f"{key} ({before!r} -> {value!r})")
    if changed:
        raise ConfigError(
            f"the checkpoint in {where or 'the workdir'} was saved with a different config: "
            f"{', '.join(changed)}; set those keys back to the saved values, or use a new workdir "
            f"to start afresh (keys that may change on resume: {', '.join(RESUMABLE_KEYS)})"
        )
