"""The supervised warm start before RL: cross-entropy on a teacher's answers (``cfg.sft``).

The teacher comes from the task (``rljax.data.teachers.TEACHERS``): the reference answers, or a
careless one. With ``sft.exact_steps`` the first steps imitate the reference answers. A teacher
of an agent task answers with a transcript (the model's turns and the env's replies); the
caller's ``encode`` renders it token-in/token-out, the env's tokens loss-masked.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np

from rljax.config import RunConfig
from rljax.data.pipeline import prompt_iterator
from rljax.data.teachers import Answer, teacher_answer
from rljax.learner.batch import TrainBatch, TrainSequence
from rljax.learner.learner import Learner
from rljax.metrics import MetricsWriter, Timeline


def warm_start(
    cfg: RunConfig,
    learner: Learner,
    examples: list[dict],
    *,
    encode: Callable[[dict, Answer], TrainSequence],
    pack: Callable[[list[TrainSequence], str], TrainBatch],
    metrics: MetricsWriter,
    timeline: Timeline,
) -> dict[str, float]:
    """Train ``learner``'s params for ``cfg.sft.steps`` steps; returns the last step's metrics.

    ``encode(example, answer)`` is what a teacher's answer (a string, or a transcript) trains.

    A learner of its own (the ``sft`` loss, its own rate, warmup and schedule) trains a copy of
    ``learner.params``, which then replace them; ``learner``'s optimiser state and version are
    untouched, so RL starts from step 0 of its own schedule.
    """
    s = cfg.sft
    if s.steps == 0:
        return {}
    data = prompt_iterator(
        examples[: s.num_examples or None], batch_size=s.batch_size, seed=cfg.seed + 1
    )
    sft_cfg = dataclasses.replace(
        cfg.learner,
        advantage="grpo",  # SFT reads no advantage; a per-token estimator's roles stay off
        kl_reward=0.0,
        warmup_steps=s.warmup_steps,
        decay_steps=s.steps - s.warmup_steps if s.schedule == "cosine" else 0,
    )
    sft = Learner(
        sft_cfg,
        learner.graphdef,
        learner.params,
        learner.mesh,
        loss="sft",
        learning_rate=s.learning_rate,
        kernel_impl=cfg.kernel_impl,
        router=learner.router,  # the router losses (a teacher's answers have no routes)
    )
    last: dict[str, float] = {}
    for step in range(s.steps):
        batch = next(data)
        rng = np.random.default_rng((cfg.seed, step))
        teacher = s.teacher if step >= s.exact_steps else "reference"
        seqs = [encode(ex, teacher_answer(teacher, ex, s.teacher_slip, rng)) for ex in batch]
        with timeline.span("sft_step"):
            last = sft.step(pack(seqs, "token_mean"))
        metrics.write(step, "sft", last)
    learner.params = sft.params
    if learner.critic is not None and cfg.critic.init == "policy":
        learner.restart_critic()  # from the warm-started policy, as critic.init says
    return last
