"""Discrete-event simulator of the sampler/learner pipeline, driving the real policy objects.

The event loop (``heapq``, no threads, no jax) replaces the engines with cost models but drives
the runtime's policies through the runtime's wiring: the ``StalenessController`` built by
:func:`rljax.policy.admission.controller` says how many groups to dispatch,
:func:`rljax.policy.routing.route` which replica takes each, the ``StalenessBuffer`` where each
goes and when a batch is ready, and the ``Reallocator`` whether to move chips, reading the
``PhaseStats`` that a :class:`~rljax.policy.meter.PhaseMeter` builds from the events the
replicas, the dispatcher and the learner report (the events the runtime driver reports).

Modes:
  sync:     colocated, eta = 0. All chips generate, then all chips train, then reshard.
  async:    disjoint sampler and learner meshes on a static split; the sampler runs up to eta
            versions ahead; weights are broadcast after every step.
  realloc:  async, plus the Reallocator is consulted every ``phase_steps`` learner steps and a
            move pays ``switch_cost_s`` of stall on the learner and on the added replicas.
  lend:     async on a static split, plus the lending policy (``rljax.policy.lending``) is
            consulted every ``phase_steps`` learner steps and its loans (Rollout-on-TrainPool,
            Trainer-on-RollPool) are carried out in each step of the next phase, with their
            costs (see :mod:`rljax.sim.lend`).

A group is dispatched to the replica ``route`` picks (its G samples share a prefill; samples
that find no free slot wait there for one), its lengths are drawn at dispatch from the
``LengthModel`` at the sampler's version, and the group is complete when its last sample
finishes. The sampler dispatches while some replica has a slot that no queued sample claims,
so a few long stragglers never hold a replica's other slots empty. In-flight groups keep
decoding across a weight swap (PipelineRL-style in-flight update), so a group's staleness is
``learner version - dispatch version``.
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools
from typing import Any

from rljax.policy import admission
from rljax.policy.lending import LendingConfig, LendingDecision
from rljax.policy.meter import Learn, LearnerWait, PhaseMeter, SamplerIdle, StepEnd
from rljax.policy.reallocation import (
    PhaseStats,
    Reallocator,
    ReallocatorConfig,
    Split,
    reallocator_settings,
)
from rljax.policy.routing import ReplicaLoad, route
from rljax.policy.staleness import StalenessBuffer, StalenessController
from rljax.sim.config import MODES, SimConfig
from rljax.sim.costs import CostModel
from rljax.sim.lend import Lender
from rljax.sim.replica import Replica
from rljax.sim.results import SimResult, Span
from rljax.sim.workload import LengthModel

__all__ = ["MODES", "SimConfig", "Simulator"]


class _Request:
    __slots__: tuple[str, ...] = ("rid", "prompt_id", "version", "replica", "tokens", "remaining")
    __slots__ += ("live", "queued", "kv_base")  # the replica's bookkeeping

    def __init__(self, rid, prompt_id, version, replica, tokens, samples):
        self.rid, self.prompt_id, self.version = rid, prompt_id, version
        self.replica, self.tokens, self.remaining = replica, tokens, samples
        self.live = self.queued = 0
        self.kv_base = 0.0


class Simulator:
    """Runs one ``SimConfig`` against a ``CostModel`` and a ``LengthModel``."""

    def __init__(
        self,
        config: SimConfig,
        cost: CostModel,
        lengths: LengthModel,
        *,
        force_lending: LendingDecision | None = None,
    ):
        self.cfg, self.cost, self.lengths = config, cost, lengths
        self.force_lending = force_lending  # mode "lend": this loan every phase (benchmarks)
        if config.train_flops_per_param is not None:
            self.cost = dataclasses.replace(
                cost, train_flops_per_param=config.train_flops_per_param
            )
        self.colocated = config.mode == "sync"
        self.unit = config.granularity or cost.chip.chips_per_host
        if not self.colocated and config.sampler_chips % cost.tp:
            raise ValueError(
                f"sampler_chips={config.sampler_chips} is not a multiple of tp={cost.tp}; "
                "each replica needs tp chips"
            )
        mean_tokens = config.prompt_tokens + lengths.mean(config.steps)
        self.slots = self.cost.kv_slots(mean_tokens, config.max_slots)
        if self.slots < config.group_size:
            raise ValueError(
                f"a {cost.tp}-chip replica holds only {self.slots} sequences of ~{mean_tokens:.0f}"
                f" tokens, fewer than group_size={config.group_size}; raise tp"
            )
        self.draw = lengths.group_sampler(config.seed)
        self.prefill_s = self.cost.prefill_s(config.prompt_tokens)  # a group's shared prefix

    # ----- setup -----------------------------------------------------------------------------

    def _start(self) -> None:
        """The state of a run at time 0: the split, replicas, buffer, policies and counters."""
        cfg = self.cfg
        self.events: list[tuple[float, int, str, Any]] = []  # (time, seq, kind, payload)
        self._seq = itertools.count()
        self.meter = PhaseMeter() if cfg.mode in ("realloc", "lend") else None
        self._rid, self._prompt_ids, self._replica_ids = (itertools.count() for _ in range(3))
        if self.colocated:
            self.sampler_chips = self.learner_chips = cfg.total_chips
        else:
            self.sampler_chips = cfg.sampler_chips
            self.learner_chips = cfg.total_chips - cfg.sampler_chips
        self.replicas = self._new_replicas(self.sampler_chips // self.cost.tp, 0.0, 0.0)
        self.open: set[Replica] = set(self.replicas)  # replicas with room for one more group
        self._denied: int | None = None  # the _changes count the policies last said no at
        self._changes = 0
        self._live = self._blocked_free = 0
        self.blocked_slot_s = self._blocked_t = self._learner_free_t = 0.0
        self.buffer = StalenessBuffer(
            batch_groups=cfg.batch_groups,
            max_staleness=cfg.max_staleness,
            overprovision=cfg.overprovision,
        )
        self.controller = self._make_controller()
        self.reallocator = Reallocator(self.reallocator_settings())
        self.switch_cost_s = self.estimated_switch_cost_s()
        self.running: dict[int, _Request] = {}
        self.lender: Lender | None = None
        if cfg.mode == "lend":
            config = cfg.lending or LendingConfig(enabled=True)
            self.lender = Lender(self, config, self.force_lending)
        self.requeue: list[int] = []
        self.sampler_version = 0
        self.learner_busy = False
        self.replica_seconds = self._replicas_since = 0.0
        self.retired: list[Replica] = []
        self.learner_train = self.retired_busy = 0.0
        self._training = (0.0, 0)  # start and tokens of the step being trained
        self.steps_done = self.dispatched = self.aborted = 0
        self.step_ends: list[float] = []
        self.staleness: list[int] = []
        self.consumed_prompts: list[int] = []
        self.moves: list[tuple[float, int, int]] = []  # (time, sampler chips, learner chips)
        self.spans: list[Span] = []

    def _min_learner_chips(self) -> int:
        # Params + grads in bf16 and Adam moments + master weights in fp32: ~16 bytes/param.
        state = 16 * self.cost.n_params
        need = -(-int(state) // int(self.cost.chip.hbm_bytes * 0.8))
        return max(self.unit, -(-need // self.unit) * self.unit)

    def reallocator_settings(self) -> ReallocatorConfig:
        """The Reallocator's settings: the ``reallocator`` section fitted to this run by
        :func:`~rljax.policy.reallocation.reallocator_settings`, as the runtime's are. A
        replica's ``tp`` chips and the chips the learner's state needs are the floors."""
        return reallocator_settings(
            self.cfg.reallocator or ReallocatorConfig(),
            max_staleness=self.cfg.max_staleness,
            granularity=self.unit,
            sampler_floor=self.cost.tp,
            learner_floor=self._min_learner_chips(),
        )

    def estimated_switch_cost_s(self) -> float:
        """Reshard the learner state over the network, then rebuild and warm an engine."""
        if self.cfg.switch_cost_s is not None:
            return self.cfg.switch_cost_s
        state = 16 * self.cost.n_params
        link = self.cost.chip.network_bytes_per_s * self.cost.efficiencies.sync
        reshard = state / (self._min_learner_chips() * link)
        engine_rebuild = 30.0  # compile + KV allocation, a typical JetStream/vLLM warm start
        return reshard + engine_rebuild

    def _split(self) -> Split:
        return Split(self.sampler_chips, self.learner_chips)

    def _make_controller(self) -> StalenessController:
        return admission.controller(
            slots=len(self.replicas) * self.slots,
            group_size=self.cfg.group_size,
            batch_groups=self.cfg.batch_groups,
            max_staleness=self.cfg.max_staleness,
            overprovision=self.cfg.overprovision,
        )

    def _new_replicas(self, count: int, now: float, ready_at: float) -> list[Replica]:
        made = []
        for _ in range(count):
            index = next(self._replica_ids)
            rep = Replica(index, self.cost, self.slots, now, self.cfg.timeline, self.meter)
            rep.pause_until = ready_at
            made.append(rep)
        return made

    # ----- events ----------------------------------------------------------------------------

    def _push(self, time: float, kind: str, payload=None) -> None:
        heapq.heappush(self.events, (time, next(self._seq), kind, payload))

    def _schedule_replica(self, rep: Replica) -> None:
        # Every change to a replica's live set ends here, so this keeps ``open`` and ``_live``
        # (live sequences over all replicas) exact.
        n = rep.n
        if not rep.lent:  # live sequences on the sampler's own chips
            self._live += n - rep.counted
        rep.counted = n
        if rep.slots - n - rep.queued > 0 and rep.epoch >= 0:
            self.open.add(rep)
        else:
            self.open.discard(rep)
        t = rep.next_finish_time()
        if t is not None:
            heapq.heappush(self.events, (t, next(self._seq), "finish", (rep, rep.epoch)))

    def _span(self, role: str, lane: int, kind: str, start: float, end: float) -> None:
        if self.cfg.timeline and end > start:
            self.spans.append(Span(role, lane, kind, start, end))

    def _dispatch(self, now: float) -> None:
        """Dispatches what the policies allow; notes the free slots they hold back."""
        denied = self.open and self._dispatch_groups(now)
        self._hold(now, len(self.replicas) * self.slots - self._live if denied else 0)

    def _hold(self, now: float, free: int) -> None:
        """From ``now`` the policies hold ``free`` free slots back (free slots only change at
        events); reports the previous stretch, if any, as the sampler's idle capacity."""
        if free != self._blocked_free:
            self._flush_held(now)
            self._blocked_free = free

    def _flush_held(self, now: float) -> None:
        held, start = self._blocked_free, self._blocked_t
        if held and now > start:
            self.blocked_slot_s += (now - start) * held
            if self.meter is not None:
                self.meter.record(SamplerIdle(start, now, held))
        self._blocked_t = now

    def _dispatch_groups(self, now: float) -> bool:
        """Returns whether the policies denied a group while a replica had a free slot."""
        cfg = self.cfg
        if self.colocated and self.learner_busy:
            return False
        g = cfg.group_size
        while self.open:
            # The policies are pure: if nothing they read changed since they last said no, they
            # would say no again, so skip the call (this halves the simulator's run time).
            # ``_changes`` counts every call that changes what they read (buffer, requests in
            # flight, sampler version, controller).
            key = self._changes
            if key == self._denied:
                return True
            cap = self.controller.capacity(
                self.buffer.version, len(self.running), self.buffer.accepted
            )
            if cap <= 0:
                self._denied = key
                return True
            rid = next(self._rid)
            if self.buffer.reserve(rid, self.sampler_version) is None:
                self._denied = key
                return True
            index = route(
                ReplicaLoad(r.index, r.slots - r.n, r.queued, r.pause_until <= now)
                for r in self.open
            )
            rep = next(r for r in self.open if r.index == index)
            prompt_id = self.requeue.pop() if self.requeue else next(self._prompt_ids)
            lengths = self.draw(self.sampler_version, g)
            req = _Request(rid, prompt_id, self.sampler_version, rep, sum(lengths), g)
            self.running[rid] = req
            self._changes += 1
            self.dispatched += 1
            rep.admit(now, req, lengths, cfg.prompt_tokens, self.prefill_s)
            self._schedule_replica(rep)
        return False

    def _abort(self, now: float, rid, requeue: bool) -> None:
        req = self.running.pop(rid)
        self._changes += 1
        req.replica.remove(now, req, self.cfg.prompt_tokens)
        self.buffer.release(rid)
        self.aborted += 1
        if requeue:
            self.requeue.append(req.prompt_id)
        self._schedule_replica(req.replica)

    def _on_finish(self, now: float, rep: Replica, epoch: int) -> None:
        if epoch != rep.epoch:
            return
        running = self.running
        for req in rep.pop_finished(now, self.cfg.prompt_tokens):
            req.remaining -= 1
            if req.remaining > 0 or req.rid not in running:
                continue
            del self.running[req.rid]
            self._changes += 1
            group = (
                req.prompt_id,
                req.version,
                self.cfg.group_size * self.cfg.prompt_tokens + req.tokens,
            )
            for surplus in self.buffer.occupy(req.rid, group, req.version):
                self._abort(now, surplus, requeue=False)
        self._schedule_replica(rep)

    def _try_train(self, now: float) -> None:
        if self.learner_busy:
            return
        v = self.buffer.version
        if not self.buffer.ready(v):
            return
        if self.colocated:
            for rid in list(self.running):  # surplus of an on-policy batch is dropped
                self._abort(now, rid, requeue=False)
        delay = self.lender.release(now) if self.lender is not None else 0.0
        groups = self.buffer.consume(v)
        self._changes += 1
        tokens = 0
        for prompt_id, version, group_tokens in groups:
            self.staleness.append(v - version)
            self.consumed_prompts.append(prompt_id)
            tokens += group_tokens
        train_s = self.cost.train_step_s(tokens, self.learner_chips)
        if self.lender is not None:
            train_s = self.lender.train_s(now, train_s)
        if self.meter is not None and now > self._learner_free_t:
            self.meter.record(LearnerWait(self._learner_free_t, now))
        self.learner_busy = True
        self.learner_train += train_s
        start = now + delay  # after the borrowed replicas' requests are handed back
        self._training = (start, tokens)
        self._span("learner", 0, "train", start, start + train_s)
        self._push(start + train_s, "trained", v + 1)

    def _on_trained(self, now: float, version: int) -> None:
        self.steps_done += 1
        self.step_ends.append(now)
        split = None
        if self.lender is not None:
            self.lender.unpark(now)
        if self.meter is not None:
            self.meter.record(Learn(self._training[0], now, self._training[1]))
            self.meter.record(StepEnd(now))
            if self.meter.steps >= self.cfg.phase_steps:
                if self.lender is not None:
                    self.lender.decide(now, self._phase_stats(now))
                else:
                    split = self.reallocator.decide(self._phase_stats(now))
        switch = 0.0
        if split is not None:
            switch = self._resize(now, split)
        if self.colocated:
            sync = self.cost.reshard_local_s()
        else:
            sync = self.cost.sync_s(self.sampler_chips, self.learner_chips)
        self._span("learner", 0, "switch" if switch else "sync", now, now + sync + switch)
        if self.cfg.sync_pauses_sampler or self.colocated:
            for rep in self.replicas:
                rep.pause(now + switch, sync)
                self._schedule_replica(rep)
        self._push(now + switch + sync, "synced", (version, sync))

    def _on_synced(self, now: float, version: int, sync: float) -> None:
        # The publish is learner work; the resize stall before it is neither busy nor idle (it
        # is the switch cost the policy weighs).
        if self.meter is not None:
            self.meter.record(Learn(now - sync, now))
        self._learner_free_t = now
        self.sampler_version = version
        self._changes += 1
        self.learner_busy = False
        if self.lender is not None:
            self.lender.on_learner_free(now)

    # ----- reallocation ----------------------------------------------------------------------

    def _phase_stats(self, now: float) -> PhaseStats:
        # Bring every report up to ``now``, then let the meter do the arithmetic.
        self._flush_held(now)
        for rep in self.replicas:
            rep.advance(now)
        assert self.meter is not None, "only modes 'realloc' and 'lend' measure phases"
        return self.meter.stats(
            split=self._split(),
            slots=len(self.replicas) * self.slots,
            buffer_rows=self.buffer.snapshot(),
            batch_groups=self.cfg.batch_groups,
            switch_cost_s=self.switch_cost_s,
            granularity=self.unit,
        )

    def _account_replicas(self, now: float) -> None:
        # Replica-seconds available, so utilisation stays right while the split changes.
        self.replica_seconds += len(self.replicas) * (now - self._replicas_since)
        self._replicas_since = now

    def _retire(self, now: float, rep: Replica) -> None:
        self._account_replicas(now)
        self.retired_busy += rep.busy_seconds(now)
        self._live -= rep.counted
        rep.advance(now)
        rep.epoch = -1  # its pending finish events are now stale
        self.open.discard(rep)
        self.retired.append(rep)
        self.replicas.remove(rep)

    def _resize(self, now: float, split: Split) -> float:
        """Moves chips at a safe point (between learner steps); returns the learner stall."""
        switch = self.switch_cost_s
        want = split.sampler_chips // self.cost.tp
        if want < len(self.replicas):
            # Drop the least-loaded replicas; their groups restart elsewhere from the prompt.
            victims = sorted(self.replicas, key=lambda r: (r.n, r.index))[
                : len(self.replicas) - want
            ]
            for rep in victims:
                for rid in [rid for rid, q in self.running.items() if q.replica is rep]:
                    self._abort(now, rid, requeue=True)
                self._retire(now, rep)
        else:
            self._account_replicas(now)
            added = self._new_replicas(want - len(self.replicas), now, now + switch)
            self.replicas += added
            self.open.update(added)
        self.sampler_chips = split.sampler_chips
        self.learner_chips = split.learner_chips
        self.controller = self._make_controller()
        self._changes += 1
        self.moves.append((now, split.sampler_chips, split.learner_chips))
        return switch

    # ----- run -------------------------------------------------------------------------------

    def run(self) -> SimResult:
        """Simulates ``cfg.steps`` learner steps and returns the measurements."""
        cfg = self.cfg
        self._start()
        now = 0.0
        self._dispatch(now)
        # The loop runs once per finished sequence (a million times at pod scale), so it skips
        # calls that would change nothing.
        events, pop, steps = self.events, heapq.heappop, cfg.steps
        while events and self.steps_done < steps:
            now, _, kind, payload = pop(events)
            if kind == "finish":
                rep, epoch = payload
                if epoch != rep.epoch:
                    continue  # stale: nothing changed, so the policies would answer as before
                self._on_finish(now, rep, epoch)
            elif kind == "trained":
                self._on_trained(now, payload)
            elif kind == "synced":
                self._on_synced(now, *payload)
            if not self.learner_busy:
                self._try_train(now)
            if self.open:
                self._dispatch(now)
            elif self._blocked_free:
                self._hold(now, 0)
        self._flush_held(now)
        if self.steps_done < cfg.steps:
            raise RuntimeError(
                f"simulation stalled after {self.steps_done}/{cfg.steps} steps: no event left; "
                "check that the sampler can fill a batch (slots, eta, overprovision)"
            )
        sampler_busy = sum(r.busy_seconds(now) for r in self.replicas) + self.retired_busy
        self._account_replicas(now)
        for rep in self.replicas + self.retired:
            for start, end in rep.busy_spans(now):
                self._span("sampler", rep.index, "decode", start, end)
        return SimResult(
            mode=cfg.mode,
            wall_s=now,
            steps=self.steps_done,
            samples=len(self.consumed_prompts) * cfg.group_size,
            sampler_util=sampler_busy / max(self.replica_seconds, 1e-9),
            learner_util=self.learner_train / max(now, 1e-9),
            staleness=tuple(self.staleness),
            consumed_prompts=tuple(self.consumed_prompts),
            dispatched=self.dispatched,
            aborted=self.aborted,
            in_flight=len(self.running),
            held=self.buffer.accepted - len(self.consumed_prompts),
            moves=tuple(self.moves),
            final_split=(self.sampler_chips, self.learner_chips),
            spans=tuple(self.spans),
            step_ends=tuple(self.step_ends),
            **(self.lender.figures() if self.lender is not None else {}),
        )
