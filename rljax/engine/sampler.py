"""The continuous-batching driver: keeps every engine slot busy from a request stream.

A request asks for ``num_samples`` responses to one prompt (a GRPO group). Its prompt is
prefilled once, which draws every sample's first token, each from its own PRNG stream; the
groups that fit the free slots are prefilled together in one call (``Engine.prefill_batch``,
at most ``sampling.prefill_batch`` prompts; one alone goes through
``Engine.prefill_multisampling``). Each sample then takes the next free slot of its home
(``Engine.bulk_insert``; homes: :mod:`rljax.engine.homes`). Slots are refilled as soon as a
sequence finishes and is freed (``Engine.free_resource``), so a long-tailed response length
distribution does not idle the batch the way static batching does. The Sampler drives the
engine only through JetStream's engine API.

Every sampled token is tagged with the params version that produced it. Params can be swapped
between ``generate`` calls (:meth:`Sampler.set_params`):
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
each new turn's tokens are prefilled (:mod:`rljax.engine.conversations`, docs/agents.md).
"""

from __future__ import annotations

import collections
import itertools
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from rljax.engine.conversations import Conversations, TurnAnswer
from rljax.engine.engine import Engine
from rljax.engine.homes import SlotHomes
from rljax.engine.pages import OutOfPages
from rljax.engine.prefill import PrefillRequest
from rljax.engine.samples import FINISH_LENGTH, FINISH_STOP, Request, Sample, Trajectory
from rljax.engine.state import DecodeState, Prefix, ResultTokens

# Request, Trajectory and the finish reasons are the Sampler's interface; they live in
# rljax.engine.samples and are importable from here too.
__all__ = ["FINISH_LENGTH", "FINISH_STOP", "Request", "Sampler", "Trajectory"]


