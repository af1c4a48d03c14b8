"""The prompt stream on a pod: every sampler host reads its own shard of it.

The stream is the one a single process reads (:func:`rljax.data.pipeline.prompt_dataset`:
shuffled, repeated), numbered by position. Of ``n`` sampler hosts, host ``i`` reads the
positions ``p`` with ``p % n == i``. The leader takes the positions in order, position ``p``
from host ``p % n``, so a pod draws the very sequence one process would, and a resize (another
``n``) only re-strides from the position reached. Each example carries its position
(:data:`POSITION`): its request's home is ``p % n`` (its samples take that host's slots,
:mod:`rljax.engine.homes`), and the same host scores its responses
(:mod:`rljax.runtime.pod_scoring`).

A follower's :class:`PromptFeeder` reads ahead on a thread, a chunk of examples at a time, and
posts chunk ``k`` under ``prompts/<epoch>/<host>/<k>``; it stays at most :data:`AHEAD` chunks
beyond what the leader took (the leader posts ``took/<epoch>/<host>/<k>`` as it takes chunk
``k``, and ``None`` there to stop the feeder at the end of a build). The epoch is the pod's
resize count. The leader's own positions it reads itself. The checkpoint holds the position
reached (``{"position": p}``): examples read ahead but not taken are read again on resume.
"""

from __future__ import annotations

import collections
from typing import Any

from rljax.config import ConfigError
from rljax.data.pipeline import prompt_dataset
from rljax.mesh.control import Channel, ChannelThread, host_key

POSITION = "stream_position"  # the key each pod example carries its position under
AHEAD = 2  # chunks a feeder posts beyond what the leader took


def first_position(start: int, host: int, hosts: int) -> int:
    """The first position at or after ``start`` that sampler host ``host`` of ``hosts`` reads."""
    return start + (host - start) % hosts


def home(example: Any, hosts: int) -> int | None:
    """The sampler host (index) whose slots an example's samples take; None if it has no
    stream position (an evaluation prompt)."""
    if isinstance(example, dict) and POSITION in example:
        return int(example[POSITION]) % hosts
    return None


def owner(example: Any, group_id: int, hosts: int) -> int:
    """The sampler host (index) that scores a group and runs its conversations' envs: the
    host that read its prompt, or ``group_id % hosts`` for a prompt without a position."""
    h = home(example, hosts)
    return group_id % hosts if h is None else h


def task_example(example: Any) -> Any:
    """``example`` as the task wrote it (without its stream position), for a reward function."""
    if isinstance(example, dict) and POSITION in example:
        return {k: v for k, v in example.items() if k != POSITION}
    return example


def _read(dataset, position: int) -> dict:
    return {**dataset[position], POSITION: position}


class PodPrompts:
    """The leader's prompt stream: positions in order, each from the host that reads it.

    A :class:`~rljax.runtime.hosting.PromptSource`: ``next()`` gives the next batch,
    ``get_state()`` the position to resume from, ``home()`` the host an example's samples
    take.
    """

    def __init__(
        self,
        dataset,
        channel: Channel,
        hosts: int,
        epoch: int,
        start: int,
        batch_size: int,
        read_by_host: dict[int, int] | None = None,
    ):
        self.dataset, self.channel, self.hosts, self.epoch = dataset, channel, hosts, epoch
        self.position = start
        self.batch_size = batch_size
        # examples each host read; a run passes one dict to every build, so it counts across
        # resizes
        self.read_by_host = {} if read_by_host is None else read_by_host
        self._chunks: dict[int, collections.deque[dict]] = {
            h: collections.deque() for h in range(1, hosts)
        }
        self._taken = dict.fromkeys(range(1, hosts), 0)

    def __next__(self) -> list[dict]:
        batch = [self._example(p) for p in range(self.position, self.position + self.batch_size)]
        self.position += self.batch_size
        return batch

    def get_state(self) -> dict[str, int]:
        return {"position": self.position}

    def home(self, example: dict) -> int | None:
        return home(example, self.hosts)

    def _example(self, position: int) -> dict:
        host = position % self.hosts
        self.read_by_host[host] = self.read_by_host.get(host, 0) + 1
        if host == 0:
            return _read(self.dataset, position)
        chunks = self._chunks[host]
        if not chunks:
            k = self._taken[host]
            key = host_key("prompts", self.epoch, host, k)
            chunks.extend(self.channel.get(key, waiting_for=f"sampler host {host}'s prompts"))
            self.channel.delete(key)
            self.channel.post(host_key("took", self.epoch, host, k), True)
            self._taken[host] = k + 1
        example = chunks.popleft()
        if example[POSITION] != position:
            raise RuntimeError(
                f"pod prompt stream out of order: host {host} sent position "
                f"{example[POSITION]} where the leader expected {position} (a bug)"
            )
        return example

    def stop(self) -> None:
        """Stop every feeder (at the end of a build, before 'end' or 'resize')."""
        for host, k in self._taken.items():
            self.channel.post(host_key("took", self.epoch, host, k), None)


