"""Benchmarks the kernel ops against baselines measured in the same run.

    python scripts/bench_kernels.py                 # CPU: XLA paths, memory ratio
    python scripts/bench_kernels.py --tokens 1024   # bigger log-prob batch
    python scripts/bench_kernels.py --only-window   # only the sliding-window attention figures

Always measured:
  - fused chunked log-probs/entropy ('xla' path) vs naive full-logits log_softmax, forward and
    forward+backward: time ratio (naive / fused; > 1 means fused is faster);
  - flash attention's 'xla' path (time-major rows, causal query blocks) vs the materialised
    reference it is tested against, forward+backward at SmolLM2's training shapes (8 rows of
    256 tokens in two packed sequences, 9 query heads over 3 kv heads of 64): time ratio
    (reference / xla path; > 1 means the xla path is faster);
  - compiled memory (temp + output bytes) of the fused forward, and temp bytes of its
    backward, as a fraction of the [T, V] f32 logits, at V = 152064;
  - flash attention with a sliding window W (a Gemma local layer) against the same layer
    global, forward+backward at T = 8 W (W = 512: T = 4096; one row, 9 query heads over 3 kv
    heads of 64, f32), the two timed in turn and each the median of its repeats: time ratio
    (global / local; > 1 means the window's skipped keys are saved; at most about 4.3 at
    T = 8 W, where a local layer computes 1/4.3 of a global layer's scores). The 'xla'
    path everywhere; on a TPU the Pallas kernels too (Pallas runs only there).
On a TPU also: Pallas vs XLA for all three ops (ratio xla / pallas).

The last line printed is one JSON object holding every figure.
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
from rljax.kernels import dispatch
from rljax.kernels.flash_attention import flash_attention, flash_attention_reference
from rljax.kernels.fused_logprobs import (
    token_logprobs_and_entropy,
    token_logprobs_and_entropy_reference,
)
from rljax.kernels.paged_attention import paged_decode_attention

MEMORY_VOCAB = 152064


def median_seconds(fn, *args, repeats: int) -> float:
    """Median wall time of ``fn(*args)`` after one warm-up (compile) call."""
    jax.block_until_ready(fn(*args))
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def medians_in_turn(fns: dict, *args, repeats: int) -> dict:
    """Median wall time of each ``fn(*args)``, the fns called in turn ``repeats`` times after
    one warm-up (compile) call each."""
    for fn in fns.values():
        jax.block_until_ready(fn(*args))
    times = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            start = time.perf_counter()
            jax.block_until_ready(fn(*args))
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(ts) for name, ts in times.items()}


def logprob_inputs(tokens, dim, vocab, dtype, seed=0):
    rng = np.random.default_rng(seed)
    hidden = jnp.asarray(rng.normal(size=(tokens, dim)), dtype)
    unembed = jnp.asarray(rng.normal(size=(dim, vocab)) / np.sqrt(dim), dtype)
    targets = jnp.asarray(rng.integers(0, vocab, size=tokens), jnp.int32)
    return hidden, unembed, targets


def logprob_fns(impl):
    """(forward, forward+backward) jitted functions for one implementation."""
    if impl == "naive":
        fwd = token_logprobs_and_entropy_reference
    else:
        fwd = lambda h, w, t: token_logprobs_and_entropy(h, w, t, impl=impl)

    def loss(h, w, t):
        logp, ent = fwd(h, w, t)
        return jnp.sum(logp) + 0.01 * jnp.sum(ent)

    return jax.jit(fwd), jax.jit(jax.grad(loss, argnums=(0, 1)))


def bench_logprobs(args, figures):
    inputs = logprob_inputs(args.tokens, args.dim, args.vocab, jnp.float32)
    naive_fwd, naive_bwd = logprob_fns("naive")
    fused_fwd, fused_bwd = logprob_fns("xla")
    t_naive = median_seconds(naive_fwd, *inputs, repeats=args.repeats)
    t_fused = median_seconds(fused_fwd, *inputs, repeats=args.repeats)
    tb_naive = median_seconds(naive_bwd, *inputs, repeats=args.repeats)
    tb_fused = median_seconds(fused_bwd, *inputs, repeats=args.repeats)
    shape = f"T={args.tokens} D={args.dim} V={args.vocab}"
    for label, naive, fused in (("fwd", t_naive, t_fused), ("fwd+bwd", tb_naive, tb_fused)):
        print(
            f"log-probs {label:8s} {shape}: naive {naive * 1e3:.1f} ms, fused {fused * 1e3:.1f} ms"
        )
    figures["logprobs_fwd_naive_over_fused"] = round(t_naive / t_fused, 3)
    figures["logprobs_fwdbwd_naive_over_fused"] = round(tb_naive / tb_fused, 3)
    figures["logprobs_fwd_ms"] = {"naive": t_naive * 1e3, "fused_xla": t_fused * 1e3}
    figures["logprobs_fwdbwd_ms"] = {"naive": tb_naive * 1e3, "fused_xla": tb_fused * 1e3}


def bench_attention(args, figures):
    """Forward + backward of one layer's causal attention over packed rows, both paths."""
    b, t, n, k, h = 8, 256, 9, 3, 64  # SmolLM2-135M's heads; the learner benchmark's batch
    rng = np.random.default_rng(0)
    q, dout = (jnp.asarray(rng.standard_normal((b, t, n, h)), jnp.float32) for _ in range(2))
    kv = [jnp.asarray(rng.standard_normal((b, t, k, h)), jnp.float32) for _ in range(2)]
    seg = jnp.asarray(np.repeat([[1] * (t // 2) + [2] * (t - t // 2)], b, axis=0), jnp.int32)
    paths = {
        "reference": lambda q, k, v: flash_attention_reference(
            q, k, v, seg, causal=True, sm_scale=h**-0.5
        ),
        "xla": lambda q, k, v: flash_attention(q, k, v, seg, causal=True, impl="xla"),
    }
    ms = {}
    for name, attend in paths.items():
        loss = lambda *a, attend=attend: jnp.sum(attend(*a) * dout)
        grad = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))
        ms[name] = median_seconds(grad, q, *kv, repeats=args.repeats) * 1e3
    print(
        f"attention fwd+bwd B={b} T={t} N={n} K={k} H={h}: reference {ms['reference']:.1f} ms,"
        f" xla path {ms['xla']:.1f} ms"
    )
    figures["attention_fwdbwd_ms"] = ms
    figures["attention_fwdbwd_reference_over_xla"] = round(ms["reference"] / ms["xla"], 3)


def bench_window(args, figures):
    """Forward + backward of a local (sliding-window) attention layer and of it as global."""
    b, n, k, h, w = 1, 9, 3, 64, args.window  # SmolLM2-135M's heads, one row of 8 windows
    t = 8 * w
    rng = np.random.default_rng(3)
    q, dout = (jnp.asarray(rng.standard_normal((b, t, n, h)), jnp.float32) for _ in range(2))
    kv = [jnp.asarray(rng.standard_normal((b, t, k, h)), jnp.float32) for _ in range(2)]
    impls = ["xla", "pallas"] if dispatch.on_tpu() else ["xla"]
    ratios, ms = {}, {}
    for impl in impls:
        grads = {}
        for name, window in (("global", None), ("local", w)):
            attend = functools.partial(flash_attention, causal=True, impl=impl, window=window)
            loss = lambda *a, attend=attend: jnp.sum(attend(*a) * dout)
            grads[name] = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))
        # In turn, so that a shared machine's load drifts over both alike.
        ms[impl] = {
            name: seconds * 1e3
            for name, seconds in medians_in_turn(grads, q, *kv, repeats=args.repeats).items()
        }
        ratios[impl] = round(ms[impl]["global"] / ms[impl]["local"], 3)
        print(
            f"attention fwd+bwd {impl} B={b} T={t} N={n} K={k} H={h}: global "
            f"{ms[impl]['global']:.1f} ms, window {w} {ms[impl]['local']:.1f} ms, "
            f"global / local {ratios[impl]:.2f}"
        )
    if not dispatch.on_tpu():
        print("No TPU: the Pallas kernels' window (band grids) is not timed; it runs on TPU only.")
    figures["window_fwdbwd_ms"] = ms
    figures["window_fwdbwd_global_over_local"] = ratios
    figures["window_shape"] = {"batch": b, "seq": t, "window": w, "heads": n, "kv_heads": k}


