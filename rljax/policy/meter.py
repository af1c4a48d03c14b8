"""PhaseMeter: turns what the sampler and the learner did into the PhaseStats the policies read.

The runtime driver (``rljax.runtime.driver``) and the simulator (``rljax.sim``) both report the
same five events and build :class:`~rljax.policy.reallocation.PhaseStats` only through a
:class:`PhaseMeter`, so the reallocation policy sees one definition of busy, idle, occupancy and
decode step time whoever drives it. Times are seconds on one clock of the driver's choosing
(``time.perf_counter()`` in the runtime, simulated seconds in the simulator). Events may be
reported in any order within a phase; each is attributed to the phase in which it is reported,
and the part of a span that lies before the phase's start is dropped (it belonged to a phase
already closed).

Events (frozen dataclasses; pass each to :meth:`PhaseMeter.record`):

* ``Generate(start, end, busy_slots, total_slots, steps=1, tokens=0)``: a sampler replica ran
  ``steps`` decode steps from ``start`` to ``end`` with ``busy_slots`` of its ``total_slots``
  slots holding a live sequence (the runtime: one ``generate`` call, counting the sequences it
  finished; the simulator: the span between two changes of a replica's live set).
* ``SamplerIdle(start, end, slots, held_back=True)``: ``slots`` free decode slots sat empty from
  ``start`` to ``end``. ``held_back=True``: the policies (the staleness controller's capacity or
  a full buffer) refused to fill them; that is the sampler's idle capacity. ``held_back=False``:
  they were unavailable for another reason (parked for a resize, engine rebuilding); such
  slot-seconds count as neither busy nor idle.
* ``Learn(start, end, tokens=0)``: the learner worked: one training step (making the batch and
  stepping), or publishing its weights (report it as its own ``Learn`` with ``tokens=0``).
* ``LearnerWait(start, end)``: the learner waited for a full batch.
* ``StepEnd(time)``: a learner step finished; the phase so far ends here (``PhaseMeter.steps``
  counts these).

:meth:`PhaseMeter.stats` closes the phase at the last ``StepEnd`` and starts the next one. Over
a phase of length ``L`` on a sampler of ``slots`` decode slots:

* ``sampler_idle_s = min(L, held-back slot-seconds / slots)``: idle is capacity the policies held
  back, so a sampler kept alive by one straggler per replica while the staleness window keeps
  every other slot empty counts as mostly idle;
* ``sampler_busy_s = L - sampler_idle_s - unavailable slot-seconds / slots``;
* ``sampler_occupancy = decoding slot-seconds (sum of busy_slots * duration over Generate) /
  (sampler_busy_s * slots)``;
* ``decode_step_s`` = decoding seconds over decode steps, and ``decode_fixed_s`` = the intercept
  of a least-squares line of step time against busy slots (each decode step one observation):
  the step time of a replica decoding nothing, i.e. the weight read and launch latency. When
  every step of the phase ran at one load the line is undetermined; the meter then keeps the
  last phase's estimate on the same split, else reports 0 (every step cost scales with load);
* ``learner_busy_s`` = the ``Learn`` seconds (at most ``L``), ``learner_idle_s`` = the
  ``LearnerWait`` seconds (at most ``L - learner_busy_s``);
* ``buffer_fill`` and ``queued_groups`` from the buffer's ``snapshot()`` rows at phase end.
"""

from __future__ import annotations

import dataclasses

from rljax.policy.reallocation import PhaseStats, Split


@dataclasses.dataclass(frozen=True, slots=True)
class Generate:
    """A sampler replica decoded ``steps`` steps with ``busy_slots`` of ``total_slots`` live."""

    start: float
    end: float
    busy_slots: int
    total_slots: int
    steps: float = 1
    tokens: int = 0


@dataclasses.dataclass(frozen=True, slots=True)
class SamplerIdle:
    """``slots`` free decode slots sat empty; ``held_back``: the policies refused to fill them."""

    start: float
    end: float
    slots: float
    held_back: bool = True


@dataclasses.dataclass(frozen=True, slots=True)
class Learn:
    """The learner trained one step (or published its weights, with ``tokens=0``)."""

    start: float
    end: float
    tokens: int = 0


@dataclasses.dataclass(frozen=True, slots=True)
class LearnerWait:
    """The learner waited for a full batch."""

    start: float
    end: float


@dataclasses.dataclass(frozen=True, slots=True)
class StepEnd:
    """A learner step finished at ``time``: a phase may end here."""

    time: float


Event = Generate | SamplerIdle | Learn | LearnerWait | StepEnd


def _check_span(event) -> None:
    if not event.end >= event.start:
        raise ValueError(
            f"{type(event).__name__} ends before it starts ({event.start} -> {event.end}); "
            "report (start, end) on one clock"
        )


