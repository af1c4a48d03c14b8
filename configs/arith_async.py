"""Asynchronous GRPO on 2-digit addition: 8 CPU devices split 6 sampler / 2 learner.

    JAX_NUM_CPU_DEVICES=8 rljax --config=configs/arith_async.py --workdir=/tmp/rljax/async
    JAX_NUM_CPU_DEVICES=8 rljax --config=configs/arith_async.py:eta2 --workdir=/tmp/rljax/eta2
    JAX_NUM_CPU_DEVICES=8 rljax --config=configs/arith_async.py:sync --workdir=/tmp/rljax/sync
    JAX_NUM_CPU_DEVICES=8 rljax --config=configs/arith_async.py:small --workdir=/tmp/rljax/s

The default recipe (configs/arith_tiny.py) on a 6/2 split. The sampler runs ahead of the
learner by at most eta = 1 (``:eta1``, the default; ``:eta2`` for 2) learner versions; the
decoupled PPO loss corrects for the staleness. ``:sync`` is the synchronous baseline on the
same 6/2 split, so both start from the same warm start (a learner mesh of another size sums in
another order, which moves the warm start's accuracy by a few points). ``:small`` is eta = 1
on the default recipe's small variant, seconds on the CPU. Fake CPU devices share 2 cores, so
this proves the pipeline, not speed (see scripts/bench_pipeline.py and rljax/sim for that).
"""

import ml_collections
from rljax.configs import arith_tiny

from rljax.config import RunConfig, replace, to_config_dict

VARIANTS = ("eta1", "eta2", "sync", "small")
_ETA = {"eta1": 1, "eta2": 2, "sync": 0, "small": 1}


def recipe(variant: str = "") -> RunConfig:
    """The typed config of a variant ('' is ``eta1``); ``get_config`` wraps it."""
    if variant not in ("", *VARIANTS):
        raise ValueError(
            f"unknown variant {variant!r} of configs/arith_async.py; "
            f"use one of {VARIANTS} or none"
        )
    variant = variant or "eta1"
    cfg = replace(
        arith_tiny.recipe("small" if variant == "small" else ""),
        **{
            "mesh.mode": "split",
            "mesh.sampler_devices": 6,
            "mesh.learner_devices": 2,
            "metrics.trace": True,
        },
    )
    eta = _ETA[variant]
    if eta == 0:  # the synchronous baseline on the same split (same warm start numerics)
        return cfg
    return replace(
        cfg, **{"mode": "async", "buffer.max_staleness": eta, "learner.loss": "decoupled_ppo"}
    )


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    return to_config_dict(recipe(arg or ""))
