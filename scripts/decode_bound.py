"""Decode step time against this machine's memory-bandwidth bound (used by bench_engine.py).

The bound of one decode step is the bytes it must read, the params plus the KV cache the slots
hold, over a bandwidth measured in the same run; the figure is the fraction of that bound a step
achieves. Two bandwidths are measured: numpy's single-threaded copy (read + write counted), and
the read bandwidth of a large XLA reduction over as many bytes as the weights, spread over the
decode engine's own devices (so it runs on the threads the decode's XLA runs on). A decode step
mostly reads, on every device of its mesh, so the read bound is the fairer (tighter) one; both
fractions are reported.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec
from rljax.kernels.paged_attention.ops import XLA_BLOCK_TOKENS

from rljax.engine.decode import call_inputs as decode_inputs
from rljax.engine.paged import PagedEngine
from rljax.models.layouts import PerLayer
from rljax.models.serving import TRANSPOSED, ServingDecoder, to_serving

# The decimals the returned figures keep: milliseconds to the microsecond, ratios to 1e-4.
# A test comparing a ratio with its rounded parts derives its tolerance from these.
MS_DECIMALS = 3
RATIO_DECIMALS = 4


def copy_bandwidth_gbs(nbytes: int, repeats: int) -> float:
    """Best numpy copy bandwidth, counting read + write bytes (the STREAM 'Copy' convention)."""
    src = np.ones(nbytes // 8, np.float64)
    dst = np.empty_like(src)
    best = math.inf
    for _ in range(repeats):
        start = time.perf_counter()
        np.copyto(dst, src)
        best = min(best, time.perf_counter() - start)
    return 2 * src.nbytes / best / 1e9


def read_bandwidth_gbs(nbytes: int, mesh, repeats: int) -> float:
    """Best read bandwidth of one jitted sum over ``nbytes`` of float32, sharded along its one
    axis over every device of ``mesh`` (each device sums its shard on its own thread, then the
    partial sums are added): the bytes read over the best time."""
    n = mesh.devices.size
    count = max(n, nbytes // 4 // n * n)
    sharding = NamedSharding(mesh, PartitionSpec(tuple(mesh.axis_names)))
    x = jax.device_put(np.ones(count, np.float32), sharding)
    total = jax.jit(jnp.sum)
    total(x).block_until_ready()
    best = math.inf
    for _ in range(max(repeats, 3)):
        start = time.perf_counter()
        total(x).block_until_ready()
        best = min(best, time.perf_counter() - start)
    return count * 4 / best / 1e9


def weight_matrices(engine: PagedEngine, params) -> list[jax.Array]:
    """Every weight matrix of the model as its own 2-D [out, in] array, the head included."""
    if not isinstance(params, ServingDecoder):  # the stacked layout: convert it here
        params = to_serving(nnx.merge(engine.graphdef, params))
    mats = [params.embed if params.head_t is None else params.head_t]
    for layer in params.layers:
        for name in TRANSPOSED:  # every projection, stored [out..., in...]
            w = layer[PerLayer.key(name)]
            if name == "wo":  # [D, N, H]: out D, in N * H
                mats.append(w.reshape(w.shape[0], -1))
            else:  # [out..., D or F]
                mats.append(w.reshape(-1, w.shape[-1]))
    return [jnp.array(m) for m in mats]  # each its own contiguous buffer


def matmul_floor_s(mats: list[jax.Array], batch: int, repeats: int) -> float:
    """Median time of one jit that multiplies every weight matrix (:func:`weight_matrices`)
    once by a [in, batch] input.

    Each matrix is its own contiguous [out, in] array and the left operand of its product,
    the form XLA's CPU dots stream fastest (rljax.models.serving), and the products are
    independent, so XLA may run them side by side: the matmuls a decode step cannot avoid,
    with nothing else. Its fraction of the bound is a limit of those kernels for this model
    and batch, measured on its own.
    """
    rng = np.random.default_rng(0)
    inputs = {
        n: jnp.asarray(rng.standard_normal((n, batch)), mats[0].dtype)
        for n in {m.shape[1] for m in mats}
    }

    @jax.jit
    def dots(ws, xs):  # accumulating in float32, the form a 16-bit weight streams fastest in
        products = (jnp.dot(w, xs[w.shape[1]], preferred_element_type=jnp.float32) for w in ws)
        return sum(jax.lax.optimization_barrier(p).sum() for p in products)

    return _median_s(dots, (mats, inputs), repeats)


def read_floor_s(mats: list[jax.Array], repeats: int) -> float:
    """Median time of one jit that sums every weight matrix along its rows (accumulating in
    float32), each its own buffer as in :func:`matmul_floor_s`: the weights' bytes read once
    by XLA's own reduction, with no multiply. Its fraction of the bound is how much of the
    copy bandwidth a plain XLA read of these matrices gets: what a decode step would reach if
    its dots read the weights as fast and everything else cost nothing. An empirical limit of
    this backend's kernels, not a physical one."""

    @jax.jit
    def sums(ws):
        rows = (w.sum(axis=1, dtype=jnp.float32) for w in ws)
        return sum(jax.lax.optimization_barrier(r).sum() for r in rows)

    return _median_s(sums, (mats,), repeats)