class PhaseMeter:
    """Accumulates events into per-phase sums; :meth:`stats` turns them into ``PhaseStats``.

    It holds only running sums (O(1) memory however many events a phase has), so the simulator
    can report one event per change of a replica's live set.

    Attributes:
      steps: ``StepEnd`` events in the current phase.
      phase_start: when the current phase began.
      tokens: ``{"sampler": ..., "learner": ...}`` tokens of the last closed phase.
    """

    def __init__(self, start: float = 0.0):
        self.phase_start = float(start)
        self.tokens = {"sampler": 0, "learner": 0}
        self._fixed: tuple[Split, float] | None = None  # the last determined fit, by split
        self._reset()

    def _reset(self) -> None:
        self.steps = 0
        self._end: float | None = None
        self._held = self._away = 0.0  # held-back / unavailable slot-seconds
        self._filled = 0.0  # decoding slot-seconds: sum of busy_slots * duration
        # Weighted least-squares sums over decode steps (weight = steps, x = busy slots,
        # y = seconds per step): sum w, sum w x, sum w x^2, sum w y, sum w x y.
        self._w = self._wx = self._wxx = self._wy = self._wxy = 0.0
        self._learn = self._wait = 0.0
        self._sampler_tokens = self._learner_tokens = 0

    def _clip(self, start: float, end: float) -> float:
        return max(0.0, end - max(start, self.phase_start))

    def record(self, event: Event) -> None:
        """Adds one event to the current phase."""
        kind = type(event)
        if kind is StepEnd:
            self.steps += 1
            self._end = event.time if self._end is None else max(self._end, event.time)
            return
        if kind not in (Generate, SamplerIdle, Learn, LearnerWait):
            raise TypeError(
                f"PhaseMeter.record takes Generate, SamplerIdle, Learn, LearnerWait or StepEnd, "
                f"got {event!r}"
            )
        _check_span(event)
        seconds = self._clip(event.start, event.end)
        if kind is Generate:
            if not 0 <= event.busy_slots <= event.total_slots or event.steps < 0:
                raise ValueError(
                    f"Generate has busy_slots={event.busy_slots} of total_slots="
                    f"{event.total_slots} and steps={event.steps}; need 0 <= busy <= total and "
                    "steps >= 0"
                )
            self._sampler_tokens += event.tokens
            self._filled += event.busy_slots * seconds
            if event.steps > 0 and event.end > event.start:
                # The clipped part of a span keeps its share of the steps.
                w = event.steps * seconds / (event.end - event.start)
                x = event.busy_slots
                self._w += w
                self._wx += w * x
                self._wxx += w * x * x
                self._wy += seconds  # w * (seconds / w)
                self._wxy += x * seconds
        elif kind is SamplerIdle:
            if event.slots < 0:
                raise ValueError(f"SamplerIdle has slots={event.slots}; report free slots >= 0")
            if event.held_back:
                self._held += event.slots * seconds
            else:
                self._away += event.slots * seconds
        elif kind is Learn:
            self._learn += seconds
            self._learner_tokens += event.tokens
        else:
            self._wait += seconds

    def decode_timings(self, split: Split) -> tuple[float, float]:
        """(mean decode step seconds, its fixed part) of the current phase; see the docstring."""
        if self._w <= 0:
            return 0.0, 0.0
        w = self._w
        step = self._wy / w
        mean_x = self._wx / w
        var = self._wxx / w - mean_x * mean_x
        if var > 1e-9 * max(1.0, mean_x * mean_x):
            slope = (self._wxy / w - mean_x * step) / var
            fixed = min(step, max(0.0, step - slope * mean_x))
            self._fixed = (split, fixed)
        elif self._fixed is not None and self._fixed[0] == split:
            fixed = min(step, self._fixed[1])
        else:
            fixed = 0.0
        return step, fixed

    def stats(
        self,
        *,
        split: Split,
        slots: int,
        buffer_rows: list[dict[str, int]],
        batch_groups: int,
        switch_cost_s: float,
        granularity: int,
    ) -> PhaseStats:
        """The phase up to the last ``StepEnd`` as PhaseStats; starts the next phase there.

        Args:
          split: the split the phase ran on.
          slots: the sampler's decode slots over all its replicas during the phase.
          buffer_rows: the staleness buffer's ``snapshot()`` at phase end.
          batch_groups: B, the seats of one buffer row.
          switch_cost_s: seconds one reallocation stalls the pipeline (measured or estimated).
          granularity: chips move in units of this many.
        """
        if self._end is None:
            raise ValueError(
                "PhaseMeter.stats needs a StepEnd in the phase: record StepEnd(time) after each "
                "learner step"
            )
        if slots < 1 or batch_groups < 1:
            raise ValueError(f"need slots >= 1 and batch_groups >= 1, got {slots}, {batch_groups}")
        length = max(0.0, self._end - self.phase_start)
        idle = min(length, self._held / slots)
        away = min(length - idle, self._away / slots)
        busy = length - idle - away
        occupancy = min(1.0, self._filled / (busy * slots)) if busy > 0 else 0.0
        step, fixed = self.decode_timings(split)
        learn = min(length, self._learn)
        held = sum(row["occupied"] for row in buffer_rows)
        seats = batch_groups * max(1, len(buffer_rows))
        stats = PhaseStats(
            sampler_busy_s=busy,
            sampler_idle_s=idle,
            learner_busy_s=learn,
            learner_idle_s=min(length - learn, self._wait),
            buffer_fill=min(1.0, held / seats),
            queued_groups=held,
            split=split,
            switch_cost_s=max(0.0, switch_cost_s),
            granularity=granularity,
            sampler_occupancy=occupancy,
            decode_step_s=step,
            decode_fixed_s=fixed,
        )
        self.tokens = {"sampler": self._sampler_tokens, "learner": self._learner_tokens}
        self.phase_start = self._end
        self._reset()
        return stats
