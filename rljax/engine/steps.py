"""The engine's compiled device steps: empty state, prefill, insert and generate.

Built once per :class:`~rljax.engine.paged.PagedEngine` by :func:`build_steps`; the engine does
the host bookkeeping (pages, slots, locks) around them. Every sampled token comes with the
log-prob of the distribution it was drawn from (:mod:`rljax.engine.sampling`), or, with a
caller's ``sampler``, ``log_softmax(logits)`` at the token it picked.

Token ``i`` of a sample (``i = 0`` is prefill's first token) is drawn with
``fold_in(key, i)`` of the sample's own key, so a sample's tokens do not depend on which slot,
batch or step it runs in.

An engine that records routes (a mixture-of-experts model, ``record_routes``) has every step
return, last, the experts each token it fed was routed to, flat [..., Lm*k] int32: prefill's
[N, T, Lm*k] (every prompt position), generate's [B, Lm*k] (each slot's fed token), extend's
[C, Lm*k] (the chunk's tokens); None when it does not record.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding
from jax.typing import ArrayLike

from rljax.engine.decode import (
    Sampler,
    StepsHost,
    decode_routes,
    decode_token,
    draw,
    generate_steps_step,
)
from rljax.engine.state import DecodeState, Prefix, SlotSampling, pack_result
from rljax.engine.weights import on_cpu
from rljax.models.paged_kv import pool_dtype, set_bits


def forward_kv(
    engine: StepsHost, model: Any, tokens_nt: jax.Array, segments_nt: jax.Array, **kw: Any
) -> tuple[jax.Array, tuple[jax.Array, jax.Array], jax.Array | None]:
    """A prefill's forward: hidden [N, T, D], each layer's keys and values, and (recording)
    the routes of every position [N, T, Lm*k]."""
    n, t = tokens_nt.shape
    positions = jnp.broadcast_to(jnp.arange(t)[None], (n, t))
    if not engine.record_routes:
        hidden, kv = model(tokens_nt, positions, segments_nt, return_kv=True, **kw)
        return hidden, kv, None
    hidden, kv, stats = model(
        tokens_nt, positions, segments_nt, return_kv=True, moe_stats=True, **kw
    )
    return hidden, kv, stats.routes.reshape(n, t, -1)


@dataclasses.dataclass
class Steps:
    """The compiled pieces of one engine."""

    make_state: Callable[[], DecodeState]
    prefill: jax.stages.Wrapped  # _prefill_step
    prefill_many: jax.stages.Wrapped  # _prefill_many_step
    insert: jax.stages.Wrapped  # _insert_step
    # generate(sampler) -> jitted (params, state) step
    generate: Callable[[Sampler | None], jax.stages.Wrapped]
    # extend(sampler) -> jitted step continuing one slot (_extend_step)
    extend: Callable[[Sampler | None], jax.stages.Wrapped]
    # generate_steps(sampler, steps) -> jitted multi-step decode (decode.generate_steps_step)
    generate_steps: Callable[[Sampler | None, int], jax.stages.Wrapped]

    def lower_generate(self, params: Any, state: DecodeState) -> jax.stages.Lowered:
        """The generate step (rljax's own sampling) lowered for ``params`` and ``state``."""
        return self.generate(None).lower(params, state)


def build_steps(engine: StepsHost) -> Steps:
    """Jit ``engine``'s device steps with its shardings (see Engine for the layout)."""
    state_sh = engine.decode_state_shardings()
    rep = engine.replicated()
    max_seq_len = engine.max_seq_len

    generates: dict[Sampler | None, jax.stages.Wrapped] = {}
    extends: dict[Sampler | None, jax.stages.Wrapped] = {}
    multis: dict[tuple[Sampler | None, int], jax.stages.Wrapped] = {}

    def generate(sampler: Sampler | None) -> jax.stages.Wrapped:
        if sampler not in generates:
            generates[sampler] = _generate_step(engine, state_sh, rep, max_seq_len, sampler)
        return generates[sampler]

    def extend(sampler: Sampler | None) -> jax.stages.Wrapped:
        if sampler not in extends:
            extends[sampler] = _extend_step(engine, state_sh, rep, sampler)
        return extends[sampler]

    def generate_steps(sampler: Sampler | None, steps: int) -> jax.stages.Wrapped:
        if (sampler, steps) not in multis:
            multis[sampler, steps] = generate_steps_step(
                engine, state_sh, rep, max_seq_len, sampler, steps
            )
        return multis[sampler, steps]

    def empty_state() -> DecodeState:
        return _empty_state(engine)

    # Compiled once per engine: building a Sampler must not re-jit the empty state.
    make_state = jax.jit(empty_state, out_shardings=state_sh)
    prefill, prefill_many = _prefill_step(engine), _prefill_many_step(engine)
    insert = _insert_step(engine, state_sh)
    return Steps(make_state, prefill, prefill_many, insert, generate, extend, generate_steps)


def _prefill_step(engine: StepsHost) -> jax.stages.Wrapped:
    """One prompt's prefill, its outputs placed where a Prefix lives."""
    prefix_sh, rep = engine.get_prefix_destination_sharding(), engine.replicated()
    model_of = engine.layout.model  # the decoder over the weights in the engine's layout
    shard = (engine.mesh, engine.rules)

    @functools.partial(
        jax.jit, static_argnames="sampler", out_shardings=(prefix_sh.k, prefix_sh.v, rep, rep, rep)
    )
    def prefill(
        params: Any,
        tokens_1t: jax.Array,
        length: jax.Array,
        keys_s2: jax.Array,
        floats: jax.Array,
        top_k: jax.Array,
        step: jax.Array,
        sampler: Sampler | None = None,
    ) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array, jax.Array | None]:
        """Cache the whole prompt; draw each sample's token ``step`` (0 for a fresh prompt, the
        tokens it has for a resumed one) from its last logits."""
        t = tokens_1t.shape[1]
        segments = (jnp.arange(t)[None] < length).astype(jnp.int32)
        model = model_of(params)
        hidden, (k, v), routes = forward_kv(
            engine, model, tokens_1t, segments, impl=engine.impl, sharding=shard
        )
        last_d = jax.lax.dynamic_index_in_dim(hidden[0], length - 1, keepdims=False)
        s = keys_s2.shape[0]
        logits_v = model.logits(last_d)
        logits_sv = jnp.broadcast_to(logits_v, (s, logits_v.shape[-1]))
        full = lambda x: jnp.full(s, x)  # noqa: E731
        tokens, logprobs = draw(
            logits_sv,
            keys_s2,
            full(floats[0]),
            full(top_k),
            full(floats[1]),
            full(floats[2]),
            full(step).astype(jnp.int32),
            jnp.ones(s, bool),
            sampler,
        )
        data, log_prob = pack_result(tokens, jnp.ones(s, bool), jnp.ones(s, jnp.int32), logprobs)
        return k[:, 0], v[:, 0], data, log_prob, routes

    return prefill


