"""Lending vs static splits on short responses, where lending should not pay.

Qwen2.5-7B on 64 TPU v5p chips (4-chip replicas), GRPO B = 64 x G = 16, eta = 1; responses
short and regular (median 150 tokens, sigma 0.3, limit 512, none runs to it), so a step lasts
seconds and the preparation and release costs of a loan eat any idle time. The policy should
decline, and lending cost at most 2% against the best static split.

  python scripts/sim_lending.py --config=configs/sim/lend_short.py
  python scripts/sim_lending.py --config=configs/sim/lend_short.py:small
  (small: 40 steps, three splits)
"""

from rljax.sim import scenario

VARIANTS = ("small",)


def get_config(arg: str = ""):
    """Builds the workload; ``arg="small"`` shrinks it for a quick run."""
    small = scenario.check_variant("configs/sim/lend_short.py", arg, VARIANTS)
    steps = 40 if small else 300
    c = scenario.scenario(
        "lend_short",
        model="qwen2.5-7b",
        chip="tpu-v5p",
        tp=4,
        efficiencies=scenario.GENERIC_EFFICIENCIES,  # not fitted
        train_flops=(6.0, 6.0),
        total_chips=64,
        steps=steps,
        batch_groups=64,
        group_size=16,
        prompt_tokens=256,
        lengths=dict(
            median=150.0, sigma=0.3, tail_prob=0.0, max_tokens=512, growth=1.0, growth_steps=steps
        ),
        phase_steps=10,
    )
    return scenario.add_lending(c, eta=1, splits=[16, 24, 32] if small else list(range(4, 57, 4)))
