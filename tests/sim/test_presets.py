"""Presets carry the published config numbers: check parameter counts and KV sizes."""

import pytest

from rljax.models import presets

# Sizes as published on each model card (billions of parameters).
PUBLISHED_BILLIONS = {
    "qwen2.5-0.5b": 0.49,
    "qwen2.5-1.5b": 1.54,
    "qwen2.5-7b": 7.61,
    "qwen3-0.6b": 0.6,
    "qwen3-8b": 8.2,
    "qwen3-30b-a3b": 30.5,
    "llama-3.2-1b": 1.24,
    "llama-3.1-8b": 8.03,
    "smollm2-135m": 0.135,
}


@pytest.mark.parametrize("name", sorted(PUBLISHED_BILLIONS))
def test_param_count_matches_published_size(name):
    count = presets.param_count(presets.PRESETS[name])
    assert count / 1e9 == pytest.approx(PUBLISHED_BILLIONS[name], rel=0.01)


@pytest.mark.parametrize("name", sorted(presets.PRESETS))
def test_every_preset_has_exactly_the_documented_keys(name):
    preset = presets.PRESETS[name]
    moe = preset["family"].endswith("_moe")
    assert set(preset) == set(presets.PRESET_KEYS + presets.MOE_PRESET_KEYS * moe)
    assert preset["family"] in ("llama", "qwen2", "qwen3", "qwen3_moe", "qwen2_moe")
    assert preset["num_heads"] % preset["num_kv_heads"] == 0
    scaling = preset["rope_scaling"]
    if scaling is not None:
        assert scaling["rope_type"] == "llama3"


def test_exact_counts_for_two_checkpoints():
    # Exact totals of the safetensors shards on the Hub.
    assert presets.param_count(presets.PRESETS["llama-3.1-8b"]) == 8_030_261_248
    assert presets.param_count(presets.PRESETS["qwen2.5-7b"]) == 7_615_616_512


def test_kv_bytes_per_token():
    # Llama-3.1-8B: 32 layers * 8 kv heads * 128 dims * (K and V) * 2 bytes = 128 KiB.
    assert presets.kv_bytes_per_token(presets.PRESETS["llama-3.1-8b"], 2) == 131_072
    assert presets.kv_bytes_per_token(presets.PRESETS["qwen2.5-7b"], 1) == 28_672


def test_bad_input_messages():
    with pytest.raises(KeyError, match="unknown model preset 'qwen9'; choose one of"):
        presets.get_preset("qwen9")
    with pytest.raises(ValueError, match="dtype_bytes must be positive"):
        presets.kv_bytes_per_token(presets.PRESETS["qwen3-8b"], 0)
    copy = presets.get_preset("qwen3-8b")
    copy["num_layers"] = 1
    assert presets.PRESETS["qwen3-8b"]["num_layers"] == 36
