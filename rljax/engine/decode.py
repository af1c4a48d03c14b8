"""The decode step's math, one token or several per device call.

:func:`decode_token` is the one decode step: the single-token ``generate`` of
:mod:`rljax.engine.steps` (JetStream's contract) runs it once per call, and
:func:`generate_steps_step` runs it ``steps`` times in a loop on the device (the sampler's
multi-step decode, ``sampling.decode_steps``), checking each slot's stop tokens and token
limit there: a slot that draws a stop id or its last allowed token stops for the rest of the
call (no KV written, nothing drawn, ``valid = 0`` in its later rows). Token ``i`` of a sample
is drawn with ``fold_in(key, i)`` either way, so a sample's tokens and log-probs do not depend
on how its steps are grouped into calls.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any, Protocol

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding

from rljax.config import ModelConfig, SamplingConfig
from rljax.engine import sampling
from rljax.engine.pools import PoolLayout
from rljax.engine.state import DecodeState, Prefix, ResultTokens, pack_result
from rljax.engine.weights import ServingLayout
from rljax.models.sharding import ShardingRules

Sampler = Callable[[jax.Array], jax.Array]  # logits [rows, V] -> tokens [rows]

# sampling.decode_steps = 0: tokens per decode call for the sampler's device kind. The CPU's is
# measured (docs/benchmarks.md, "Multi-step decode"): 4, 8 and 16 tokens a call decode no faster
# than 1 there, whose host share is already near 0, and a slot that stops early idles for the
# rest of a call, so 1. Accelerators' 8 is not measured by rljax yet (scripts/device_check.py
# times 1 against it): it is where returning to the host after every token costs most
# (tpu-inference measured a 40% cut in decode time from several steps a call).
DEFAULT_DECODE_STEPS = {"cpu": 1, "gpu": 8, "tpu": 8}


def steps_per_call(setting: int, mesh: Mesh) -> int:
    """Tokens per decode call: ``setting`` (``sampling.decode_steps``), or for 0 the default
    of the mesh's device kind (:data:`DEFAULT_DECODE_STEPS`; 1 for a kind not listed)."""
    if setting:
        return setting
    return DEFAULT_DECODE_STEPS.get(mesh.devices.flat[0].platform, 1)


class StepsHost(Protocol):
    """What the steps read of the engine they are built for: its layout and shardings.

    :class:`~rljax.engine.paged.PagedEngine` is the one implementation; it imports this
    module, so naming it here would close an import circle.
    """

    model_cfg: ModelConfig
    sampling_cfg: SamplingConfig
    layout: ServingLayout
    rules: ShardingRules
    impl: str
    record_routes: bool
    max_seq_len: int
    page_size: int
    pages_per_slot: int
    kv_shards: int
    slots_per_shard: int
    pool_layout: PoolLayout

    @property
    def mesh(self) -> Mesh: ...

    @property
    def max_concurrent_decodes(self) -> int: ...

    def replicated(self) -> NamedSharding: ...

    def decode_state_shardings(self) -> DecodeState: ...

    def get_prefix_destination_sharding(self) -> Prefix: ...


def draw(
    logits_sv: jax.Array,
    keys_s: jax.Array,
    temperature: jax.Array,
    top_k: jax.Array,
    top_p: jax.Array,
    min_p: jax.Array,
    steps_s: jax.Array,
    live_s: jax.Array,
    sampler: Sampler | None,
) -> tuple[jax.Array, jax.Array]:
    """Tokens and log-probs for rows of logits, each with its own key, step and settings.

    ``sampler`` (a callable or None) replaces rljax's sampling; ``live_s`` marks the rows whose
    settings count when deciding whether the filters' sort runs at all.
    """
    if sampler is not None:
        tokens = jnp.asarray(sampler(logits_sv)).astype(jnp.int32).reshape(-1)
        logp = jax.nn.log_softmax(logits_sv.astype(jnp.float32), axis=-1)
        return tokens, jnp.take_along_axis(logp, tokens[:, None], axis=-1)[:, 0]
    keys = jax.vmap(lambda kd, s: jax.random.fold_in(jax.random.wrap_key_data(kd), s))(
        keys_s, steps_s
    )
    # The filters' sort runs only when some sampled (not greedy) row asks for one.
    asks = (top_k > 0) | (top_p < 1.0) | (min_p > 0.0)
    return sampling.sample(
        logits_sv,
        keys,
        temperature,
        top_k,
        top_p,
        min_p,
        use_filters=jnp.any(asks & live_s & (temperature > 0.0)),
    )


def decode_routes(
    engine: StepsHost, model: Any, *args: Any, **kw: Any
) -> tuple[jax.Array, tuple[jax.Array, ...], tuple[jax.Array, ...], jax.Array | None]:
    """``model.decode`` over the state's pools (tuples: :meth:`DecodeState.pools`): hidden
    [B, D], each pool's keys and values, and (recording) the routes of each row's fed token
    [B, Lm*k]."""
    if not engine.record_routes:
        return (*model.decode(*args, **kw), None)
    hidden, kp, vp, routes = model.decode(*args, record_routes=True, **kw)
    return hidden, kp, vp, routes.reshape(routes.shape[0], -1)


