"""The training prompt stream, read by every process that shares the work.

The stream is the task's examples shuffled and repeated (:func:`rljax.data.pipeline.
prompt_dataset`), numbered by position; a batch is the next ``batch_size`` positions, in order.
Of ``n`` participants of the run's :class:`~rljax.runtime.exchange.Exchange`, participant ``i``
reads the positions ``p`` with ``p % n == i``, and the batch comes back in position order, so
one process, the processes of one SPMD program and a pod's sampler hosts all draw the very
sequence one process would, and a resize (another ``n``) only re-strides from the position
reached. The checkpoint holds that position (``{"position": p}``), whatever the process count.

Each example carries its position (:data:`POSITION`). On a pod, its request's home is the host
that read it (its samples take that host's slots, :mod:`rljax.engine.homes`), and the same host
scores its group and runs its conversations' envs (:func:`owner_key`).
"""

from __future__ import annotations

import json
import logging
from typing import Any

from rljax.config import ConfigError
from rljax.data.pipeline import prompt_dataset
from rljax.runtime.exchange import Exchange, spread

log = logging.getLogger(__name__)

POSITION = "stream_position"  # the key each training example carries its position under
TOPIC = "prompts"


def owner_key(example: Any, group_id: int) -> int:
    """What decides the owner of a group (its reader, scorer and env host): the stream position
    of its prompt, or the group id for a prompt with none (an evaluation prompt)."""
    if isinstance(example, dict) and POSITION in example:
        return int(example[POSITION])
    return group_id


def task_example(example: Any) -> Any:
    """``example`` as the task wrote it (without its stream position), for a reward function."""
    if isinstance(example, dict) and POSITION in example:
        return {k: v for k, v in example.items() if k != POSITION}
    return example


def resumed_position(meta: dict[str, Any] | None) -> int:
    """The stream position a checkpoint's meta holds (0 for a fresh run)."""
    if meta is None:
        return 0
    state = meta.get("data") or {}
    if "position" not in state:
        raise ConfigError(
            f"the checkpoint's prompt-stream state {state} is not a position in the stream (a "
            "checkpoint written before the stream was numbered); start a fresh workdir"
        )
    return int(state["position"])


class PromptStream:
    """A :class:`~rljax.runtime.hosting.PromptSource`: ``next()`` is the next global batch (the
    same list on every participant that calls it), ``get_state()`` the position to resume from.

    ``homes``: whether an example's samples take the slots of the host that read it (a pod's
    sampler hosts), or any slot. ``read_by`` (``{participant: examples}``) is added to as
    participants read; a run passes one dict to every build's stream, so it counts across
    resizes.
    """

    def __init__(
        self,
        examples: list[dict],
        *,
        seed: int,
        batch_size: int,
        exchange: Exchange,
        start: int = 0,
        homes: bool = False,
        read_by: dict[int, int] | None = None,
    ):
        self.dataset = prompt_dataset(examples, seed=seed)
        self.exchange, self.batch_size, self.homes = exchange, batch_size, homes
        self.position = start
        self.read_by = {} if read_by is None else read_by

    def __iter__(self) -> PromptStream:
        return self

    def __next__(self) -> list[dict]:
        positions = list(range(self.position, self.position + self.batch_size))
        indices, shares = spread(self.exchange, TOPIC, positions, positions, self.read)
        batch: list[dict] = [{}] * len(positions)
        for p, (share, examples) in enumerate(zip(indices, shares, strict=True)):
            self.read_by[p] = self.read_by.get(p, 0) + len(share)
            for i, example in zip(share, examples, strict=True):
                if example[POSITION] != positions[i]:
                    raise RuntimeError(
                        f"prompt stream out of order: participant {p} sent position "
                        f"{example[POSITION]} where {positions[i]} was expected (a bug)"
                    )
                batch[i] = example
        self.position += self.batch_size
        return batch

    def read(self, positions: list[int]) -> list[dict]:
        """This participant's examples at ``positions`` (the ``work`` of every transport)."""
        examples = [{**self.dataset[p], POSITION: p} for p in positions]
        if log.isEnabledFor(logging.DEBUG):  # one JSON line per read, for pod debugging
            fields = {"process": self.exchange.index, "prompts": [e["prompt"] for e in examples]}
            log.debug("data read %s", json.dumps(fields))
        return examples

    def get_state(self) -> dict[str, Any]:
        return {"position": self.position}

    def home(self, example: dict) -> int | None:
        """The participant whose slots ``example``'s samples take (None: any slot)."""
        if not self.homes or POSITION not in example:
            return None
        return int(example[POSITION]) % self.exchange.count

    def stop(self) -> None:
        """The end of a build: a pod follower's reader returns."""
        self.exchange.close(TOPIC)