def bench_logprob_memory(args, figures):
    shapes = (
        jax.ShapeDtypeStruct((args.memory_tokens, args.dim), jnp.float32),
        jax.ShapeDtypeStruct((args.dim, MEMORY_VOCAB), jnp.float32),
        jax.ShapeDtypeStruct((args.memory_tokens,), jnp.int32),
    )
    logits_bytes = args.memory_tokens * MEMORY_VOCAB * 4
    rows = {}
    for name in ("naive", "xla"):
        fwd, bwd = logprob_fns(name)
        f = fwd.lower(*shapes).compile().memory_analysis()
        b = bwd.lower(*shapes).compile().memory_analysis()
        rows[name] = {
            "fwd_temp_plus_out": f.temp_size_in_bytes + f.output_size_in_bytes,
            "bwd_temp": b.temp_size_in_bytes,
        }
    fused, naive = rows["xla"], rows["naive"]
    mib = lambda n: f"{n / 2**20:.1f} MiB"
    print(
        f"log-probs memory T={args.memory_tokens} D={args.dim} V={MEMORY_VOCAB}: logits "
        f"{mib(logits_bytes)}; fused fwd {mib(fused['fwd_temp_plus_out'])}, bwd temp "
        f"{mib(fused['bwd_temp'])}; naive fwd {mib(naive['fwd_temp_plus_out'])}, bwd temp "
        f"{mib(naive['bwd_temp'])}"
    )
    figures["logprobs_fwd_memory_over_logits"] = round(fused["fwd_temp_plus_out"] / logits_bytes, 5)
    figures["logprobs_bwd_temp_over_logits"] = round(fused["bwd_temp"] / logits_bytes, 5)
    figures["naive_fwd_memory_over_logits"] = round(naive["fwd_temp_plus_out"] / logits_bytes, 3)


