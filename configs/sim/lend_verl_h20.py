"""Lending vs static splits on a long-tail workload modelled on verl's 128-GPU case.

verl recipe/fully_async_policy (github.com/volcengine/verl): Qwen2.5-Math-7B, DAPO, 128 H20,
512 prompts x 16 samples per step, responses up to 28K tokens, fully async with staleness and
partial rollout (eta = 4 here). Unpublished knobs at the validation's nominal values: prompt
200 tokens, response median 700 (lognormal sigma 0.9), 0.2% of responses run to the limit.
Efficiencies: the values fitted to verl's 32-GPU colocated per-phase times (docs/simulator.md),
not refitted here.

  python scripts/sim_lending.py --config=configs/sim/lend_verl_h20.py
  python scripts/sim_lending.py --config=configs/sim/lend_verl_h20.py:small
  (small: 12 steps, three splits)
"""

import ml_collections

VARIANTS = ("small",)


def get_config(arg: str = "") -> ml_collections.ConfigDict:
    """Builds the workload; ``arg="small"`` shrinks it for a quick run."""
    if arg and arg not in VARIANTS:
        raise ValueError(
            f"unknown variant {arg!r} of configs/sim/lend_verl_h20.py; "
            f"use one of {VARIANTS} or none"
        )
    small = arg == "small"
    c = ml_collections.ConfigDict()
    c.name = "lend_verl_h20"
    c.model = "qwen2.5-7b"
    c.chip = "h20"
    c.tp = 1
    # decode_hbm and train_mfu fitted to verl's 32-GPU colocated phases (nominal knobs).
    c.efficiencies = ml_collections.ConfigDict(
        dict(decode_hbm=0.3897, decode_mfu=0.5, prefill_mfu=0.5, train_mfu=0.3628, sync=0.5)
    )
    c.train_flops_per_param = ml_collections.ConfigDict(dict(sync=8.0, async_=6.0))
    c.total_chips = 128
    c.steps = 12 if small else 40
    c.batch_groups = 512
    c.group_size = 16
    c.prompt_tokens = 200
    c.max_slots = 256
    c.phase_steps = 5  # learner steps per lending (and reallocation) decision
    c.switch_cost_s = -1.0  # < 0: estimate from the cost model (reshard + engine rebuild)
    c.seed = 0
    c.lengths = ml_collections.ConfigDict(
        dict(
            median=700.0,
            sigma=0.9,
            tail_prob=0.002,
            max_tokens=28672,
            growth=1.0,
            growth_steps=c.steps,
        )
    )
    c.lend = ml_collections.ConfigDict(
        dict(
            eta=4,
            splits=[40, 48, 56] if small else [32, 40, 48, 56, 64, 72, 80, 88, 96],
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
