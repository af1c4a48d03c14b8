"""PhaseMeter: turns what the sampler and the learner did into the PhaseStats the policies read.

The runtime driver (``rljax.runtime.driver``) and the simulator (``rljax.sim``) both report the
same five events and build :class:`~rljax.policy.reallocation.PhaseStats` only through a
:class:`PhaseMeter`, so the reallocation policy sees one definition of busy, idle, occupancy and
decode step time whoever drives it. Times are seconds on one clock of the driver's choosing
(``time.perf_counter()`` in the runtime, simulated seconds in the simulator). Events may be
reported in any order within a phase; each is attributed to the phase in which it is reported,
and the part of a span that lies before the phase's start is dropped (it belonged to a phase
already closed).

Events (immutable named tuples; pass each to :meth:`PhaseMeter.record`):

* ``Generate(start, end, busy_slots, total_slots, steps=1, tokens=0, kv_tokens=0)``: a sampler
  replica ran ``steps`` decode steps from ``start`` to ``end`` with ``busy_slots`` of its
  ``total_slots`` slots holding a live sequence, which together held ``kv_tokens`` tokens of KV
  cache (prompt plus tokens so far, summed over the live sequences; the mean over the steps),
  and produced ``tokens`` tokens. The runtime reports one ``generate`` call (counting the
  sequences it finished); the simulator the span between two changes of a replica's live set.
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
  of a least-squares fit of step time on busy slots and KV tokens (each decode step one
  observation), clamped to ``[0, decode_step_s]``: the step time of a replica decoding nothing,
  i.e. the weight read and launch latency. The KV term matters: late in a group the few live
  sequences are the long ones, so a fit on busy slots alone reads their KV reads as fixed cost.
  Without ``kv_tokens`` (all 0) the fit is on busy slots alone. When every step of the phase
  ran at one load the fit is undetermined; the meter then keeps the last phase's estimate on
  the same split, else reports 0 (every step cost scales with the load);
* ``learner_busy_s`` = the ``Learn`` seconds (at most ``L``), ``learner_idle_s`` = the
  ``LearnerWait`` seconds (at most ``L - learner_busy_s``);
* ``buffer_fill`` and ``queued_groups`` from the buffer's ``snapshot()`` rows at phase end;
* ``steps``: the ``StepEnd`` events of the phase;
* ``learner_publish_s``: the part of ``learner_busy_s`` reported as ``Learn`` events with
  ``tokens=0`` (publishing the weights), which lending cannot shorten;
* ``sampler_engaged_s = min(L, sum of total_slots * duration over Generate / slots)``: the time
  the replicas held a live sequence, averaged over the slots (the rest of ``L`` the replicas
  were empty: whole chips the lending policy can borrow without moving a request).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

from rljax.policy.reallocation import PhaseStats, Split

# Events are named tuples, not frozen dataclasses: the simulator reports one per change of a
# replica's live set (a million in a pod-scale run), and a named tuple is several times cheaper
# to build. Compare them by type as well as value; ``record`` dispatches on the type.


class Generate(NamedTuple):
    """A sampler replica decoded ``steps`` steps with ``busy_slots`` of ``total_slots`` live."""

    start: float
    end: float
    busy_slots: int
    total_slots: int
    steps: float = 1
    tokens: int = 0
    kv_tokens: float = 0.0


class SamplerIdle(NamedTuple):
    """``slots`` free decode slots sat empty; ``held_back``: the policies refused to fill them."""

    start: float
    end: float
    slots: float
    held_back: bool = True


class Learn(NamedTuple):
    """The learner trained one step (or published its weights, with ``tokens=0``)."""

    start: float
    end: float
    tokens: int = 0


class LearnerWait(NamedTuple):
    """The learner waited for a full batch."""

    start: float
    end: float


class StepEnd(NamedTuple):
    """A learner step finished at ``time``: a phase may end here."""

    time: float


Event = Generate | SamplerIdle | Learn | LearnerWait | StepEnd


def _span(event, phase_start: float) -> float:
    """Seconds of ``event`` from ``phase_start`` on; refuses a span that ends before it starts."""
    start, end = event.start, event.end
    if not end >= start:
        raise ValueError(
            f"{type(event).__name__} ends before it starts ({start} -> {end}); "
            "report (start, end) on one clock"
        )
    return end - start if start >= phase_start else max(0.0, end - phase_start)


def _spread(mean_sq: float, mean: float) -> float:
    """A variance from E[x^2] and E[x], or 0 when it is within rounding of none."""
    var = mean_sq - mean * mean
    return var if var > 1e-9 * max(1.0, mean * mean) else 0.0


class _StepFit:
    """Weighted least squares of decode step seconds on (1, busy slots, KV tokens), as sums.

    Each observation is a span of ``w`` decode steps taking ``seconds``, i.e. ``w`` steps of
    ``y = seconds / w``, so ``w * y`` is just the seconds.
    """

    def __init__(self):
        self.w = self.wn = self.wk = self.wnn = self.wkk = self.wnk = 0.0
        self.wy = self.wny = self.wky = 0.0

    def add(self, w: float, n: float, kv: float, seconds: float) -> None:
        self.w += w
        self.wn += w * n
        self.wk += w * kv
        self.wnn += w * n * n
        self.wkk += w * kv * kv
        self.wnk += w * n * kv
        self.wy += seconds
        self.wny += n * seconds
        self.wky += kv * seconds

    def intercept(self) -> float | None:
        """Step seconds at no busy slot and no KV; None when the data cannot tell."""
        w = self.w
        mn, mk, my = self.wn / w, self.wk / w, self.wy / w
        cnn, ckk = _spread(self.wnn / w, mn), _spread(self.wkk / w, mk)
        cnk = self.wnk / w - mn * mk
        cny, cky = self.wny / w - mn * my, self.wky / w - mk * my
        det = cnn * ckk - cnk * cnk
        if cnn and ckk and det > 1e-9 * cnn * ckk:
            bn = (ckk * cny - cnk * cky) / det
            bk = (cnn * cky - cnk * cny) / det
            return my - bn * mn - bk * mk
        if cnn:  # KV not reported, or moving in lock-step with the load
            return my - cny / cnn * mn
        if ckk:
            return my - cky / ckk * mk
        return None


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
        # Each event type's handler (it takes an event of that type).
        self._handlers: dict[type, Callable[[Any], None]] = {
            Generate: self._generate,
            SamplerIdle: self._idle,
            Learn: self._learn_event,
            LearnerWait: self._wait_event,
            StepEnd: self._step_end,
        }
        self._reset()

    def _reset(self) -> None:
        self.steps = 0
        self._end: float | None = None
        self._held = self._away = 0.0  # held-back / unavailable slot-seconds
        self._filled = 0.0  # decoding slot-seconds: sum of busy_slots * duration
        self._engaged = 0.0  # slot-seconds of replicas with a live sequence
        self._fit = _StepFit()
        self._learn = self._wait = self._publish = 0.0
        self._sampler_tokens = self._learner_tokens = 0

    def record(self, event: Event) -> None:
        """Adds one event to the current phase."""
        handler = self._handlers.get(type(event))
        if handler is None:
            raise TypeError(
                "PhaseMeter.record takes Generate, SamplerIdle, Learn, LearnerWait or StepEnd, "
                f"got {event!r}"
            )
        handler(event)

    def _step_end(self, event: StepEnd) -> None:
        self.steps += 1
        self._end = event.time if self._end is None else max(self._end, event.time)

    def _generate(self, event: Generate) -> None:
        busy, steps = event.busy_slots, event.steps
        if not 0 <= busy <= event.total_slots or steps < 0 or event.kv_tokens < 0:
            raise ValueError(
                f"Generate has busy_slots={busy} of total_slots={event.total_slots}, "
                f"steps={steps} and kv_tokens={event.kv_tokens}; need 0 <= busy <= total, "
                "steps >= 0 and kv_tokens >= 0"
            )
        seconds = _span(event, self.phase_start)
        self._sampler_tokens += event.tokens
        self._filled += busy * seconds
        if busy:
            self._engaged += event.total_slots * seconds
        full = event.end - event.start
        if steps > 0 and full > 0 and seconds > 0:
            # One observation per decode step: x = (1, busy, kv), y = seconds per step. A span
            # cut at the phase start keeps its share of the steps.
            self._fit.add(steps * seconds / full, busy, event.kv_tokens, seconds)

    def _idle(self, event: SamplerIdle) -> None:
        if event.slots < 0:
            raise ValueError(f"SamplerIdle has slots={event.slots}; report free slots >= 0")
        slot_s = event.slots * _span(event, self.phase_start)
        if event.held_back:
            self._held += slot_s
        else:
            self._away += slot_s

    def _learn_event(self, event: Learn) -> None:
        seconds = _span(event, self.phase_start)
        self._learn += seconds
        self._learner_tokens += event.tokens
        if event.tokens == 0:  # a publish (or a step that trained nothing)
            self._publish += seconds

    def _wait_event(self, event: LearnerWait) -> None:
        self._wait += _span(event, self.phase_start)

    def decode_timings(self, split: Split) -> tuple[float, float]:
        """(mean decode step seconds, its fixed part) of the current phase; see the docstring."""
        fit = self._fit
        if fit.w <= 0:
            return 0.0, 0.0
        step = fit.wy / fit.w
        fixed = fit.intercept()
        if fixed is not None:
            fixed = min(step, max(0.0, fixed))
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
            steps=max(1, self.steps),
            learner_publish_s=min(learn, self._publish),
            sampler_engaged_s=min(length, self._engaged / slots),
        )
        self.tokens = {"sampler": self._sampler_tokens, "learner": self._learner_tokens}
        self.phase_start = self._end
        self._reset()
        return stats
