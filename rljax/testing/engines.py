"""Small real engines for tests and research code: a random tiny decoder on a CPU mesh."""

from __future__ import annotations

import dataclasses
import functools
import re
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from rljax.config import ModelConfig, SamplingConfig
from rljax.engine.engine import Engine
from rljax.engine.paged import PagedEngine
from rljax.models.sharding import SAMPLER_RULES, make_mesh
from rljax.models.transformer import init_sharded
from rljax.testing.configs import TINY_MODEL


@dataclasses.dataclass
class TinyEngine:
    """An engine over a randomly initialised tiny model, plus a reference greedy decoder.

    ``engine`` is the native engine (what a Sampler drives), ``jetstream`` the JetStream
    ``Engine`` over that same engine. ``params`` is what the engine serves (in its
    ``weights_layout``); ``state`` the same weights as the Decoder's params state, which the
    reference decodes from.
    """

    engine: PagedEngine
    graphdef: nnx.GraphDef
    params: object
    state: nnx.State
    jetstream: Engine

    def next_logits(self, seq: list[int]) -> np.ndarray:
        """Logits [V] after ``seq``, by a full forward pass over the whole sequence."""
        width = self.engine.max_seq_len
        buf = np.zeros((1, width), np.int32)
        buf[0, : len(seq)] = seq
        return np.asarray(self._last_logits(self.state, jnp.asarray(buf), len(seq)))

    @functools.cached_property
    def _last_logits(self) -> Callable[[nnx.State, jax.Array, int], jax.Array]:
        width = self.engine.max_seq_len

        @jax.jit
        def last(params: nnx.State, tokens: jax.Array, length: jax.Array) -> jax.Array:
            model = nnx.merge(self.graphdef, params)
            pos = jnp.arange(width)[None]
            seg = (pos < length).astype(jnp.int32)
            return model.logits(model(tokens, pos, seg))[0, length - 1]

        return last

    def greedy_reference(self, prompt: list[int], n: int) -> list[int]:
        """Greedy continuation by full recompute of the whole sequence at every step."""
        seq = list(prompt)
        for _ in range(n):
            seq.append(int(np.argmax(self.next_logits(seq))))
        return seq[len(prompt) :]


def tiny_engine(
    *,
    model: ModelConfig = TINY_MODEL,
    devices: Sequence[jax.Device] | None = None,
    seed: int = 0,
    impl: str = "auto",
    data: int = 1,
    **sampling: Any,
) -> TinyEngine:
    """A TinyEngine; ``sampling`` overrides SamplingConfig fields.

    The sampler mesh spans ``devices`` (default: the first device) as ``data`` slot shards
    times a 'tensor' axis taking the rest.
    """
    defaults = dict(max_new_tokens=12, max_prefill_length=16, max_concurrent_decodes=4, page_size=4)
    cfg = SamplingConfig(**{**defaults, **sampling})
    devices = list(devices or jax.devices()[:1])
    mesh = make_mesh(devices, {"data": data, "tensor": -1})
    graphdef, params = init_sharded(model, mesh, SAMPLER_RULES, seed)
    jetstream = Engine(model, cfg, mesh, graphdef, impl=impl)
    engine = jetstream.native
    return TinyEngine(engine, graphdef, engine.load_params(params), params, jetstream)


def materialised(hlo: str) -> list[str]:
    """The instructions of a compiled module's text (``compiled.as_text()``) whose results are
    buffers: those outside fusion bodies (a convert or slice inside a fusion computes only what
    the fusion's output needs, so it is no copy)."""
    fused = set(re.findall(r"fusion\(.*calls=%([\w.-]+)", hlo))
    out, inside = [], False
    for line in hlo.splitlines():
        header = re.match(r"^(?:ENTRY )?%([\w.-]+) .*\{$", line)
        if header:
            inside = header.group(1) in fused
        elif not inside:
            out.append(line)
    return out
