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

from rljax.sim import scenario

VARIANTS = ("small",)  # small: 100 steps over three splits

# The workload, which configs/sim/lend_growing_v5p128.py runs too.
LENGTHS = dict(median=700.0, sigma=0.7, max_tokens=16384, growth=10.0)
TAIL = 0.002  # the share of responses that never stop (they run to max_tokens)
ETA = 4


def workload(name: str, small: bool) -> ml_collections.ConfigDict:
    """The workload's scenario fields (lengths without the tail, which each script places)."""
    steps = 100 if small else 1000
    return scenario.scenario(
        name,
        model="qwen2.5-7b",
        chip="tpu-v5p",
        tp=4,
        efficiencies=scenario.GENERIC_EFFICIENCIES,  # as in pod_compare; not fitted
        train_flops=(6.0, 6.0),
        total_chips=64,
        steps=steps,
        batch_groups=64,
        group_size=16,
        prompt_tokens=512,
        lengths=dict(LENGTHS, growth_steps=steps),
        phase_steps=10,
    )


def get_config(arg: str = "") -> ml_collections.ConfigDict:
    """Builds the scenario; ``arg="small"`` runs 100 steps over three splits."""
    small = scenario.check_variant("configs/sim/growing_v5p128.py", arg, VARIANTS)
    c = workload("growing_v5p128", small)
    c.growth = ml_collections.ConfigDict(
        dict(
            LENGTHS,
            tail=TAIL,
            eta=ETA,
            splits=[16, 32, 48] if small else list(range(16, 49, 4)),
            starts=[16, 32, 48],
            plot="" if small else "docs/sim_growing.png",
        )
    )
    # The growth runs are the timed 1,000-step runs (wall_s, cpu_s in the output): perf_steps 0.
    return c
