"""Data between the processes that share a piece of work, written once over three transports.

Several pieces of a run are shared among processes: which process reads a prompt, which scores
a group, which runs a conversation's env. Each is written once, as a ``work`` function that a
process applies to the items it owns, over an :class:`Exchange` that says who owns what and
moves the results:

- :class:`Alone`: one process; it owns everything and nothing moves.
- :class:`AllGather`: several processes of one SPMD program (sharing both meshes); each calls
  the same function with the same items, works on its own share, and an all-gather gives every
  process every share.
- :class:`ChannelExchange`: the sampler hosts of a pod. Only the leader (process 0) runs the
  driver, so the leader posts each follower its items through the coordination service
  (:class:`~rljax.mesh.control.Channel`), works on its own share meanwhile, and gathers the
  followers' results; each follower runs the same ``work`` on a :class:`Server` thread.

The owner of an item is its key modulo the participants (:meth:`Exchange.owners`): for a
prompt, its position in the stream; for a group, the position of the prompt it answers. So the
process that read a prompt scores its group and runs its envs, on every transport.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from rljax.mesh import distributed
from rljax.mesh.control import Channel, ChannelThread, host_key

Work = Callable[[list[Any]], Any]


class Exchange(Protocol):
    """Who owns which item, and the transport that moves items and results between owners."""

    @property
    def count(self) -> int:
        """Participants: the processes sharing the work."""
        ...

    @property
    def index(self) -> int:
        """This process's place among them (0 leads)."""
        ...

    def scatter(self, topic: str, per_owner: list[list[Any]] | None) -> list[Any] | None:
        """This participant's items of the next ``topic`` call: ``per_owner[index]`` where every
        participant holds the items; on a pod follower (``per_owner`` None) those the leader
        posted, or None once the leader closed ``topic``."""
        ...

    def share(self, topic: str, local: Any) -> list[Any] | None:
        """Every participant's ``local``, in participant order (None on a pod follower, which
        only hands its own to the leader)."""
        ...

    def close(self, topic: str) -> None:
        """No more ``topic`` calls: a pod follower's server for it returns."""
        ...

    # A stream: messages a participant sends the leader as they come (env answers), in order.
    def post(self, topic: str, value: Any) -> None:
        """Send the leader ``value`` on ``topic`` (a participant other than the leader; any
        thread). After :meth:`end`, nothing is sent."""
        ...

    def listen(self, topic: str, heard: Callable[[int, Any], None]) -> None:
        """The leader's: call ``heard(participant, value)`` for each value posted on ``topic``,
        each participant's in order, on threads of this exchange."""
        ...

    def check(self, topic: str) -> None:
        """Raise what failed while listening on ``topic``."""
        ...

    def end(self, topic: str) -> None:
        """The end of ``topic``'s stream: a participant sends its last; the leader waits for
        every participant's last (and raises what failed)."""
        ...


def owners(keys: Sequence[int], count: int) -> list[int]:
    """The participant that owns each item: its key modulo ``count``."""
    return [int(k) % count for k in keys]


def spread(
    exchange: Exchange, topic: str, keys: Sequence[int], items: Sequence[Any], work: Work
) -> tuple[list[list[int]], list[Any]]:
    """``work`` on every item, each participant on those it owns; a call every participant
    makes alike (a pod's followers serve it: :func:`serve`).

    Returns ``(indices, shares)``: ``indices[p]`` are the positions in ``items`` that
    participant ``p`` worked on, and ``shares[p]`` what its ``work`` returned for them.
    """
    count = exchange.count
    indices: list[list[int]] = [[] for _ in range(count)]
    for i, p in enumerate(owners(keys, count)):
        indices[p].append(i)
    mine = exchange.scatter(topic, [[items[i] for i in share] for share in indices])
    assert mine is not None  # only a pod follower is told to stop, and it serves instead
    shares = exchange.share(topic, work(mine))
    assert shares is not None  # every participant that calls spread gets every share
    return indices, shares


def serve(exchange: Exchange, topic: str, work: Work) -> None:
    """A pod follower's side of :func:`spread`: ``work`` on each call's items, until the
    leader closes ``topic``."""
    while (mine := exchange.scatter(topic, None)) is not None:
        exchange.share(topic, work(mine))


class _Leader:
    """A transport whose only participant that streams is the leader itself: nothing to hear
    (one process, or an SPMD program, whose processes decide alike and stream nothing)."""

    index: int

    def post(self, topic: str, value: Any) -> None:
        raise RuntimeError(
            f"participant {self.index} posted on '{topic}', a stream only a pod's followers "
            "send (a bug)"
        )

    def listen(self, topic: str, heard: Callable[[int, Any], None]) -> None:
        pass

    def check(self, topic: str) -> None:
        pass

    def end(self, topic: str) -> None:
        pass


class Alone(_Leader):
    """One process: it owns every item; nothing moves."""

    count = 1
    index = 0

    def scatter(self, topic: str, per_owner: list[list[Any]] | None) -> list[Any] | None:
        assert per_owner is not None
        return per_owner[0]

    def share(self, topic: str, local: Any) -> list[Any] | None:
        return [local]

    def close(self, topic: str) -> None:
        pass


