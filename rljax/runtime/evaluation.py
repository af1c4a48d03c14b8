"""Held-out evaluation: greedy answers to the held-out split, scored.

The score is the run's reward, or with ``reward.heldout`` a verifier of its own: a run that
trains on a learned reward (a reward model, a judge) is still judged on what it is for. The
record then also holds the training reward's mean on the same answers
(``heldout_train_reward``) and how often it agrees with the verifier
(``heldout_reward_agreement``: the training reward above :data:`AGREEMENT_THRESHOLD` for its
kind, against the verifier's 1).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from rljax.config import RewardConfig
from rljax.engine.sampler import Trajectory
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


def evaluate(run: Any, step: int, phase: str) -> float:
    """Greedy accuracy of ``run``'s policy on the held-out split (``Run.evaluate``)."""
    examples = run.heldout_examples[: run.cfg.eval_examples]
    run._swap_to_latest()  # the driver's sampler swaps only when it generates
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
