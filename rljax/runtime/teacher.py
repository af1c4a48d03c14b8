"""The teacher of on-policy distillation (``learner.advantage='opd'``), loaded for the learner.

``teacher.init`` names a run's workdir (its newest checkpoint's params, with the model, init and
tokenizer its saved config records), a Hugging Face directory, a GGUF file or 'smollm2'. The
teacher scores the student's tokens, so it must read them as the student wrote them: its
tokenizer is compared with the policy's before any weight loads, and a different one is refused
in one line (:func:`check_same_tokenizer`).
"""

from __future__ import annotations

from typing import Any

from flax import nnx
from jax.sharding import Mesh

from rljax import io
from rljax.checkpoint import Checkpointer, CheckpointError
from rljax.config import CheckpointConfig, ConfigError, LoRAConfig, RunConfig, replace
from rljax.config.convert import from_config_dict
from rljax.models.loading import (
    abstract_params,
    initial_model_config,
    load_base_params,
    load_tokenizer,
)
from rljax.models.tokenizer import Tokenizer


def is_run_workdir(path: str) -> bool:
    """Whether ``path`` is a run's workdir (it holds the run's checkpoints)."""
    return io.is_dir(io.join(path, "checkpoints"))


def saved_run_config(workdir: str, key: str = "teacher.init") -> RunConfig:
    """The run config a workdir's newest checkpoint was saved with (``key``: the config key
    that named the workdir, for the one-line errors)."""
    try:
        meta = Checkpointer(io.join(workdir, "checkpoints"), _READ_ONLY).read_meta()
    except CheckpointError as e:
        raise ConfigError(f"config key '{key}' = {workdir!r}: {e}") from None
    saved = meta.get("config")
    if not isinstance(saved, dict):
        raise ConfigError(
            f"config key '{key}' = {workdir!r}: its checkpoint holds no run config (saved by "
            "an older rljax); export the model to a Hugging Face directory"
        )
    return _unflatten(saved)


def load_run_params(workdir: str, mesh: Mesh, key: str = "teacher.init") -> tuple[Any, ...]:
    """(model config, graphdef, params) of a run's newest checkpoint, on ``mesh`` (a LoRA
    run's are refused: its checkpoints hold the adapters alone)."""
    saved = saved_run_config(workdir, key)
    if saved.lora.enabled:
        raise ConfigError(
            f"config key '{key}' = {workdir!r} is a LoRA run (its checkpoints hold adapters "
            "alone); export it merged to a Hugging Face directory and point there"
        )
    model_cfg = initial_model_config(saved)
    graphdef, abstract = abstract_params(model_cfg, mesh)
    ckpt = Checkpointer(io.join(workdir, "checkpoints"), _READ_ONLY)
    try:
        return model_cfg, graphdef, ckpt.restore_params(abstract)
    except CheckpointError as e:
        raise ConfigError(f"config key '{key}' = {workdir!r}: {e}") from None


_READ_ONLY = CheckpointConfig(enabled=False)


def teacher_run_config(cfg: RunConfig) -> RunConfig:
    """What the teacher is, as a run config: the saved config of a workdir's newest checkpoint,
    or ``cfg`` with ``init`` (and ``tokenizer``) the teacher's."""
    t = cfg.teacher
    if is_run_workdir(t.init):
        return saved_run_config(t.init)
    return replace(cfg, init=t.init, tokenizer=t.tokenizer, lora=LoRAConfig())


def _unflatten(flat: dict[str, Any]) -> RunConfig:
    nested: dict[str, Any] = {}
    for key, value in flat.items():
        *path, last = key.split(".")
        node = nested
        for part in path:
            node = node.setdefault(part, {})
        node[last] = value
    return from_config_dict(nested)


def check_same_tokenizer(student: Tokenizer, teacher: Tokenizer, where: str) -> None:
    """Refuses, in one line, a teacher whose tokenizer gives other ids than the student's."""
    mine, theirs = student.vocab(), teacher.vocab()
    problem = ""
    if len(mine) != len(theirs):
        problem = f"{len(theirs)} tokens, not {len(mine)}"
    elif mine != theirs:
        differ = sum(theirs.get(token) != i for token, i in mine.items())
        problem = f"{differ} of its {len(mine)} tokens have other ids"
    elif student.eos_id != teacher.eos_id:
        problem = f"end-of-sequence id {teacher.eos_id}, not {student.eos_id}"
    if problem:
        raise ConfigError(
            f"config key 'teacher.init' = {where!r} has another tokenizer than the policy "
            f"({problem}); distillation compares log-probs of the same token ids: pick a "
            "teacher trained with the policy's tokenizer"
        )


def check_teacher(cfg: RunConfig, student: Tokenizer) -> RunConfig | None:
    """The teacher's run config (None without one), once it is known to load as a teacher and
    to share the ``student``'s tokenizer (no weight is read: the run checks this before it
    writes)."""
    where = cfg.teacher.init
    if not where:
        return None
    tcfg = teacher_run_config(cfg)
    if tcfg.lora.enabled:
        raise ConfigError(
            f"config key 'teacher.init' = {where!r} is a LoRA run (its checkpoints hold adapters "
            "alone); export it merged to a Hugging Face directory and point teacher.init there"
        )
    try:
        tokenizer = load_tokenizer(tcfg)
    except ConfigError as e:
        raise ConfigError(f"config key 'teacher.init' = {where!r}: {e}") from None
    check_same_tokenizer(student, tokenizer, where)
    return tcfg


def load_teacher(cfg: RunConfig, mesh: Mesh, student: Tokenizer) -> tuple[nnx.GraphDef, Any]:
    """The teacher's (graphdef, params) on ``mesh``, after :func:`check_teacher`."""
    where = cfg.teacher.init
    tcfg = check_teacher(cfg, student)
    assert tcfg is not None, "load_teacher needs teacher.init"
    if is_run_workdir(where):
        _, graphdef, params = load_run_params(where, mesh)
    else:
        _, graphdef, params = load_base_params(tcfg, mesh)
    return graphdef, params
