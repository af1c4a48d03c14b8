"""Every preset builds abstractly (no memory) and agrees with presets.param_count and HF."""

import math

import jax
import pytest
from flax import nnx

from rljax.config import ModelConfig
from rljax.models import presets
from rljax.models.families import config_from_hf, config_to_hf, model_config
from rljax.models.moe import moe_layers
from rljax.models.transformer import Decoder

NAMES = sorted(presets.PRESETS)


def _abstract_params(cfg: ModelConfig):
    """The parameter ShapeDtypeStructs of a Decoder, built under jax.eval_shape."""
    state = jax.eval_shape(lambda: nnx.split(Decoder(cfg, rngs=nnx.Rngs(0)))[1])
    return nnx.to_pure_dict(state)


@pytest.mark.parametrize("name", NAMES)
def test_preset_builds_abstractly_with_its_param_count(name):
    cfg = model_config(name, param_dtype="bfloat16")
    params = _abstract_params(cfg)
    assert all(isinstance(p, jax.ShapeDtypeStruct) for p in params.values())
    assert {p.dtype for p in params.values()} == {jax.numpy.dtype("bfloat16")}
    count = sum(math.prod(p.shape) for p in params.values())
    assert count == presets.param_count(presets.PRESETS[name])
    assert ("lm_head" in params) == (not cfg.tie_embeddings)
    l_, d = cfg.num_layers, cfg.hidden_size
    assert params["wq"].shape == (l_, d, cfg.num_heads, cfg.head_dim)
    lm = presets.moe_layer_count(presets.PRESETS[name])
    assert lm == len(moe_layers(cfg))
    if l_ > lm:
        assert params["w_down"].shape == (l_ - lm, cfg.intermediate_size, d)
    if lm:
        e, fe = cfg.num_experts, cfg.moe_intermediate_size
        assert params["we_down"].shape == (lm, e, fe, d)


@pytest.mark.parametrize("name", NAMES)
def test_active_params_are_what_one_token_multiplies(name):
    """k of the E experts' weights, the rest whole: counted from the built model's shapes."""
    cfg = model_config(name)
    params = _abstract_params(cfg)
    experts = sum(math.prod(p.shape) for k, p in params.items() if k.startswith("we_"))
    total = sum(math.prod(p.shape) for p in params.values())
    k_of_e = cfg.num_experts_per_tok / cfg.num_experts if cfg.num_experts else 1.0
    want = total - experts + experts * k_of_e
    assert presets.active_param_count(presets.PRESETS[name]) == want


def test_tiny_preset_of_a_mixture_counts_its_experts():
    from rljax.configs import arith_moe

    from rljax.sim.measured import tiny_preset

    cfg = arith_moe.MODEL
    params = _abstract_params(cfg)
    preset = tiny_preset(cfg)
    assert presets.param_count(preset) == sum(math.prod(p.shape) for p in params.values())
    assert presets.moe_layer_count(preset) == len(moe_layers(cfg)) == 2


@pytest.mark.parametrize("name", NAMES)
def test_preset_hf_config_round_trip(name):
    cfg = model_config(name)
    assert config_from_hf(config_to_hf(cfg)) == cfg


@pytest.mark.parametrize("name", NAMES)
def test_preset_matches_transformers_param_count(name):
    torch = pytest.importorskip("torch", reason="the HF cross-check builds models on torch")
    transformers = pytest.importorskip("transformers", reason="the HF cross-check needs it")
    hf_config = transformers.AutoConfig.for_model(**config_to_hf(model_config(name)))
    with torch.device("meta"):  # shapes only, no memory
        model = transformers.AutoModelForCausalLM.from_config(hf_config)
    # parameters() yields a tied embedding once, as param_count counts it.
    assert sum(p.numel() for p in model.parameters()) == presets.param_count(presets.PRESETS[name])


def test_model_config_errors():
    with pytest.raises(KeyError, match=r"unknown model preset 'llama-9b'; choose one of"):
        model_config("llama-9b")
    with pytest.raises(ValueError, match=r"'model.dtype' = 'fp8' is invalid"):
        model_config("smollm2-135m", dtype="fp8")
