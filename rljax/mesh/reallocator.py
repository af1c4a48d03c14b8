"""Reallocator: the pure policy that decides when to move chips between sampler and learner.

Between phases the runtime (or the simulator) hands the policy what each side did in the
last phase; the policy answers with a new split or ``None``. It holds only plain counters
(no jax, threads or clocks), so the threaded runtime and ``rljax.sim`` drive the same object.

The model behind a decision: in the last phase the sampler did ``sampler_busy_s`` seconds of
work on ``sampler_chips`` chips at ``sampler_occupancy`` of its slots, i.e.
``W_s = busy * occupancy * chips`` chip-seconds, and the learner ``W_l = busy * chips``.
Both sides scale about linearly in chips (decode replicas are data parallel; the learner is
compute bound), so with ``n`` sampler chips the next phase takes about
``max(W_s / n, W_l / (total - n))``. A move pays off when ``horizon`` phases of that saving
beat the measured switch cost. Hysteresis (``patience`` consecutive phases of the same
imbalance, then ``cooldown`` phases of silence after a move) stops a noisy phase from
bouncing chips back and forth, since each bounce costs a reshard.
"""

from __future__ import annotations

import dataclasses
import enum


@dataclasses.dataclass(frozen=True)
class Split:
    """How many chips each role holds."""

    sampler_chips: int
    learner_chips: int

    def __post_init__(self):
        if self.sampler_chips < 1 or self.learner_chips < 1:
            raise ValueError(
                f"Split needs at least one chip per role, got sampler={self.sampler_chips}, "
                f"learner={self.learner_chips}; give each side a chip or use colocated mode"
            )

    @property
    def total(self) -> int:
        return self.sampler_chips + self.learner_chips


@dataclasses.dataclass(frozen=True)
class PhaseStats:
    """What happened in the last phase, as measured by the runtime or the simulator.

    Attributes:
      sampler_busy_s / sampler_idle_s: seconds the sampler generated / sat idle (idle means
        it was blocked by the staleness controller or a full buffer).
      learner_busy_s / learner_idle_s: seconds the learner trained / waited for a batch.
      buffer_fill: fraction in [0, 1] of buffer seats holding finished groups at phase end.
      queued_groups: finished groups waiting to be consumed at phase end.
      split: the split the phase ran on.
      switch_cost_s: measured (or estimated) seconds one reallocation stalls the pipeline.
      granularity: chips move in units of this many (a host of 4 or 8 chips).
      sampler_occupancy: mean fraction of decode slots filled while the sampler was busy. A
        sampler busy with a few long stragglers is latency bound, and more chips would not
        finish it sooner, so only ``busy * occupancy`` counts as chip-scalable work.
    """

    sampler_busy_s: float
    sampler_idle_s: float
    learner_busy_s: float
    learner_idle_s: float
    buffer_fill: float
    queued_groups: int
    split: Split
    switch_cost_s: float
    granularity: int
    sampler_occupancy: float = 1.0

    def __post_init__(self):
        times = (self.sampler_busy_s, self.sampler_idle_s, self.learner_busy_s)
        if min((*times, self.learner_idle_s, self.switch_cost_s)) < 0:
            raise ValueError("PhaseStats times must be non-negative; pass measured seconds")
        if not 0.0 <= self.buffer_fill <= 1.0:
            raise ValueError(
                f"buffer_fill must be a fraction in [0, 1], got {self.buffer_fill}; "
                "divide filled seats by total seats"
            )
        if not 0.0 <= self.sampler_occupancy <= 1.0:
            raise ValueError(
                f"sampler_occupancy must be a fraction in [0, 1], got {self.sampler_occupancy}"
            )
        if self.granularity < 1:
            raise ValueError(f"granularity must be >= 1 chip, got {self.granularity}")


class Direction(enum.Enum):
    """Which way the last phase says chips should move."""

    NONE = "none"
    TO_LEARNER = "to_learner"  # learner is the bottleneck; sampler sits idle
    TO_SAMPLER = "to_sampler"  # buffer starves; learner sits idle


