"""What a simulated run measured: throughput, utilisation, staleness, moves and a timeline."""

from __future__ import annotations

import collections
import dataclasses
from typing import Any


@dataclasses.dataclass(frozen=True)
class Span:
    """One interval of activity on the timeline.

    Attributes:
      role: "sampler" or "learner".
      lane: replica index for the sampler, 0 for the learner.
      kind: "decode", "train", "sync" or "switch".
      start / end: simulated seconds.
    """

    role: str
    lane: int
    kind: str
    start: float
    end: float


@dataclasses.dataclass(frozen=True)
class SimResult:
    """Measurements of one ``Simulator.run``.

    Attributes:
      mode: the simulated mode.
      wall_s: simulated seconds until the last learner step finished.
      steps: learner steps done.
      samples: samples (responses) consumed by the learner.
      sampler_util: fraction of sampler replica-seconds with live sequences.
      learner_util: fraction of wall time the learner spent training.
      staleness: staleness of every consumed group, in consumption order.
      consumed_prompts: prompt id of every consumed group, in consumption order.
      dispatched / aborted: group requests sent to replicas / aborted (surplus or resize).
      in_flight: group requests still decoding at the end.
      held: groups accepted into the buffer but not yet consumed at the end.
      moves: (time, sampler_chips, learner_chips) of each reallocation.
      final_split: (sampler_chips, learner_chips) at the end.
      spans: the timeline, if recorded.
      lends: (time, direction, chips, share) of each lending decision that lends (mode "lend").
      lent_steps: {direction: learner steps in which that loan was carried out}.
      migrated: requests interrupted on lent or parked chips and resumed elsewhere.
      step_ends: simulated time at which each learner step finished training.
    """

    mode: str
    wall_s: float
    steps: int
    samples: int
    sampler_util: float
    learner_util: float
    staleness: tuple[int, ...]
    consumed_prompts: tuple[int, ...]
    dispatched: int
    aborted: int
    in_flight: int
    held: int
    moves: tuple[tuple[float, int, int], ...]
    final_split: tuple[int, int]
    spans: tuple[Span, ...]
    lends: tuple[tuple[float, str, int, float], ...] = ()
    lent_steps: tuple[tuple[str, int], ...] = ()
    migrated: int = 0
    step_ends: tuple[float, ...] = ()

    @property
    def step_s(self) -> float:
        """Mean seconds per learner step."""
        return self.wall_s / max(1, self.steps)

    def steady_step_s(self, skip: int) -> float:
        """Mean seconds per learner step after the first ``skip`` steps (the pipeline fill):
        what a published per-step mean over hundreds of steps measures."""
        if not 0 <= skip < len(self.step_ends) - 1:
            raise ValueError(
                f"steady_step_s(skip={skip}) needs more than skip + 1 recorded steps, "
                f"got {len(self.step_ends)}; run more steps or skip fewer"
            )
        ends = self.step_ends
        return (ends[-1] - ends[skip]) / (len(ends) - 1 - skip)

    @property
    def samples_per_s(self) -> float:
        return self.samples / max(self.wall_s, 1e-9)

    @property
    def steps_per_s(self) -> float:
        return self.steps / max(self.wall_s, 1e-9)

    def staleness_histogram(self) -> dict[int, int]:
        """Consumed groups per staleness value."""
        return dict(sorted(collections.Counter(self.staleness).items()))

    def summary(self) -> dict[str, Any]:
        """Plain-data figures (no timeline), for printing and JSON."""
        mean_staleness = sum(self.staleness) / max(1, len(self.staleness))
        return {
            "mode": self.mode,
            "wall_s": round(self.wall_s, 3),
            "step_s": round(self.step_s, 3),
            "samples_per_s": round(self.samples_per_s, 4),
            "steps_per_s": round(self.steps_per_s, 6),
            "sampler_util": round(self.sampler_util, 4),
            "learner_util": round(self.learner_util, 4),
            "mean_staleness": round(mean_staleness, 4),
            "staleness_hist": {str(k): v for k, v in self.staleness_histogram().items()},
            "moves": len(self.moves),
            "final_split": list(self.final_split),
            "lent_steps": dict(self.lent_steps),
            "migrated": self.migrated,
        }
