"""Asynchronous GRPO on 2-digit addition: 8 CPU devices split 6 sampler / 2 learner.

    JAX_NUM_CPU_DEVICES=8 rljax --config=configs/arith_async.py --workdir=/tmp/rljax/async
    JAX_NUM_CPU_DEVICES=8 rljax --config=configs/arith_async.py:eta2 --workdir=/tmp/rljax/eta2
    JAX_NUM_CPU_DEVICES=8 rljax --config=configs/arith_async.py:sync --workdir=/tmp/rljax/sync

The sampler runs ahead of the learner by at most eta = 1 (``:eta2`` for 2) learner versions;
the decoupled PPO loss corrects for the staleness. ``:sync`` is the synchronous baseline on the
same 6/2 split, so both start from the same warm start (a learner mesh of another size sums in
another order, which moves the warm start's accuracy by a few points). Fake CPU devices share
2 cores, so this proves the pipeline, not speed (see scripts/bench_pipeline.py and rljax/sim
for that).
"""

from rljax.config import replace, to_config_dict
from rljax.testing.configs import arith_tiny


def get_config(arg: str | None = None):
    variants = {"": 1, "eta1": 1, "eta2": 2, "sync": 0}
    if (arg or "") not in variants:
        raise ValueError(f"unknown arith_async variant {arg!r}; use one of {sorted(variants)}")
    eta = variants[arg or ""]
    split = {
        "mesh.mode": "split",
        "mesh.sampler_devices": 6,
        "mesh.learner_devices": 2,
        "metrics.trace": True,
    }
    if eta == 0:  # the synchronous baseline on the same split (same warm start numerics)
        return to_config_dict(replace(arith_tiny(), **split))
    cfg = replace(
        arith_tiny(),
        **split,
        **{"mode": "async", "buffer.max_staleness": eta, "learner.loss": "decoupled_ppo"},
    )
    return to_config_dict(cfg)
