"""RL on a pod: sampler hosts and learner hosts of one ``jax.distributed`` program.

On several processes with a split topology (``mesh.mode='split'``, each mesh made of whole
hosts), each process owns devices of one mesh only, so each plays one role:

- **The sampler leader** (the first sampler process, process 0) runs the one
  :class:`~rljax.runtime.driver.Driver`, threaded (mode='async') or lock-step (mode='sync'),
  with the same policies as one host. It takes every decision once: which requests enter the
  sampler, when weights swap and to which version, which groups the buffer hands the learner,
  when to checkpoint and stop. It writes the metrics, and shares each scoring call with the
  other sampler hosts (:mod:`rljax.runtime.scoring`).
- **Sampler followers** replay the leader's sampler operations in the same order (submit,
  swap, generate, interrupt, ...), so their engine state stays identical; each generate is one
  program over the whole sampler mesh. Each reads its stride of the prompt stream
  (:mod:`rljax.runtime.prompts`), whose groups take its slots, and scores them. With an
  env, it steps those groups' conversations, and each step applies the env answers the
  leader posted with it (:mod:`rljax.runtime.env_answers`).
- **Learner processes** replay the learner operations: train on the groups the leader chose,
  send weights, save checkpoints (orbax on the learner processes only).

The operations travel as *ticks* (``tick/<k>``, JSON lists of ``[op, arg]``) through the
coordination service (:class:`~rljax.mesh.control.Channel`). The leader posts a tick before
each operation that touches devices of another process (a generate, a weight swap), so every
process enters each collective in the same order; host-only operations ride along with the
next one. Weights move as one computation over the union of both meshes
(:func:`rljax.mesh.transfer.transfer`); a learner step and a generate run concurrently on
their own chips, which is what makes the schedule asynchronous.

No host's clock feeds another host's decision: the leader's decisions depend on its timing
(when a learner step reports done), but they are taken once and carried out by all.
"""

from __future__ import annotations

import collections
import dataclasses
import enum
import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import jax

from rljax.engine.paged import PagedEngine
from rljax.engine.sampler import Request, Sampler, Trajectory
from rljax.engine.samples import Turns
from rljax.engine.state import SlotSampling
from rljax.mesh.control import Channel, PodProtocolError
from rljax.mesh.pod_weights import PodWeights
from rljax.mesh.weight_sync import HISTORY, SyncStats
from rljax.runtime.rollout import Group, encode_group

if TYPE_CHECKING:
    from rljax.runtime.env_answers import EnvAnswers

log = logging.getLogger(__name__)

# How long the leader's sampler waits for an env answer when nothing else can run, before it
# steps (and posts a tick) anyway: a pod whose every sample waits for its env would otherwise
# post empty steps as fast as it can.
WAIT_FOR_ENV_S = 0.05


class Op(enum.Enum):
    """The operations the leader posts; a tick is a list of ``[op.value, arg]``."""

    SUBMIT = "submit"  # requests enter the sampler (arg: the encoded requests)
    SWAP = "swap"  # weights move to the sampler (arg: the version)
    STEP = "step"  # one generate call (arg: the env answers it applies, or null)
    INTERRUPT = "interrupt"  # a request leaves its slots, resumable (arg: its id)
    RESUME = "resume"
    ABORT = "abort"
    CLEAR = "clear"  # every slot and queue emptied
    LEARN = "learn"  # one learner step (arg: the version and the encoded groups)
    SFT = "sft"  # the supervised warm start
    SAVE = "save"  # every process saves (arg: version, meta, whether to wait)
    RESIZE = "resize"  # the build ends; the pod rebuilds for a split (arg: split, cause)
    END = "end"  # the build ends; the run is over


def parse_op(name: Any, tick: int) -> Op:
    """The operation ``name`` read from tick ``tick``; a one-line error for an unknown one."""
    try:
        return Op(name)
    except ValueError:
        known = ", ".join(op.value for op in Op)
        raise PodProtocolError(
            f"unknown pod operation {name!r} in the leader's tick {tick} (known: {known}); "
            "every process of a pod must run the same rljax: relaunch them from one install"
        ) from None


# -- requests and weights on the wire ----------------------------------------------------------


def encode_request(r: Request) -> dict[str, Any]:
    out = {
        "prompt_tokens": list(r.prompt_tokens),
        "num_samples": r.num_samples,
        "seed": r.seed,
        "sampling": None if r.sampling is None else dataclasses.asdict(r.sampling),
        "request_id": r.request_id,
        "max_new_tokens": r.max_new_tokens,
        "home": r.home,
    }
    if r.turns is not None:  # a conversation: each host makes its turns from the example
        out["conversation"] = r.payload
    return out


