"""Conversations' env answers, wherever their envs run: written once over the run's
:class:`~rljax.runtime.exchange.Exchange`.

A conversation (docs/agents.md) belongs to the participant that read its prompt, the one that
scores its group (:func:`rljax.runtime.prompts.owner_key`: stream position ``p``'s participant
``p % n``, or ``group_id % n`` for an evaluation prompt). Every participant makes each sample's
:class:`~rljax.engine.samples.Turns` itself when its sampler makes the sample
(:meth:`EnvAnswers.bind`, from the request's example): on the owner the real
:class:`~rljax.envs.conversation.Conversation`, its env reset and stepped in that participant's
EnvPool, so an env that raises, hangs or returns a bad step is isolated and counted there; on
every other participant a stand-in (:class:`RemoteTurns`). On one process every conversation is
its own, and nothing moves.

On a pod every sampler must see the same answers at the same step, whenever each host's env
futures resolve, so the leader decides: it takes the snapshot of answers ready now
(``Sampler.ready_turns``), posts it with the step (:mod:`rljax.runtime.pod`), and steps with it;
a follower's step applies exactly those answers, never its own futures. The leader must
therefore hear every answer: a follower posts each of its conversations' answers (the
conversation's serial, its sample index, the ids or null, the reward so far, the counters) to
the leader (:meth:`Exchange.post`), which delivers them to its stand-in (:class:`AnswerBook`),
whose reward and counters are then the trajectory's ``env_reward`` and ``env_info``.

A conversation's serial counts the conversations made on that participant in this build: every
sampler makes the same samples in the same order (the replicated state a pod rests on), so the
serials agree, and the sample index travels too and is checked.
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import itertools
import threading
import weakref
from collections.abc import Callable

from rljax.engine.samples import Request, Turns
from rljax.envs.conversation import NO_TURNS, Conversation, Conversations
from rljax.mesh.control import PodProtocolError
from rljax.runtime.exchange import Exchange
from rljax.runtime.prompts import owner_key, task_example

TOPIC = "env"

# (ids or None, reward so far, counters): what a turn's answer sets on the leader's stand-in.
Answer = tuple[list[int] | None, float, dict]
Report = Callable[[int, int, list[int] | None, float, dict], None]


class HomeTurns:
    """A conversation whose env runs on this host: the real one, with each answer reported as
    ``report(serial, index, ids, reward, info)`` before the turn's future resolves."""

    def __init__(self, conversation: Conversation, serial: int, index: int, report: Report):
        self.conversation, self.serial, self.index = conversation, serial, index
        self._report = report

    def next_turn(self, turn_tokens: list[int]) -> concurrent.futures.Future[list[int] | None]:
        out: concurrent.futures.Future[list[int] | None] = concurrent.futures.Future()

        def answered(future: concurrent.futures.Future) -> None:
            ids, c = future.result(), self.conversation
            try:
                self._report(self.serial, self.index, ids, c.reward, c.info)
            finally:  # the Turns contract: the future resolves whatever happens
                out.set_result(ids)

        self.conversation.next_turn(turn_tokens).add_done_callback(answered)
        return out

    @property
    def reward(self) -> float:
        return self.conversation.reward

    @property
    def info(self) -> dict:
        return self.conversation.info


class RemoteTurns:
    """A conversation whose env runs on another host: each turn's future resolves when that
    host's answer is delivered (:meth:`deliver`, maybe before the turn asks), and the reward
    and counters are then that answer's. On a follower nothing is delivered: its steps apply
    the leader's answers."""

    def __init__(self, index: int):
        self.index = index
        self._lock = threading.Lock()
        self._early: collections.deque[Answer] = collections.deque()
        self._asked: concurrent.futures.Future | None = None
        self._reward = 0.0
        self._info: dict = dict(NO_TURNS)

    def next_turn(self, turn_tokens: list[int]) -> concurrent.futures.Future[list[int] | None]:
        future: concurrent.futures.Future[list[int] | None] = concurrent.futures.Future()
        with self._lock:
            if not self._early:
                self._asked = future
                return future
            answer = self._early.popleft()
        self._resolve(future, answer)
        return future

    def deliver(self, answer: Answer) -> None:
        with self._lock:
            asked, self._asked = self._asked, None
            if asked is None:
                self._early.append(answer)
                return
        self._resolve(asked, answer)

    def _resolve(self, future: concurrent.futures.Future, answer: Answer) -> None:
        ids, reward, info = answer
        with self._lock:  # set before the future resolves: the sampler reads them after it
            self._reward, self._info = float(reward), dict(info)
        future.set_result(ids)

    @property
    def reward(self) -> float:
        with self._lock:
            return self._reward

    @property
    def info(self) -> dict:
        with self._lock:
            return dict(self._info)


