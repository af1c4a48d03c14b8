"""Conversations (multi-turn samples) waiting for their env: :class:`TurnTracker`.

A sample whose request has ``turns`` ends a model turn on a stop token. The Sampler then has
the tracker ask its :class:`~rljax.engine.samples.Turns` for the next turn
(:meth:`TurnTracker.end_turn`, which sets the sample's ``future`` at once) and keeps decoding
the other slots. Each step polls the futures without blocking. When one gives token ids, they
are appended to the sample (env tokens: log-prob 0.0, version -1, loss mask 0) and only the
tokens the slot has not cached (the turn's stop token and the env's ids) are prefilled onto its
pages (``PagedEngine.extend``); the last position's logits draw the next model token, and
decoding goes on. None ends the conversation.

**The poll is an input.** ``Sampler.ready_turns`` is a snapshot of the answers a step would
apply now (request id, sample index, ids or None), and ``Sampler.step(answers=...)`` applies
exactly those instead of polling. One process polls (``step()`` applies its own snapshot); a
pod's sampler followers apply the snapshot the leader took and posted with the step
(:mod:`rljax.runtime.env_answers`), so every replica continues the same conversations at the same
step whenever each host's env futures happen to resolve.

**What a waiting conversation holds: its slot and its pages.** The slot is paused
(``PagedEngine.pause``): ``generate`` skips it and it takes no new page, but its KV stays, so
the next turn prefills the new tokens only. The number of conversations waiting at once is then
bounded by the slots (``sampling.max_concurrent_decodes``) and by the page pool. When the pool
runs short, a waiting conversation is preempted before any decoding one (the youngest first):
it gives its slot and pages back and, once its env answers, is prefilled again from its whole
prefix (prompt and every token so far, env tokens included: ids are kept, never encoded again).
The same happens under a swap in mode ``recompute`` or ``drain`` (its KV came from the old
params), with ``keep_kv=False`` (the baseline that re-prefills every turn), and when the pool
cannot hold the new turn's tokens. Counted in ``Sampler.stats``: ``turns`` (model turns
ended), ``turn_kv_kept`` / ``turn_re_prefills`` (continuations prefilled onto kept KV / again
from the whole prefix), ``prefill_tokens`` (every token prefilled), ``prefill_tokens_saved``
(what a full re-prefill of each kept continuation would have prefilled beyond its new tokens)
and ``conversations_waiting`` (how many wait now, a gauge).

The seam: a slot is free, decoding (the Sampler's) or paused (the tracker's). The tracker owns
the conversations waiting for their env, in their paused slots or without one, and their
futures: it sets them, polls them, and applies their answers (freeing, extending or giving back
the slots it holds). The Sampler calls it with its params and decode state, and takes back the
slots that decode again and the samples to prefill again (through its Backlog).
"""

from __future__ import annotations

import collections
import concurrent.futures
from collections.abc import Sequence
from typing import Any

from rljax.engine.backlog import Backlog
from rljax.engine.paged import PagedEngine
from rljax.engine.pages import OutOfPages
from rljax.engine.samples import FINISH_LENGTH, FINISH_STOP, Recorder, Sample, Trajectory
from rljax.engine.state import DecodeState

# One env answer as a step applies it: (request id, sample index, the env's token ids, or None
# when the conversation is over). JSON gives it back as a list, which unpacks alike.
TurnAnswer = tuple[int, int, list[int] | None]


