"""Conversations on a pod: each one's env runs on the sampler host that owns it.

A conversation (docs/agents.md) belongs to the sampler host that read its prompt, the host that
scores its group (:func:`rljax.runtime.prompts.owner_key`: stream position ``p``'s host
``p % n``, or ``group_id % n`` for an evaluation prompt). Every sampler host makes each
sample's :class:`~rljax.engine.samples.Turns` itself, at the same point of the steps it runs or
replays (:class:`PodTurns`, from the request's example, which travels in the submit tick): on
the home host the real :class:`~rljax.envs.conversation.Conversation`, its env reset and
stepped in that host's EnvPool, so an env that raises, hangs or returns a bad step is isolated
and counted there; on every other host a stand-in (:class:`RemoteTurns`).

Every sampler must see the same answers at the same step, whenever each host's env futures
resolve. So the leader takes the snapshot of answers ready now (``Sampler.ready_turns``), posts
it with the step (``Op.STEP``'s argument: request id, sample index, token ids or null), and
then steps with it; a follower's step applies exactly those answers
(``Sampler.step(answers=...)``), never its own futures. The leader must therefore hear every
answer: a follower posts each of its conversations' answers (the conversation's serial, its
sample index, the ids or null, the reward so far, the counters) under ``env/<epoch>/<host>/<n>``
(:class:`AnswerPoster`), and a thread per follower on the leader reads them in order and
resolves the leader's stand-in (:class:`AnswerBook`, :class:`AnswerReader`), whose reward and
counters are then the trajectory's ``env_reward`` and ``env_info``. The leader's own
conversations resolve in its own EnvPool.

A conversation's serial counts the conversations made on that host in this build: every sampler
host makes the same samples in the same order (the replicated state a pod rests on), so the
serials agree, and the sample index travels too and is checked. At the end of a build (END or
RESIZE) each follower posts null after its last answer and posts no more; the leader's thread
for it ends there. Keys carry the epoch (the resize count) and each is deleted by its reader,
as in :mod:`rljax.runtime.pod_scoring`.
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import itertools
import threading
import weakref
from collections.abc import Callable
from typing import Any, Protocol

from rljax.engine.samples import Request, Turns
from rljax.envs.conversation import NO_TURNS, Conversation, Conversations
from rljax.mesh.control import Channel, ChannelThread, PodProtocolError, host_key
from rljax.runtime.prompts import owner_key, task_example

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


class AnswerReader(ChannelThread):
    """The leader's thread for one follower sampler host: delivers that host's answers in
    order until its null. An error here fails the pod (:meth:`Channel.fail`)."""

    def __init__(
        self,
        channel: Channel,
        host: int,
        epoch: int,
        book: AnswerBook,
        count: Callable[[int], None],
    ):
        super().__init__(channel, f"pod-envs-{host}")
        self.host, self.epoch, self.book, self.count = host, epoch, book, count
        self.start()

    def _serve(self) -> None:
        n = 0
        while True:
            key = host_key("env", self.epoch, self.host, n)
            posted = self.channel.get(key, waiting_for=f"sampler host {self.host}'s env answers")
            self.channel.delete(key)
            if posted is None:
                return
            serial, index, ids, reward, info = posted
            self.book.deliver(serial, index, (ids, reward, info))
            self.count(self.host)
            n += 1


class AnswerPoster:
    """A follower's side: posts each answer its conversations' envs give, in order, until
    :meth:`stop` (then an answer from a conversation of the ended build is not posted)."""

    def __init__(self, channel: Channel, me: int, epoch: int):
        self.channel, self.me, self.epoch = channel, me, epoch
        self._lock = threading.Lock()
        self._n = 0
        self._stopped = False

    def post(self, serial: int, index: int, ids: list[int] | None, reward: float, info: dict):
        with self._lock:
            if not self._stopped:
                self._post([serial, index, ids, reward, info])

    def stop(self) -> None:
        """Post the null that ends the leader's reader (at the end of a build)."""
        with self._lock:
            if not self._stopped:
                self._post(None)
                self._stopped = True

    def _post(self, value: Any) -> None:
        try:
            self.channel.post(host_key("env", self.epoch, self.me, self._n), value)
        except BaseException as e:  # on an env thread: the leader would wait for it for ever
            self.channel.fail(e)
            raise
        self._n += 1