def decode_request(
    d: dict[str, Any], turns: Callable[[Request], Callable[[int], Turns]] | None = None
) -> Request:
    """The request ``d`` encodes; a conversation's turns are ``turns(request)`` (this host's
    :meth:`~rljax.runtime.env_answers.EnvAnswers.turns`)."""
    sampling = None if d["sampling"] is None else SlotSampling(**d["sampling"])
    r = Request(
        d["prompt_tokens"],
        d["num_samples"],
        seed=d["seed"],
        sampling=sampling,
        request_id=d["request_id"],
        max_new_tokens=d["max_new_tokens"],
        home=d["home"],
    )
    if "conversation" in d:
        if turns is None:
            raise PodProtocolError(
                f"the leader submitted request {r.request_id} as a conversation, and this "
                "process has no env to make its turns; every process of a pod must run the "
                "same config (env.name)"
            )
        r.payload = d["conversation"]
        r.turns = turns(r)
    return r


# Every process reports how far it read every PROGRESS_EVERY ticks; the leader then deletes
# the ticks everyone has read (a learn tick carries a batch of trajectories: the store must
# not grow with the run).
PROGRESS_EVERY = 64


def report_progress(channel: Channel, k: int) -> None:
    if k % PROGRESS_EVERY == 0:
        channel.post(f"read/{jax.process_index()}", k, overwrite=True)


class Ticks:
    """The leader's side of the tick stream: operations are queued, then posted in order."""

    def __init__(self, channel: Channel):
        self.channel = channel
        self.lock = threading.RLock()  # one tick (and the device work it orders) at a time
        self.count = 0
        self.deleted = 0  # ticks below this are gone from the store
        self._ops: list[list] = []

    def queue(self, op: Op, arg: Any = None) -> None:
        with self.lock:
            self._ops.append([op.value, arg])

    def flush(self, op: Op | None = None, arg: Any = None) -> None:
        """Posts the queued operations (and ``op``) as the next tick."""
        with self.lock:
            if op is not None:
                self._ops.append([op.value, arg])
            if not self._ops:
                return
            self.channel.post(f"tick/{self.count}", self._ops)
            self.count += 1
            self._ops = []
            if self.count % PROGRESS_EVERY == 0:
                self._delete_read()

    def _delete_read(self) -> None:
        """Delete the ticks every other process has read."""
        others = [p for p in range(self.channel.count) if p != jax.process_index()]
        posted = [self.channel.try_get(f"read/{p}") for p in others]
        read = [int(r) for r in posted if r is not None]
        if len(read) < len(others):
            return
        upto = min(read)
        for k in range(self.deleted, upto):
            self.channel.delete(f"tick/{k}")
        self.deleted = max(self.deleted, upto)


