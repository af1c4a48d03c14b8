"""Reallocator: the pure policy that decides when to move chips between sampler and learner.

Between phases the runtime (or the simulator) hands the policy what each side did in the
last phase; the policy answers with a new split or ``None``. It holds only plain counters
(no jax, threads or clocks), so the threaded runtime and ``rljax.sim`` drive the same object.

Two models predict the next phase's length at another split:

* Linear (when the phase carries no decode timings): the sampler did ``sampler_busy_s``
  seconds of work on ``sampler_chips`` chips at ``sampler_occupancy`` of its slots, i.e.
  ``W_s = busy * occupancy * chips`` chip-seconds, and the learner ``W_l = busy * chips``;
  both are taken to scale linearly in chips: ``max(W_s / n, W_l / (total - n))``.
* Decode-aware (when the phase carries ``decode_step_s`` and ``decode_fixed_s``): a decode
  step costs a fixed part (the weight read and launch latency, paid whatever the batch) plus
  a part proportional to the live sequences on the replica. The sampler's rate is its live
  sequences over their step time (Little's law). When the policies held slots back (the
  staleness window, not the slot count, caps the live sequences), more chips spread the
  same sequences over more replicas: each step gets cheaper but only down to the fixed part,
  and fewer chips pile them onto fewer, slower replicas. When every slot was wanted, the
  live sequences scale with the chips. When the learner waited for batches the sampler paced
  the phase; when it did not, the sampler needed only the slot-seconds it filled. The learner
  is compute bound and scales linearly. The linear model misses both effects: it reads slots
  the window held back as spare capacity, and would shrink a latency-bound sampler.

A move pays off when ``horizon`` phases of the predicted saving beat the measured switch cost
(times ``margin``). Hysteresis (``patience`` consecutive phases wanting the same direction,
then ``cooldown`` phases of silence after a move) stops a noisy phase from bouncing chips
back and forth, since each bounce costs a reshard.
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
      decode_step_s: mean seconds of one decode step of a sampler replica while it decoded
        (decoding time over decode steps); 0 = not measured, use the linear model.
      decode_fixed_s: the part of a decode step that does not depend on the live sequences
        (the weight read, bytes / HBM bandwidth, plus launch latency: the step time of a
        replica decoding one short sequence); 0 = every step cost scales with the load.
      steps: learner steps in the phase (``PhaseMeter`` counts its ``StepEnd`` events); the
        lending policy divides phase seconds by it to get seconds per step.
      learner_publish_s: the part of ``learner_busy_s`` spent publishing weights (``Learn``
        events with ``tokens=0``); 0 = not separated.
      sampler_engaged_s: seconds the sampler's replicas held at least one live sequence,
        averaged over its slots (``Generate`` span seconds weighted by the replica's slots,
        over all slots); a replica with none is a whole idle chip group, free to lend without
        moving a request. None = not measured (every replica taken as engaged while busy).
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
    decode_step_s: float = 0.0
    decode_fixed_s: float = 0.0
    steps: int = 1
    learner_publish_s: float = 0.0
    sampler_engaged_s: float | None = None

    def __post_init__(self):
        times = (self.sampler_busy_s, self.sampler_idle_s, self.learner_busy_s)
        times += (self.learner_idle_s, self.switch_cost_s, self.decode_step_s, self.decode_fixed_s)
        times += (self.learner_publish_s,)
        if min(times) < 0:
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
        if self.steps < 1:
            raise ValueError(f"steps must be >= 1 learner step per phase, got {self.steps}")


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
        models are only trusted near the measured split.
      reversal_block: phases during which a move that was just reversed may not be made
        again (the pair cost two switches and gained nothing); 0 disables it.
      sliver: with the decode-aware model, a sampler that filled less than this fraction of
        its slots may shrink half way to the predicted split in one move; otherwise it shrinks
        one host per move.
      min_gain: with the decode-aware model, the smallest predicted saving, as a fraction of
        the phase, that asks for a move (smaller ones are within the model's error).
      held_threshold: fraction of the sampler's slot capacity the policies must hold back in
        a phase for the decode-aware model to treat its live sequences as capped by the
        staleness window rather than by the slot count. The lending policy reads the same
        meter and is given this value too (``rljax.policy.lending.decide``).
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
    reversal_block: int = 30
    sliver: float = 0.1
    min_gain: float = 0.03
    held_threshold: float = 0.05

    def __post_init__(self):
        # The messages name the config key: this is RunConfig's ``reallocator`` section (and
        # SimConfig's), so ``--config.reallocator.margin=...`` is how a run sets it.
        def fail(name: str, expected: str) -> None:
            raise ValueError(
                f"config key 'reallocator.{name}' = {getattr(self, name)!r} is invalid: "
                f"expected {expected}"
            )

        for name, least in (
            ("min_sampler_chips", 1),
            ("min_learner_chips", 1),
            ("patience", 1),
            ("horizon", 1),
            ("cooldown", 0),
            ("reversal_block", 0),
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                unit = "chips" if name.startswith("min_") else "phases"
                fail(name, f"an integer >= {least} ({unit})")
        for name, low, high, closed in (
            ("idle_threshold", 0.0, 1.0, False),
            ("full_fill", 0.0, 1.0, True),
            ("max_move_fraction", 0.0, 1.0, True),
            ("sliver", 0.0, 1.0, True),
            ("min_gain", 0.0, 1.0, False),
            ("held_threshold", 0.0, 1.0, False),
        ):
            value = getattr(self, name)
            ok = isinstance(value, int | float) and not isinstance(value, bool)
            if not (ok and low <= value and (value <= high if closed else value < high)):
                fail(name, f"a fraction in [{low}, {high}{']' if closed else ')'}")
        margin = self.margin
        if isinstance(margin, bool) or not isinstance(margin, int | float) or not margin > 0:
            fail("margin", "a positive number (benefit / switch cost; 1.0 is break-even)")


def reallocator_settings(
    section: ReallocatorConfig,
    *,
    max_staleness: int,
    granularity: int,
    sampler_floor: int = 1,
    learner_floor: int = 1,
) -> ReallocatorConfig:
    """The settings a run's :class:`Reallocator` decides with: its ``reallocator`` section,
    fitted to the run. The runtime (:class:`~rljax.mesh.resize.Reallocation`) and the simulator
    both build their policy from this, so one config decides the same in both.

    * A side never shrinks below the section's minimum, one move (``granularity`` chips) or its
      floor: the sampler one replica (its tensor-parallel chips), the learner the chips its
      state needs.
    * ``full_fill`` is read against the fill a learner-bound pipeline holds. The meter's
      ``buffer_fill`` counts the seats of all eta + 1 buffer rows at the phase's end, just
      after a batch was consumed, when such a pipeline holds about eta of them full (the next
      batch is still being sampled); so for eta > 0 the section's figure is scaled by
      ``eta / (eta + 1)``. Unscaled, 0.9 is out of reach at eta = 1 (about 0.5 is full), and
      a learner idle for another reason (a sync) is blamed on the sampler.

    Args:
      section: the ``reallocator`` config section (``RunConfig`` and ``SimConfig`` alike).
      max_staleness: eta, the staleness buffer's bound (``buffer.max_staleness``).
      granularity: chips per move (``mesh.reallocate_granularity``, the simulator's unit).
      sampler_floor: the fewest chips the sampler runs on.
      learner_floor: the fewest chips the learner runs on.
    """
    for name, value, least in (
        ("max_staleness", max_staleness, 0),
        ("granularity", granularity, 1),
        ("sampler_floor", sampler_floor, 1),
        ("learner_floor", learner_floor, 1),
    ):
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise ValueError(
                f"reallocator_settings: {name}={value!r} must be an integer >= {least}"
            )
    full_fill = section.full_fill
    if max_staleness:
        full_fill = section.full_fill * max_staleness / (max_staleness + 1)
    return dataclasses.replace(
        section,
        min_sampler_chips=max(section.min_sampler_chips, sampler_floor, granularity),
        min_learner_chips=max(section.min_learner_chips, learner_floor, granularity),
        full_fill=full_fill,
    )


def predicted_phase_s(sampler_work: float, learner_work: float, sampler_chips: int, total: int):
    """Phase time of a pipelined split whose two sides scale linearly in chips."""
    return max(sampler_work / sampler_chips, learner_work / (total - sampler_chips))


def decode_aware_phase_s(
    stats: PhaseStats,
    sampler_chips: int,
    *,
    idle_threshold: float,
    held_threshold: float,
) -> float:
    """Phase time at ``sampler_chips`` from the decode-aware model (see the module docstring).

    Needs ``stats.decode_step_s > 0``. At the measured split it returns the phase the model
    attributes to the slower side, so savings compare predictions with predictions.
    """
    split = stats.split
    length = stats.sampler_busy_s + stats.sampler_idle_s
    learner = stats.learner_busy_s * split.learner_chips / (split.total - sampler_chips)
    if length <= 0:
        return learner
    x = sampler_chips / split.sampler_chips
    live = min(1.0, stats.sampler_busy_s * stats.sampler_occupancy / length)
    if stats.sampler_idle_s / length > held_threshold:
        # The window capped the live sequences; they keep their number unless the new split's
        # slots (x times today's, of which ``live`` were filled) cannot hold them.
        sequences = min(1.0, x / max(live, 1e-9))
    else:
        sequences = x
    load = sequences / x  # live sequences per replica, relative to now
    fixed = min(stats.decode_fixed_s, stats.decode_step_s)
    step = fixed + (stats.decode_step_s - fixed) * load
    rate = sequences * stats.decode_step_s / step
    # How much of the phase the sampler side set: all of it when the learner waited for
    # batches at all (a tenth of the idle threshold: with a staleness window the learner
    # waits only once stragglers pace the pipeline), only the slot-seconds it filled when the
    # learner never waited.
    paced = min(1.0, stats.learner_idle_s / length / max(0.1 * idle_threshold, 1e-9))
    sampler_now = length * (live + (1.0 - live) * paced)
    return max(learner, sampler_now / rate)


class Reallocator:
    """Decides, once per phase, whether moving chips is worth its switch cost."""

    def __init__(self, config: ReallocatorConfig | None = None):
        self.config = config or ReallocatorConfig()
        self._streak_direction = Direction.NONE
        self._streak = 0
        self._cooldown_left = 0
        self._last_move = Direction.NONE
        self._undone = Direction.NONE  # the direction a reversal just undid ...
        self._undone_left = 0  # ... and the phases it stays barred

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

    def predict(self, stats: PhaseStats, sampler_chips: int) -> float:
        """Predicted phase seconds at ``sampler_chips`` (decode-aware when timings are given)."""
        split = stats.split
        if stats.decode_step_s > 0:
            cfg = self.config
            return decode_aware_phase_s(
                stats,
                sampler_chips,
                idle_threshold=cfg.idle_threshold,
                held_threshold=cfg.held_threshold,
            )
        w_s = stats.sampler_busy_s * stats.sampler_occupancy * split.sampler_chips
        w_l = stats.learner_busy_s * split.learner_chips
        return predicted_phase_s(w_s, w_l, sampler_chips, split.total)

    def best_split(self, stats: PhaseStats, direction: Direction) -> tuple[Split, float]:
        """Best split reachable in ``direction`` and its predicted per-phase saving (s)."""
        cfg = self.config
        split, unit = stats.split, stats.granularity
        total = split.total
        now = self.predict(stats, split.sampler_chips)
        step = unit if direction is Direction.TO_SAMPLER else -unit
        best, best_t = split.sampler_chips, now
        n = split.sampler_chips + step
        reach = max(unit, int(cfg.max_move_fraction * total))
        while cfg.min_sampler_chips <= n <= total - cfg.min_learner_chips:
            if abs(n - split.sampler_chips) > reach:
                break
            t = self.predict(stats, n)
            if t < best_t:
                best, best_t = n, t
            n += step
        if stats.decode_step_s > 0 and direction is Direction.TO_LEARNER:
            # Shrinking the sampler rests on its slack, the least certain part of the model (a
            # sampler whose stragglers start to pace the pipeline gives no warning), so it goes
            # one host at a time, or half way when it filled only a sliver of its slots; the
            # next phases are measured before the rest.
            length = stats.sampler_busy_s + stats.sampler_idle_s
            live = stats.sampler_busy_s * stats.sampler_occupancy / max(length, 1e-9)
            gap = split.sampler_chips - best
            if gap > 0:
                move = gap // 2 // unit * unit if live < cfg.sliver else unit
                best = split.sampler_chips - min(gap, max(unit, move))
                best_t = self.predict(stats, best)
        return Split(best, total - best), now - best_t

    def wanted(self, stats: PhaseStats) -> Direction:
        """The direction the phase asks for: by idle fractions for the linear model, by the
        predicted best split (either way) for the decode-aware one."""
        if stats.decode_step_s <= 0:
            return self.imbalance(stats)
        to_sampler = self.best_split(stats, Direction.TO_SAMPLER)[1]
        to_learner = self.best_split(stats, Direction.TO_LEARNER)[1]
        floor = self.config.min_gain * self.predict(stats, stats.split.sampler_chips)
        if max(to_sampler, to_learner) <= floor:
            return Direction.NONE
        return Direction.TO_SAMPLER if to_sampler >= to_learner else Direction.TO_LEARNER

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
        barred = self._undone if self._undone_left > 0 else Direction.NONE
        self._undone_left = max(0, self._undone_left - 1)
        if self._cooldown_left > 0:
            self._cooldown_left -= 1
            self._streak_direction, self._streak = Direction.NONE, 0
            return None
        direction = self.wanted(stats)
        if direction is barred and direction is not Direction.NONE:
            direction = Direction.NONE  # that move was just undone; do not repeat it yet
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
        if self._last_move not in (Direction.NONE, direction):
            # A reversal: the last move did not pay, so bar its direction for a while.
            self._undone, self._undone_left = self._last_move, cfg.reversal_block
        self._last_move = direction
        return target