@dataclasses.dataclass(frozen=True)
class ReallocatorConfig:
    """Knobs of the reallocation policy.

    Attributes:
      min_sampler_chips / min_learner_chips: never shrink a side below this (e.g. the
        learner needs enough HBM for params + optimizer state).
      idle_threshold: a side counts as starved when its idle fraction of the phase exceeds
        this and exceeds the other side's idle fraction by the same margin.
      patience: consecutive phases of the same imbalance before moving (hysteresis).
      cooldown: phases to ignore after a move, so the new split is measured before judging.
      horizon: phases over which the saving must repay the switch cost.
      margin: required benefit / switch-cost ratio (1.0 = break even).
      full_fill: buffer fill at or above which the learner already has work queued, so
        learner idleness is not blamed on the sampler.
      max_move_fraction: most chips one decision moves, as a fraction of all chips; the
        linear model is only trusted near the measured split.
    """

    min_sampler_chips: int = 1
    min_learner_chips: int = 1
    idle_threshold: float = 0.1
    patience: int = 2
    cooldown: int = 2
    horizon: int = 8
    margin: float = 1.5
    full_fill: float = 0.9
    max_move_fraction: float = 0.25

    def __post_init__(self):
        if self.min_sampler_chips < 1 or self.min_learner_chips < 1:
            raise ValueError("min_sampler_chips and min_learner_chips must be >= 1")
        if not 0.0 <= self.idle_threshold < 1.0:
            raise ValueError(f"idle_threshold must be in [0, 1), got {self.idle_threshold}")
        if self.patience < 1 or self.horizon < 1 or self.cooldown < 0:
            raise ValueError("need patience >= 1, horizon >= 1 and cooldown >= 0 (phases)")
        if self.margin <= 0:
            raise ValueError(f"margin must be positive, got {self.margin}; 1.0 is break-even")


def predicted_phase_s(sampler_work: float, learner_work: float, sampler_chips: int, total: int):
    """Phase time of a pipelined split whose two sides scale linearly in chips."""
    return max(sampler_work / sampler_chips, learner_work / (total - sampler_chips))


class Reallocator:
    """Decides, once per phase, whether moving chips is worth its switch cost."""

    def __init__(self, config: ReallocatorConfig | None = None):
        self.config = config or ReallocatorConfig()
        self._streak_direction = Direction.NONE
        self._streak = 0
        self._cooldown_left = 0

    def imbalance(self, stats: PhaseStats) -> Direction:
        """Classifies the last phase; idle fractions decide, buffer fill can veto."""
        cfg = self.config
        sampler_phase = stats.sampler_busy_s + stats.sampler_idle_s
        learner_phase = stats.learner_busy_s + stats.learner_idle_s
        if sampler_phase <= 0 or learner_phase <= 0:
            return Direction.NONE
        s_idle = stats.sampler_idle_s / sampler_phase
        l_idle = stats.learner_idle_s / learner_phase
        if s_idle > cfg.idle_threshold and s_idle - l_idle > cfg.idle_threshold:
            return Direction.TO_LEARNER
        if l_idle > cfg.idle_threshold and l_idle - s_idle > cfg.idle_threshold:
            # A full buffer means the learner idled for some other reason (e.g. a sync).
            if stats.buffer_fill >= cfg.full_fill:
                return Direction.NONE
            return Direction.TO_SAMPLER
        return Direction.NONE

    def best_split(self, stats: PhaseStats, direction: Direction) -> tuple[Split, float]:
        """Best split reachable in ``direction`` and its predicted per-phase saving (s)."""
        cfg = self.config
        split, unit = stats.split, stats.granularity
        total = split.total
        w_s = stats.sampler_busy_s * stats.sampler_occupancy * split.sampler_chips
        w_l = stats.learner_busy_s * split.learner_chips
        now = predicted_phase_s(w_s, w_l, split.sampler_chips, total)
        step = unit if direction is Direction.TO_SAMPLER else -unit
        best, best_t = split.sampler_chips, now
        n = split.sampler_chips + step
        reach = max(unit, int(cfg.max_move_fraction * total))
        while cfg.min_sampler_chips <= n <= total - cfg.min_learner_chips:
            if abs(n - split.sampler_chips) > reach:
                break
            t = predicted_phase_s(w_s, w_l, n, total)
            if t < best_t:
                best, best_t = n, t
            n += step
        return Split(best, total - best), now - best_t

    def decide(self, stats: PhaseStats) -> Split | None:
        """Returns the split to move to after this phase, or None to stay."""
        cfg = self.config
        if stats.split.sampler_chips < cfg.min_sampler_chips or (
            stats.split.learner_chips < cfg.min_learner_chips
        ):
            raise ValueError(
                f"current split {stats.split} is below the configured minimum "
                f"(sampler {cfg.min_sampler_chips}, learner {cfg.min_learner_chips}); "
                "lower the minimums or start from a larger split"
            )
        if self._cooldown_left > 0:
            self._cooldown_left -= 1
            self._streak_direction, self._streak = Direction.NONE, 0
            return None
        direction = self.imbalance(stats)
        if direction is Direction.NONE or direction is not self._streak_direction:
            self._streak_direction, self._streak = direction, 0
        if direction is Direction.NONE:
            return None
        self._streak += 1
        if self._streak < cfg.patience:
            return None
        target, saving = self.best_split(stats, direction)
        if target == stats.split or saving * cfg.horizon < cfg.margin * stats.switch_cost_s:
            return None
        self._streak_direction, self._streak = Direction.NONE, 0
        self._cooldown_left = cfg.cooldown
        return target
