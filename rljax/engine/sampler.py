"""The continuous-batching driver: keeps every engine slot busy from a request stream.

A request asks for ``num_samples`` responses to one prompt (a GRPO group). Its prompt is
prefilled once, which draws every sample's first token, each from its own PRNG stream; the
groups that fit the free slots are prefilled together in one call
(``PagedEngine.prefill_batch``, at most ``sampling.prefill_batch`` prompts; one alone goes
through ``PagedEngine.prefill_multisampling``). Each sample then takes the next free slot of its
home (``PagedEngine.bulk_insert``; homes: :mod:`rljax.engine.homes`). Slots are refilled as
soon as a sequence finishes and is freed (``PagedEngine.free_resource``), so a long-tailed
response length distribution does not idle the batch the way static batching does. The Sampler
drives rljax's native engine (:mod:`rljax.engine.paged`), JetStream's calls and its extensions.

Each :meth:`Sampler.step` runs one decode call of ``decode_steps`` tokens a slot, a loop on
the device that stops each slot at a stop id or its budget (:mod:`rljax.engine.decode`); a slot
that stops early idles for the rest of the call (counted as ``decode_steps_idle``). New samples
take freed slots at the next call.

Every sampled token is tagged with the params version that produced it. Params can be swapped
between decode calls (:meth:`Sampler.set_params`):
- ``inflight``: keep the KV cache and continue (PipelineRL-style in-flight update);
- ``recompute``: re-prefill every running sequence under the new params, and every sample
  still waiting for a slot (its first token, drawn by the old params, is kept);
- ``drain``: admit nothing new until running sequences finish, then swap; waiting samples
  are re-prefilled under the new params too.

Only ``inflight`` lets a token tagged with the new version read KV made by the old params.

A running sample can be interrupted (partial rollout); it is kept with the tokens it has and
resumes later from its prefix (prompt + tokens so far), re-prefilled under the current params.
When the page pool runs out, the youngest running sample is preempted the same way. Token
``i`` of a sample's response is drawn from step ``i`` of its own PRNG stream, so a resumed
sample draws what it would have drawn uninterrupted.

A request with ``turns`` is a conversation: its samples keep their KV across turns and only
each new turn's tokens are prefilled (:mod:`rljax.engine.turns`, docs/agents.md).

The Sampler owns the decoding slots, the params and the decode state, and holds three parts: a
:class:`~rljax.engine.backlog.Backlog` (what waits for a slot), a
:class:`~rljax.engine.turns.TurnTracker` (conversations waiting for their env, in their paused
slots or without one) and a :class:`~rljax.engine.samples.Recorder` (the stop rules).
"""

from __future__ import annotations

import collections
import itertools
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from rljax.engine.backlog import Backlog, prefill_request
from rljax.engine.decode import steps_per_call
from rljax.engine.homes import SlotHomes
from rljax.engine.paged import PagedEngine
from rljax.engine.pages import OutOfPages
from rljax.engine.samples import FINISH_LENGTH, FINISH_STOP, Recorder, Request, Sample, Trajectory
from rljax.engine.state import DecodeState, Prefix, ResultTokens
from rljax.engine.turns import TurnAnswer, TurnTracker

# Request, Trajectory and the finish reasons are the Sampler's interface; they live in
# rljax.engine.samples and are importable from here too.
__all__ = ["FINISH_LENGTH", "FINISH_STOP", "Request", "Sampler", "Trajectory", "TurnAnswer"]