class Sampler(Conversations):
    """Drives an :class:`Engine` with continuous batching on the sampler mesh.

    ``keep_kv=False`` gives up a conversation's slot and pages at each turn end and prefills
    its whole prefix again for the next turn (the baseline keeping the KV is measured against).
    """

    def __init__(
        self,
        engine: Engine,
        params,
        *,
        version: int = 0,
        stop_ids: Sequence[int] = (),
        stop_strings: Sequence[str] = (),
        detokenize: Callable[[list[int]], str] | None = None,
        swap_mode: str | None = None,
        slot_homes: Sequence[int] | None = None,
        keep_kv: bool = True,
    ):
        if stop_strings and detokenize is None:
            raise ValueError("stop_strings need a detokenize function to read the text")
        self.engine = engine
        self.params: Any = engine.serving_params(params)
        self.version = version
        self.stop_ids = frozenset(int(t) for t in stop_ids)
        self.stop_strings = tuple(stop_strings)
        self.detokenize = detokenize
        self.swap_mode = swap_mode or engine.sampling_cfg.swap_mode
        self.keep_kv = keep_kv
        self.state: DecodeState = engine.init_decode_state()
        self._slots: list[Sample | None] = [None] * engine.max_concurrent_decodes
        self.homes = SlotHomes(slot_homes, len(self._slots))
        self._queue: collections.deque[Sample] = collections.deque()  # resumable samples
        # Samples waiting for slots with the prefix they share (prefix sample i = samples[i]).
        self._pending: collections.deque[tuple[Prefix, list[Sample]]] = collections.deque()
        self._requests: collections.deque[Request] = collections.deque()
        self._held: dict[int, list[Sample]] = {}  # interrupted, by request id
        self._waiting: list[Sample] = []  # conversations waiting for their env, no slot
        self._next_id = itertools.count()
        self._order = itertools.count()
        self._staged: tuple[Any, int] | None = None
        self.stats: collections.Counter[str] = collections.Counter()

    # -- requests ---------------------------------------------------------------------------

    def submit(self, requests: Sequence[Request]) -> list[int]:
        """Queue requests; checks each before any is queued. Returns their request ids."""
        budget = self.engine.sampling_cfg.max_new_tokens
        for r in requests:
            n = len(r.prompt_tokens)
            if n == 0:
                raise ValueError("a request's prompt_tokens is empty; give at least one token")
            if n > self.engine.max_prefill_length:
                raise ValueError(
                    f"prompt of {n} tokens is longer than sampling.max_prefill_length="
                    f"{self.engine.max_prefill_length}; raise it or truncate the prompt"
                )
            if r.max_new_tokens is not None and not 0 < r.max_new_tokens <= budget:
                raise ValueError(
                    f"max_new_tokens={r.max_new_tokens} must be in [1, {budget}] "
                    "(sampling.max_new_tokens bounds the KV cache)"
                )
            if r.num_samples < 1:
                raise ValueError(f"num_samples={r.num_samples} must be >= 1")
            self.homes.check(r.home)
        ids = []
        for r in requests:
            # A caller may name its requests (e.g. by buffer reservation); ids must be unique.
            if r.request_id < 0:
                r.request_id = next(self._next_id)
            if r.max_new_tokens is None:
                r.max_new_tokens = budget
            self._requests.append(r)
            ids.append(r.request_id)
        return ids

    @property
    def busy_slots(self) -> int:
        return sum(s is not None for s in self._slots)

    @property
    def num_slots(self) -> int:
        """Decode slots: sequences the engine decodes at once."""
        return len(self._slots)

    @property
    def free_slots(self) -> int:
        return self.num_slots - self.busy_slots

    @property
    def kv_tokens(self) -> int:
        """Tokens the live slots hold in the KV cache (prompt plus response so far)."""
        return sum(len(s.request.prompt_tokens) + len(s.tokens) for s in self._slots if s)

    @property
    def queued_samples(self) -> int:
        """Samples waiting for a slot (submitted, pending a prefix, or resumed)."""
        pending = sum(len(samples) for _, samples in self._pending)
        return len(self._queue) + pending + sum(r.num_samples for r in self._requests)

    def has_work(self) -> bool:
        return bool(
            self.busy_slots or self._queue or self._pending or self._requests or self._waiting
        )

    # -- params -----------------------------------------------------------------------------

    def set_params(self, params, version: int) -> None:
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
            waiting = [s for _, samples in self._pending for s in samples]
            self._pending.clear()
            self._queue.extendleft(reversed(waiting))

    # -- interruption -----------------------------------------------------------------------

    def interrupt(self, request_id: int) -> int:
        """Hold every running or queued sample of a request; returns how many were held."""
        held = self._held.setdefault(request_id, [])
        for slot, s in enumerate(self._slots):
            if s is not None and s.request.request_id == request_id:
                self.engine.free_resource(slot)
                self._slots[slot] = None
                held.append(s)
        held.extend(s for s in self._queue if s.request.request_id == request_id)
        held.extend(s for s in self._waiting if s.request.request_id == request_id)
        self._waiting = [s for s in self._waiting if s.request.request_id != request_id]
        keep = [s for s in self._queue if s.request.request_id != request_id]
        self._queue.clear()
        self._queue.extend(keep)
        pending = list(self._pending)
        self._pending.clear()
        for prefix, samples in pending:
            kept = [i for i, s in enumerate(samples) if s.request.request_id != request_id]
            held.extend(s for s in samples if s.request.request_id == request_id)
            if len(kept) == len(samples):
                self._pending.append((prefix, samples))
            elif kept:
                self._pending.append((prefix.select(kept), [samples[i] for i in kept]))
        for r in list(self._requests):
            if r.request_id == request_id:
                self._requests.remove(r)
                held.extend(Sample(r, i) for i in range(r.num_samples))
        self.stats["interrupted"] += len(held)
        return len(held)

    def resume(self, request_id: int) -> None:
        """Queue a held request's samples again; they continue from their prefixes (a
        conversation waiting for its env waits on, and continues once it answers)."""
        for s in self._held.pop(request_id, []):
            self._route(s)

    def hand_over(self, request_id: int) -> list:
        """Interrupt a request and give up its samples (partial rollouts) for another sampler's
        :meth:`adopt`; they keep their tokens, log-probs and versions."""
        self.interrupt(request_id)
        return self._held.pop(request_id, [])

    def adopt(self, samples: Sequence) -> None:
        """Queue samples another sampler handed over; they resume here from their prefixes."""
        for s in samples:
            self._route(s)

    def request_ids(self) -> set[int]:
        """Ids of the requests with a sample here (running, pending, queued or held)."""
        samples = [s for s in self._slots if s is not None] + list(self._queue)
        samples += [s for _, group in self._pending for s in group] + self._waiting
        return (
            {s.request.request_id for s in samples}
            | set(self._held)
            | {r.request_id for r in self._requests}
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
        self._queue.clear()
        self._pending.clear()
        self._requests.clear()
        self._held.clear()
        self._waiting.clear()
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

    # -- the loop ---------------------------------------------------------------------------

    def _prefill(self, batch: list[list[Sample]], finished: list[Trajectory]) -> None:
        """Prefill each sample list's shared prompt + tokens so far, in one engine call.

        Draws each sample's next token and records it; the samples still running go to
        ``_pending`` with their prefix (the ones that finished on this token to ``finished``).
        """
        requests = []
        for samples in batch:
            first = samples[0]
            seeds = [_sample_seed(s.request.seed, s.index) for s in samples]
            requests.append(
                PrefillRequest(
                    list(first.request.prompt_tokens) + first.tokens,
                    len(samples),
                    _keys(seeds),
                    first.request.sampling,
                    step=len(first.tokens),  # a resumed sample continues its stream
                )
            )
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
            keep = self._record(samples, result.convert_to_numpy(), range(len(samples)), finished)
            # A conversation whose turn ended on its first token waits without a slot.
            self._waiting.extend(s for s in samples if s.future is not None)
            if keep:
                running = [samples[i] for i in keep]
                if len(keep) != prefix.num_samples:
                    prefix = prefix.select(keep)
                self._pending.append((prefix, running))

    def _record(self, samples, result: ResultTokens, rows, finished) -> list[int]:
        """Append each valid row's token to its sample; returns the indices still running.

        A conversation whose turn ended is neither running nor finished: it asks its env for
        the next turn and waits (``future`` set)."""
        tokens, valid, logprobs = result.tokens, result.valid, result.logprobs
        running = []
        for i, (s, row) in enumerate(zip(samples, rows, strict=True)):
            if not valid[row]:
                running.append(i)
                continue
            token = int(tokens[row])
            s.tokens.append(token)
            s.logprobs.append(float(logprobs[row]))
            s.versions.append(self.version)
            if s.turns is not None:
                s.loss_mask.append(1)
            self.stats["tokens"] += 1
            reason = self._finish_reason(s, token)
            if reason == FINISH_STOP and s.turns is not None:
                self._end_turn(s)
            elif reason:
                finished.append(s.to_trajectory(reason))
            else:
                running.append(i)
        return running

    def _fill_slots(self, finished: list[Trajectory]) -> None:
        if self._staged is not None and self.swap_mode == "drain":
            return
        while True:
            free = [slot for slot, s in enumerate(self._slots) if s is None]
            nxt = self._next_batch(free, finished) if free else None
            if nxt is None:
                return
            prefix, samples = nxt
            slots = self.homes.usable(samples[0].request.home, free)[: len(samples)]
            try:
                self.state = self.engine.bulk_insert(prefix, self.state, slots)
            except OutOfPages:
                self._pending.appendleft((prefix, samples))
                return
            for slot, s in zip(slots, samples, strict=True):
                s.order = next(self._order)
                self._slots[slot] = s

    def _next_batch(self, free: list[int], finished) -> tuple[Prefix, list[Sample]] | None:
        """Running samples that share one prefix and fit free slots of their home: the first
        waiting group's with room, or one resumed sample with its own prefix."""
        while True:
            for i, (prefix, samples) in enumerate(self._pending):
                room = len(self.homes.usable(samples[0].request.home, free))
                if not room:
                    continue
                del self._pending[i]
                if len(samples) > room:
                    rest = list(range(room, len(samples)))
                    self._pending.insert(i, (prefix.select(rest), samples[room:]))
                    prefix, samples = prefix.select(list(range(room))), samples[:room]
                return prefix, samples
            batch = self._take_prompts(free)
            if not batch:
                return None
            self._prefill(batch, finished)

    def _take_prompts(self, free: list[int]) -> list[list[Sample]]:
        """The next prompts to prefill together: resumed samples first (each its own prompt),
        then new groups; at least one, then more while their samples fit the free slots of
        their homes. One whose home has no free slot waits without holding up the others."""
        left = self.homes.rooms(free)
        batch: list[list[Sample]] = []
        for source in (self._queue, self._requests):
            i = 0
            while i < len(source) and len(batch) < self.engine.sampling_cfg.prefill_batch:
                item = source[i]
                if isinstance(item, Sample):  # resumed: one sample, its own prompt
                    samples = [item]
                else:
                    samples = [Sample(item, k) for k in range(item.num_samples)]
                home = self.homes.key(samples[0].request.home)
                if not left.get(home):
                    if not any(left.values()):
                        return batch
                    i += 1
                    continue
                if batch and len(samples) > left[home]:
                    return batch
                del source[i]
                batch.append(samples)
                left[home] -= min(len(samples), left[home])
                if home is not None:
                    left[None] -= min(len(samples), left[None])
        return batch

    def _preempt_youngest(self) -> None:
        """Free pages: the youngest conversation waiting for its env, else the youngest
        decoding sample."""
        if self._preempt_waiting():
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
        while True:
            try:
                self.state, result = self.engine.generate(self.params, self.state)
                break
            except OutOfPages:
                if len(self._decoding()) == 1 and not self.waiting_conversations:
                    raise RuntimeError(
                        "the KV page pool cannot hold even one sequence; raise sampling.num_pages"
                    ) from None
                self._preempt_youngest()
        self.stats["generate_steps"] += 1
        result = result.convert_to_numpy()
        busy = self._decoding()
        done: list[Trajectory] = []
        running = self._record([s for _, s in busy], result, [slot for slot, _ in busy], done)
        still = {busy[i][0] for i in running}
        for slot, s in busy:
            if slot not in still:
                self._park_turn(slot, s)
        self.stats["conversations_waiting"] = self.waiting_conversations
        return finished + done

    def _finish_reason(self, s: Sample, token: int) -> str | None:
        if token in self.stop_ids:
            return FINISH_STOP
        if self.stop_strings and self.detokenize is not None:  # __init__ checked it is given
            text = self.detokenize(s.tokens[s.turn_start :])  # this turn's (one turn's all)
            if any(stop in text for stop in self.stop_strings):
                return FINISH_STOP
        if len(s.tokens) >= s.budget:
            return FINISH_LENGTH
        return None

    def run(self, requests: Sequence[Request] = ()) -> list[Trajectory]:
        """Submit ``requests`` and step until everything queued has finished."""
        self.submit(requests)
        out = []
        while self.has_work():
            out.extend(self.step())
        return out


def _keys(seeds: Sequence[int]) -> jax.Array:
    """One PRNG key per seed, for prefill_multisampling's ``rng``."""
    return jax.vmap(jax.random.key)(jnp.asarray(seeds, jnp.uint32))


def _sample_seed(seed: int, index: int) -> int:
    """A per-sample seed, independent of which slot or batch the sample lands in; a resumed
    sample keeps it (its tokens are drawn at their steps of the one stream)."""
    return (seed * 1_000_003 + index * 7919) % (2**31 - 1)
