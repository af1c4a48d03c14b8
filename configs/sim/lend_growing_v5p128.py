"""Lending vs static splits on the growing-length workload (Qwen2.5-7B, TPU v5p-128).

The workload of configs/sim/growing_v5p128.py: 64 v5p chips, 4-chip decode replicas, GRPO
B = 64 x G = 16, eta = 4, 1,000 steps; response lengths lognormal (sigma 0.7, limit 16,384,
0.2% never stop) with a median growing 10x over the run. Generic efficiencies, not fitted.

  python scripts/sim_lending.py --config=configs/sim/lend_growing_v5p128.py
  python scripts/sim_lending.py --config=configs/sim/lend_growing_v5p128.py:small
  (small: 100 steps, three splits)
"""

import ml_collections

VARIANTS = ("small",)


def get_config(arg: str = "") -> ml_collections.ConfigDict:
    """Builds the workload; ``arg="small"`` shrinks it for a quick run."""
    if arg and arg not in VARIANTS:
        raise ValueError(
            f"unknown variant {arg!r} of configs/sim/lend_growing_v5p128.py; "
            f"use one of {VARIANTS} or none"
        )
    small = arg == "small"
    c = ml_collections.ConfigDict()
    c.name = "lend_growing_v5p128"
    c.model = "qwen2.5-7b"
    c.chip = "tpu-v5p"
    c.tp = 4
    # Generic efficiencies (fractions of datasheet peak), as in growing_v5p128; not fitted.
    c.efficiencies = ml_collections.ConfigDict(
        dict(decode_hbm=0.6, decode_mfu=0.5, prefill_mfu=0.5, train_mfu=0.4, sync=0.5)
    )
    c.train_flops_per_param = ml_collections.ConfigDict(dict(sync=6.0, async_=6.0))
    c.total_chips = 64
    c.steps = 100 if small else 1000
    c.batch_groups = 64
    c.group_size = 16
    c.prompt_tokens = 512
    c.max_slots = 256
    c.phase_steps = 10  # learner steps per lending (and reallocation) decision
    c.switch_cost_s = -1.0  # < 0: estimate from the cost model (reshard + engine rebuild)
    c.seed = 0
    c.lengths = ml_collections.ConfigDict(
        dict(
            median=700.0,
            sigma=0.7,
            tail_prob=0.002,
            max_tokens=16384,
            growth=10.0,
            growth_steps=c.steps,
        )
    )
    c.lend = ml_collections.ConfigDict(
        dict(
            eta=4,
            splits=[24, 28, 32] if small else [16, 20, 24, 28, 32, 36, 40, 44, 48],
            # LendingConfig overrides (none: the documented defaults, not tuned here).
            lending=dict(),
            perf_steps=0,
        )
    )
    c.etas, c.sampler_fractions, c.tails = [], [], []
    c.validation = ml_collections.ConfigDict(dict(enabled=False))
    c.growth = ml_collections.ConfigDict(dict(median=0.0, growth=1.0, tail=0.0, eta=1))
    c.perf_steps = 0
    c.plot = ""
    return c
