"""One sampler replica as a continuous-batching server, advanced analytically between events.

Stepping every decode step would cost millions of Python iterations per simulated hour, so a
replica keeps a real-valued decode-step counter ``P``. Between events (an admission, a
completion, a pause) the live set is fixed, every live sequence gains one token per step, and
the step time is the roofline ``max(C(n), a + c * (base + n * P))``: constant compute side,
memory side growing linearly as the KV cache grows. The time to advance ``x`` steps is then a
closed-form integral, and so is its inverse; each event costs O(log n).

Slots are filled one sequence at a time, as the runtime's ``Sampler`` does: a group routed to a
replica with fewer free slots than samples waits in the replica's queue for the rest, and each
finished sequence frees its slot for the next queued one. A group's prompt is prefilled once,
on arrival; queued samples reuse that prefix.

Given a :class:`~rljax.policy.meter.PhaseMeter`, a replica reports each stretch of decoding at a
fixed live set as one ``Generate`` event, as the runtime reports each ``generate`` call.
"""

from __future__ import annotations

import collections
import heapq
import itertools
import math
from typing import Protocol

from rljax.policy.meter import Generate, PhaseMeter
from rljax.sim.costs import CostModel

_TIEBREAK = itertools.count()  # heap entries never compare requests


class Tracked(Protocol):
    """What a replica keeps on each request it serves (the simulator's requests)."""

    live: int  # samples decoding here
    queued: int  # samples waiting here for a slot
    kv_base: float  # sum over its live samples of ``prompt - start step``


