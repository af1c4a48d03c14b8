"""Continuous vs static batching on one Engine, as a distribution (used by bench_engine.py).

Continuous batching is the Sampler: it refills a slot as soon as its sequence ends. Static
batching is the same Sampler on the same Engine refilled only once every slot is free. Both
serve the same greedy requests, whose response lengths are drawn from a capped lognormal, so
they produce exactly the same tokens. The comparison is repeated over several seeds (fresh
lengths and prompts) and several tail shapes (lognormal sigma, same median); each shape is
reported as the median and [min, max] over its seeds of

  * the generate-step ratio, static steps / continuous steps: a property of the schedule
    alone, the same on any machine at any load;
  * the tokens/s ratio, continuous / static: what the step ratio becomes once each step's
    cost (which grows with the live slots) is paid, on this machine under its load;
  * slot occupancy of each driver: busy slot-steps / (generate steps x slots), where a
    response of n tokens is busy for n - 1 steps (prefill gives it its first token).
"""

from __future__ import annotations

import math
import statistics
import time

import jax
import numpy as np

from rljax.config import ModelConfig
from rljax.engine.paged import PagedEngine
from rljax.engine.sampler import Request, Sampler
from rljax.models.loading import abstract_params

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


def random_params(model_cfg: ModelConfig, mesh, rules, seed: int):
    """(graphdef, params) of ``model_cfg``'s shapes placed on ``mesh`` by ``rules``.

    Drawn on the host (normal, scale 0.02), so no init is compiled: these benchmarks time
    shapes and bytes, never what the weights compute (response lengths are forced).
    """
    graphdef, abstract = abstract_params(model_cfg, mesh, rules)
    rng = np.random.default_rng(seed)

    def draw(s):
        return jax.device_put((rng.standard_normal(s.shape) * 0.02).astype(s.dtype), s.sharding)

    return graphdef, jax.tree.map(draw, abstract)


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


def spread(values) -> dict:
    """Median and [min, max] of ``values``, rounded for the JSON line."""
    values = list(values)
    return {
        "median": round(statistics.median(values), 4),
        "min": round(min(values), 4),
        "max": round(max(values), 4),
    }


class EngineCallTimer:
    """Seconds spent in each Engine call during a run (results blocked on, so attributable).

    Wraps the methods on the instance and restores them on exit; the Engine is not modified.
    """

    CALLS = ("prefill_multisampling", "prefill_batch", "bulk_insert", "generate", "free_resource")

    def __init__(self, engine: PagedEngine):
        self.engine = engine
        self.calls = [name for name in self.CALLS if hasattr(engine, name)]
        self.seconds = dict.fromkeys(self.calls, 0.0)

    def __enter__(self):
        for name in self.calls:
            setattr(self.engine, name, self._wrap(name, getattr(self.engine, name)))
        return self

    def __exit__(self, *exc):
        for name in self.calls:
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
    # Prefill gives each response its first token; the others take one slot-step each.
    slot_steps = tokens - len(out)
    return {
        "tokens": tokens,
        "seconds": round(seconds, 4),
        "generate_steps": steps,
        "slot_occupancy": round(slot_steps / (steps * engine.max_concurrent_decodes), 4),
        "engine_call_seconds": calls.seconds,
    }


DRIVERS = (("continuous", Sampler), ("static", StaticSampler))


def warm_up(engine, params, vocab: int, max_prompt: int, seed: int) -> None:
    """Compiles what the timed runs will call: for each prefill bucket, 1, 2, 4, ... up to
    every slot's worth of requests queued at once (prefill may batch the queued prompts, and
    compiles per bucket and padded batch size), then insert, generate and free."""
    rng = np.random.default_rng(seed)
    slots, k = engine.max_concurrent_decodes, 1
    sizes = []
    while k < slots:
        sizes.append(k)
        k *= 2
    sizes.append(slots)
    for bucket in (b for b in engine.buckets if b <= max_prompt):
        for k in sizes:
            prompts = [rng.integers(0, vocab, size=bucket) for _ in range(k)]
            Sampler(engine, params).run(make_requests(prompts, [2] * k))


