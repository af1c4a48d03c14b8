"""The driver's sampler while lending: the run's sampler plus a replica lent on the learner's
chips (Rollout-on-TrainPool, :mod:`rljax.runtime.lending`), with routing between them and the
hand-back of the lent replica's requests as partial rollouts."""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from rljax.engine.sampler import Request, Trajectory
from rljax.policy.routing import ReplicaLoad, route
from rljax.runtime.parts import SamplerPart


class MovableSampler(SamplerPart, Protocol):
    """A sampler whose requests can move to another one, keeping their tokens so far:
    :class:`~rljax.engine.sampler.Sampler` and :class:`~rljax.testing.fakes.FakeSampler`."""

    @property
    def stats(self) -> Mapping[str, int]:
        """Running counts; ``tokens``: tokens decoded."""
        ...

    def request_ids(self) -> set[int]:
        """Ids of the requests with a sample here."""
        ...

    def hand_over(self, request_id: int) -> list[Any]:
        """Take a request's samples out, for another sampler's :meth:`adopt`."""
        ...

    def adopt(self, samples: Sequence[Any]) -> None:
        """Queue samples another sampler handed over."""
        ...


class ReplicaSet:
    """The driver's sampler: the run's sampler, plus a lent replica on the learner's chips.

    The sampler thread drives ``main`` as before (``step``, ``submit``, ``set_params``,
    ``abort``); the learner thread drives the lent replica (:meth:`serve`) between
    :meth:`lend` and :meth:`release`. Requests routed to the lent replica wait in an inbox the
    learner thread takes; what it finishes, and the samples it hands back at release, wait
    until the sampler thread's next call, so only that thread touches ``main``. Locks: ``_serve``
    around any use of the lent sampler, then ``_lock`` (short) around the lent pointer, the
    inbox and the lent load; always in that order. ``busy_slots``, ``num_slots`` and
    ``kv_tokens`` are the main sampler's (the PhaseMeter measures it); ``lent_free_slots`` is
    what admission adds while a replica is lent.
    """

    def __init__(
        self,
        main: MovableSampler,
        *,
        max_new_tokens: int | None = None,
        on_routed: Callable[[], None] = lambda: None,
    ):
        self.main = main
        # The budget a routed request without its own gets, so a resumed one keeps it.
        self.max_new_tokens = max_new_tokens
        self.lent: MovableSampler | None = None
        self._serve = threading.Lock()
        self._lock = threading.Lock()
        self._inbox: collections.deque[Request] = collections.deque()
        # Handed back: a started request's samples (a list) or a request no replica started.
        self._returns: collections.deque[list | Request] = collections.deque()
        self._lent_load = (0, 0)  # (free slots, queued samples) after its last step
        # Trajectories the lent replica finished, returned by the sampler thread's next step.
        self._finished: collections.deque[Trajectory] = collections.deque()
        self.on_routed = on_routed  # wakes the learner thread serving the lent replica
        self.stats: collections.Counter = collections.Counter()

    # -- the sampler interface the driver uses ----------------------------------------------

    @property
    def version(self) -> int:
        return self.main.version

    @property
    def busy_slots(self) -> int:
        return self.main.busy_slots

    @property
    def num_slots(self) -> int:
        return self.main.num_slots

    @property
    def kv_tokens(self) -> int:
        return self.main.kv_tokens

    @property
    def free_slots(self) -> int:
        """The main sampler's free slots, plus the lent replica's (admission fills both)."""
        return self.main.free_slots + self.lent_free_slots

    @property
    def lent_free_slots(self) -> int:
        with self._lock:
            return self._lent_load[0] if self.lent is not None else 0

    @property
    def queued_samples(self) -> int:
        with self._lock:
            lent = self._lent_load[1] + sum(r.num_samples for r in self._inbox)
        return self._main_queued() + lent

    @property
    def returning_samples(self) -> int:
        """Samples handed back that the main sampler has not adopted yet."""
        return sum(_samples(x) for x in list(self._returns))

    def _main_queued(self) -> int:
        return self.main.queued_samples + self.returning_samples

    def has_work(self) -> bool:
        return bool(self._returns or self._finished) or self.main.has_work()

    def submit(self, requests: Sequence[Request]) -> list[int]:
        """Route each group to a replica with an unclaimed slot (the main one when none has)."""
        main: list[Request] = []
        lent: list[Request] = []
        with self._lock:  # a release cannot slip between routing and the inbox
            load = [ReplicaLoad(0, self.main.free_slots, self._main_queued())]
            if self.lent is not None:
                inbox = sum(r.num_samples for r in self._inbox)
                load.append(ReplicaLoad(1, self._lent_load[0], self._lent_load[1] + inbox))
            for r in requests:
                i = route(load) or 0
                load[i] = load[i]._replace(queued=load[i].queued + r.num_samples)
                (lent if i else main).append(r)
            if lent:
                self._check(lent)
                self._inbox.extend(lent)
                self.stats["routed_groups"] += len(lent)
        ids = self.main.submit(main) if main else []
        if lent:
            self.on_routed()
        return ids + [r.request_id for r in lent]

    def step(self) -> list[Trajectory]:
        """One generate on the main sampler, plus what the lent replica finished meanwhile."""
        self._adopt()
        lent = [self._finished.popleft() for _ in range(len(self._finished))]
        return self.main.step() + lent

    def set_params(self, params: Any, version: int) -> None:
        self.main.set_params(params, version)

    def abort(self, request_id: int) -> None:
        self._adopt()
        self.main.abort(request_id)
        with self._serve:
            with self._lock:
                self._drop_inbox(request_id)
                lent = self.lent
            if lent is not None:
                lent.abort(request_id)

    def interrupt(self, request_id: int) -> int:
        """Hold the request on the main sampler, wherever its samples were (resume reads it)."""
        self._adopt()
        with self._serve:
            with self._lock:
                waiting, lent = self._drop_inbox(request_id), self.lent
            self.main.submit(waiting)
            if lent is not None:
                self.main.adopt(lent.hand_over(request_id))
        return self.main.interrupt(request_id)

    def resume(self, request_id: int) -> None:
        self.main.resume(request_id)

    # -- lending ----------------------------------------------------------------------------

    def lend(self, replica: MovableSampler) -> None:
        """Start serving on ``replica`` (its weights loaded, its slots empty)."""
        with self._lock:
            self.lent = replica
            self._lent_load = (replica.num_slots, 0)
            self.stats["lends"] += 1

    def serve(self) -> bool:
        """One generate on the lent replica; False when none is lent or it has nothing to do.

        What it finishes goes to the main sampler's caller with its next ``step``.
        """
        with self._serve:
            with self._lock:
                lent = self.lent
                new = [self._inbox.popleft() for _ in range(len(self._inbox))]
            if lent is None:
                return False
            if new:
                lent.submit(new)
            if not lent.has_work():
                return False
            tokens = lent.stats["tokens"]
            finished = lent.step()
            self._finished.extend(finished)
            with self._lock:
                self.stats["served_tokens"] += lent.stats["tokens"] - tokens
                self.stats["served_samples"] += len(finished)
                self.stats["served_steps"] += 1
                self._lent_load = (lent.num_slots - lent.busy_slots, lent.queued_samples)
            return True

    def release(self) -> MovableSampler | None:
        """Stop lending: the replica's requests go back to the main sampler; returns it."""
        with self._serve, self._lock:
            lent, self.lent = self.lent, None
            self._lent_load = (0, 0)
            if lent is None:
                return None
            self.stats["handed_over_samples"] += sum(r.num_samples for r in self._inbox)
            self._returns.extend(self._inbox)
            self._inbox.clear()
            for rid in sorted(lent.request_ids()):
                samples = lent.hand_over(rid)
                self.stats["handed_over_samples"] += len(samples)
                self._returns.append(samples)
        return lent

    def _adopt(self) -> None:
        """Queue the samples the lent replica handed back (on the thread driving ``main``)."""
        while self._returns:
            item = self._returns.popleft()
            self.stats["adopted_samples"] += _samples(item)
            if isinstance(item, Request):
                self.main.submit([item])
            else:
                self.main.adopt(item)

    def _drop_inbox(self, request_id: int) -> list[Request]:
        """Take a request out of the inbox (call under ``_lock``)."""
        out = [r for r in self._inbox if r.request_id == request_id]
        for r in out:
            self._inbox.remove(r)
        return out

    def _check(self, requests: list[Request]) -> None:
        for r in requests:
            if r.request_id < 0:
                raise ValueError("a request routed to a lent replica needs its own request_id")
            if r.max_new_tokens is None:
                r.max_new_tokens = self.max_new_tokens


def _samples(item: list | Request) -> int:
    return item.num_samples if isinstance(item, Request) else len(item)
