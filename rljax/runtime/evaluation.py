"""Held-out evaluation: greedy answers to the held-out split, scored; or, with ``eval.k`` and
``eval.temperature``, k samples per problem, logged with ``rljax eval``'s figures (avg@k, pass@j,
maj@k, length, cut fraction: :mod:`rljax.eval.problems`).

The score is the run's reward, or with ``reward.heldout`` a verifier of its own: a run that
trains on a learned reward (a reward model, a judge) is still judged on what it is for. The
record then also holds the training reward's mean on the same answers
(``heldout_train_reward``) and how often it agrees with the verifier
(``heldout_reward_agreement``: the training reward above :data:`AGREEMENT_THRESHOLD` for its
kind, against the verifier's 1).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from rljax.config import RewardConfig
from rljax.engine.sampler import Trajectory
from rljax.engine.samples import FINISH_LENGTH
from rljax.engine.state import SlotSampling
from rljax.eval.problems import CORRECT_ABOVE, Problem, Sample, answer_key, summary
from rljax.rewards.registry import get_reward
from rljax.runtime.prompts import task_example
from rljax.runtime.scoring import completion_text

# Where a training reward says "correct": a reward model's logit above 0, anything else (a
# verifier's 0/1, a judge's [0, 1]) above one half.
AGREEMENT_THRESHOLD = {"model": 0.0}


def heldout_scores(
    cfg: RewardConfig, tokenizer: Any, trajs: list[Trajectory], rewards: np.ndarray
) -> tuple[np.ndarray, dict[str, float]]:
    """The held-out score of each trajectory (``rewards``, the run's, without
    ``reward.heldout``), and the record's extra figures."""
    if not cfg.heldout:
        return rewards, {}
    verifier = get_reward(cfg.heldout, key="reward.heldout")
    verdicts = np.asarray(
        [float(verifier(completion_text(tokenizer, t), task_example(t.payload))) for t in trajs]
    )
    above = rewards > AGREEMENT_THRESHOLD.get(cfg.name, 0.5)
    return verdicts, {
        "heldout_train_reward": float(np.mean(rewards)),
        "heldout_reward_agreement": float(np.mean(above == (verdicts > 0.5))),
    }


def sample_problems(
    run: Any, examples: list[dict], k: int, sampling: SlotSampling, bar: Any = None
) -> list[Problem]:
    """``k`` samples of each of ``examples`` from ``run``'s sampler, scored (a failed reward
    is wrong), problem by problem. The problems go in chunks that fill the slots about twice,
    so ``bar`` (a tqdm bar, or None) moves as they finish."""
    chunk = max(1, 2 * run.cfg.sampling.max_concurrent_decodes // k)
    problems: list[Problem] = []
    for start in range(0, len(examples), chunk):
        part = examples[start : start + chunk]
        requests = [
            run.make_request(ex, start + i, samples=k, sampling=sampling)
            for i, ex in enumerate(part)
        ]
        trajs = run.sampler.run(requests)  # in the order they finished
        rewards = np.nan_to_num(run.score(trajs), nan=0.0)
        scores, _ = heldout_scores(run.cfg.reward, run.tokenizer, trajs, rewards)
        by_problem: dict[int, list[tuple[int, Sample]]] = {}
        for t, score in zip(trajs, scores, strict=True):
            text = completion_text(run.tokenizer, t)
            sample = Sample(
                text=text,
                answer=answer_key(text),
                score=float(score),
                correct=bool(score > CORRECT_ABOVE),
                tokens=len(t.response_tokens),
                truncated=t.finish_reason == FINISH_LENGTH,
            )
            by_problem.setdefault(t.group_id, []).append((t.sample_index, sample))
        for i, ex in enumerate(part):
            samples = sorted(by_problem.get(start + i, []), key=lambda x: x[0])
            problems.append(Problem(start + i, ex, [s for _, s in samples]))
        if bar is not None:
            bar.update(len(part))
    run.env_metrics.skip(getattr(run.sampler, "stats", None))  # train steps' alone
    return problems


def evaluate(run: Any, step: int, phase: str) -> float:
    """Held-out accuracy of ``run``'s policy (``Run.evaluate``): greedy, or with ``eval.k``
    samples per problem their mean accuracy (avg@k), the record holding every figure."""
    examples = run.heldout_examples[: run.cfg.eval_examples]
    run._swap_to_latest()  # the driver's sampler swaps only when it generates
    e = run.cfg.eval
    if e.k > 1 or e.temperature > 0:
        with run.timeline.span("eval"):
            sampling = dataclasses.replace(
                SlotSampling.from_config(run.cfg.sampling), temperature=e.temperature
            )
            problems = sample_problems(run, examples, e.k, sampling)
        figures = summary(problems, e.k)
        acc = float(figures["avg@k"]["mean"])
        record = {"heldout_accuracy": acc, "examples": len(examples), "eval_k": e.k}
        record |= {f"eval/{n}": v["mean"] for n, v in figures.items() if isinstance(v, dict)}
        record |= {f"eval/{n}_se": v["se"] for n, v in figures.items() if isinstance(v, dict)}
        shares = [p.correct / e.k for p in problems]  # each problem's share of right samples
        run.metrics.write(step, phase, record | {"heldout_rewards": shares})
        return acc
    with run.timeline.span("eval"):
        requests = [run.make_request(ex, i, greedy=True) for i, ex in enumerate(examples)]
        trajs = run.sampler.run(requests)  # in the order they finished
        rewards = np.nan_to_num(run.score(trajs), nan=0.0)  # a failed reward is wrong
        rewards, extra = heldout_scores(run.cfg.reward, run.tokenizer, trajs, rewards)
    run.env_metrics.skip(getattr(run.sampler, "stats", None))  # train steps' alone
    by_problem = np.zeros(len(examples))
    by_problem[[t.group_id for t in trajs]] = rewards  # group_id: the request's index
    acc = float(np.mean(rewards))
    record = {"heldout_accuracy": acc, "examples": len(examples), **extra}
    run.metrics.write(step, phase, record | {"heldout_rewards": by_problem.tolist()})
    return acc
