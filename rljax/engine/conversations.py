"""The Sampler's conversations (multi-turn samples): turn ends, waiting for the env, and the
next turn prefilled onto the KV the conversation already holds.

A sample whose request has ``turns`` ends a model turn on a stop token. The Sampler then asks
its :class:`~rljax.engine.samples.Turns` for the next turn (``next_turn``, which returns a
future at once) and keeps decoding the other slots. Each ``step`` polls the futures without
blocking. When one gives token ids, they are appended to the sample (env tokens: log-prob 0.0,
version -1, loss mask 0) and only the tokens the slot has not cached (the turn's stop token and
the env's ids) are prefilled onto its pages (``Engine.extend``); the last position's logits
draw the next model token, and decoding goes on. None ends the conversation.

**The poll is an input.** :meth:`Conversations.ready_turns` is a snapshot of the answers a
step would apply now (request id, sample index, ids or None), and ``step(answers=...)``
applies exactly those instead of polling. One process polls (``step()`` applies its own
snapshot); a pod's sampler followers apply the snapshot the leader took and posted with the
step (:mod:`rljax.runtime.pod_envs`), so every replica continues the same conversations at the
same step whenever each host's env futures happen to resolve.

**What a waiting conversation holds: its slot and its pages.** The slot is paused
(``Engine.pause``): ``generate`` skips it and it takes no new page, but its KV stays, so the
next turn prefills the new tokens only. The number of conversations waiting at once is then
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
"""

from __future__ import annotations

import collections
import concurrent.futures
from collections.abc import Callable, Sequence

from rljax.engine.engine import Engine
from rljax.engine.pages import OutOfPages
from rljax.engine.samples import FINISH_LENGTH, FINISH_STOP, Sample, Trajectory
from rljax.engine.state import DecodeState, ResultTokens

# One env answer as a step applies it: (request id, sample index, the env's token ids, or None
# when the conversation is over). JSON gives it back as a list, which unpacks alike.
TurnAnswer = tuple[int, int, list[int] | None]


