"""Validation against verl's published fully-async result (recipe/fully_async_policy README).

Published: Qwen2.5-Math-7B, DAPO, 128 H20 GPUs, 512 prompts x 16 samples per step, up to 28K
response tokens. Colocated sync: 356.30 s/step (gen 177.85, old_log_prob 53.92, update
113.81); fully async on a 64:64 split with staleness and partial rollout: 150.63 s/step
(update 113.16). Ratio 2.37.

  python scripts/simulate.py --config=configs/sim/verl_async_h20.py
"""

import ml_collections

VARIANTS = ("small",)  # small: 6 steps instead of 20


def get_config(arg: str = "") -> ml_collections.ConfigDict:
    """The verl case; ``arg="small"`` runs fewer steps."""
    if arg and arg not in VARIANTS:
        raise ValueError(
            f"unknown variant {arg!r} of configs/sim/verl_async_h20.py; "
            f"use one of {VARIANTS} or none"
        )
    c = ml_collections.ConfigDict()
    c.name = "verl_async_h20"
    c.model = "qwen2.5-7b"  # Qwen2.5-Math-7B has the same shapes
    c.chip = "h20"
    c.tp = 1
    # The two calibrated generic efficiencies (see docs/simulator.md): decode_hbm fitted so
    # that the colocated generation phase matches 178 s, train_mfu so that a 64-GPU update
    # matches 113 s. Everything else is left at the defaults.
    c.efficiencies = ml_collections.ConfigDict(
        dict(decode_hbm=0.5, decode_mfu=0.5, prefill_mfu=0.5, train_mfu=0.45, sync=0.5)
    )
    # verl's colocated trainer recomputes old log-probs (+2N per token); fully async uses the
    # rollout's log-probs.
    c.train_flops_per_param = ml_collections.ConfigDict(dict(sync=8.0, async_=6.0))
    c.total_chips = 128
    c.steps = 6 if arg == "small" else 20
    c.batch_groups = 512
    c.group_size = 16
    c.prompt_tokens = 200
    c.max_slots = 256  # vLLM max_num_seqs default
    c.phase_steps = 10
    c.switch_cost_s = -1.0
    c.seed = 0
    c.lengths = ml_collections.ConfigDict(
        dict(median=700.0, sigma=0.9, max_tokens=28_672, growth=1.0, growth_steps=400)
    )
    # eta=4: verl's partial rollout lets a long sample continue across parameter syncs, so
    # its oldest token can be several versions old (staleness_threshold=0.5 bounds sample
    # counts, not token ages).
    c.validation = ml_collections.ConfigDict(
        dict(enabled=True, sampler_chips=64, eta=4, tail=0.002, published_ratio=356.30 / 150.63)
    )
    c.etas, c.sampler_fractions, c.tails = [], [], []
    c.growth = ml_collections.ConfigDict(dict(median=0.0, growth=1.0, tail=0.0, eta=1))
    c.perf_steps = 0
    c.plot = ""
    return c