def _median_s(fn, args, repeats: int) -> float:
    """Median seconds of ``fn(*args)`` over ``max(repeats, 3)`` calls after one untimed."""
    fn(*args).block_until_ready()
    times = []
    for _ in range(max(repeats, 3)):
        start = time.perf_counter()
        fn(*args).block_until_ready()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def time_busy_steps(
    label, engine: PagedEngine, params, steps: int
) -> tuple[list[float], list[int]]:
    """Seconds of up to ``steps`` generate calls with every slot busy, and the tokens held.

    One prompt of max_prefill_length tokens is prefilled into every slot first (untimed), and
    two untimed steps compile generate.
    """
    b = engine.max_concurrent_decodes
    state = _fill_every_slot(engine, params)
    # The prompt fills max_prefill_length; the cache holds max_new_tokens more: stay inside.
    steps = min(steps, engine.sampling_cfg.max_new_tokens - 2)
    if steps < 1:
        raise ValueError(f"{label}: max_new_tokens must be >= 3 to time a decode step")
    for _ in range(2):  # warm-up: compiles generate for this engine
        state, _ = engine.generate(params, state)
    times, held = [], []
    for _ in range(steps):
        held.append(sum(engine.slot_length(s) for s in range(b)))
        start = time.perf_counter()
        state, result = engine.generate(params, state)
        jax.block_until_ready((state, result))
        times.append(time.perf_counter() - start)
    return times, held


def layouts_ab(label, engine: PagedEngine, state, steps: int, rounds: int) -> dict:
    """The decode step of ``engine``'s model served stacked and per_layer, interleaved.

    ``state`` is the params state (the learner's layout). Each round times both layouts, the
    order alternating, so that a drift in the machine's speed does not favour one; the ratio
    stacked / per_layer is taken within each round.
    """
    engines = {}
    for layout in ("stacked", "per_layer"):
        sampling = dataclasses.replace(engine.sampling_cfg, weights_layout=layout)
        other = PagedEngine(engine.model_cfg, sampling, engine.mesh, engine.graphdef)
        engines[layout] = (other, other.load_params(state))
    medians = {layout: [] for layout in engines}
    for r in range(rounds):
        for layout in sorted(engines, reverse=r % 2 == 1):
            eng, params = engines[layout]
            medians[layout].append(statistics.median(time_busy_steps(label, eng, params, steps)[0]))
    ratios = [a / b for a, b in zip(medians["stacked"], medians["per_layer"], strict=True)]
    print(
        f"(c) {label}: decode step stacked / per_layer, {rounds} interleaved rounds: median "
        f"{statistics.median(ratios):.2f}x [{min(ratios):.2f}, {max(ratios):.2f}]; per_layer "
        f"{statistics.median(medians['per_layer']) * 1e3:.1f} ms, stacked "
        f"{statistics.median(medians['stacked']) * 1e3:.1f} ms",
        flush=True,
    )
    ms = {k: [round(v * 1e3, MS_DECIMALS) for v in vals] for k, vals in medians.items()}
    ratios = [round(x, RATIO_DECIMALS) for x in ratios]
    return {"rounds": rounds, "step_ms": ms, "stacked_over_per_layer": ratios}