class Sampler:
    """Drives a :class:`~rljax.engine.paged.PagedEngine` with continuous batching on the
    sampler mesh.

    ``keep_kv=False`` gives up a conversation's slot and pages at each turn end and prefills
    its whole prefix again for the next turn (the baseline keeping the KV is measured against).
    ``decode_steps`` (default: the engine's ``sampling.decode_steps``) is the tokens a slot may
    draw in one :meth:`step`'s decode call; swaps, new samples and turns wait for the call's end.
    """

    def __init__(
        self,
        engine: PagedEngine,
        params: Any,
        *,
        version: int = 0,
        stop_ids: Sequence[int] = (),
        stop_strings: Sequence[str] = (),
        detokenize: Callable[[list[int]], str] | None = None,
        swap_mode: str | None = None,
        slot_homes: Sequence[int] | None = None,
        keep_kv: bool = True,
        decode_steps: int | None = None,
    ):
        self.stats: collections.Counter[str] = collections.Counter()
        self._recorder = Recorder(stop_ids, stop_strings, detokenize, self.stats)
        self.engine = engine
        self.params: Any = engine.serving_params(params)
        self.version = version
        self.swap_mode = swap_mode or engine.sampling_cfg.swap_mode
        self.state: DecodeState = engine.init_decode_state()
        # The decoding samples; a conversation waiting in its paused slot is the tracker's.
        self._slots: list[Sample | None] = [None] * engine.max_concurrent_decodes
        self.homes = SlotHomes(slot_homes, len(self._slots))
        self._backlog = Backlog(self.homes, engine.sampling_cfg.prefill_batch)
        self._turns = TurnTracker(
            engine, self._backlog, self._recorder, self.stats, keep_kv=keep_kv
        )
        self._held: dict[int, list[Sample]] = {}  # interrupted, by request id
        self._next_id = itertools.count()
        self._order = itertools.count()
        self._staged: tuple[Any, int] | None = None
        # Tokens per decode call (rljax.engine.decode). Stop strings are read from the text on
        # the host, which the device cannot check: with any, one token a call.
        setting = engine.sampling_cfg.decode_steps if decode_steps is None else decode_steps
        self.decode_steps = 1 if stop_strings else steps_per_call(setting, engine.mesh)

    # -- requests ---------------------------------------------------------------------------

    def submit(self, requests: Sequence[Request]) -> list[int]:
        """Queue requests; checks each before any is queued. Returns their request ids."""
        budget = self.engine.sampling_cfg.max_new_tokens
        for r in requests:
            r.check(self.engine.max_prefill_length, budget)
            self.homes.check(r.home)
        ids = []
        for r in requests:
            # A caller may name its requests (e.g. by buffer reservation); ids must be unique.
            if r.request_id < 0:
                r.request_id = next(self._next_id)
            if r.max_new_tokens is None:
                r.max_new_tokens = budget
            self._backlog.add_requests([r])
            ids.append(r.request_id)
        return ids

    @property
    def stop_ids(self) -> frozenset[int]:
        """The token ids that end a sample (or a conversation's model turn)."""
        return self._recorder.stop_ids

    @property
    def busy_slots(self) -> int:
        """Slots holding a sample (decoding, or a conversation waiting in its paused slot)."""
        return sum(s is not None for s in self._slots) + len(self._turns.in_slots())

    @property
    def num_slots(self) -> int:
        """Decode slots: sequences the engine decodes at once."""
        return len(self._slots)

    @property
    def free_slots(self) -> int:
        """Slots holding no sample."""
        return self.num_slots - self.busy_slots

    @property
    def kv_tokens(self) -> int:
        """Tokens the live slots hold in the KV cache (prompt plus response so far)."""
        held = [s for s in self._slots if s] + self._turns.in_slots()
        return sum(len(s.request.prompt_tokens) + len(s.tokens) for s in held)

    @property
    def queued_samples(self) -> int:
        """Samples waiting for a slot (submitted, pending a prefix, or resumed)."""
        return self._backlog.samples

    def has_work(self) -> bool:
        """Whether anything is decoding, waiting for a slot or waiting for its env."""
        return bool(self.busy_slots or self._backlog or self._turns.waiting)

    # -- params -----------------------------------------------------------------------------

    def set_params(self, params: Any, version: int) -> None:
        """Stage new params; they take effect at the next generate boundary per swap mode.

        With no sequence in flight there is no boundary to wait for: they apply at once.
        """
        self._staged = (self.engine.serving_params(params), version)
        if not self.busy_slots:
            self._apply_staged()

    def _apply_staged(self) -> None:
        if self._staged is None:
            return
        if self.swap_mode == "drain" and self._decoding():
            return  # a conversation waiting for its env has drained: it does not hold a swap
        self.params, self.version = self._staged
        self._staged = None
        self.stats["swaps"] += 1
        if self.swap_mode != "inflight":  # their KV came from the old params: prefill again
            # recompute: every slot; drain: what is left, conversations waiting for their env.
            for slot, s in enumerate(self._slots):
                if s is not None:
                    self._evict(slot, front=True)
            self._turns.release_slots()
            self._backlog.drop_prefixes()

    # -- interruption -----------------------------------------------------------------------

    def interrupt(self, request_id: int) -> int:
        """Hold every running or queued sample of a request; returns how many were held."""
        held = self._held.setdefault(request_id, [])
        for slot, s in enumerate(self._slots):
            if s is not None and s.request.request_id == request_id:
                self.engine.free_resource(slot)
                self._slots[slot] = None
                held.append(s)
        held.extend(self._backlog.remove(request_id))
        held.extend(self._turns.remove(request_id))
        self.stats["interrupted"] += len(held)
        return len(held)

    def resume(self, request_id: int) -> None:
        """Queue a held request's samples again; they continue from their prefixes (a
        conversation waiting for its env waits on, and continues once it answers)."""
        for s in self._held.pop(request_id, []):
            self._route(s)

    def hand_over(self, request_id: int) -> list[Sample]:
        """Interrupt a request and give up its samples (partial rollouts) for another sampler's
        :meth:`adopt`; they keep their tokens, log-probs and versions."""
        self.interrupt(request_id)
        return self._held.pop(request_id, [])

    def adopt(self, samples: Sequence[Sample]) -> None:
        """Queue samples another sampler handed over; they resume here from their prefixes."""
        for s in samples:
            self._route(s)

    def request_ids(self) -> set[int]:
        """Ids of the requests with a sample here (running, pending, queued or held)."""
        samples = [s for s in self._slots if s is not None] + self._turns.samples()
        return (
            {s.request.request_id for s in samples} | self._backlog.request_ids() | set(self._held)
        )

    def abort(self, request_id: int) -> None:
        """Drop a request entirely (e.g. surplus of a redundant rollout)."""
        self.interrupt(request_id)
        self._held.pop(request_id, None)

    def clear(self) -> int:
        """Drop every queued, pending, held and running sample; returns how many ran."""
        running = self.busy_slots
        for slot, s in enumerate(self._slots):
            if s is not None:
                self.engine.free_resource(slot)
                self._slots[slot] = None
        self._turns.clear()
        self._backlog.clear()
        self._held.clear()
        return running

    def close(self) -> None:
        """Free the KV pool and the weights now (a lent replica given back); the engine stays
        compiled, and this sampler is not used again."""
        del self.state, self.params

    def _evict(self, slot: int, *, front: bool) -> None:
        s = self._slots[slot]
        assert s is not None, f"slot {slot} is free: nothing to evict"
        self.engine.free_resource(slot)
        self._slots[slot] = None
        self._route(s, front=front)

    def _route(self, s: Sample, *, front: bool = False) -> None:
        """A sample without a slot: back to the backlog, or to wait for its env."""
        if s.future is not None:
            self._turns.wait_without_slot(s)
        else:
            self._backlog.add_resumed(s, front=front)

    # -- the loop ---------------------------------------------------------------------------

    def _prefill(self, batch: list[list[Sample]], finished: list[Trajectory]) -> None:
        """Prefill each sample list's shared prompt + tokens so far, in one engine call.

        Draws each sample's next token and records it; the samples still running go to the
        backlog with their prefix (the ones that finished on this token to ``finished``).
        """
        requests = [prefill_request(samples) for samples in batch]
        if len(requests) == 1:
            r = requests[0]
            out = [
                self.engine.prefill_multisampling(
                    params=self.params,
                    padded_tokens=np.asarray(r.tokens, np.int32),
                    true_length=len(r.tokens),
                    rng=r.rng,
                    num_samples=r.num_samples,
                    sampling=r.sampling,
                    step=r.step,
                )
            ]
        else:
            out = self.engine.prefill_batch(params=self.params, requests=requests)
        self.stats["prefills"] += len(requests)
        self.stats["prefill_calls"] += 1
        self.stats["prefill_tokens"] += sum(len(r.tokens) for r in requests)
        for samples, (prefix, result) in zip(batch, out, strict=True):
            result = result.convert_to_numpy()
            if result.routes is not None:  # the response tokens a resumed sample re-fed
                for s in samples:
                    s.feed_routes(0, result.routes)
            keep, turn_ended = self._recorder.record(
                samples, result, range(len(samples)), self.version, finished
            )
            for s in turn_ended:  # its turn ended on its first token: it waits without a slot
                self._turns.end_turn(s)
                self._turns.wait_without_slot(s)
            if keep:
                running = [samples[i] for i in keep]
                if len(keep) != prefix.num_samples:
                    prefix = prefix.select(keep)
                self._backlog.add_prefilled(prefix, running)

    def _fill_slots(self, finished: list[Trajectory]) -> None:
        if self._staged is not None and self.swap_mode == "drain":
            return
        while True:
            free = [
                slot
                for slot, s in enumerate(self._slots)
                if s is None and not self._turns.holds(slot)
            ]
            nxt = self._next_batch(free, finished) if free else None
            if nxt is None:
                return
            prefix, samples = nxt
            slots = self.homes.usable(samples[0].request.home, free)[: len(samples)]
            try:
                self.state = self.engine.bulk_insert(prefix, self.state, slots)
            except OutOfPages:
                self._backlog.put_back(prefix, samples)
                return
            for slot, s in zip(slots, samples, strict=True):
                s.order = next(self._order)
                self._slots[slot] = s

    def _next_batch(
        self, free: list[int], finished: list[Trajectory]
    ) -> tuple[Prefix, list[Sample]] | None:
        """Running samples that share one prefix and fit free slots of their home: the first
        prefilled group with room, else the next prompts the backlog gives, prefilled."""
        while True:
            group = self._backlog.group_for(free)
            if group is not None:
                return group
            batch = self._backlog.take_prompts(free)
            if not batch:
                return None
            self._prefill(batch, finished)

    def _preempt_youngest(self) -> None:
        """Free pages: the youngest conversation waiting for its env, else the youngest
        decoding sample."""
        if self._turns.preempt():
            return
        busy = [(s.order, slot) for slot, s in self._decoding()]
        _, slot = max(busy)
        self._evict(slot, front=True)
        self.stats["preempted"] += 1

    def step(self, answers: Sequence[TurnAnswer] | None = None) -> list[Trajectory]:
        """Continue the conversations whose env answered, fill free slots, run one generate,
        and return the sequences that finished. ``answers``: the env answers to apply (the
        :meth:`ready_turns` of the sampler whose steps this one replays); None: its own."""
        self._apply_staged()
        finished: list[Trajectory] = []
        self._poll_turns(finished, answers)
        self._fill_slots(finished)
        if not self._decoding():
            return finished
        results = self._decode()
        busy = self._decoding()
        done: list[Trajectory] = []
        active = busy
        for result in results:  # one per decode step of the call
            running, turn_ended = self._recorder.record(
                [s for _, s in active],
                result,
                [slot for slot, _ in active],
                self.version,
                done,
                fed_routes=None if result.routes is None else np.asarray(result.routes),
            )
            for s in turn_ended:
                self._turns.end_turn(s)
            active = [active[i] for i in running]
        # Slot-steps a call ran for slots that had stopped (at most the call's steps after).
        self.stats["decode_steps_idle"] += len(busy) * len(results) - self._drawn(results, busy)
        still = {slot for slot, _ in active}
        for slot, s in busy:
            if slot not in still:  # finished, or waiting for its env
                self._slots[slot] = None
                if s.future is None:
                    self.engine.free_resource(slot)
                else:
                    self._turns.park(slot, s)
        self.stats["conversations_waiting"] = self._turns.waiting
        return finished + done

    def _decode(self) -> list[ResultTokens]:
        """One decode call: ``decode_steps`` tokens a slot (host results, one per step),
        preempting the youngest sample while the pool cannot hold even one token a slot."""
        steps = self.decode_steps
        while True:
            try:
                if steps == 1:
                    self.state, result = self.engine.generate(self.params, self.state)
                    results = [result.convert_to_numpy()]
                else:
                    limits = np.zeros(self.num_slots, np.int32)
                    for slot, s in self._decoding():
                        limits[slot] = max(1, s.budget - len(s.tokens))
                    self.state, results = self.engine.generate_steps(
                        self.params, self.state, steps, limits, self.stop_ids
                    )
                break
            except OutOfPages:
                if steps > 1:  # the pages for a whole call are short: one token this call
                    steps = 1
                    self.stats["decode_calls_shortened"] += 1
                    continue
                if len(self._decoding()) == 1 and not self.waiting_conversations:
                    raise RuntimeError(
                        "the KV page pool cannot hold even one sequence; raise sampling.num_pages"
                    ) from None
                self._preempt_youngest()
        self.stats["generate_steps"] += len(results)
        self.stats["decode_calls"] += 1
        return results

    @staticmethod
    def _drawn(results: list[ResultTokens], busy: list[tuple[int, Sample]]) -> int:
        return int(sum(r.valid[[slot for slot, _ in busy]].sum() for r in results))

    def run(self, requests: Sequence[Request] = ()) -> list[Trajectory]:
        """Submit ``requests`` and step until everything queued has finished."""
        self.submit(requests)
        out = []
        while self.has_work():
            out.extend(self.step())
        return out

    # -- conversations ----------------------------------------------------------------------

    @property
    def waiting_conversations(self) -> int:
        """Conversations waiting for their env (holding a slot or not)."""
        return self._turns.waiting

    def ready_turns(self) -> list[TurnAnswer]:
        """The env answers the next step applies: every waiting conversation whose future is
        done, in the order the step continues them (none while a drain swap holds them). Staged
        params are applied first if due, as the step would: which turns may continue depends
        on it. Never blocks; a future that raised (the Turns contract says never) gives None,
        counted as ``turn_errors``."""
        self._apply_staged()
        if self._turns_held():
            return []
        return self._turns.ready()

    def wait_for_turns(self, timeout_s: float) -> None:
        """Wait up to ``timeout_s`` for an env to answer when a step could do nothing else
        (every sample here waits for its env, none has answered); else return at once."""
        if self._decoding() or self._backlog:
            return
        self._turns.wait(timeout_s)

    def _decoding(self) -> list[tuple[int, Sample]]:
        """The slots the engine decodes now (a waiting conversation's slot is paused)."""
        return [(slot, s) for slot, s in enumerate(self._slots) if s is not None]

    def _turns_held(self) -> bool:
        """Whether answered turns wait for a drain swap (they continue under the new params)."""
        return self._staged is not None and self.swap_mode == "drain"

    def _poll_turns(
        self, finished: list[Trajectory], answers: Sequence[TurnAnswer] | None = None
    ) -> None:
        """Continue or end every conversation ``answers`` answers (None: this sampler's own
        :meth:`ready_turns`), in their order; never blocks."""
        if answers is None:
            answers = self.ready_turns()
        if answers and self._turns_held():
            raise RuntimeError(
                f"{len(answers)} env answers given while a drain swap holds every turn: this "
                "sampler's state is not the one that took them (a pod's samplers diverged)"
            )
        self.state, decoding = self._turns.apply(
            answers, self.params, self.state, self.version, finished
        )
        for slot, s in decoding:
            self._slots[slot] = s
        self.stats["conversations_waiting"] = self._turns.waiting
