"""Smoke test of scripts/bench_turns.py --quick: its counts, never its timings."""

import contextlib
import importlib.util
import io
import json
import pathlib
import sys

REPO = pathlib.Path(__file__).resolve().parents[2]


def test_quick_counts_are_the_prompts_and_the_new_turns_only():
    spec = importlib.util.spec_from_file_location("bench_turns", REPO / "scripts/bench_turns.py")
    bench = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = bench
    spec.loader.exec_module(bench)
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        figures = bench.main(["--quick", "--conversations=4"])
    assert json.loads(buf.getvalue().strip().splitlines()[-1]) == figures
    row = figures["turns"]["2"]
    n = figures["conversations"]
    assert row["turns_ended_per_conversation"] == 2  # each conversation got its observation
    # Kept: each prompt once, then per observation the turn's stop token and the env's ids.
    assert row["kept_prefill_tokens"] == n * len(bench.PROMPT) + n * (1 + len(bench.OBS))
    # Re-prefilling the history costs exactly what keeping the KV says it saved.
    saved = row["kept_prefill_tokens_saved"]
    assert saved > n * len(bench.PROMPT)  # every second turn saved at least its prompt
    assert row["re_prefill_prefill_tokens"] == row["kept_prefill_tokens"] + saved
    assert row["prefill_ratio"] > 1
    # Both ratios are re-prefilling over keeping, each measured in this run.
    assert row["prefill_ratio"] == row["re_prefill_prefill_tokens"] / row["kept_prefill_tokens"]
    assert row["wall_ratio"] == row["re_prefill_wall_s"] / row["kept_wall_s"]