def decode_step_vs_bound(
    label, engine: PagedEngine, params, bandwidth_gbs, steps: int, read_gbs: float | None = None
) -> dict:
    """Median generate time with every slot busy, against (param + held KV bytes) / bandwidth:
    ``bandwidth_gbs`` the copy's, ``read_gbs`` (measured here when None) the read bandwidth of
    :func:`read_bandwidth_gbs` over the weights' bytes on the engine's mesh."""
    cfg = engine.model_cfg
    b = engine.max_concurrent_decodes
    times, held = time_busy_steps(label, engine, params, steps)
    kv_per_token = (
        2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * np.dtype(cfg.dtype).itemsize
    )
    param_bytes = sum(x.nbytes for x in jax.tree.leaves(params))
    kv_held = statistics.mean(held) * kv_per_token
    # The XLA paged attention reads every slot's table up to the longest slot's last block.
    z = engine.sampling_cfg.page_size
    block = max(1, XLA_BLOCK_TOKENS // z)
    longest = max(engine.slot_length(s) for s in range(b)) + 1
    pages_read = min(engine.pages_per_slot, -(-longest // (block * z)) * block)
    kv_gathered = b * pages_read * z * kv_per_token
    step = statistics.median(times)
    bound = (param_bytes + kv_held) / (bandwidth_gbs * 1e9)
    if read_gbs is None:
        read_gbs = read_bandwidth_gbs(int(param_bytes), engine.mesh, repeats=5)
    read_bound = (param_bytes + kv_held) / (read_gbs * 1e9)
    print(
        f"(c) {label}: {b} slots, step {step * 1e3:.2f} ms; params {param_bytes / 1e6:.1f} MB + "
        f"KV held {kv_held / 1e6:.2f} MB at {bandwidth_gbs:.1f} GB/s (copy) -> bound "
        f"{bound * 1e3:.2f} ms; achieved {bound / step:.3f} of the copy bound; at "
        f"{read_gbs:.1f} GB/s (XLA read over {engine.mesh.devices.size} devices) -> "
        f"{read_bound * 1e3:.2f} ms, {read_bound / step:.3f} of the read bound",
        flush=True,
    )
    floor = matmul_floor_s(weight_matrices(engine, params), b, steps)
    print(
        f"(c) {label}: the weight matmuls alone, batch {b}: {floor * 1e3:.2f} ms, "
        f"{bound / floor:.3f} of the bound (a limit of this CPU's dot kernels for this model)",
        flush=True,
    )
    return {
        "slots": b,
        "step_ms": round(step * 1e3, MS_DECIMALS),
        "matmul_floor_ms": round(floor * 1e3, MS_DECIMALS),
        "matmul_floor_fraction_of_bound": round(bound / floor, RATIO_DECIMALS),
        "param_bytes": int(param_bytes),
        "kv_bytes_held": int(kv_held),
        "kv_bytes_gathered_by_xla_attention": int(kv_gathered),
        "bound_ms": round(bound * 1e3, MS_DECIMALS),
        "fraction_of_bound": round(bound / step, RATIO_DECIMALS),
        "read_bandwidth_gbs": round(read_gbs, 3),
        "read_bound_ms": round(read_bound * 1e3, MS_DECIMALS),
        "fraction_of_read_bound": round(read_bound / step, RATIO_DECIMALS),
    }


def _fill_every_slot(engine: PagedEngine, params):
    """A fresh decode state with one prompt of max_prefill_length tokens in every slot."""
    b = engine.max_concurrent_decodes
    prompt = np.arange(1, engine.max_prefill_length + 1, dtype=np.int32)
    prompt %= engine.model_cfg.vocab_size
    prefix, _ = engine.prefill_multisampling(
        params=params, padded_tokens=prompt, true_length=len(prompt), num_samples=b
    )
    return engine.bulk_insert(prefix, engine.init_decode_state(), list(range(b)))


def time_calls(engine: PagedEngine, params, per_call: int, calls: int) -> dict:
    """Seconds of ``calls`` decode calls of ``per_call`` tokens a slot, every slot busy.

    ``call_s``: the engine's whole call, as the Sampler makes it (``generate`` and the copy of
    its result to the host for 1; ``generate_steps`` otherwise): host bookkeeping (page tables
    grown, inputs placed, results read back) and the device's work. ``device_s``: the same
    compiled program called back to back on prepared inputs, waiting only for its outputs.
    Two untimed calls compile each first; each timing starts from every slot freshly filled.
    """
    b = engine.max_concurrent_decodes
    limits = np.full(b, per_call * (calls + 2), np.int32)

    def engine_call(state):
        if per_call == 1:
            state, result = engine.generate(params, state)
            return state, result.convert_to_numpy()
        return engine.generate_steps(params, state, per_call, limits, ())

    out = {}
    state, held = _fill_every_slot(engine, params), []
    for _ in range(2):
        state, _ = engine_call(state)
    times = []
    for _ in range(calls):
        held.append(sum(engine.slot_length(s) for s in range(b)))
        start = time.perf_counter()
        state, _ = engine_call(state)
        times.append(time.perf_counter() - start)
    out["call_s"], out["held"] = times, held
    # The device program alone: the pages taken above stay held, so it writes where it may.
    state = _fill_every_slot(engine, params)
    if per_call == 1:
        program, inputs = engine.steps.generate(None), ()
    else:
        program = engine.steps.generate_steps(None, per_call)
        _, inputs = decode_inputs(per_call, limits, (), engine.replicated())
    for _ in range(2):
        state, *rest = program(params, state, *inputs)
        jax.block_until_ready(rest)
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        state, *rest = program(params, state, *inputs)
        jax.block_until_ready(rest)
        times.append(time.perf_counter() - start)
    out["device_s"] = times
    return out


def decode_calls_vs_bound(
    label, engine: PagedEngine, params, bandwidth_gbs, per_call: int, tokens: int
) -> dict:
    """Tokens/s of calls of ``per_call`` tokens a slot, every slot busy, against the copy bound
    of one token step ((params + held KV bytes) / ``bandwidth_gbs``), and the host's share of a
    call: 1 - the device program's time / the engine call's (medians over the calls)."""
    cfg = engine.model_cfg
    b = engine.max_concurrent_decodes
    calls = max(1, tokens // per_call)
    t = time_calls(engine, params, per_call, calls)
    kv_bytes = jnp.dtype(engine.sampling_cfg.dtype).itemsize  # the sampler's KV pages
    kv_per_token = 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * kv_bytes
    param_bytes = sum(x.nbytes for x in jax.tree.leaves(params))
    # Every token step of a call reads the params and the KV held then (about half a call on).
    kv_held = (statistics.mean(t["held"]) + b * (per_call - 1) / 2) * kv_per_token
    call, device = statistics.median(t["call_s"]), statistics.median(t["device_s"])
    step = call / per_call
    bound = (param_bytes + kv_held) / (bandwidth_gbs * 1e9)
    row = {
        "decode_steps": per_call,
        "slots": b,
        "calls": calls,
        "tokens_per_s": round(b * per_call / call, 3),
        "step_ms": round(step * 1e3, MS_DECIMALS),
        "bound_ms": round(bound * 1e3, MS_DECIMALS),
        "fraction_of_bound": round(bound / step, RATIO_DECIMALS),
        "host_share": round(max(0.0, 1 - device / call), RATIO_DECIMALS),
    }
    print(
        f"(e) {label}: {per_call} tokens a call x {b} slots: {row['tokens_per_s']:.1f} tok/s, "
        f"{row['step_ms']:.2f} ms a token step, {row['fraction_of_bound']:.3f} of the copy bound "
        f"({row['bound_ms']:.2f} ms), host {row['host_share']:.3f} of a call",
        flush=True,
    )
    return row


# ---- driver -------------------------------------------------------------------------------
