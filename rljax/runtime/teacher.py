"""The teacher of on-policy distillation (``learner.advantage='opd'``), loaded for the learner.

``teacher.init`` names a run's workdir or one step of it (:mod:`rljax.models.saved_runs`: the
params, with the model, init and tokenizer its saved config records; a LoRA run's adapters
folded in), a Hugging Face directory, a GGUF file or 'smollm2'. The
teacher scores the student's tokens, so it must read them as the student wrote them: its
tokenizer is compared with the policy's before any weight loads, and a different one is refused
in one line (:func:`check_same_tokenizer`).
"""

from __future__ import annotations

from typing import Any

from flax import nnx
from jax.sharding import Mesh

from rljax.config import ConfigError, LoRAConfig, RunConfig, replace
from rljax.models import saved_runs
from rljax.models.loading import load_base_params, load_saved_run, load_tokenizer
from rljax.models.tokenizer import Tokenizer


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


def check_teacher(cfg: RunConfig, student: Tokenizer) -> RunConfig | None:
    """The teacher's run config (None without one), once it is known to load as a teacher and
    to share the ``student``'s tokenizer (no weight is read: the run checks this before it
    writes)."""
    where = cfg.teacher.init
    if not where:
        return None
    tcfg = teacher_run_config(cfg)
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
    run = saved_runs.parse(where)
    if run is not None:
        _, graphdef, params, _ = load_saved_run(run, mesh, "config key 'teacher.init'")
    else:
        _, graphdef, params = load_base_params(tcfg, mesh)
    return graphdef, params
