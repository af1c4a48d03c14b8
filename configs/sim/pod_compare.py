"""Pod-scale comparison: sync colocated vs async static split vs async with reallocation.

Qwen2.5-7B on a 256-chip TPU v5p slice, GRPO with B=32 prompts x G=16 samples per step,
swept over eta and the length of the response tail; a second workload has response lengths
that triple over training, where a static split tuned for the start is wrong by the end.

  python scripts/simulate.py --config=configs/sim/pod_compare.py
  python scripts/simulate.py --config=configs/sim/pod_compare.py:small   # seconds, for CI
"""

import ml_collections

VARIANTS = ("small",)  # small: 64 chips, 30 steps, a few seconds


def get_config(arg: str = "") -> ml_collections.ConfigDict:
    """Builds the sweep; ``arg="small"`` shrinks it to a few seconds."""
    if arg and arg not in VARIANTS:
        raise ValueError(
            f"unknown variant {arg!r} of configs/sim/pod_compare.py; "
            f"use one of {VARIANTS} or none"
        )
    small = arg == "small"
    c = ml_collections.ConfigDict()
    c.name = "pod_compare"
    c.model = "qwen2.5-7b"
    c.chip = "tpu-v5p"
    c.tp = 4  # chips per sampler replica
    # Generic efficiencies (fractions of datasheet peak); not fitted to this scenario.
    c.efficiencies = ml_collections.ConfigDict(
        dict(decode_hbm=0.6, decode_mfu=0.5, prefill_mfu=0.5, train_mfu=0.4, sync=0.5)
    )
    c.train_flops_per_param = ml_collections.ConfigDict(dict(sync=6.0, async_=6.0))
    c.total_chips = 64 if small else 256
    c.steps = 30 if small else 300
    c.batch_groups = 32
    c.group_size = 16
    c.prompt_tokens = 256
    c.max_slots = 256
    c.etas = [1, 4] if small else [1, 2, 4]
    # Static splits tried (sampler fraction of the chips); the best one is the baseline that
    # reallocation must beat. Reallocation starts from the middle one.
    c.sampler_fractions = [0.5, 0.75] if small else [0.375, 0.5, 0.625, 0.75, 0.875]
    c.phase_steps = 10
    c.switch_cost_s = -1.0  # < 0: estimate from the cost model (reshard + engine rebuild)
    c.lengths = ml_collections.ConfigDict(
        dict(median=1024.0, sigma=0.7, max_tokens=8192, growth=1.0, growth_steps=300)
    )
    c.tails = [0.0, 0.05] if small else [0.0, 0.02, 0.08]  # P(response hits max_tokens)
    # Growing-length workload for the reallocation-vs-best-static figure.
    c.growth = ml_collections.ConfigDict(dict(median=400.0, growth=4.0, tail=0.02, eta=2))
    c.validation = ml_collections.ConfigDict(dict(enabled=False))
    c.perf_steps = 100 if small else 1000  # the timed pod-scale run
    c.plot = "" if small else "docs/sim_timeline.png"
    c.seed = 0
    return c
