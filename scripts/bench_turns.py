"""Prefill saved by keeping a conversation's KV across turns, against re-prefilling its history.

    python scripts/bench_turns.py                 # 2, 4 and 8 turns, 3 repeats
    python scripts/bench_turns.py --quick         # the smoke test's run

The real Sampler and Engine (the tiny model of configs/arith_tiny.py with a longer context),
conversations scripted by rljax.testing.turns: a 32-token prompt, model turns that end on the
model's stop tokens, and an observation of 16 env tokens after each but the last model turn.
Each setting runs the same seeded conversations twice: with the KV kept (only each new turn's
tokens are prefilled onto the slot's pages) and with ``keep_kv=False`` (every turn prefills the
whole prompt + history again, what a stack without an in-process engine does). Figures: the
tokens each prefilled (the Sampler's ``prefill_tokens``, a count: the same on any machine), the
ratio, and the wall seconds of the whole run (median of --repeats; only meaningful on an
otherwise idle machine). Both must decode the same tokens; the script checks it. Ends with one
JSON line of every figure.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time

from rljax.engine.sampler import Request, Sampler
from rljax.testing.configs import TINY_MODEL
from rljax.testing.engines import tiny_engine
from rljax.testing.turns import scripted

PROMPT = [3 + (7 * i) % 14 for i in range(32)]
STOP = [0, 12]  # tokens the tiny random model emits every few tokens: model turns end on them
OBS = list(range(3, 19))  # 16 env tokens per observation


def run(tiny, turns: int, keep_kv: bool, conversations: int) -> tuple[dict, list, float]:
    factory, _ = scripted([OBS] * (turns - 1))
    sampler = Sampler(tiny.engine, tiny.params, stop_ids=STOP, keep_kv=keep_kv)
    requests = [
        Request(
            PROMPT,
            num_samples=1,
            max_new_tokens=tiny.engine.sampling_cfg.max_new_tokens,
            seed=seed,
            turns=factory,
        )
        for seed in range(conversations)
    ]
    start = time.perf_counter()
    trajs = sorted(sampler.run(requests), key=lambda t: t.group_id)
    return dict(sampler.stats), trajs, time.perf_counter() - start


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--conversations", type=int, default=8)
    args = p.parse_args(argv)
    settings = (2,) if args.quick else (2, 4, 8)
    repeats = 1 if args.quick else args.repeats
    model = dataclasses.replace(TINY_MODEL, max_position_embeddings=1024)
    tiny = tiny_engine(
        model=model,
        temperature=0.0,
        max_new_tokens=512,
        max_prefill_length=512,
        max_concurrent_decodes=args.conversations,
        num_pages=args.conversations * 140,
    )
    figures: dict = {"conversations": args.conversations, "turns": {}}
    for turns in settings:
        row: dict = {}
        out = {}
        for keep in (True, False):
            walls = []
            for _ in range(repeats + 1):  # the first compiles
                stats, trajs, wall = run(tiny, turns, keep, args.conversations)
                walls.append(wall)
            out[keep] = trajs
            name = "kept" if keep else "re_prefill"
            row[f"{name}_prefill_tokens"] = stats["prefill_tokens"]
            row[f"{name}_wall_s"] = statistics.median(walls[1:])
            row[f"{name}_turns"] = stats.get("turns", 0)
            row[f"{name}_prefill_tokens_saved"] = stats.get("prefill_tokens_saved", 0)
        for a, b in zip(out[True], out[False], strict=True):
            if a.response_tokens != b.response_tokens:
                raise AssertionError("keeping the KV changed the decoded tokens")
        row["turns_ended_per_conversation"] = row["kept_turns"] / args.conversations
        row["mean_response_tokens"] = statistics.mean(len(t.response_tokens) for t in out[True])
        row["prefill_ratio"] = row["re_prefill_prefill_tokens"] / row["kept_prefill_tokens"]
        row["wall_ratio"] = row["re_prefill_wall_s"] / row["kept_wall_s"]
        figures["turns"][str(turns)] = row
        print(f"{turns} turns: {row}", flush=True)
    print(json.dumps(figures))
    return figures


if __name__ == "__main__":
    main(sys.argv[1:])