def _prefill_many_step(engine: StepsHost) -> jax.stages.Wrapped:
    """N prompts' prefill in one forward pass, its outputs placed where a Prefix lives."""
    prefix_sh, rep = engine.get_prefix_destination_sharding(), engine.replicated()
    model_of = engine.layout.model  # the decoder over the weights in the engine's layout
    shard = (engine.mesh, engine.rules)

    # A Sharding given for a tuple output applies to each of its arrays.
    @functools.partial(
        jax.jit, static_argnames="sampler", out_shardings=(prefix_sh.k, prefix_sh.v, rep, rep, rep)
    )
    def prefill_many(
        params: Any,
        tokens_nt: jax.Array,
        lengths_n: jax.Array,
        rows_s: jax.Array,
        keys_s2: jax.Array,
        floats_s3: jax.Array,
        top_k_s: jax.Array,
        steps_s: jax.Array,
        sampler: Sampler | None = None,
    ) -> tuple[tuple[jax.Array, ...], tuple[jax.Array, ...], jax.Array, jax.Array, Any]:
        """Cache N prompts in one forward pass; sample s draws from prompt ``rows_s[s]``.

        Returns each prompt's keys and values as a tuple of N arrays [L, T, K, H], and the
        samples' first tokens. Padding prompts (length 1) and samples cost compute only.
        """
        n, t = tokens_nt.shape
        segments = (jnp.arange(t)[None] < lengths_n[:, None]).astype(jnp.int32)
        model = model_of(params)
        hidden, (k, v), routes = forward_kv(
            engine, model, tokens_nt, segments, impl=engine.impl, sharding=shard
        )
        last_nd = jnp.take_along_axis(hidden, (lengths_n - 1)[:, None, None], axis=1)[:, 0]
        logits_sv = model.logits(last_nd)[rows_s]
        s = rows_s.shape[0]
        tokens, logprobs = draw(
            logits_sv,
            keys_s2,
            floats_s3[:, 0],
            top_k_s,
            floats_s3[:, 1],
            floats_s3[:, 2],
            steps_s,
            jnp.ones(s, bool),
            sampler,
        )
        data, log_prob = pack_result(tokens, jnp.ones(s, bool), jnp.ones(s, jnp.int32), logprobs)
        ks, vs = tuple(k[:, i] for i in range(n)), tuple(v[:, i] for i in range(n))
        return ks, vs, data, log_prob, routes

    return prefill_many