class PodSampler:
    """The leader's sampler: the real :class:`Sampler`, with each operation also posted.

    The driver's :class:`~rljax.runtime.parts.SamplerPart`, plus what ``Run.evaluate`` uses. A
    swap or a generate posts the tick first, then runs here, so followers and learner processes
    enter the same collectives in the same order.
    """

    def __init__(
        self,
        sampler: Sampler,
        ticks: Ticks,
        weights: PodWeights,
        sync: PodWeightSync,
        answers: EnvAnswers | None = None,
        on_tick: Callable[[], None] = lambda: None,
    ):
        self.real = sampler
        self.ticks = ticks
        self.weights = weights
        self.sync = sync
        self.answers = answers  # this host's conversations (rljax.runtime.env_answers)
        self.swapped = -1
        self.on_tick = on_tick  # the leader polls for stop requests here

    # -- the real sampler's state, read by the driver ---------------------------------------

    @property
    def version(self) -> int:
        return self.real.version

    @property
    def busy_slots(self) -> int:
        return self.real.busy_slots

    @property
    def num_slots(self) -> int:
        return self.real.num_slots

    @property
    def free_slots(self) -> int:
        return self.real.free_slots

    @property
    def queued_samples(self) -> int:
        return self.real.queued_samples

    @property
    def kv_tokens(self) -> int:
        return self.real.kv_tokens

    @property
    def engine(self) -> PagedEngine:
        return self.real.engine

    @property
    def stats(self) -> collections.Counter[str]:
        return self.real.stats

    def has_work(self) -> bool:
        return self.real.has_work()

    def submit(self, requests: Sequence[Request]) -> list[int]:
        with self.ticks.lock:
            ids = self.real.submit(requests)
            self.ticks.queue(Op.SUBMIT, [encode_request(r) for r in requests])
            return ids

    def set_params(self, _params: Any, version: int) -> None:
        """Swap to the learner's ``version``: one union transfer, entered by every process."""
        with self.ticks.lock:
            if version <= self.swapped:
                return
            self.ticks.flush(Op.SWAP, version)
            start = time.perf_counter()
            params = self.weights.move()
            self.sync.record(
                SyncStats(
                    version,
                    self.weights.bytes,
                    time.perf_counter() - start,
                    self.weights.stage_bytes,
                )
            )
            self.swapped = version
            self.real.set_params(params, version)

    def catch_up(self) -> None:
        """Swap now if the learner published a version the sampler has not taken yet."""
        latest = self.sync.latest_version
        if latest > self.swapped:
            self.set_params(None, latest)

    def step(self) -> list[Trajectory]:
        """One step everywhere, with the env answers ready now: posted with the step, so the
        followers continue the same conversations (:mod:`rljax.runtime.env_answers`)."""
        self.on_tick()  # outside the tick lock: it may take the driver's
        if self.answers is not None and self.answers.conversations is not None:
            self.answers.check()
            self.real.wait_for_turns(WAIT_FOR_ENV_S)
        with self.ticks.lock:
            answers = self.real.ready_turns()
            self.ticks.flush(Op.STEP, answers or None)
            return self.real.step(answers)

    def run(self, requests: Sequence[Request] = ()) -> list[Trajectory]:
        self.submit(requests)
        out = []
        while self.has_work():
            out.extend(self.step())
        return out

    def interrupt(self, request_id: int) -> int:
        with self.ticks.lock:
            out = self.real.interrupt(request_id)
            self.ticks.queue(Op.INTERRUPT, request_id)
            return out

    def resume(self, request_id: int) -> None:
        with self.ticks.lock:
            self.real.resume(request_id)
            self.ticks.queue(Op.RESUME, request_id)

    def abort(self, request_id: int) -> None:
        with self.ticks.lock:
            self.real.abort(request_id)
            self.ticks.queue(Op.ABORT, request_id)

    def clear(self) -> int:
        with self.ticks.lock:
            self.ticks.queue(Op.CLEAR)
            return self.real.clear()


class PodWeightSync:
    """The leader's view of the weight sync: a publish only announces a version.

    The bytes move when the sampler swaps (:meth:`PodSampler.set_params`), which records the
    transfer here; :meth:`publish` returns the newest such record.
    """

    def __init__(self) -> None:
        self.history: list[SyncStats] = []
        self._latest = -1
        self._lock = threading.Lock()

    def due(self, version: int) -> bool:
        return True  # every version is announced (as WeightSync publishes every step)

    def publish(self, _params: Any, version: int, *, block: bool = True) -> SyncStats:
        with self._lock:
            self._latest = max(self._latest, version)
            return self.history[-1] if self.history else SyncStats(version, 0, 0.0)

    def record(self, stats: SyncStats) -> None:
        with self._lock:
            self.history = [*self.history[-(HISTORY - 1) :], stats]

    def acquire(self) -> tuple[Any, int] | None:
        with self._lock:
            return None if self._latest < 0 else (None, self._latest)

    @property
    def latest_version(self) -> int:
        with self._lock:
            return self._latest


@dataclasses.dataclass
class PodBatch:
    """What the leader hands its remote learner: the groups, encoded."""

    groups: list[dict]
    num_tokens: int


class RemoteLearner:
    """The leader's learner: a step posts the groups and waits for the learner processes."""

    def __init__(self, sampler: PodSampler, channel: Channel, version: int):
        self.sampler = sampler
        self.channel = channel
        self.version = version
        self.params = None  # the params live on the learner processes

    def step(self, batch: PodBatch) -> dict[str, Any]:
        with self.sampler.ticks.lock:
            # The learner processes send weights in tick order: a version announced but not
            # yet swapped must go out before the step that overwrites those params.
            self.sampler.catch_up()
            self.sampler.ticks.flush(Op.LEARN, {"version": self.version, "groups": batch.groups})
        metrics = self.channel.get(f"done/{self.version}", waiting_for="a learner step")
        self.version += 1
        return metrics


def make_pod_batch(groups: list[Group]) -> PodBatch:
    tokens = sum(
        len(t.prompt_tokens) + len(t.response_tokens) for g in groups for t in g.trajectories
    )
    return PodBatch([encode_group(g) for g in groups], tokens)
