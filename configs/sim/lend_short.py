"""Lending vs static splits on short responses, where lending should not pay.

Qwen2.5-7B on 64 TPU v5p chips (4-chip replicas), GRPO B = 64 x G = 16, eta = 1; responses
short and regular (median 150 tokens, sigma 0.3, limit 512, none runs to it), so a step lasts
seconds and the preparation and release costs of a loan eat any idle time. The policy should
decline, and lending cost at most 2% against the best static split.

  python scripts/sim_lending.py --config=configs/sim/lend_short.py
  python scripts/sim_lending.py --config=configs/sim/lend_short.py:small
  (small: 40 steps, three splits)
"""

import ml_collections

VARIANTS = ("small",)


def get_config(arg: str = "") -> ml_collections.ConfigDict:
    """Builds the workload; ``arg="small"`` shrinks it for a quick run."""
    if arg and arg not in VARIANTS:
        raise ValueError(
            f"unknown variant {arg!r} of configs/sim/lend_short.py; use one of {VARIANTS} or none"
        )
    small = arg == "small"
    c = ml_collections.ConfigDict()
    c.name = "lend_short"
    c.model = "qwen2.5-7b"
    c.chip = "tpu-v5p"
    c.tp = 4
    # Generic efficiencies (fractions of datasheet peak); not fitted.
    c.efficiencies = ml_collections.ConfigDict(
        dict(decode_hbm=0.6, decode_mfu=0.5, prefill_mfu=0.5, train_mfu=0.4, sync=0.5)
    )
    c.train_flops_per_param = ml_collections.ConfigDict(dict(sync=6.0, async_=6.0))
    c.total_chips = 64
    c.steps = 40 if small else 300
    c.batch_groups = 64
    c.group_size = 16
    c.prompt_tokens = 256
    c.max_slots = 256
    c.phase_steps = 10  # learner steps per lending (and reallocation) decision
    c.switch_cost_s = -1.0  # < 0: estimate from the cost model (reshard + engine rebuild)
    c.seed = 0
    c.lengths = ml_collections.ConfigDict(
        dict(
            median=150.0,
            sigma=0.3,
            tail_prob=0.0,
            max_tokens=512,
            growth=1.0,
            growth_steps=c.steps,
        )
    )
    c.lend = ml_collections.ConfigDict(
        dict(
            eta=1,
            splits=[16, 24, 32] if small else list(range(4, 57, 4)),
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
