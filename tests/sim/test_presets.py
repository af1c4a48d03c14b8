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
    # Gemma 3's text towers: the model cards' 12B and 27B count the SigLIP vision tower and
    # its projector (0.42B) too; Gemma3ForCausalLM's own counts are these.
    "gemma3-12b": 11.77,
    "gemma3-27b": 27.01,
}


@pytest.mark.parametrize("name", sorted(PUBLISHED_BILLIONS))
def test_param_count_matches_published_size(name):
    count = presets.param_count(presets.PRESETS[name])
    assert count / 1e9 == pytest.approx(PUBLISHED_BILLIONS[name], rel=0.01)


@pytest.mark.parametrize("name", sorted(presets.PRESETS))
def test_every_preset_has_exactly_the_documented_keys(name):
    preset = presets.PRESETS[name]
    moe = preset["family"].endswith("_moe")
    gemma = preset["family"].startswith("gemma")
    keys = presets.PRESET_KEYS + presets.MOE_PRESET_KEYS * moe + presets.GEMMA_PRESET_KEYS * gemma
    assert set(preset) == set(keys)
    assert preset["family"] in ("llama", "qwen2", "qwen3", "qwen3_moe", "qwen2_moe", "gemma3")
    assert preset["num_heads"] % preset["num_kv_heads"] == 0
    scaling = preset["rope_scaling"]
    if scaling is not None:
        assert scaling["rope_type"] == ("linear" if gemma else "llama3")


def test_exact_counts_for_two_checkpoints():
    # Exact totals of the safetensors shards on the Hub.
    assert presets.param_count(presets.PRESETS["llama-3.1-8b"]) == 8_030_261_248
    assert presets.param_count(presets.PRESETS["qwen2.5-7b"]) == 7_615_616_512


def test_kv_bytes_per_token():
    # Llama-3.1-8B: 32 layers * 8 kv heads * 128 dims * (K and V) * 2 bytes = 128 KiB.
    assert presets.kv_bytes_per_token(presets.PRESETS["llama-3.1-8b"], 2) == 131_072
    assert presets.kv_bytes_per_token(presets.PRESETS["qwen2.5-7b"], 1) == 28_672


def test_exact_gemma3_counts():
    # Gemma3ForCausalLM's text tower: tied embedding 262208 x D, per layer q/k/v/o, q/k norms
    # of head_dim, four norms of D and a GeGLU MLP of 3 D F, then the final norm.
    for name, (d, f, layers, heads, kv, hd) in {
        "gemma3-12b": (3840, 15360, 48, 16, 8, 256),
        "gemma3-27b": (5376, 21504, 62, 32, 16, 128),
    }.items():
        layer = 2 * d * heads * hd + 2 * d * kv * hd + 2 * hd + 4 * d + 3 * d * f
        assert presets.param_count(presets.PRESETS[name]) == 262_208 * d + layers * layer + d
    assert presets.param_count(presets.PRESETS["gemma3-12b"]) == 11_766_034_176
    assert presets.param_count(presets.PRESETS["gemma3-27b"]) == 27_009_346_304


def test_gemma3_layers_and_window():
    for name, layers, local in (("gemma3-12b", 48, 40), ("gemma3-27b", 62, 52)):
        preset = presets.PRESETS[name]
        assert presets.local_layer_count(preset) == local and len(preset["layer_types"]) == layers
        assert preset["layer_types"][5] == "full_attention" and preset["sliding_window"] == 1024
    assert presets.local_layer_count(presets.PRESETS["qwen3-8b"]) == 0


def test_kv_bytes_of_a_sequence_count_the_window():
    # Gemma-3-12B in bf16: K and V, 8 kv heads of 256, 2 bytes: 8 KiB a layer a token.
    g12 = presets.PRESETS["gemma3-12b"]
    assert presets.kv_bytes_per_token(g12, 2) == 48 * 8_192
    # 2048 tokens: the 8 global layers hold all of them, the 40 local ones their last 1024.
    assert presets.kv_bytes_of_sequence(g12, 2, 2048) == 8_192 * (8 * 2048 + 40 * 1024)
    # Within the window every layer holds every token; a model without windows always does.
    assert presets.kv_bytes_of_sequence(g12, 2, 1000) == 1000 * presets.kv_bytes_per_token(g12, 2)
    q8 = presets.PRESETS["qwen3-8b"]
    assert presets.kv_bytes_of_sequence(q8, 2, 4096) == 4096 * presets.kv_bytes_per_token(q8, 2)
    with pytest.raises(ValueError, match="tokens must be >= 0"):
        presets.kv_bytes_of_sequence(g12, 2, -1)


def test_bad_input_messages():
    with pytest.raises(KeyError, match="unknown model preset 'qwen9'; choose one of"):
        presets.get_preset("qwen9")
    with pytest.raises(ValueError, match="dtype_bytes must be positive"):
        presets.kv_bytes_per_token(presets.PRESETS["qwen3-8b"], 0)
    copy = presets.get_preset("qwen3-8b")
    copy["num_layers"] = 1
    assert presets.PRESETS["qwen3-8b"]["num_layers"] == 36
