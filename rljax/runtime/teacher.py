"""The teacher of on-policy distillation (``learner.advantage='opd'``), loaded for the learner.

``teacher.init`` names a run's workdir or one step of it (:mod:`rljax.models.saved_runs`: the
params, with the model, init and tokenizer its saved config records; a LoRA run's adapters
folded in), a Hugging Face directory, a GGUF file or 'smollm2'. The
teacher scores the student's tokens, so it must read them as the student wrote them: its
tokenizer is compared with the policy's before any weight loads, and a different one is refused
in one line (:func:`check_same_tokenizer`).

Where it lives: the learner mesh (``teacher.devices=()``), or a mesh of its own over
``teacher.devices`` (:func:`teacher_mesh`; :class:`~rljax.learner.scoring.TeacherMesh` scores
there). Those devices are refused in one line (:func:`check_teacher_devices`) past this
process's devices, on a pod, or, in split mode, where the sampler or the learner may run.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
from jax.sharding import Mesh

from rljax.config import ConfigError, LoRAConfig, RunConfig, replace
from rljax.learner.roles import Teacher
from rljax.models import saved_runs
from rljax.models.loading import load_base_params, load_saved_run, load_tokenizer
from rljax.models.tokenizer import Tokenizer
from rljax.rewards.model import local_mesh


def teacher_run_config(cfg: RunConfig) -> RunConfig:
    """What the teacher is, as a run config: the saved config of a run's step (a LoRA run's
    adapters are folded into its weights when it loads), or ``cfg`` with ``init`` (and
    ``tokenizer``) the teacher's."""
    t = cfg.teacher
    run = saved_runs.parse(t.init)
    if run is not None:
        return saved_runs.saved_config(run, "config key 'teacher.init'")
    return replace(cfg, init=t.init, tokenizer=t.tokenizer, lora=LoRAConfig())


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


def teacher_mesh(cfg: RunConfig) -> Mesh | None:
    """The teacher's own mesh over ``teacher.devices`` ('data' axis: weights replicated, rows
    split), or None: the learner's."""
    return local_mesh(cfg.teacher.devices, "teacher.devices") if cfg.teacher.devices else None


def check_teacher_devices(cfg: RunConfig, devices: Sequence[jax.Device] | None = None) -> None:
    """Refuses, in one line, ``teacher.devices`` on a pod, past this process's devices, or in
    split mode on one the sampler or the learner may take: the first sampler + learner of the
    run's ``devices`` (default ``jax.devices()``), the largest of the first split and the
    scheduled ones (a reallocation moves chips between the two, keeping their sum)."""
    picked = cfg.teacher.devices
    if not picked:
        return
    key = f"config key 'teacher.devices' = {picked!r}"
    if jax.process_count() > 1:
        raise ConfigError(
            f"{key} on a run of {jax.process_count()} processes; a teacher mesh of its own "
            "holds one process's devices: set teacher.devices=() (the learner mesh)"
        )
    local = teacher_mesh(cfg)  # refuses an index past this process's devices
    assert local is not None
    m = cfg.mesh
    if m.mode != "split":
        return  # colocated: both roles use every device, and the teacher shares them
    splits = [(m.sampler_devices, m.learner_devices), *m.scheduled_splits().values()]
    total = max(s + n for s, n in splits)
    taken = list(jax.devices() if devices is None else devices)[:total]
    for i in picked:
        if jax.local_devices()[i] in taken:
            raise ConfigError(
                f"{key} names local device {i}, which mesh.mode='split' gives the sampler or "
                f"the learner (the run's first {total} devices, resizes included); pick devices "
                "neither mesh takes, or set teacher.devices=() (the learner mesh)"
            )


def check_teacher(
    cfg: RunConfig, student: Tokenizer, devices: Sequence[jax.Device] | None = None
) -> RunConfig | None:
    """The teacher's run config (None without one), once it is known to load as a teacher,
    to share the ``student``'s tokenizer and to have devices of its own it may use
    (:func:`check_teacher_devices`; no weight is read: the run checks this before it
    writes)."""
    where = cfg.teacher.init
    if not where:
        return None
    check_teacher_devices(cfg, devices)
    tcfg = teacher_run_config(cfg)
    try:
        tokenizer = load_tokenizer(tcfg)
    except ConfigError as e:
        raise ConfigError(f"config key 'teacher.init' = {where!r}: {e}") from None
    check_same_tokenizer(student, tokenizer, where)
    return tcfg


def load_teacher(cfg: RunConfig, mesh: Mesh, student: Tokenizer) -> Teacher:
    """The teacher on the learner's ``mesh``, or on its own (``teacher.devices``), after
    :func:`check_teacher`."""
    where = cfg.teacher.init
    tcfg = check_teacher(cfg, student)
    assert tcfg is not None, "load_teacher needs teacher.init"
    own = teacher_mesh(cfg)
    on = mesh if own is None else own
    run = saved_runs.parse(where)
    if run is not None:
        _, graphdef, params, _ = load_saved_run(run, on, "config key 'teacher.init'")
    else:
        _, graphdef, params = load_base_params(tcfg, on)
    return Teacher(graphdef, params, own)