class TurnTracker:
    """The conversations waiting for their env and their futures (see the module docstring).

    ``engine``: pauses, extends and frees the slots held here; ``backlog``: where a
    conversation goes that must be prefilled again from its whole prefix; ``recorder``: records
    the token an extend draws; ``stats``: the Sampler's counters, shared on purpose so one
    ``Sampler.stats`` reports every count; ``keep_kv``: whether a waiting conversation keeps its
    slot paused (else it gives the slot up and is prefilled again).
    """

    def __init__(
        self,
        engine: PagedEngine,
        backlog: Backlog,
        recorder: Recorder,
        stats: collections.Counter[str],
        *,
        keep_kv: bool = True,
    ):
        self._engine = engine
        self._backlog = backlog
        self._recorder = recorder
        self._stats = stats
        self.keep_kv = keep_kv
        self._paused: dict[int, Sample] = {}  # slot -> conversation waiting in it, paused
        self._slotless: list[Sample] = []  # waiting for their env, holding no slot

    # -- what waits -------------------------------------------------------------------------

    @property
    def waiting(self) -> int:
        """Conversations waiting for their env (holding a slot or not)."""
        return len(self._paused) + len(self._slotless)

    def holds(self, slot: int) -> bool:
        """Whether ``slot`` is paused here, held by a waiting conversation."""
        return slot in self._paused

    def in_slots(self) -> list[Sample]:
        """The conversations waiting in their paused slots, in slot order."""
        return [self._paused[slot] for slot in sorted(self._paused)]

    def samples(self) -> list[Sample]:
        """Every waiting conversation: in paused slots (slot order), then without one."""
        return self.in_slots() + list(self._slotless)

    # -- a turn ends ------------------------------------------------------------------------

    def end_turn(self, s: Sample) -> None:
        """A conversation's model turn ended: ask its env for the next turn (not blocking)."""
        assert s.turns is not None, "only a conversation has turns"
        s.future = s.turns.next_turn(list(s.tokens[s.turn_start :]))
        self._stats["turns"] += 1

    def park(self, slot: int, s: Sample) -> None:
        """``s`` began waiting in ``slot``: the slot is paused and held here (or, without
        ``keep_kv``, freed and ``s`` waits without it)."""
        if self.keep_kv:
            self._engine.pause(slot)
            self._paused[slot] = s
            return
        self._engine.free_resource(slot)
        self.wait_without_slot(s)

    def wait_without_slot(self, s: Sample) -> None:
        """``s`` waits for its env holding no slot (it gave its slot up, or never had one)."""
        assert s.future is not None, "only a conversation waiting for its env waits here"
        self._slotless.append(s)

    # -- answers ----------------------------------------------------------------------------

    def ready(self) -> list[TurnAnswer]:
        """The answers ready now, in the order :meth:`apply` continues them: every waiting
        conversation whose future is done. Never blocks; a future that raised (the Turns
        contract says never) gives None, counted as ``turn_errors``."""
        out: list[TurnAnswer] = []
        for s in self.samples():
            assert s.future is not None
            if s.future.done():
                out.append((s.request.request_id, s.index, self._result(s.future)))
        return out

    def wait(self, timeout_s: float) -> None:
        """Wait up to ``timeout_s`` for any waiting conversation's env to answer."""
        futures = [s.future for s in self.samples() if s.future is not None]
        if futures:
            concurrent.futures.wait(
                futures, timeout=timeout_s, return_when=concurrent.futures.FIRST_COMPLETED
            )

    def apply(
        self,
        answers: Sequence[TurnAnswer],
        params: Any,
        state: DecodeState,
        version: int,
        finished: list[Trajectory],
    ) -> tuple[DecodeState, list[tuple[int, Sample]]]:
        """Continue or end each answered conversation, in the order of ``answers``.

        An ended one goes to ``finished`` (its slot freed); one without a slot, or whose new
        turn the pool cannot hold, goes to the backlog to be prefilled again from its whole
        prefix; one in its paused slot is extended (``params``, ``state``: the Sampler's) and
        its next token recorded as drawn by ``version``. Returns the new decode state and the
        (slot, sample) that decode again, for the Sampler's slots."""
        decoding: list[tuple[int, Sample]] = []
        for request_id, index, ids in answers:
            slot, s = self._take(request_id, index)
            end = None
            if ids is None:
                end = FINISH_STOP
            elif len(s.tokens) + len(ids) >= s.budget:  # no room for a model token after them
                end = FINISH_LENGTH
            if end is not None:
                if slot is not None:
                    self._engine.free_resource(slot)
                finished.append(s.to_trajectory(end))
                continue
            assert ids is not None
            s.append_env(ids)
            if slot is None:
                self._stats["turn_re_prefills"] += 1
                self._backlog.add_resumed(s)
                continue
            state, goes_on = self._extend(slot, s, params, state, version, finished)
            if goes_on:
                decoding.append((slot, s))
        return state, decoding

    def _take(self, request_id: int, index: int) -> tuple[int | None, Sample]:
        """The waiting conversation (request id, sample index) and its slot (None: none); it
        stops waiting here, its future cleared."""
        key = (request_id, index)
        found: tuple[int | None, Sample] | None = None
        for slot in sorted(self._paused):
            s = self._paused[slot]
            if (s.request.request_id, s.index) == key:
                found = slot, self._paused.pop(slot)
                break
        else:
            for s in self._slotless:
                if (s.request.request_id, s.index) == key:
                    self._slotless.remove(s)
                    found = None, s
                    break
        if found is None:
            raise RuntimeError(
                f"an env answer for request {request_id} sample {index}, which is not waiting "
                "for its env here: this sampler's state is not the one that took the answers "
                "(a pod's samplers diverged)"
            )
        found[1].future = None
        return found

    def _extend(
        self,
        slot: int,
        s: Sample,
        params: Any,
        state: DecodeState,
        version: int,
        finished: list[Trajectory],
    ) -> tuple[DecodeState, bool]:
        """Prefill what ``slot`` has not cached of ``s`` onto its pages and record the next
        token; returns the decode state and whether ``s`` decodes on in its slot."""
        cached = self._engine.slot_length(slot)
        chunk = (list(s.request.prompt_tokens) + s.tokens)[cached:]
        try:
            state, result = self._engine.extend(params, state, slot, chunk, step=len(s.tokens))
        except OutOfPages:  # the pool cannot hold the new turn: prefill it all again later
            self._engine.free_resource(slot)
            self._stats["turn_re_prefills"] += 1
            self._backlog.add_resumed(s)
            return state, False
        self._stats["turn_kv_kept"] += 1
        self._stats["prefill_tokens"] += len(chunk)
        self._stats["prefill_tokens_saved"] += cached
        result = result.convert_to_numpy()
        if result.routes is not None:  # the chunk: the last turn's stop token, then env tokens
            s.feed_routes(cached - len(s.request.prompt_tokens), result.routes)
        running, turn_ended = self._recorder.record([s], result, [0], version, finished)
        if running:
            return state, True
        if turn_ended:  # it ended its turn on the first token drawn: it waits again
            self.end_turn(s)
            self.park(slot, s)
        else:
            self._engine.free_resource(slot)
        return state, False

    # -- giving slots back ------------------------------------------------------------------

    def preempt(self) -> bool:
        """Give the youngest paused conversation's slot and pages back; False if none."""
        if not self._paused:
            return False
        _, slot = max((s.order, slot) for slot, s in self._paused.items())
        self._engine.free_resource(slot)
        self.wait_without_slot(self._paused.pop(slot))
        self._stats["preempted_waiting"] += 1
        return True

    def release_slots(self) -> None:
        """Free every paused slot; their conversations wait on without one (new params: their
        KV is stale)."""
        for slot in sorted(self._paused):
            self._engine.free_resource(slot)
            self.wait_without_slot(self._paused.pop(slot))

    def remove(self, request_id: int) -> list[Sample]:
        """Take out the request's waiting conversations (an interrupt), freeing their slots;
        they keep their futures and wait on once given back (:meth:`wait_without_slot`)."""
        out = []
        for slot in sorted(self._paused):
            if self._paused[slot].request.request_id == request_id:
                self._engine.free_resource(slot)
                out.append(self._paused.pop(slot))
        out += [s for s in self._slotless if s.request.request_id == request_id]
        self._slotless = [s for s in self._slotless if s.request.request_id != request_id]
        return out

    def clear(self) -> None:
        """Forget every waiting conversation, freeing the slots held here."""
        for slot in sorted(self._paused):
            self._engine.free_resource(slot)
        self._paused.clear()
        self._slotless.clear()

    def _result(self, future: concurrent.futures.Future) -> list[int] | None:
        try:
            ids = future.result()
        except Exception:  # a broken env still ends only its own conversation
            self._stats["turn_errors"] += 1
            return None
        return None if ids is None else [int(t) for t in ids]
