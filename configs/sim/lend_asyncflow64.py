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

from rljax.sim import scenario

VARIANTS = ("small",)


def get_config(arg: str = ""):
    """Builds the workload; ``arg="small"`` shrinks it for a quick run."""
    small = scenario.check_variant("configs/sim/lend_asyncflow64.py", arg, VARIANTS)
    steps = 12 if small else 40
    c = scenario.scenario(
        "lend_asyncflow64",
        model="qwen2.5-7b",
        chip="h20",
        tp=1,
        efficiencies=scenario.VERL_H20_EFFICIENCIES,
        train_flops=(8.0, 6.0),
        total_chips=64,
        steps=steps,
        batch_groups=256,
        group_size=16,
        prompt_tokens=200,
        lengths=dict(
            median=1200.0,
            sigma=0.8,
            tail_prob=0.01,
            max_tokens=8192,
            growth=1.0,
            growth_steps=steps,
        ),
        phase_steps=5,
    )
    return scenario.add_lending(c, eta=1, splits=[24, 32, 40] if small else list(range(8, 57, 8)))
