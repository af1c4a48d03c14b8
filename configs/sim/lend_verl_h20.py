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

from rljax.sim import scenario

VARIANTS = ("small",)


def get_config(arg: str = ""):
    """Builds the workload; ``arg="small"`` shrinks it for a quick run."""
    small = scenario.check_variant("configs/sim/lend_verl_h20.py", arg, VARIANTS)
    steps = 12 if small else 40
    c = scenario.scenario(
        "lend_verl_h20",
        model="qwen2.5-7b",
        chip="h20",
        tp=1,
        efficiencies=scenario.VERL_H20_EFFICIENCIES,
        train_flops=(8.0, 6.0),
        total_chips=128,
        steps=steps,
        batch_groups=512,
        group_size=16,
        prompt_tokens=200,
        lengths=dict(
            median=700.0,
            sigma=0.9,
            tail_prob=0.002,
            max_tokens=28672,
            growth=1.0,
            growth_steps=steps,
        ),
        phase_steps=5,
    )
    splits = [40, 48, 56] if small else [32, 40, 48, 56, 64, 72, 80, 88, 96]
    return scenario.add_lending(c, eta=4, splits=splits)