class AllGather(_Leader):
    """The processes of one SPMD program: each works on its share, an all-gather (a collective:
    every process calls it in the same order) hands every share to every process."""

    def __init__(self) -> None:
        self.count, self.index = distributed.process_count(), distributed.process_index()

    def scatter(self, topic: str, per_owner: list[list[Any]] | None) -> list[Any] | None:
        assert per_owner is not None  # every process computed the same split
        return per_owner[self.index]

    def share(self, topic: str, local: Any) -> list[Any] | None:
        if self.count == 1:
            return [local]
        return distributed.allgather_objects(local)

    def close(self, topic: str) -> None:
        pass


class ChannelExchange:
    """A pod's sampler hosts (``processes``, the leader first) over the coordination service.

    The leader's ``n``-th call of a topic posts each follower its items under
    ``<topic>/<epoch>/<host>/<n>`` and reads its result under ``<topic>-out/<epoch>/<host>/<n>``;
    the epoch (the pod's resize count) keeps a rebuilt pod from meeting an earlier build's keys,
    and each key is deleted by its reader. Values travel as JSON.
    """

    def __init__(self, channel: Channel, processes: Sequence[int], me: int, epoch: int):
        self.channel, self.epoch = channel, epoch
        self.processes = tuple(processes)
        self.count, self.index = len(self.processes), self.processes.index(me)
        self._sent: dict[str, int] = {}  # the leader's calls per topic, or a follower's served
        self._shared: dict[str, int] = {}
        self._lock = threading.Lock()  # a stream's posts come from any thread
        self._posted: dict[str, int] = {}
        self._ended: set[str] = set()
        self._readers: dict[str, list[_Reader]] = {}

    def _next(self, counts: dict[str, int], topic: str) -> int:
        n = counts.get(topic, 0)
        counts[topic] = n + 1
        return n

    def scatter(self, topic: str, per_owner: list[list[Any]] | None) -> list[Any] | None:
        n = self._next(self._sent, topic)
        if self.index == 0:
            assert per_owner is not None
            for host in range(1, self.count):
                self.channel.post(host_key(topic, self.epoch, host, n), per_owner[host])
            return per_owner[0]
        key = host_key(topic, self.epoch, self.index, n)
        mine = self.channel.get(key, waiting_for=f"the leader's next '{topic}' items")
        self.channel.delete(key)
        return mine

    def share(self, topic: str, local: Any) -> list[Any] | None:
        n = self._next(self._shared, topic)
        out = f"{topic}-out"
        if self.index:
            self.channel.post(host_key(out, self.epoch, self.index, n), local)
            return None
        shares = [local]
        for host in range(1, self.count):
            key = host_key(out, self.epoch, host, n)
            what = f"sampler host {self.processes[host]}'s '{topic}' results"
            shares.append(self.channel.get(key, waiting_for=what))
            self.channel.delete(key)
        return shares

    def close(self, topic: str) -> None:
        """The leader's: post every follower the end of ``topic`` (a null)."""
        if self.index:
            return
        n = self._next(self._sent, topic)
        for host in range(1, self.count):
            self.channel.post(host_key(topic, self.epoch, host, n), None)

    def post(self, topic: str, value: Any) -> None:
        with self._lock:
            if topic not in self._ended:
                self._post(topic, value)

    def _post(self, topic: str, value: Any) -> None:
        key = host_key(topic, self.epoch, self.index, self._next(self._posted, topic))
        try:
            self.channel.post(key, value)
        except BaseException as e:  # maybe on an env's thread: the leader would wait for ever
            self.channel.fail(e)
            raise

    def listen(self, topic: str, heard: Callable[[int, Any], None]) -> None:
        self._readers[topic] = [_Reader(self, topic, h, heard) for h in range(1, self.count)]

    def check(self, topic: str) -> None:
        for reader in self._readers.get(topic, []):
            if reader.error is not None:
                raise reader.error

    def end(self, topic: str) -> None:
        if self.index == 0:
            for reader in self._readers.pop(topic, []):  # each ends on its follower's null
                reader.join()
            return
        with self._lock:
            if topic not in self._ended:
                self._post(topic, None)
                self._ended.add(topic)


class Server(ChannelThread):
    """A pod follower's thread serving one topic (:func:`serve`) until the leader closes it.
    An error here fails the pod (:meth:`Channel.fail`), naming this process."""

    def __init__(self, exchange: ChannelExchange, topic: str, work: Work):
        super().__init__(exchange.channel, f"pod-{topic}")
        self.exchange, self.topic, self.work = exchange, topic, work
        self.start()

    def _serve(self) -> None:
        serve(self.exchange, self.topic, self.work)


class _Reader(ChannelThread):
    """The leader's thread hearing one follower's stream on a topic, until its null. An error
    here fails the pod (:meth:`Channel.fail`)."""

    def __init__(
        self,
        exchange: ChannelExchange,
        topic: str,
        host: int,
        heard: Callable[[int, Any], None],
    ):
        super().__init__(exchange.channel, f"pod-{topic}-{host}")
        self.exchange, self.topic, self.host, self.heard = exchange, topic, host, heard
        self.start()

    def _serve(self) -> None:
        x, n = self.exchange, 0
        while True:
            key = host_key(self.topic, x.epoch, self.host, n)
            what = f"sampler host {x.processes[self.host]}'s '{self.topic}' messages"
            value = x.channel.get(key, waiting_for=what)
            x.channel.delete(key)
            if value is None:
                return
            self.heard(self.host, value)
            n += 1