class AnswerBook:
    """The leader's stand-ins by serial, resolved as the follower homes' answers arrive.

    A stand-in is held weakly: once the sampler lets go of its sample (finished, cleared or
    aborted), an answer still on its way finds nobody and is dropped. An answer for a serial
    the leader has not made yet is kept until it does."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._live: weakref.WeakValueDictionary[int, RemoteTurns] = weakref.WeakValueDictionary()
        self._early: dict[int, RemoteTurns] = {}
        self._made = -1  # serials are made in increasing order

    def make(self, serial: int, index: int) -> RemoteTurns:
        with self._lock:
            turns = self._early.pop(serial, None) or RemoteTurns(index)
            self._live[serial] = turns
            self._made = max(self._made, serial)
        _check_index(serial, turns.index, index)
        return turns

    def deliver(self, serial: int, index: int, answer: Answer) -> None:
        with self._lock:
            turns = self._live.get(serial)
            if turns is None:
                if serial <= self._made:
                    return  # its sample is gone: nobody waits for this answer
                turns = self._early.setdefault(serial, RemoteTurns(index))
        _check_index(serial, index, turns.index)
        turns.deliver(answer)


def _check_index(serial: int, posted: int, made: int) -> None:
    if posted != made:
        raise PodProtocolError(
            f"pod conversations out of step: conversation {serial} is sample {made} here and "
            f"sample {posted} on its home host (the sampler hosts made their samples in a "
            "different order: a bug)"
        )


class EnvAnswers:
    """This participant's conversations: each request's samples get this participant's Turns
    (real on the conversation's owner, a stand-in elsewhere), made when its sampler makes them.

    ``counts`` (``{participant: answers}``, one dict across a pod's builds) counts the answers
    each participant's envs gave, as the leader hears of them.
    """

    def __init__(
        self,
        conversations: Conversations | None,
        exchange: Exchange,
        counts: dict[int, int] | None = None,
    ):
        self.conversations, self.exchange = conversations, exchange
        self.counts = {} if counts is None else counts
        self._lock = threading.Lock()
        self._serials = itertools.count()
        self.book = AnswerBook()
        if conversations is not None and exchange.index == 0:
            exchange.listen(TOPIC, self._heard)

    def bind(self, request: Request) -> Request:
        """``request`` with this participant's Turns (one of a run without an env as it is)."""
        if self.conversations is None or request.payload is None:
            return request
        return dataclasses.replace(request, turns=self.turns(request))

    def turns(self, request: Request) -> Callable[[int], Turns]:
        """``request.turns`` here: its example is the request's payload."""
        if request.request_id < 0:
            raise ValueError("a conversation needs its request id (its owner's rule)")
        assert self.conversations is not None
        exchange, real = self.exchange, None
        if owner_key(request.payload, request.request_id) % exchange.count == exchange.index:
            real = self.conversations.turns(task_example(request.payload), request.prompt_tokens)

        def make(index: int) -> Turns:
            serial = next(self._serials)
            if real is not None:
                return HomeTurns(real(index), serial, index, self._report)
            if exchange.index == 0:
                return self.book.make(serial, index)
            return RemoteTurns(index)  # a follower applies the leader's answers instead

        return make

    def _report(
        self, serial: int, index: int, ids: list[int] | None, reward: float, info: dict
    ) -> None:
        if self.exchange.index == 0:
            self._count(0)
        else:
            self.exchange.post(TOPIC, [serial, index, ids, reward, info])

    def _heard(self, participant: int, posted: list) -> None:
        serial, index, ids, reward, info = posted
        self.book.deliver(serial, index, (ids, reward, info))
        self._count(participant)

    def _count(self, participant: int) -> None:
        with self._lock:
            self.counts[participant] = self.counts.get(participant, 0) + 1

    def check(self) -> None:
        """Raise what failed while hearing the other participants' answers."""
        self.exchange.check(TOPIC)

    def stop(self) -> None:
        """The end of a build: a follower posts no more answers, the leader hears the last."""
        if self.conversations is not None:
            self.exchange.end(TOPIC)
