"""``sampling.dtype='bfloat16'``: a bf16 sampler fed from the learner's f32 master copy."""

import json

import jax
import jax.numpy as jnp
import pytest
from rljax.configs import arith_tiny, qwen2_5_1_5b_gsm8k, qwen3_8b_gsm8k

from rljax.config import ConfigError, SamplingConfig, replace
from rljax.runtime import Run


def _dtypes(tree):
    return {x.dtype for x in jax.tree.leaves(tree) if jnp.issubdtype(x.dtype, jnp.floating)}


def test_bf16_sampler_runs_on_bf16_weights_and_logs_the_mismatch(tmp_path):
    cfg = replace(
        arith_tiny.recipe("small"),
        **{"sampling.dtype": "bfloat16", "num_steps": 2, "sft.steps": 3, "eval_examples": 4},
    )
    run = Run(cfg, str(tmp_path))
    try:
        # The first params, before any publish, are already the sampler's bf16 copy.
        assert _dtypes(run.sampler.params) == {jnp.dtype("bfloat16")}
        summary = run.train()
        assert summary["steps"] == 2
        # What the engine serves after the publishes: bf16 weights, bf16 KV pages and a
        # decoder that computes in bf16; the learner's master copy stays f32.
        assert _dtypes(run.sampler.params) == {jnp.dtype("bfloat16")}
        # (bfloat16 KV bits, stored as uint16 on the CPU: rljax.models.paged_kv.pool_dtype)
        assert run.sampler.state.k_pages.dtype == jnp.uint16
        assert run.parts.engine.model_cfg.dtype == "bfloat16"
        assert _dtypes(run.learner.params) == {jnp.dtype("float32")}
        assert run.weight_sync.history[-1].bytes * 2 == sum(
            x.nbytes for x in jax.tree.leaves(run.learner.params)
        )
    finally:
        run.close()
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    train = [r for r in map(json.loads, lines) if r["phase"] == "train"]
    assert len(train) == 2
    for r in train:
        # bf16 rounding moves the log-probs, but only a little; sync mode: every token fresh.
        assert 0 < r["mismatch/abs_logp"] < 0.1, train
        assert 0 <= r["mismatch/k3"] < 0.01
        assert r["mismatch/fresh_frac"] == 1.0
        assert r["mismatch/abs_logp_fresh"] == pytest.approx(r["mismatch/abs_logp"])
        assert r["mismatch/k3_fresh"] == pytest.approx(r["mismatch/k3"])


def test_bad_sampling_dtype_is_a_one_line_error():
    with pytest.raises(ConfigError) as exc:
        SamplingConfig(dtype="float16")
    message = str(exc.value)
    assert "'sampling.dtype'" in message and "bfloat16" in message and "\n" not in message


def test_tpu_recipes_sample_in_bf16_and_cpu_recipes_in_f32():
    for recipe in (qwen2_5_1_5b_gsm8k.recipe, qwen3_8b_gsm8k.recipe):
        assert recipe("").sampling.dtype == "bfloat16"
    assert arith_tiny.recipe("").sampling.dtype == "float32"
