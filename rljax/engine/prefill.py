"""Prefill's host side: one prompt (:func:`prefill_one`, behind
``PagedEngine.prefill_multisampling``) or many in one device call (:func:`prefill_batch`, an
rljax extension of JetStream's API); and the padding of an extend's tokens.

Both check the request, pad it to the engine's buckets, draw each sample's PRNG stream, run the
engine's compiled prefill step (:mod:`rljax.engine.steps`) and wrap what it returns as a
:class:`~rljax.engine.state.Prefix` and a :class:`~rljax.engine.state.ResultTokens`.

JetStream's ``prefill`` takes one prompt. A sampler that admits a dozen GRPO groups at once
would then run a dozen forward passes of one row each; :func:`prefill_batch` runs them as one
``[N, T]`` pass. N is rounded up to a power of two (at most ``sampling.prefill_batch``), T to
the engine's bucket for the longest prompt, and every prompt's sample rows to the same power of
two, so a warmed-up engine (:func:`warm_up`) never compiles again. Each sample draws its first
token with its own key, as in ``prefill_multisampling``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, Protocol

import jax
import jax.numpy as jnp
import numpy as np

from rljax.config import SamplingConfig
from rljax.engine.decode import Sampler as LogitsSampler
from rljax.engine.state import DecodeState, Prefix, ResultTokens, SlotSampling
from rljax.engine.steps import Steps


class PrefillHost(Protocol):
    """What the functions here use of the engine they serve: its buckets, keys and steps,
    and (for :func:`warm_up`) its slots.

    :class:`~rljax.engine.paged.PagedEngine` is the one implementation; it imports this
    module, so naming it here would close an import circle.
    """

    sampling_cfg: SamplingConfig
    steps: Steps
    buckets: tuple[int, ...]
    max_seq_len: int
    page_size: int

    @property
    def max_concurrent_decodes(self) -> int: ...

    def bucket_for(self, length: int) -> int: ...

    def sample_keys(self, rng: jax.Array | None, n: int) -> jax.Array: ...

    def prefill_multisampling(
        self, *, params: Any, padded_tokens: Any, true_length: int, num_samples: int = 1
    ) -> tuple[Prefix, ResultTokens]: ...

    def init_decode_state(self) -> DecodeState: ...

    def bulk_insert(
        self, prefix: Prefix, decode_state: DecodeState, slots: Sequence[int]
    ) -> DecodeState: ...

    def generate(
        self, params: Any, decode_state: DecodeState
    ) -> tuple[DecodeState, ResultTokens]: ...

    def free_resource(self, slot: int) -> None: ...


@dataclasses.dataclass
class PrefillRequest:
    """One prompt of a batched prefill and the samples to draw from it."""

    tokens: Sequence[int]
    num_samples: int = 1
    rng: jax.Array | None = None  # as prefill_multisampling's rng
    sampling: SlotSampling | None = None
    step: int = 0  # the index of the token drawn in each sample's response (its PRNG step)


def pow2(n: int) -> int:
    return 1 << (max(n, 1) - 1).bit_length()


def sample_keys(rng: jax.Array, n: int) -> jax.Array:
    """Key data [n, 2] from one key (split per sample) or one key per sample."""
    if not jnp.issubdtype(rng.dtype, jax.dtypes.prng_key):
        rng = jax.random.wrap_key_data(jnp.asarray(rng, jnp.uint32))
    if rng.shape == ():
        rng = jax.random.split(rng, n) if n > 1 else rng[None]
    if rng.shape != (n,):
        raise ValueError(
            f"rng holds {rng.shape} keys for {n} samples; pass one key, or one per sample"
        )
    return jax.random.key_data(rng)


def prefill_one(
    engine: PrefillHost,
    params: Any,
    padded_tokens: Any,
    true_length: int,
    *,
    rng: jax.Array | None = None,
    num_samples: int = 1,
    sampling: SlotSampling | None = None,
    sampler: LogitsSampler | None = None,
    step: int = 0,
) -> tuple[Prefix, ResultTokens]:
    """``PagedEngine.prefill_multisampling``: one prompt, ``num_samples`` first tokens.

    The prompt ``padded_tokens[:true_length]`` is padded to its bucket; ``rng``, ``sampling``
    and ``step`` are as in ``prefill_multisampling``.
    """
    if not isinstance(num_samples, int) or num_samples < 1:
        raise ValueError(f"num_samples={num_samples!r} must be an int >= 1")
    tokens = np.asarray(padded_tokens, np.int32).reshape(-1)
    if not 1 <= true_length <= tokens.shape[0]:
        raise ValueError(
            f"true_length={true_length} must be in [1, {tokens.shape[0]}] "
            "(the padded prompt's length)"
        )
    row = np.zeros((1, engine.bucket_for(true_length)), np.int32)
    row[0, :true_length] = tokens[:true_length]
    keys = engine.sample_keys(rng, num_samples)
    s = sampling or SlotSampling.from_config(engine.sampling_cfg)
    floats = np.asarray([s.temperature, s.top_p, s.min_p], np.float32)
    k, v, data, log_prob, routes = engine.steps.prefill(
        params,
        jnp.asarray(row),
        jnp.int32(true_length),
        keys,
        floats,
        np.int32(s.top_k),
        np.int32(step),
        sampler=sampler,
    )
    prefix = Prefix(
        k=k,
        v=v,
        length=np.int32(true_length),
        tokens=data[:, 0],
        keys=keys,
        floats=floats,
        top_k=np.int32(s.top_k),
        steps=np.int32(step),
    )
    fed = fed_routes(routes, 0, true_length, step)
    result = ResultTokens(data, samples_per_slot=num_samples, log_prob=log_prob, routes=fed)
    return prefix, result


def prefill_batch(
    engine: PrefillHost,
    params: Any,
    requests: Sequence[PrefillRequest],
    *,
    sampler: LogitsSampler | None = None,
) -> list[tuple[Prefix, ResultTokens]]:
    """One ``(Prefix, ResultTokens)`` per request, like ``prefill_multisampling`` of each."""
    if not requests:
        raise ValueError("prefill_batch got no requests; pass at least one PrefillRequest")
    if len(requests) > engine.sampling_cfg.prefill_batch:
        raise ValueError(
            f"prefill_batch got {len(requests)} prompts, more than sampling.prefill_batch="
            f"{engine.sampling_cfg.prefill_batch}; split them or raise the setting"
        )
    lengths = [len(r.tokens) for r in requests]
    for i, (r, n) in enumerate(zip(requests, lengths, strict=True)):
        if n < 1:
            raise ValueError(f"prefill_batch request {i} has an empty prompt; give it a token")
        if not isinstance(r.num_samples, int) or r.num_samples < 1:
            raise ValueError(f"request {i}: num_samples={r.num_samples!r} must be an int >= 1")
    t = engine.bucket_for(max(lengths))
    n_pad = pow2(len(requests))
    g = pow2(max(r.num_samples for r in requests))
    tokens = np.zeros((n_pad, t), np.int32)
    lengths_n = np.ones(n_pad, np.int32)  # padding prompts: one token, never read back
    rows = np.repeat(np.arange(n_pad, dtype=np.int32), g)
    keys = np.zeros((n_pad * g, 2), np.uint32)
    floats = np.zeros((n_pad * g, 3), np.float32)
    top_k = np.zeros(n_pad * g, np.int32)
    steps = np.zeros(n_pad * g, np.int32)
    settings = []
    for i, (r, n) in enumerate(zip(requests, lengths, strict=True)):
        tokens[i, :n] = np.asarray(r.tokens, np.int32)
        lengths_n[i] = n
        s = r.sampling or SlotSampling.from_config(engine.sampling_cfg)
        f = np.asarray([s.temperature, s.top_p, s.min_p], np.float32)
        sl = slice(i * g, i * g + r.num_samples)
        keys[sl] = np.asarray(engine.sample_keys(r.rng, r.num_samples))
        floats[sl], top_k[sl], steps[sl] = f, s.top_k, r.step
        settings.append((f, np.int32(s.top_k)))
    ks, vs, data, log_prob, routes = engine.steps.prefill_many(
        params,
        jnp.asarray(tokens),
        jnp.asarray(lengths_n),
        jnp.asarray(rows),
        jnp.asarray(keys),
        jnp.asarray(floats),
        jnp.asarray(top_k),
        jnp.asarray(steps),
        sampler=sampler,
    )
    data, log_prob = np.asarray(data), np.asarray(log_prob)
    out = []
    for i, r in enumerate(requests):
        sl = slice(i * g, i * g + r.num_samples)
        f, k = settings[i]
        prefix = Prefix(
            k=ks[i],
            v=vs[i],
            length=np.int32(lengths[i]),
            tokens=jnp.asarray(data[sl, 0]),
            keys=jnp.asarray(keys[sl]),
            floats=f,
            top_k=k,
            steps=np.int32(r.step),
        )
        fed = fed_routes(routes, i, lengths[i], r.step)
        result = ResultTokens(
            data[sl], samples_per_slot=r.num_samples, log_prob=log_prob[sl], routes=fed
        )
        out.append((prefix, result))
    return out


def fed_routes(routes_ntw: Any, i: int, length: int, step: int) -> Any:
    """Of a prefill's routes [N, T, Lm*k], those of the ``step`` response tokens its prompt
    ``i`` of ``length`` tokens re-fed (its last ``step``; [0, Lm*k] for a fresh prompt, nothing
    to copy to the host); None when the engine does not record routes."""
    if routes_ntw is None:
        return None
    if not step:
        return np.zeros((0, routes_ntw.shape[-1]), np.int32)
    return routes_ntw[i, length - step : length]


def warm_up(engine: PrefillHost, params: Any, *, num_samples: int = 1) -> int:
    """Compile every prefill shape (prompt counts x buckets), insert width and generate.

    Returns the number of prefill shapes compiled. Afterwards a sampler whose groups have
    ``num_samples`` samples compiles nothing more. Uses and frees the engine's slots: call it
    before serving.
    """
    shapes, batch, slots = 0, 1, engine.max_concurrent_decodes
    while True:
        for bucket in engine.buckets:
            reqs = [PrefillRequest([0] * bucket, num_samples) for _ in range(batch)]
            shapes += 1
            if batch > 1:
                prefill_batch(engine, params, reqs)
                continue
            # The buckets past max_prefill_length re-prefill resumed sequences, which always
            # leave a slot room for one more token.
            length = min(bucket, engine.max_seq_len - 1)
            prefix, _ = engine.prefill_multisampling(
                params=params,
                padded_tokens=reqs[0].tokens,
                true_length=length,
                num_samples=num_samples,
            )
            # Every insert the Sampler makes: k of a group's samples into k slots, and a
            # one-sample prefix into any power-of-two width.
            inserts = [(list(range(k)), list(range(k))) for k in range(2, num_samples + 1)]
            width = 1
            while width < 2 * slots:
                inserts.append(([0], list(range(min(width, slots)))))
                width *= 2
            for samples, used in inserts:
                state = engine.bulk_insert(prefix.select(samples), engine.init_decode_state(), used)
                engine.generate(params, state)
                for slot in used:
                    engine.free_resource(slot)
        if batch >= engine.sampling_cfg.prefill_batch:
            return shapes
        batch = min(batch * 2, engine.sampling_cfg.prefill_batch)


def extend_buckets(engine: PrefillHost) -> tuple[int, ...]:
    """The chunk lengths an extend is padded to: powers of two from ``page_size`` up to the
    longest chunk a slot can take, so at most log2(max_seq_len) shapes compile."""
    out = [pow2(engine.page_size)]
    while out[-1] < engine.max_seq_len:
        out.append(out[-1] * 2)
    return tuple(out)


def extend_chunk(engine: PrefillHost, tokens: Sequence[int]) -> np.ndarray:
    """``tokens`` (an extend's new tokens) padded to the first of :func:`extend_buckets` that
    holds them."""
    n = len(tokens)
    if n < 1:
        raise ValueError("extend got no tokens; give the slot's next token at least")
    c = next(b for b in extend_buckets(engine) if b >= n)
    chunk = np.zeros(c, np.int32)
    chunk[:n] = np.asarray(tokens, np.int32)
    return chunk