def chunk_size(batch_size: int, hosts: int) -> int:
    """Examples per posted chunk: one host's share of a batch."""
    return -(-batch_size // hosts)


class PromptFeeder(ChannelThread):
    """A sampler follower's side: a thread posting its shard of the stream, from ``start``,
    until the leader stops it. An error here fails the pod (:meth:`Channel.fail`)."""

    def __init__(
        self, dataset, channel: Channel, host: int, hosts: int, epoch: int, start: int, chunk: int
    ):
        super().__init__(channel, "pod-prompts")
        self.dataset = dataset
        self.host, self.hosts, self.epoch = host, hosts, epoch
        self.start_position, self.chunk = start, chunk
        self.start()

    def _serve(self) -> None:
        position = first_position(self.start_position, self.host, self.hosts)
        k = 0
        while True:
            if k >= AHEAD:
                key = host_key("took", self.epoch, self.host, k - AHEAD)
                took = self.channel.get(key, waiting_for="the leader to take prompts")
                self.channel.delete(key)
                if took is None:
                    break
            positions = range(position, position + self.chunk * self.hosts, self.hosts)
            chunk = [_read(self.dataset, p) for p in positions]
            self.channel.post(host_key("prompts", self.epoch, self.host, k), chunk)
            position += self.chunk * self.hosts
            k += 1
        for unread in range(k - AHEAD, k):  # posted, never taken
            self.channel.delete(host_key("prompts", self.epoch, self.host, unread))


def resumed_position(meta: dict[str, Any] | None) -> int:
    """The stream position a pod checkpoint's meta holds (0 for a fresh run)."""
    if meta is None:
        return 0
    state = meta.get("data") or {}
    if "position" not in state:
        raise ConfigError(
            f"the checkpoint's prompt-stream state {state} is not a pod's (no 'position'); "
            "resume it with the process count that wrote it, or start a fresh workdir"
        )
    return int(state["position"])


def open_stream(
    roles,
    channel: Channel,
    epoch: int,
    examples: list[dict],
    seed: int,
    meta: dict[str, Any] | None,
    batch_size: int,
    read_by_host: dict[int, int],
) -> PodPrompts | PromptFeeder:
    """This sampler host's side of the stream for build ``epoch`` of a pod run: the leader's
    :class:`PodPrompts`, or a follower's :class:`PromptFeeder` (from the position ``meta``, a
    checkpoint's, holds)."""
    hosts, me = len(roles.sampler), roles.sampler.index(roles.me)
    dataset = prompt_dataset(examples, seed=seed)
    start = resumed_position(meta)
    if roles.is_leader:
        return PodPrompts(dataset, channel, hosts, epoch, start, batch_size, read_by_host)
    chunk = chunk_size(batch_size, hosts)
    return PromptFeeder(dataset, channel, me, hosts, epoch, start, chunk)
