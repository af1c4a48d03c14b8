"""Lending vs static splits on a 64-chip one-step-off workload modelled on AsyncFlow's.

AsyncFlow (arXiv 2507.01663) compares its streaming, one-step-off-policy pipeline on 64 NPUs
with on-policy baselines. Its per-phase setup was not available to this study, so every knob
below is an assumption, stated: Qwen2.5-7B, 64 chips with H20 figures (Ascend chips are not in
rljax/sim/chips.py) and the verl-fitted efficiencies, GRPO B = 256 x G = 16, eta = 1 (the
deferred parameter update within a staleness of one), responses up to 8K tokens (median 1,200,
sigma 0.8, 1% run to the limit).

  python scripts/sim_lending.py --config=configs/sim/lend_asyncflow64.py
  python scripts/sim_lending.py --config=configs/sim/lend_asyncflow64.py:small
  (small: 12 steps, three splits)
"""

import ml_collections

VARIANTS = ("small",)


def get_config(arg: str = "") -> ml_collections.ConfigDict:
    """Builds the workload; ``arg="small"`` shrinks it for a quick run."""
    if arg and arg not in VARIANTS:
        raise ValueError(
            f"unknown variant {arg!r} of configs/sim/lend_asyncflow64.py; "
            f"use one of {VARIANTS} or none"
        )
    small = arg == "small"
    c = ml_collections.ConfigDict()
    c.name = "lend_asyncflow64"
    c.model = "qwen2.5-7b"
    c.chip = "h20"
    c.tp = 1
    # decode_hbm and train_mfu fitted to verl's 32-GPU colocated phases (nominal knobs).
    c.efficiencies = ml_collections.ConfigDict(
        dict(decode_hbm=0.3897, decode_mfu=0.5, prefill_mfu=0.5, train_mfu=0.3628, sync=0.5)
    )
    c.train_flops_per_param = ml_collections.ConfigDict(dict(sync=8.0, async_=6.0))
    c.total_chips = 64
    c.steps = 12 if small else 40
    c.batch_groups = 256
    c.group_size = 16
    c.prompt_tokens = 200
    c.max_slots = 256
    c.phase_steps = 5  # learner steps per lending (and reallocation) decision
    c.switch_cost_s = -1.0  # < 0: estimate from the cost model (reshard + engine rebuild)
    c.seed = 0
    c.lengths = ml_collections.ConfigDict(
        dict(
            median=1200.0,
            sigma=0.8,
            tail_prob=0.01,
            max_tokens=8192,
            growth=1.0,
            growth_steps=c.steps,
        )
    )
    c.lend = ml_collections.ConfigDict(
        dict(
            eta=1,
            splits=[24, 32, 40] if small else list(range(8, 57, 8)),
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