class Conversations:
    """The multi-turn part of :class:`~rljax.engine.sampler.Sampler` (a mixin)."""

    # The Sampler's, used here.
    engine: Engine
    params: object
    state: DecodeState
    stats: collections.Counter[str]
    keep_kv: bool
    swap_mode: str
    _staged: object
    _slots: list[Sample | None]
    _queue: collections.deque[Sample]
    _pending: collections.deque
    _requests: collections.deque
    _waiting: list[Sample]  # conversations waiting for their env without a slot
    _record: Callable[..., list[int]]
    _apply_staged: Callable[[], None]

    @property
    def waiting_conversations(self) -> int:
        """Conversations waiting for their env (holding a slot or not)."""
        held = sum(s is not None and s.future is not None for s in self._slots)
        return held + len(self._waiting)

    def _decoding(self) -> list[tuple[int, Sample]]:
        """The slots the engine decodes now (a waiting conversation's slot is paused)."""
        return [
            (slot, s) for slot, s in enumerate(self._slots) if s is not None and s.future is None
        ]

    def _end_turn(self, s: Sample) -> None:
        """A conversation's model turn ended: ask its env for the next turn (not blocking)."""
        assert s.turns is not None, "only a conversation has turns"
        s.future = s.turns.next_turn(list(s.tokens[s.turn_start :]))
        self.stats["turns"] += 1

    def _park_turn(self, slot: int, s: Sample) -> None:
        """After a generate or an extend: a sample that began waiting keeps its slot paused
        (or gives it up without ``keep_kv``); a finished one frees it."""
        if s.future is not None and self.keep_kv:
            self.engine.pause(slot)
            return
        self.engine.free_resource(slot)
        self._slots[slot] = None
        if s.future is not None:
            self._waiting.append(s)

    def _route(self, s: Sample, *, front: bool = False) -> None:
        """A sample without a slot: back to the queue, or to wait for its env."""
        if s.future is not None:
            self._waiting.append(s)
        else:
            (self._queue.appendleft if front else self._queue.append)(s)

    def _waiting_samples(self) -> list[Sample]:
        """Every conversation waiting for its env: those holding a slot in slot order, then
        those without one (the order their answers are applied in)."""
        held = [s for s in self._slots if s is not None and s.future is not None]
        return held + [s for s in self._waiting if s.future is not None]

    def _turns_held(self) -> bool:
        """Whether answered turns wait for a drain swap (they continue under the new params)."""
        return self._staged is not None and self.swap_mode == "drain"

    def ready_turns(self) -> list[TurnAnswer]:
        """The env answers the next step applies: every waiting conversation whose future is
        done, in the order the step continues them (none while a drain swap holds them). Staged
        params are applied first if due, as the step would: which turns may continue depends
        on it. Never blocks; a future that raised (the Turns contract says never) gives None,
        counted as ``turn_errors``."""
        self._apply_staged()
        if self._turns_held():
            return []
        out: list[TurnAnswer] = []
        for s in self._waiting_samples():
            assert s.future is not None
            if s.future.done():
                out.append((s.request.request_id, s.index, self._result(s.future)))
        return out

    def _result(self, future: concurrent.futures.Future) -> list[int] | None:
        try:
            ids = future.result()
        except Exception:  # a broken env still ends only its own conversation
            self.stats["turn_errors"] += 1
            return None
        return None if ids is None else [int(t) for t in ids]

    def wait_for_turns(self, timeout_s: float) -> None:
        """Wait up to ``timeout_s`` for an env to answer when a step could do nothing else
        (every sample here waits for its env, none has answered); else return at once."""
        if self._decoding() or self._queue or self._pending or self._requests:
            return
        futures = [s.future for s in self._waiting_samples() if s.future is not None]
        if futures:
            concurrent.futures.wait(
                futures, timeout=timeout_s, return_when=concurrent.futures.FIRST_COMPLETED
            )

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
        for request_id, index, ids in answers:
            slot, s = self._waiting_for(request_id, index)
            s.future = None
            if slot is None:
                self._waiting.remove(s)
            self._answer(s, slot, ids, finished)
        self.stats["conversations_waiting"] = self.waiting_conversations

    def _waiting_for(self, request_id: int, index: int) -> tuple[int | None, Sample]:
        """The waiting conversation (request id, sample index) and its slot (None: none)."""
        key = (request_id, index)
        for slot, s in enumerate(self._slots):
            if s is not None and s.future is not None and (s.request.request_id, s.index) == key:
                return slot, s
        for s in self._waiting:
            if s.future is not None and (s.request.request_id, s.index) == key:
                return None, s
        raise RuntimeError(
            f"an env answer for request {request_id} sample {index}, which is not waiting for "
            "its env here: this sampler's state is not the one that took the answers (a pod's "
            "samplers diverged)"
        )

    def _answer(
        self, s: Sample, slot: int | None, ids: list[int] | None, finished: list[Trajectory]
    ) -> None:
        reason = None
        if ids is None:
            reason = FINISH_STOP
        elif len(s.tokens) + len(ids) >= s.budget:  # no room for a model token after them
            reason = FINISH_LENGTH
        if reason is not None:
            if slot is not None:
                self.engine.free_resource(slot)
                self._slots[slot] = None
            finished.append(s.to_trajectory(reason))
            return
        assert ids is not None
        s.append_env(ids)
        if slot is None:
            self.stats["turn_re_prefills"] += 1
            self._queue.append(s)
            return
        self._extend(slot, s, finished)

    def _extend(self, slot: int, s: Sample, finished: list[Trajectory]) -> None:
        """Prefill what ``slot`` has not cached of ``s`` onto its pages; record the next token."""
        cached = self.engine.slot_length(slot)
        full = list(s.request.prompt_tokens) + s.tokens
        chunk = full[cached:]
        try:
            self.state, result = self.engine.extend(
                self.params, self.state, slot, chunk, step=len(s.tokens)
            )
        except OutOfPages:  # the pool cannot hold the new turn: prefill it all again later
            self.engine.free_resource(slot)
            self._slots[slot] = None
            self.stats["turn_re_prefills"] += 1
            self._queue.append(s)
            return
        self.stats["turn_kv_kept"] += 1
        self.stats["prefill_tokens"] += len(chunk)
        self.stats["prefill_tokens_saved"] += cached
        numpy_result: ResultTokens = result.convert_to_numpy()
        if not self._record([s], numpy_result, [0], finished):
            self._park_turn(slot, s)

    def _preempt_waiting(self) -> bool:
        """Give the youngest waiting conversation's slot and pages back; False if none waits."""
        waiting = [
            (s.order, slot)
            for slot, s in enumerate(self._slots)
            if s is not None and s.future is not None
        ]
        if not waiting:
            return False
        _, slot = max(waiting)
        s = self._slots[slot]
        assert s is not None
        self.engine.free_resource(slot)
        self._slots[slot] = None
        self._waiting.append(s)
        self.stats["preempted_waiting"] += 1
        return True
