"""The default recipe, rewarded by a reward model instead of exact match: train it, then GRPO.

    rljax --workdir=/tmp/rljax/arith_tiny --config.checkpoint.enabled=True       # step 1
    rljax --workdir=/tmp/rljax/warm_start --config.checkpoint.enabled=True --config.num_steps=0
    python scripts/train_rm.py --out=/tmp/rljax/arith_rm/reward_model          # step 2
    rljax --config=configs/arith_rm.py --workdir=/tmp/rljax/arith_rm           # step 3
    rljax --config=configs/arith_rm.py:small --workdir=/tmp/rljax/arith_rm_small  # < 1 minute

Step 1 saves the default recipe's trained model (the reward model's trunk) and its warm start
alone; both write the wrong answers the reward model learns from, beside made-up ones. Step 2
trains a tiny ``LlamaForSequenceClassification`` (that trunk with a score head) to tell correct
sums from wrong ones (scripts/train_rm.py). Step 3 is configs/arith_tiny.py with
``reward.name='model'``: the reward of a completion is that model's score of the prompt and the
completion (a logit, unbounded; GRPO normalises it within each group), and nothing else. The
held-out accuracy is still exact match (``reward.heldout``), and each evaluation records the
reward model's mean score and its agreement with exact match on the same answers
(rljax.runtime.evaluation). Point ``--config.reward.model.path`` elsewhere to use another reward
model.

Seeds 0-4 (docs/benchmarks.md, "Reward model"): held-out exact match from a median 32.0 % to
74.6 % [69.1, 88.3] at step 150, +41.4 points [+38.7, +56.2], the reward model agreeing with
exact match on 0.87 [0.75, 0.91] of the final answers; 143-155 s a run. A reward model trained
on one fixed wrong answer per problem was over-optimised within 25 steps (it read the ones digit
and the length, not the carry).
"""

import ml_collections
from rljax.configs import arith_tiny

from rljax.config import RewardConfig, RewardModelConfig, RunConfig, replace, to_config_dict

VARIANTS = arith_tiny.VARIANTS  # small: the same run shrunk to well under a minute
REWARD_MODEL = "/tmp/rljax/arith_rm/reward_model"  # where step 1 writes it by default


def recipe(variant: str = "") -> RunConfig:
    """The typed config of a variant ('' for the full run); ``get_config`` wraps it."""
    if variant not in ("", *VARIANTS):
        raise ValueError(
            f"unknown variant {variant!r} of configs/arith_rm.py; use one of {VARIANTS} or none"
        )
    reward = RewardConfig(
        name="model",
        model=RewardModelConfig(path=REWARD_MODEL, batch_size=64),
        timeout_s=60.0,  # a whole step's groups in one call
        num_workers=1,  # one model on one device: a second worker would wait for it
        heldout="exact_match",  # judged on the task, not on the reward model's opinion
    )
    return replace(arith_tiny.recipe(variant), reward=reward)


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    return to_config_dict(recipe(arg or ""))