def decode_token(
    engine: StepsHost, model: Any, state: DecodeState, live: jax.Array, sampler: Sampler | None
) -> tuple[DecodeState, jax.Array, jax.Array, Any]:
    """One token for each ``live`` slot (traceable): the new state, each slot's token (the
    one it held where not live), its log-prob (0 where not live) and, recording, the routes
    of the token each slot fed. The one decode step generate and the multi-step decode share
    (:mod:`rljax.engine.multistep`)."""
    # A full slot decodes onto its shard's null page, so it never writes past its pages.
    ks, vs, tables = zip(*state.pools(), strict=True)
    hidden, kp, vp, routes = decode_routes(
        engine,
        model,
        state.tokens,
        jnp.where(live, state.positions, 0),
        ks,
        vs,
        tuple(jnp.where(live[:, None], table, 0) for table in tables),
        impl=engine.impl,
        sharding=(engine.mesh, engine.rules),
        kv_shards=engine.kv_shards,
    )
    tokens, logprobs = draw(
        model.logits(hidden),
        state.keys,
        state.temperature,
        state.top_k,
        state.top_p,
        state.min_p,
        state.steps,
        live,
        sampler,
    )
    tokens = jnp.where(live, tokens, state.tokens)
    new = dataclasses.replace(
        state.with_pages(kp, vp),
        tokens=tokens,
        positions=state.positions + live,
        steps=state.steps + live,
    )
    return new, tokens, jnp.where(live, logprobs, 0.0), routes


def generate_steps_step(
    engine: StepsHost,
    state_sh: DecodeState,
    rep: NamedSharding,
    max_seq_len: int,
    sampler: Sampler | None,
    steps: int,
) -> jax.stages.Wrapped:
    """``steps`` decode steps in one device call (a ``lax.scan`` of :func:`decode_token`).

    The jitted function takes ``(params, state, limits [B] int32, stop_ids [S] int32)``: slot
    b draws at most ``limits[b]`` tokens, and stops after drawing any of ``stop_ids`` (pad
    with -1). It returns the state and, stacked over the steps, the rows generate returns:
    data [steps, B, 3], log_prob [steps, B, 1] and (recording) routes [steps, B, Lm*k].
    """

    @functools.partial(jax.jit, donate_argnums=1, out_shardings=(state_sh, rep, rep, rep))
    def generate_steps(
        params: Any, state: DecodeState, limits: jax.Array, stop_ids: jax.Array
    ) -> tuple[DecodeState, jax.Array, jax.Array, Any]:
        model = engine.layout.model(params)

        def one(carry: Any, _: Any) -> Any:
            state, drawn, stopped = carry
            live = state.active & (state.positions < max_seq_len) & ~stopped & (drawn < limits)
            new, tokens, logprobs, routes = decode_token(engine, model, state, live, sampler)
            data, log_prob = pack_result(tokens, live, new.steps, logprobs)
            stopped = stopped | (live & jnp.isin(tokens, stop_ids))
            return (new, drawn + live, stopped), (data, log_prob, routes)

        start = (state, jnp.zeros_like(limits), jnp.zeros(limits.shape, bool))
        (state, _, _), (data, log_prob, routes) = jax.lax.scan(one, start, length=steps)
        return state, data, log_prob, routes

    return generate_steps


def call_inputs(
    steps: int, limits: Any, stop_ids: Any, replicated: NamedSharding
) -> tuple[np.ndarray, tuple[jax.Array, jax.Array]]:
    """The host side of a multi-step call: the tokens each slot may write (for the page
    tables) and the call's device inputs, ``limits`` and the stop ids padded with -1."""
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps={steps!r} must be an int >= 1 (decode steps in one call)")
    limits = np.asarray(limits, np.int32)
    stops = sorted(int(t) for t in stop_ids)
    stop = np.full(max(1, len(stops)), -1, np.int32)
    stop[: len(stops)] = stops
    inputs = (jax.device_put(limits, replicated), jax.device_put(stop, replicated))
    return np.minimum(limits, steps), inputs


def split_steps(data: jax.Array, log_prob: jax.Array, routes: Any) -> list[ResultTokens]:
    """A multi-step call's stacked rows as one host ResultTokens per step."""
    rows, logps = np.asarray(data), np.asarray(log_prob)
    fed = None if routes is None else np.asarray(routes)
    return [
        ResultTokens(rows[j], log_prob=logps[j], routes=None if fed is None else fed[j])
        for j in range(rows.shape[0])
    ]


def decoded(results: list[ResultTokens]) -> np.ndarray:
    """How many tokens each slot drew over a multi-step call's results."""
    return np.sum([r.valid for r in results], axis=0)