class Replica:
    """A decode engine of ``cost.tp`` chips with ``slots`` concurrent sequences.

    Live sequences sit in a heap keyed by the step count at which they finish. A request
    tracks ``live`` (sequences in slots), ``queued`` (samples waiting here for a slot) and
    ``kv_base`` (sum over its live sequences of ``prompt - start step``). Aborting a request
    removes it from the speed model and leaves dead heap and queue entries behind, skipped when
    they surface (a dead request has ``live == queued == 0``).
    """

    def __init__(
        self,
        index: int,
        cost: CostModel,
        slots: int,
        now: float,
        record: bool = False,
        meter: PhaseMeter | None = None,
    ):
        self.index = index
        self.cost = cost
        self.slots = slots
        self.t0 = now
        self.p0 = 0.0
        self.pause_until = now
        self.n = 0
        self.base = 0.0  # sum over live sequences of (prompt - start); KV tokens = base + n * P
        self.heap: list[tuple[float, int, Tracked, float]] = []
        # (request, length, done) triples; ``done`` > 0 for a sample resumed from a prefix.
        self.waiting: collections.deque[tuple[Tracked, float, float]] = collections.deque()
        self.lent = False  # runs on borrowed learner chips (Rollout-on-TrainPool)
        self.queued = 0  # live samples in ``waiting``
        self.counted = 0  # ``n`` as the simulator last counted it
        self.epoch = 0
        self.busy_acc = 0.0
        self.meter = meter
        self.busy_since: float | None = None
        self._record = record
        self._spans: list[tuple[float, float]] = []
        self._mem0 = cost.decode_memory_s(0.0)
        self._kv_slope = cost.kv_seconds_per_token()
        self._compute = [cost.decode_compute_s(b) for b in range(slots + 1)]

    @property
    def free(self) -> int:
        return self.slots - self.n

    @property
    def headroom(self) -> int:
        """Free slots not yet promised to queued samples (negative when the queue is longer)."""
        return self.slots - self.n - self.queued

    # The two clock functions below run once per simulated sequence (a million times in a
    # pod-scale run), so they inline the step-time shape: the memory-side step time now
    # ``m0 = a + c * (base + n * P)``, its slope per step ``c * n`` and the compute-side ``C(n)``.

    def _time_for(self, x: float) -> float:
        """Seconds to advance ``x`` decode steps from ``p0``."""
        n = self.n
        if x <= 0 or n == 0:
            return 0.0
        kv = self._kv_slope
        m0 = self._mem0 + kv * (self.base + n * self.p0)
        slope = kv * n
        comp = self._compute[n]
        if m0 >= comp:
            return m0 * x + 0.5 * slope * x * x
        if slope == 0:
            return comp * x
        xc = (comp - m0) / slope
        if x <= xc:
            return comp * x
        y = x - xc
        return comp * x + 0.5 * slope * y * y

    def _steps_for(self, e: float) -> float:
        """Decode steps completed in ``e`` seconds from ``p0`` (inverse of ``_time_for``)."""
        n = self.n
        if e <= 0 or n == 0:
            return 0.0
        kv = self._kv_slope
        m0 = self._mem0 + kv * (self.base + n * self.p0)
        slope = kv * n
        comp = self._compute[n]
        if m0 >= comp:
            # Root of slope/2 x^2 + m0 x - e = 0, in the cancellation-free form.
            return 2.0 * e / (m0 + math.sqrt(m0 * m0 + 2.0 * slope * e))
        if slope == 0:
            return e / comp
        xc = (comp - m0) / slope
        if e <= comp * xc:
            return e / comp
        rest = e - comp * xc
        return xc + 2.0 * rest / (comp + math.sqrt(comp * comp + 2.0 * slope * rest))

    def advance(self, now: float) -> None:
        """Brings ``p0`` and the busy clock up to time ``now``."""
        t0 = self.t0
        start = t0 if t0 >= self.pause_until else self.pause_until
        if now > start:
            steps = self._steps_for(now - start)
            if steps:
                if self.meter is not None:
                    n = self.n
                    kv = self.base + n * (self.p0 + 0.5 * steps)  # mean KV tokens over the steps
                    self.meter.record(
                        Generate(start, now, n, self.slots, steps, round(steps * n), kv)
                    )
                self.p0 += steps
        if now > t0:
            self.t0 = now

    def pause(self, now: float, seconds: float) -> None:
        """Stalls decoding for ``seconds`` (prefill, weight load); progress resumes after."""
        self.advance(now)
        self.pause_until = max(self.pause_until, now) + seconds
        self.epoch += 1

    def admit(
        self, now: float, request: Tracked, lengths: list[int], prompt: int, prefill_s: float
    ) -> None:
        """Routes a request here: prefill its prompt once, then start its samples (decoding from
        step ``p0``) in free slots; the rest wait in the queue for slots to free up."""
        self.advance(now)
        request.live = 0
        request.kv_base = 0.0
        self.waiting.extend([(request, length, 0) for length in lengths])
        request.queued = len(lengths)
        self.queued += len(lengths)
        # pause(now, prefill_s), whose advance(now) would be a no-op here.
        self.pause_until = max(self.pause_until, now) + prefill_s
        self.epoch += 1
        self._fill(now, prompt)

    def _fill(self, now: float, prompt: int) -> None:
        """Moves queued samples of live requests into free slots (``advance`` already ran)."""
        waiting, heap, p0, slots = self.waiting, self.heap, self.p0, self.slots
        n = self.n
        while waiting and n < slots:
            request, length, done = waiting.popleft()
            if request.queued == 0:
                continue  # aborted
            request.queued -= 1
            self.queued -= 1
            if n == 0:
                self.busy_since = now
            # A resumed sample "started" ``done`` steps ago: its KV holds the tokens so far.
            heapq.heappush(heap, (p0 + length, next(_TIEBREAK), request, p0 - done))
            n += 1
            self.base += prompt - p0 + done
            request.live += 1
            request.kv_base += prompt - p0 + done
        self.n = n

    def remove(self, now: float, request: Tracked, prompt: int) -> None:
        """Drops the live and queued samples of an aborted request (their entries go dead)."""
        self.advance(now)
        self.n -= request.live
        self.base -= request.kv_base
        self.queued -= request.queued
        request.live = request.queued = 0
        request.kv_base = 0.0
        self.epoch += 1
        self._fill(now, prompt)
        self._maybe_idle(now)

    def extract(self, now: float, request: Tracked, prompt: int) -> list[tuple[float, float]]:
        """Interrupts ``request`` here (partial rollout): returns ``(remaining, done)`` tokens of
        each of its unfinished samples and purges it from this replica's heap and queue, so
        the request can resume elsewhere (and this replica be parked or retired)."""
        self.advance(now)
        p0 = self.p0
        samples = [(f - p0, p0 - start) for f, _, r, start in self.heap if r is request]
        samples += [(length, done) for r, length, done in self.waiting if r is request]
        self.heap = [entry for entry in self.heap if entry[2] is not request]
        heapq.heapify(self.heap)
        self.waiting = collections.deque(e for e in self.waiting if e[0] is not request)
        self.remove(now, request, prompt)
        return samples

    def resume(
        self,
        now: float,
        request: Tracked,
        samples: list[tuple[float, float]],
        prompt: int,
        prefill_s: float,
    ) -> None:
        """Takes over an interrupted request: re-prefills its prefixes, then decodes the rest
        of each sample (``samples`` as :meth:`extract` returns them)."""
        self.advance(now)
        request.live = 0
        request.kv_base = 0.0
        self.waiting.extend([(request, remaining, done) for remaining, done in samples])
        request.queued = len(samples)
        self.queued += len(samples)
        self.pause_until = max(self.pause_until, now) + prefill_s
        self.epoch += 1
        self._fill(now, prompt)

    def _maybe_idle(self, now: float) -> None:
        if self.n == 0 and self.busy_since is not None:
            self.busy_acc += now - self.busy_since
            if self._record:
                self._spans.append((self.busy_since, now))
            self.busy_since = None
            self.base = 0.0  # drop float drift once the replica empties

    def next_finish_time(self) -> float | None:
        """Time at which the next live sequence finishes, or None if nothing is live."""
        heap = self.heap
        while heap and heap[0][2].live == 0:
            heapq.heappop(heap)  # aborted
        if not heap:
            return None
        t0, pause_until = self.t0, self.pause_until
        start = t0 if t0 >= pause_until else pause_until
        return start + self._time_for(heap[0][0] - self.p0)

    def pop_finished(self, now: float, prompt: int) -> list:
        """Retires every sequence done by ``now`` and refills the freed slots from the queue.

        Returns one request per retired sequence.
        """
        self.advance(now)
        heap, done = self.heap, []
        p0 = self.p0
        n, base = self.n, self.base
        while heap and (heap[0][2].live == 0 or heap[0][0] <= p0 + 1e-6):
            finish, _, request, start = heapq.heappop(heap)
            if request.live == 0:
                continue
            if finish > p0:
                p0 = finish
            request.live -= 1
            request.kv_base -= prompt - start
            n -= 1
            base -= prompt - start
            done.append(request)
        self.p0, self.n, self.base = p0, n, base
        self.epoch += 1
        if self.waiting:
            self._fill(now, prompt)
        if self.n == 0:
            self._maybe_idle(now)
        return done

    def busy_spans(self, now: float) -> list[tuple[float, float]]:
        """(start, end) of each period with live sequences, the open one cut at ``now``."""
        tail = [(self.busy_since, now)] if self.busy_since is not None else []
        return self._spans + tail

    def busy_seconds(self, now: float) -> float:
        """Seconds this replica has had live sequences, up to ``now``."""
        open_span = now - self.busy_since if self.busy_since is not None else 0.0
        return self.busy_acc + open_span
