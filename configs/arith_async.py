"""Asynchronous GRPO on 2-digit addition: 8 CPU devices split 6 sampler / 2 learner.

    JAX_NUM_CPU_DEVICES=8 rljax --config=configs/arith_async.py --workdir=/tmp/rljax/async
    JAX_NUM_CPU_DEVICES=8 rljax --config=configs/arith_async.py:eta2 --workdir=/tmp/rljax/eta2

The sampler runs ahead of the learner by at most eta = 1 (``:eta2`` for 2) learner versions;
the decoupled PPO loss corrects for the staleness. Fake CPU devices share 2 cores, so this
proves the pipeline, not speed (see scripts/bench_pipeline.py and rljax/sim for that).
"""

from rljax.config import replace, to_config_dict
from rljax.testing.configs import arith_tiny


def get_config(arg: str | None = None):
    eta = {"": 1, "eta1": 1, "eta2": 2}[arg or ""]
    cfg = replace(
        arith_tiny(),
        **{
            "mode": "async",
            "buffer.max_staleness": eta,
            "learner.loss": "decoupled_ppo",
            "mesh.mode": "split",
            "mesh.sampler_devices": 6,
            "mesh.learner_devices": 2,
            "metrics.trace": True,
        },
    )
    return to_config_dict(cfg)
