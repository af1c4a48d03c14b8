"""Versioned weight hand-off from the learner mesh to the sampler mesh.

``publish(params, version)`` reshards the learner's params onto the sampler's shardings with
``jax.device_put`` (a jit cannot write onto a disjoint mesh), casting them to the sampler's
dtype (``sampling.dtype``) first on the learner side, so with bfloat16 half the bytes cross and
the sampler holds half the weight memory; the learner keeps its f32 master copy. ``acquire()``
returns the newest published ``(params, version)``; the sampler takes it at its next generate
boundary, per its swap mode. Every publish is timed and its bytes counted. ``copy(params)`` is
the same cast and copy without publishing (the sampler's first params).

Given the topology's ``slices`` (a multislice job), the copy is the two-stage plan of
:mod:`rljax.mesh.fan_out`: one copy crosses into each sampler slice over DCN, then it is
replicated over ICI; ``SyncStats.stage_bytes`` counts the first stage's bytes.

With ``adapters_only`` (a LoRA run, :mod:`rljax.models.lora`), the sampler keeps the frozen
base it received in the first copy, and every later publish moves the adapters alone: the
newest params are that base joined with the adapters just copied, and ``SyncStats.bytes``
counts what moved. A :meth:`retarget` drops the base with the copy, so the next publish
moves everything once more.

:func:`sampler_model` gives the engine the model in the sampler's dtype, so a bfloat16 sampler
also computes its activations and holds its KV pages in bfloat16 (logits stay float32).
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import threading
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from rljax.config import LoRAConfig, ModelConfig
from rljax.mesh.fan_out import fan_out, stage_bytes
from rljax.mesh.slices import SliceMap, count
from rljax.models.lora import join, split_adapters
from rljax.models.transformer import Decoder

# Publishes kept in WeightSync.history (the newest; the driver and reallocator read the last).
HISTORY = 64


@functools.partial(jax.jit, static_argnames="dtype")
def cast_floating(tree, dtype):
    """``tree`` with its floating leaves cast to ``dtype`` (on their own devices); others kept."""
    return jax.tree.map(
        lambda x: x.astype(dtype) if jnp.issubdtype(x.dtype, jnp.floating) else x, tree
    )


@dataclasses.dataclass(frozen=True)
class SyncStats:
    version: int
    bytes: int
    seconds: float
    stage_bytes: int = 0  # multislice: bytes of stage 1, the copy that crosses slices


class AdapterMoves:
    """The adapters-only move of a LoRA run, over any way of moving a params tree (a
    ``device_put`` here, a pod's union transfer in :mod:`rljax.mesh.pod_weights`): the first
    move carries the whole params and leaves the frozen base on the sampler; every later one
    carries the adapters alone, joined to that base on arrival. Off (``enabled`` False), every
    move carries everything."""

    def __init__(self, enabled: bool):
        self.enabled = enabled
        self.base: Any = None  # the base the first move left (None leaves off the sampler)

    @property
    def whole(self) -> bool:
        """Whether the next move carries the whole params."""
        return self.base is None

    def outgoing(self, params: Any) -> Any:
        """What the next move carries of ``params`` (None: a process that sends nothing)."""
        return params if self.whole or params is None else split_adapters(params)[0]

    def arrived(self, moved: Any) -> Any:
        """The sampler's params from what a move delivered: a whole move's base is kept."""
        if self.whole:
            if self.enabled and not _adapters_alone(moved):
                self.base = split_adapters(moved)[1]
            return moved
        return join(self.base, moved)

    def forget(self) -> None:
        """The base lives on a mesh that is gone (a resize): the next move carries it again."""
        self.base = None


class WeightSync:
    """Holds the newest sampler-side copy of the learner's params."""

    def __init__(
        self,
        target_shardings: Callable,
        *,
        dtype: str | None = None,
        slices: SliceMap = (),
        adapters_only: bool = False,
    ):
        self._target_shardings = target_shardings
        # Floating leaves are cast to ``dtype`` on the learner side; None keeps theirs.
        self.dtype = None if dtype is None else jnp.dtype(dtype)
        # Two stages (DCN once, then ICI) only when the job has several slices.
        self.slices = slices if count(slices) > 1 else ()
        self._stage_bytes = 0
        self._lock = threading.Lock()
        self._latest: tuple[object, int] | None = None
        self.adapters = AdapterMoves(adapters_only)
        # The newest publishes only (one a step; a long run must not grow host memory).
        self.history: collections.deque[SyncStats] = collections.deque(maxlen=HISTORY)

    def copy(self, params: Any) -> Any:
        """``params`` cast to the sampler's dtype and copied onto its shardings; not published.

        Always a copy, never an alias: the learner donates its buffers to its next step.
        """
        return self.adapters.arrived(self._move(self.adapters.outgoing(params)))

    def _move(self, params: Any) -> Any:
        needs_cast = self.dtype is not None and any(
            jnp.issubdtype(x.dtype, jnp.floating) and x.dtype != self.dtype
            for x in jax.tree.leaves(params)
        )
        src = cast_floating(params, self.dtype) if needs_cast else params
        if not self.slices:
            out = jax.device_put(src, self._target_shardings(src), may_alias=False)
        else:
            out, staged = fan_out(src, self._target_shardings(src), self.slices)
            self._stage_bytes = stage_bytes(staged)
        return out

    def retarget(self, target_shardings: Callable) -> None:
        """Publish onto new sampler shardings from now on (a resize rebuilt the sampler mesh).

        The held copy lives on the old mesh, so it is dropped: ``acquire()`` returns None until
        the next ``publish``. The history is kept.
        """
        with self._lock:
            self._target_shardings = target_shardings
            self._latest = None
            self.adapters.forget()

    def due(self, version: int) -> bool:
        """Whether ``version`` should be published: every learner step is (the sampler serves
        the newest weights; only the fakes thin publishes out, to test the driver's use)."""
        return True

    def publish(self, params, version: int, *, block: bool = True) -> SyncStats:
        """Copy ``params`` to the sampler shardings and make them the newest version."""
        start = time.perf_counter()
        moved = self._move(self.adapters.outgoing(params))
        if block:
            jax.block_until_ready(moved)
        nbytes = sum(x.nbytes for x in jax.tree.leaves(moved))  # what crossed
        copy = self.adapters.arrived(moved)
        stats = SyncStats(version, nbytes, time.perf_counter() - start, self._stage_bytes)
        with self._lock:
            if self._latest is None or version > self._latest[1]:
                self._latest = (copy, version)
            self.history.append(stats)
        return stats

    def acquire(self) -> tuple[object, int] | None:
        """The newest ``(params, version)``, or None before the first publish."""
        with self._lock:
            return self._latest

    @property
    def latest_version(self) -> int:
        with self._lock:
            return -1 if self._latest is None else self._latest[1]


def _adapters_alone(params) -> bool:
    """Whether a params tree is a LoRA adapters state and nothing else."""
    leaves = jax.tree.leaves(params)
    return bool(leaves) and len(jax.tree.leaves(split_adapters(params)[0])) == len(leaves)


def sampler_model(
    model_cfg: ModelConfig,
    graphdef: nnx.GraphDef,
    dtype: str,
    lora: LoRAConfig | None = None,
) -> tuple[ModelConfig, nnx.GraphDef]:
    """The engine's model config and graphdef: the learner's model in the sampler's ``dtype``
    (with ``lora``'s adapters, those the learner's graphdef holds).

    The graphdef carries the config the decoder computes with (activation dtype, which the
    KV pages follow), so a sampler in another dtype than the learner needs its own.
    """
    if model_cfg.dtype == dtype and model_cfg.param_dtype == dtype:
        return model_cfg, graphdef
    cfg = dataclasses.replace(model_cfg, dtype=dtype, param_dtype=dtype)
    decoder = lambda: Decoder(cfg, rngs=nnx.Rngs(0), lora=lora)  # noqa: E731
    return cfg, nnx.graphdef(nnx.eval_shape(decoder))
