"""Custom reward and loss functions that cannot work: refused by rljax.Run before any step."""

import jax.numpy as jnp
import pytest
from rljax.configs import arith_tiny

from rljax.learner.losses import Loss, grpo
from rljax.runtime.run import Run

CFG = arith_tiny.recipe("small")


def reward_one_arg(completion):
    return 1.0


async def reward_async(completion, example):
    return 1.0


REWARD_CASES = [
    ("F01", reward_one_arg, "give it two positional parameters"),
    ("F02", "exact_match", "pass a function: def reward(completion: str, example: dict)"),
    ("F03", reward_async, "the pool calls it synchronously"),
]


@pytest.mark.parametrize("row_id, fn, fix", REWARD_CASES, ids=[c[0] for c in REWARD_CASES])
def test_bad_reward_fn(refused, check_row, workdir, row_id, fn, fix):
    message = refused(lambda: Run(CFG, str(workdir), reward_fn=fn), TypeError, workdir)
    check_row(row_id, message, fix)


def loss_one_arg(x):
    return grpo(x, None)


def loss_scalar(x, cfg):
    per_token, metrics = grpo(x, cfg)
    return jnp.mean(per_token), metrics


def loss_no_metrics(x, cfg):
    return grpo(x, cfg)[0]


def loss_scalar_metric(x, cfg):
    per_token, _ = grpo(x, cfg)
    return per_token, {"ratio": jnp.mean(jnp.exp(x.logprobs - x.old_logprobs))}


def loss_typo(x, cfg):
    return -x.log_probs * x.advantages, {}


LOSS_CASES = [
    ("F04", grpo, TypeError, "wrap it as rljax.Loss(fn)"),
    ("F05", Loss(loss_one_arg), TypeError, "a loss maps (inputs: LossInputs, cfg: LearnerConfig)"),
    ("F06", Loss(loss_scalar), ValueError, "return one value per token (no reduction"),
    ("F07", Loss(loss_no_metrics), TypeError, "to (per-token loss [R, T], {metric name"),
    ("F08", Loss(loss_scalar_metric), ValueError, "the learner averages it over response"),
    ("F09", Loss(loss_typo), TypeError, "a loss maps (inputs: LossInputs, cfg: LearnerConfig)"),
]


@pytest.mark.parametrize("row_id, loss, error, fix", LOSS_CASES, ids=[c[0] for c in LOSS_CASES])
def test_bad_custom_loss(refused, check_row, workdir, row_id, loss, error, fix):
    message = refused(lambda: Run(CFG, str(workdir), loss=loss), error, workdir)
    check_row(row_id, message, fix)
