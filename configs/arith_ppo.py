"""PPO with a learned critic (GAE) on the default recipe's task, CPU, minutes.

    rljax --config=configs/arith_ppo.py --workdir=/tmp/rljax/ppo              # sync
    rljax --config=configs/arith_ppo.py:eta2 --workdir=/tmp/rljax/ppo_eta2    # async, eta = 2
    rljax --config=configs/arith_ppo.py:small --workdir=/tmp/rljax/ppo_small  # < 1 minute

configs/arith_tiny.py's model, warm start and schedule, with the group baseline replaced by a
critic: a copy of the warm-started policy with a zero value head, trained beside it with the
clipped value loss (rljax.learner.critic). Each token's advantage is GAE's from the critic's
values at learn time, whitened over the batch (rljax.learner.token_advantages; gamma = lambda
= 1 as verl's default, so A_t = R - V_t). The critic trains alone for its first steps, so the
policy's first advantages already carry a baseline. ``:eta2`` is the async run on
configs/arith_async.py's 6/2 split of 8 CPU devices (JAX_NUM_CPU_DEVICES=8). Library code
builds it with ``rljax.configs.arith_ppo.recipe()``.
"""

import ml_collections
from rljax.configs import arith_tiny

from rljax.config import RunConfig, replace, to_config_dict

VARIANTS = ("sync", "eta2", "small")


def recipe(variant: str = "") -> RunConfig:
    """The typed config of a variant ('' is ``sync``); ``get_config`` wraps it."""
    if variant not in ("", *VARIANTS):
        raise ValueError(
            f"unknown variant {variant!r} of configs/arith_ppo.py; use one of {VARIANTS} or none"
        )
    cfg = replace(
        arith_tiny.recipe("small" if variant == "small" else ""),
        **{
            "learner.advantage": "gae",
            "learner.gamma": 1.0,
            "learner.lam": 1.0,
            "critic.enabled": True,
            "critic.init": "policy",
            "critic.learning_rate": 1e-3,
            "critic.warmup_steps": 0 if variant == "small" else 5,
        },
    )
    if variant == "eta2":
        cfg = replace(
            cfg,
            **{
                "mesh.mode": "split",
                "mesh.sampler_devices": 6,
                "mesh.learner_devices": 2,
                "mode": "async",
                "buffer.max_staleness": 2,
                "learner.loss": "decoupled_ppo",
            },
        )
    return cfg


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    return to_config_dict(recipe(arg or ""))