def bench_pallas_vs_xla(args, figures):
    """TPU only: each op's Pallas kernel against its XLA implementation."""
    rng = np.random.default_rng(1)
    bf16 = jnp.bfloat16
    ratios = {}

    def ratio(name, fn):
        t_xla = median_seconds(jax.jit(lambda *a: fn(*a, impl="xla")), *ops_args, repeats=10)
        t_pallas = median_seconds(jax.jit(lambda *a: fn(*a, impl="pallas")), *ops_args, repeats=10)
        ratios[name] = round(t_xla / t_pallas, 3)
        print(f"{name}: xla {t_xla * 1e3:.2f} ms, pallas {t_pallas * 1e3:.2f} ms")

    b, n, kv, h, s, pps = 32, 32, 8, 128, 16, 128
    pool = b * pps
    ops_args = (
        jnp.asarray(rng.normal(size=(b, n, h)), bf16),
        jnp.asarray(rng.normal(size=(kv, pool, s, h)), bf16),
        jnp.asarray(rng.normal(size=(kv, pool, s, h)), bf16),
        jnp.asarray(rng.integers(1, pps * s, size=b), jnp.int32),
        jnp.asarray(rng.permutation(pool).reshape(b, pps), jnp.int32),
    )
    ratio("paged_decode_attention", paged_decode_attention)
    t = 2048
    ops_args = (
        jnp.asarray(rng.normal(size=(4, t, n, h)), bf16),
        jnp.asarray(rng.normal(size=(4, t, kv, h)), bf16),
        jnp.asarray(rng.normal(size=(4, t, kv, h)), bf16),
    )
    ratio("flash_attention", flash_attention)
    ops_args = logprob_inputs(args.tokens, args.dim, args.vocab, bf16)
    ratio("token_logprobs_and_entropy", token_logprobs_and_entropy)
    figures["pallas_speedup_over_xla"] = ratios


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=512)
    parser.add_argument("--dim", type=int, default=256)
    parser.add_argument("--vocab", type=int, default=MEMORY_VOCAB)
    parser.add_argument("--memory-tokens", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--window", type=int, default=512, help="sliding window W (T = 8 W)")
    parser.add_argument(
        "--only-window", action="store_true", help="only the sliding-window attention figures"
    )
    args = parser.parse_args()
    figures = {"backend": jax.default_backend(), "device_kind": jax.devices()[0].device_kind}
    if args.only_window:
        bench_window(args, figures)
        print(json.dumps(figures, sort_keys=True))
        return
    bench_logprobs(args, figures)
    bench_attention(args, figures)
    bench_window(args, figures)
    bench_logprob_memory(args, figures)
    if dispatch.on_tpu():
        bench_pallas_vs_xla(args, figures)
    else:
        print("No TPU: Pallas kernels would run in interpret mode; Pallas vs XLA skipped.")
    print(json.dumps(figures, sort_keys=True))


if __name__ == "__main__":
    main()
