"""Lending vs static splits on the growing-length workload (Qwen2.5-7B, TPU v5p-128).

The workload of configs/sim/growing_v5p128.py (built by its ``workload``): 64 v5p chips, 4-chip
decode replicas, GRPO B = 64 x G = 16, eta = 4, 1,000 steps; response lengths lognormal (sigma
0.7, limit 16,384, 0.2% never stop) with a median growing 10x over the run. Generic
efficiencies, not fitted.

  python scripts/sim_lending.py --config=configs/sim/lend_growing_v5p128.py
  python scripts/sim_lending.py --config=configs/sim/lend_growing_v5p128.py:small
  (small: 100 steps, three splits)
"""

import pathlib

from rljax.sim import scenario

VARIANTS = ("small",)
_GROWING = pathlib.Path(__file__).with_name("growing_v5p128.py")


def get_config(arg: str = ""):
    """Builds the workload; ``arg="small"`` shrinks it for a quick run."""
    small = scenario.check_variant("configs/sim/lend_growing_v5p128.py", arg, VARIANTS)
    growing = scenario.load_config_module(_GROWING)
    c = growing.workload("lend_growing_v5p128", small)
    c.lengths.tail_prob = growing.TAIL
    splits = [24, 28, 32] if small else [16, 20, 24, 28, 32, 36, 40, 44, 48]
    return scenario.add_lending(c, eta=growing.ETA, splits=splits)