def _insert_step(engine: StepsHost, state_sh: DecodeState) -> jax.stages.Wrapped:
    """Copying a prefix into slots of the decode state, which it donates."""
    layout = engine.pool_layout

    @functools.partial(jax.jit, donate_argnums=0, out_shardings=state_sh)
    def insert(
        state: DecodeState,
        prefix: Prefix,
        rows: tuple[jax.Array, ...],
        slots_w: jax.Array,
        cols_w: jax.Array,
        fold_w: jax.Array,
    ) -> DecodeState:
        """Copy the prefix into each slot's pages (``rows``: each pool's page-table rows
        [W, M]); slot w feeds sample ``cols_w[w]``."""
        # Page tables hold shard-local ids; the pools are indexed globally. Padding rows
        # (slot index B) land on the last shard's null page.
        shard_w = jnp.minimum(slots_w // engine.slots_per_shard, engine.kv_shards - 1)
        ks, vs = [], []
        pools = zip(state.pools(), layout.layers, layout.pages_per_shard, rows, strict=True)
        for (kp, vp, _), layers, per_shard, rows_wm in pools:
            null_w1 = (shard_w * per_shard)[:, None]  # each shard's page 0
            k, v = _layers_of(prefix.k, layers), _layers_of(prefix.v, layers)
            ks.append(_prefix_into_pool(kp, k, prefix.length, rows_wm, null_w1))
            vs.append(_prefix_into_pool(vp, v, prefix.length, rows_wm, null_w1))
        keys = prefix.keys[cols_w]
        # One sample broadcast to several slots: each slot past the first gets its own stream.
        folded = jax.vmap(
            lambda kd, i: jax.random.key_data(jax.random.fold_in(jax.random.wrap_key_data(kd), i))
        )(keys, fold_w)
        keys = jnp.where(fold_w[:, None] > 0, folded, keys)
        w = slots_w.shape[0]

        def put(arr: jax.Array, val: ArrayLike) -> jax.Array:
            val = jnp.broadcast_to(val, (w, *arr.shape[1:])).astype(arr.dtype)
            return arr.at[slots_w].set(val, mode="drop")

        tables = [put(t, r) for (_, _, t), r in zip(state.pools(), rows, strict=True)]
        return dataclasses.replace(
            state.with_pages(ks, vs).with_tables(tables),
            tokens=put(state.tokens, prefix.tokens[cols_w]),
            positions=put(state.positions, prefix.length),
            active=put(state.active, True),
            keys=put(state.keys, keys),
            steps=put(state.steps, prefix.steps + 1),
            temperature=put(state.temperature, prefix.floats[0]),
            top_p=put(state.top_p, prefix.floats[1]),
            min_p=put(state.min_p, prefix.floats[2]),
            top_k=put(state.top_k, prefix.top_k),
        )

    return insert


def _layers_of(x_l: jax.Array, layers: tuple[int, ...]) -> jax.Array:
    """Rows ``layers`` of a per-layer array (all of it when they are every layer, in order)."""
    if layers == tuple(range(x_l.shape[0])):
        return x_l
    return x_l[np.asarray(layers, np.int32)]


def _prefix_into_pool(
    pool: jax.Array, x_ltkh: jax.Array, length: ArrayLike, rows_wm: jax.Array, null_w1: jax.Array
) -> jax.Array:
    """A prompt's keys (or values) [L, T, K, H] written into each slot's pages of ``pool``
    [L, K, P, Z, H] through its page-table row; positions whose column holds the null page
    (past the prompt, or before a local pool's window) land on the slot's shard's null page."""
    z = pool.shape[3]
    pos_t = jnp.arange(x_ltkh.shape[1])
    col_t = jnp.minimum(pos_t // z, rows_wm.shape[1] - 1)
    page_wt = jnp.where(pos_t < length, rows_wm[:, col_t] + null_w1, null_w1)
    off_wt = jnp.broadcast_to(pos_t % z, page_wt.shape)
    # [L, T, K, H] -> [L, K, W, T, H], one copy of the prompt per slot.
    x = jnp.broadcast_to(
        x_ltkh.transpose(0, 2, 1, 3)[:, :, None],
        (*pool.shape[:2], *page_wt.shape, x_ltkh.shape[-1]),
    )
    return set_bits(pool, (slice(None), slice(None), page_wt, off_wt), x)


def _generate_step(
    engine: StepsHost,
    state_sh: DecodeState,
    rep: NamedSharding,
    max_seq_len: int,
    sampler: Sampler | None,
) -> jax.stages.Wrapped:
    """One token for every live slot: active and holding fewer than ``max_seq_len`` tokens."""

    # What the host reads back is replicated: with the slots sharded over 'data', a
    # multi-process sampler could not fetch rows that live on another host's devices.
    @functools.partial(jax.jit, donate_argnums=1, out_shardings=(state_sh, rep, rep, rep))
    def generate(params: Any, state: DecodeState) -> tuple[DecodeState, jax.Array, jax.Array, Any]:
        model = engine.layout.model(params)
        live = state.active & (state.positions < max_seq_len)
        new, tokens, logprobs, routes = decode_token(engine, model, state, live, sampler)
        data, log_prob = pack_result(tokens, live, new.steps, logprobs)
        return new, data, log_prob, routes

    return generate


def _extend_step(
    engine: StepsHost, state_sh: DecodeState, rep: NamedSharding, sampler: Sampler | None
) -> jax.stages.Wrapped:
    """One slot's next chunk of tokens prefilled onto its pages, and the token after it drawn.

    The chunk is C rows of one forward pass through the decoder's paged path: row c writes its
    key and value at ``start + c`` through the slot's page row before attending, and attends
    to the ``start + c + 1`` tokens cached there, so it sees the slot's earlier tokens and the
    chunk causally. Padding rows (``c >= n``) point at the null page only.
    """
    # The paged path splits rows over the 'batch' axes with their own shard's pages; the
    # chunk's rows share one slot's pages, so with several kv shards it runs as plain XLA over
    # global page ids, which GSPMD partitions.
    one_shard = engine.kv_shards == 1
    impl = engine.impl if one_shard else "xla"
    shard = (engine.mesh, engine.rules) if one_shard else None

    @functools.partial(jax.jit, donate_argnums=1, out_shardings=(state_sh, rep, rep, rep))
    def extend(
        params: Any,
        state: DecodeState,
        tokens_c: jax.Array,
        n: jax.Array,
        start: jax.Array,
        rows: tuple[jax.Array, ...],
        slot: jax.Array,
        step: jax.Array,
    ) -> tuple[DecodeState, jax.Array, jax.Array, Any]:
        """Cache ``tokens_c[:n]`` at ``start..start+n`` of ``slot`` (``rows``: its page row
        [M + 1] in each pool, in global page ids, ending with its shard's null page) and draw
        its token ``step``."""
        model = engine.layout.model(params)
        c = tokens_c.shape[0]
        valid_c = jnp.arange(c) < n
        positions_c = jnp.where(valid_c, start + jnp.arange(c), 0)
        # Padding rows point at the null page only.
        tables = tuple(jnp.where(valid_c[:, None], row[None, :-1], row[-1]) for row in rows)
        ks, vs, _ = zip(*state.pools(), strict=True)
        hidden, kp, vp, routes = decode_routes(
            engine, model, tokens_c, positions_c, ks, vs, tables, impl=impl, sharding=shard
        )
        last_d = jax.lax.dynamic_index_in_dim(hidden, n - 1, keepdims=False)
        pick = lambda x: x[slot][None]  # noqa: E731
        tokens, logprobs = draw(
            model.logits(last_d)[None],
            pick(state.keys),
            pick(state.temperature),
            pick(state.top_k),
            pick(state.top_p),
            pick(state.min_p),
            jnp.full(1, step, jnp.int32),
            jnp.ones(1, bool),
            sampler,
        )
        new = dataclasses.replace(
            state.with_pages(kp, vp),
            tokens=state.tokens.at[slot].set(tokens[0]),
            positions=state.positions.at[slot].set(start + n),
            active=state.active.at[slot].set(True),
            steps=state.steps.at[slot].set(step + 1),
        )
        data, log_prob = pack_result(tokens, jnp.ones(1, bool), jnp.full(1, step + 1), logprobs)
        return new, data, log_prob, routes

    return extend


def _empty_state(engine: StepsHost) -> DecodeState:
    cfg, b = engine.model_cfg, engine.max_concurrent_decodes
    layout = engine.pool_layout
    dtype = pool_dtype(cfg.dtype, on_cpu(engine.mesh))  # a bfloat16 cache's bits as uint16
    s = SlotSampling.from_config(engine.sampling_cfg)
    zeros_i = jnp.zeros(b, jnp.int32)
    # One pool per kind of layer, [L, K, P, Z, H], and its page table [B, M].
    shapes = [
        (len(layers), cfg.num_kv_heads, pages * engine.kv_shards, engine.page_size, cfg.head_dim)
        for layers, pages in zip(layout.layers, layout.pages_per_shard, strict=True)
    ]
    ks, vs = [jnp.zeros(x, dtype) for x in shapes], [jnp.zeros(x, dtype) for x in shapes]
    tables = [jnp.zeros((b, engine.pages_per_slot), jnp.int32) for _ in shapes]
    state = DecodeState(
        k_pages=ks[0],
        v_pages=vs[0],
        tokens=zeros_i,
        positions=zeros_i,
        page_table=tables[0],
        active=jnp.zeros(b, bool),
        keys=jnp.zeros((b, 2), jnp.uint32),
        steps=zeros_i,
        temperature=jnp.full(b, s.temperature, jnp.float32),
        top_k=jnp.full(b, s.top_k, jnp.int32),
        top_p=jnp.full(b, s.top_p, jnp.float32),
        min_p=jnp.full(b, s.min_p, jnp.float32),
    )
    return state.with_pages(ks, vs).with_tables(tables)
