"""One simulated run's settings (:class:`SimConfig`); :mod:`rljax.sim.simulator` runs it.

The reallocation policy's settings are the runtime's own section,
:class:`~rljax.policy.reallocation.ReallocatorConfig` (``RunConfig.reallocator``), so a policy
tuned here is configured the same way in a real run.
"""

from __future__ import annotations

import dataclasses

from rljax.policy.lending import LendingConfig
from rljax.policy.reallocation import ReallocatorConfig

MODES = ("sync", "async", "realloc", "lend")


@dataclasses.dataclass(frozen=True)
class SimConfig:
    """One simulated run.

    Attributes:
      mode: "sync" | "async" | "realloc" | "lend" (see ``rljax.sim.simulator``).
      total_chips: chips in the job.
      sampler_chips: chips on the sampler mesh at the start (ignored by "sync").
      steps: learner steps to simulate.
      batch_groups: B, groups per learner step.
      group_size: G, samples per group.
      prompt_tokens: prompt length of every group.
      max_staleness: eta; "sync" requires 0.
      overprovision: k extra reservations per buffer (redundant rollout).
      max_slots: cap on concurrent sequences per replica (the engine's batch size).
      train_flops_per_param: overrides the cost model's per-token training FLOPs / N (e.g. 8
        when the stack recomputes old log-probs), or None to keep the cost model's.
      sync_pauses_sampler: whether sampler replicas stall while a weight broadcast lands.
      phase_steps: learner steps per reallocation (or lending) phase.
      switch_cost_s: stall of one reallocation; None estimates it from the cost model.
      granularity: chips move in units of this many; None = the chip's chips_per_host.
      reallocator: policy knobs (minimum chips default to what holds the model).
      lending: the lending policy's knobs (RunConfig's ``lending`` section); None in mode
        "lend" means ``LendingConfig(enabled=True)``.
      seed: seeds the length draws.
      timeline: record spans for plotting.
    """

    mode: str = "async"
    total_chips: int = 64
    sampler_chips: int = 32
    steps: int = 100
    batch_groups: int = 32
    group_size: int = 16
    prompt_tokens: int = 256
    max_staleness: int = 1
    overprovision: int = 0
    max_slots: int = 256
    train_flops_per_param: float | None = None
    sync_pauses_sampler: bool = True
    phase_steps: int = 5
    switch_cost_s: float | None = None
    granularity: int | None = None
    reallocator: ReallocatorConfig | None = None
    lending: LendingConfig | None = None
    seed: int = 0
    timeline: bool = True

    def __post_init__(self):
        if self.mode not in MODES:
            raise ValueError(f"mode={self.mode!r} is unknown; choose one of {MODES}")
        if self.mode == "sync" and self.max_staleness != 0:
            raise ValueError("mode='sync' is on-policy: set max_staleness=0 (or use mode='async')")
        if self.mode != "sync" and not 0 < self.sampler_chips < self.total_chips:
            raise ValueError(
                f"sampler_chips={self.sampler_chips} must leave chips for both meshes of "
                f"total_chips={self.total_chips}; pick 0 < sampler_chips < total_chips"
            )
        if min(self.steps, self.batch_groups, self.group_size, self.prompt_tokens) < 1:
            raise ValueError("steps, batch_groups, group_size and prompt_tokens must be >= 1")
        if self.max_slots < self.group_size:
            raise ValueError(
                f"max_slots={self.max_slots} < group_size={self.group_size}: a replica must "
                "hold one whole group; raise max_slots"
            )
