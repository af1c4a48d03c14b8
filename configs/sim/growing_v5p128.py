"""Reallocation vs every static split, and the 1,000-step pod-scale timing run.

Qwen2.5-7B GRPO on a TPU v5p-128 slice (64 chips, 4-chip decode replicas), B=64 prompts x
G=16 samples per step, eta=4. Response lengths grow over training as a policy learns to
reason longer: mean ~0.9k tokens at step 0 to ~8k at step 1000 (lognormal body, sigma 0.7,
generation limit 16k, 0.2% of responses never stop). Every static split with 16..48 sampler
chips (the 4-chip host granularity) runs the same workload; reallocation starts from the
smallest, the middle and the largest of them.

  python scripts/simulate.py --config=configs/sim/growing_v5p128.py
  python scripts/simulate.py --config=configs/sim/growing_v5p128.py:small   # 100 steps
"""

import ml_collections

VARIANTS = ("small",)  # small: 100 steps over three splits


def get_config(arg: str = "") -> ml_collections.ConfigDict:
    """Builds the scenario; ``arg="small"`` runs 100 steps over three splits."""
    if arg and arg not in VARIANTS:
        raise ValueError(
            f"unknown variant {arg!r} of configs/sim/growing_v5p128.py; "
            f"use one of {VARIANTS} or none"
        )
    small = arg == "small"
    c = ml_collections.ConfigDict()
    c.name = "growing_v5p128"
    c.model = "qwen2.5-7b"
    c.chip = "tpu-v5p"
    c.tp = 4
    # Generic efficiencies (fractions of datasheet peak), as in pod_compare; not fitted.
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
    c.phase_steps = 10
    c.switch_cost_s = -1.0  # < 0: estimate from the cost model (reshard + engine rebuild)
    c.seed = 0
    c.lengths = ml_collections.ConfigDict(
        dict(median=700.0, sigma=0.7, max_tokens=16384, growth=10.0, growth_steps=c.steps)
    )
    splits = [16, 32, 48] if small else list(range(16, 49, 4))
    c.growth = ml_collections.ConfigDict(
        dict(
            median=700.0,
            sigma=0.7,
            max_tokens=16384,
            growth=10.0,
            tail=0.002,
            eta=4,
            splits=splits,
            starts=[16, 32, 48],
            plot="" if small else "docs/sim_growing.png",
        )
    )
    c.etas, c.sampler_fractions, c.tails = [], [], []
    c.validation = ml_collections.ConfigDict(dict(enabled=False))
    c.perf_steps = 0  # the growth runs are the timed 1,000-step runs (wall_s, cpu_s in the output)
    c.plot = ""
    return c