class EnvSide(Protocol):
    """What differs between the leader and a follower in a pod's conversations."""

    def home(self, conversation: Conversation, serial: int, index: int) -> Turns:
        """The Turns of a conversation whose env runs on this host."""
        ...

    def remote(self, serial: int, index: int) -> Turns:
        """The Turns of a conversation whose env runs on another host."""
        ...

    def check(self) -> None:
        """Raise what failed in this side's threads."""
        ...

    def stop(self) -> None:
        """The end of a build (after END or RESIZE)."""
        ...


class LeaderEnvs:
    """The leader's side: a reader per follower sampler host; ``counts`` (``{sampler process:
    answers}``, one dict across builds) counts the answers each host's envs gave."""

    def __init__(
        self, channel: Channel, hosts: tuple[int, ...], epoch: int, counts: dict[int, int]
    ):
        self.me, self.counts = hosts[0], counts
        self._lock = threading.Lock()
        self.book = AnswerBook()
        self.readers = [AnswerReader(channel, h, epoch, self.book, self._count) for h in hosts[1:]]

    def home(self, conversation: Conversation, serial: int, index: int) -> Turns:
        return HomeTurns(conversation, serial, index, lambda *_: self._count(self.me))

    def remote(self, serial: int, index: int) -> Turns:
        return self.book.make(serial, index)

    def check(self) -> None:
        for reader in self.readers:
            if reader.error is not None:
                raise reader.error

    def stop(self) -> None:
        for reader in self.readers:  # each ends on its follower's null, posted at END/RESIZE
            reader.join()

    def _count(self, host: int) -> None:
        with self._lock:
            self.counts[host] = self.counts.get(host, 0) + 1


class FollowerEnvs:
    """A follower's side: its conversations' answers posted to the leader."""

    def __init__(self, channel: Channel, me: int, epoch: int):
        self.poster = AnswerPoster(channel, me, epoch)

    def home(self, conversation: Conversation, serial: int, index: int) -> Turns:
        return HomeTurns(conversation, serial, index, self.poster.post)

    def remote(self, serial: int, index: int) -> Turns:
        return RemoteTurns(index)

    def check(self) -> None:
        pass

    def stop(self) -> None:
        self.poster.stop()


class PodTurns:
    """A pod sampler host's conversations: each request's samples get this host's Turns (real
    on the conversation's home host, a stand-in elsewhere), made when the sampler makes them."""

    def __init__(self, conversations: Conversations, hosts: int, me: int, side: EnvSide):
        self.conversations, self.hosts, self.me, self.side = conversations, hosts, me, side
        self._serials = itertools.count()

    def turns(self, request: Request) -> Callable[[int], Turns]:
        """``request.turns`` on this host (its example is the request's payload)."""
        if request.request_id < 0:
            raise ValueError("a pod's conversation needs its request id (its home host's rule)")
        real = None
        if owner_key(request.payload, request.request_id) % self.hosts == self.me:
            example = task_example(request.payload)
            real = self.conversations.turns(example, request.prompt_tokens)

        def make(index: int) -> Turns:
            serial = next(self._serials)
            if real is not None:
                return self.side.home(real(index), serial, index)
            return self.side.remote(serial, index)

        return make

    def bind(self, request: Request) -> Request:
        """``request`` with this host's Turns (one without turns, as it is)."""
        if request.turns is None:
            return request
        return dataclasses.replace(request, turns=self.turns(request))

    def check(self) -> None:
        self.side.check()

    def stop(self) -> None:
        self.side.stop()


def open_envs(
    roles,
    channel: Channel,
    epoch: int,
    conversations: Conversations | None,
    counts: dict[int, int],
) -> PodTurns | None:
    """This sampler host's side of build ``epoch``'s conversations (None for a run without
    an env): the leader's readers, or a follower's poster."""
    if conversations is None:
        return None
    side: EnvSide
    if roles.is_leader:
        side = LeaderEnvs(channel, roles.sampler, epoch, counts)
    else:
        side = FollowerEnvs(channel, roles.me, epoch)
    return PodTurns(conversations, len(roles.sampler), roles.sampler.index(roles.me), side)