def one_seed(engine, params, vocab: int, work: dict, sigma: float, seed: int, flip: bool):
    """Both drivers on one draw of requests; ``flip`` runs static first (load drift cancels)."""
    rng = np.random.default_rng(seed)
    n, cap = work["requests"], work["max_new_tokens"]
    lengths = lognormal_lengths(rng, n, work["median_len"], sigma, cap)
    prompts = [rng.integers(0, vocab, size=k) for k in rng.integers(4, work["max_prompt"] + 1, n)]
    rows = {}
    for name, cls in reversed(DRIVERS) if flip else DRIVERS:
        rows[name] = timed_run(cls, engine, params, prompts, lengths)
    cont, static = rows["continuous"], rows["static"]
    return {
        "sigma": sigma,
        "seed": seed,
        "tokens": cont["tokens"],
        "mean_len": round(float(lengths.mean()), 2),
        "max_len": int(lengths.max()),
        **rows,
        "step_ratio": round(static["generate_steps"] / cont["generate_steps"], 4),
        "tokens_per_s_ratio": round(static["seconds"] / cont["seconds"], 4),
    }


def batching_distribution(engine, params, vocab: int, work: dict, log) -> dict:
    """Runs every (sigma, seed) of ``work`` on a warm ``engine``; the figures of (a).

    ``work`` holds requests, slots, median_len, sigmas, seeds (a list), max_new_tokens and
    max_prompt.
    """
    log(
        f"(a) per seed: {work['requests']} requests, {engine.max_concurrent_decodes} slots, "
        f"lengths lognormal(median={work['median_len']}, sigma) capped at "
        f"{work['max_new_tokens']}; sigmas {list(work['sigmas'])}, seeds {list(work['seeds'])}"
    )
    call_seconds = {name: {} for name, _ in DRIVERS}
    runs, shapes = [], {}
    for sigma in work["sigmas"]:
        mine = []
        for seed in work["seeds"]:
            run = one_seed(engine, params, vocab, work, sigma, seed, flip=len(runs) % 2 == 1)
            for name, _ in DRIVERS:
                for call, s in run[name].pop("engine_call_seconds").items():
                    call_seconds[name][call] = call_seconds[name].get(call, 0.0) + s
            runs.append(run)
            mine.append(run)
            c, s = run["continuous"], run["static"]
            log(
                f"    sigma {sigma} seed {seed}: {run['tokens']} tokens (mean {run['mean_len']},"
                f" max {run['max_len']}); steps {c['generate_steps']} vs {s['generate_steps']}"
                f" -> {run['step_ratio']:.2f}x; {c['seconds']:.2f} s vs {s['seconds']:.2f} s -> "
                f"{run['tokens_per_s_ratio']:.2f}x; occupancy {c['slot_occupancy']:.2f} vs "
                f"{s['slot_occupancy']:.2f}"
            )
        shapes[f"sigma_{sigma}"] = shape = {
            "sigma": sigma,
            "seeds": len(mine),
            "mean_len": spread(r["mean_len"] for r in mine),
            "step_ratio": spread(r["step_ratio"] for r in mine),
            "tokens_per_s_ratio": spread(r["tokens_per_s_ratio"] for r in mine),
            "slot_occupancy_continuous": spread(r["continuous"]["slot_occupancy"] for r in mine),
            "slot_occupancy_static": spread(r["static"]["slot_occupancy"] for r in mine),
        }
        log(
            f"    sigma {sigma}, {len(mine)} seeds: step ratio {fmt(shape['step_ratio'])}, "
            f"tokens/s ratio {fmt(shape['tokens_per_s_ratio'])} (continuous / static; median "
            f"[min, max])"
        )
    generate_share = {
        name: round(secs["generate"] / max(sum(secs.values()), 1e-9), 4)
        for name, secs in call_seconds.items()
    }
    log(
        "    share of Engine-call seconds in generate: "
        + ", ".join(f"{k} {v:.2f}" for k, v in generate_share.items())
    )
    return {
        "workload": {**work, "slots": engine.max_concurrent_decodes, "seeds": list(work["seeds"])},
        "shapes": shapes,
        "generate_share_of_engine_seconds": generate_share,
        "runs": runs,
    }


def fmt(s: dict) -> str:
    """``median [min, max]`` of a :func:`spread`, as 2-decimal ratios."""
    return f"{s['median']:.2f}x [{s['min']:.2f}, {s['max']:.2f}]"
