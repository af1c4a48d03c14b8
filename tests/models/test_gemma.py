"""Gemma 2 and Gemma 3 (text): import, export and logits against transformers.

The sequences are five times the sliding window, so a local layer's attention differs from a
global one's (a test below checks that it does), and the soft-caps are small enough to bend the
scores and logits they cap.
"""

import dataclasses
import json
import os

import jax
import numpy as np
import pytest
from flax import nnx

from rljax.models import hf
from rljax.models.families import config_from_hf, config_to_hf
from rljax.models.hf import load_hf, save_hf
from rljax.models.layer_runs import segments
from rljax.models.sharding import LEARNER_RULES, make_mesh
from rljax.models.transformer import abstract_decoder
from tests.models.parity import assert_logits_close, hf_logits, rljax_logits

torch = pytest.importorskip("torch", reason="parity tests compare against transformers on torch")
transformers = pytest.importorskip("transformers", reason="parity tests need transformers")

WINDOW = 8
SMALL = dict(
    vocab_size=96,
    hidden_size=64,
    intermediate_size=96,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    max_position_embeddings=128,
    rms_norm_eps=1e-5,
    sliding_window=WINDOW,
    query_pre_attn_scalar=24,  # not head_dim: the scale must come from it
)
TOKENS = np.random.RandomState(0).randint(0, SMALL["vocab_size"], (2, 5 * WINDOW))


def _hf_config(kind):
    if kind == "gemma2":  # local and global alternating; both soft-caps on, small enough to bend
        return transformers.Gemma2Config(
            **SMALL, num_hidden_layers=4, attn_logit_softcapping=2.0, final_logit_softcapping=1.5
        )
    types = ["sliding_attention", "sliding_attention", "full_attention", "sliding_attention"]
    rope = {
        "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
        "full_attention": {"rope_type": "default", "rope_theta": 1_000_000.0},
    }
    if kind == "gemma3_linear":  # Gemma 3 4B+'s global layers: positions divided by a factor
        rope["full_attention"] = {"rope_type": "linear", "factor": 4.0, "rope_theta": 1e6}
    return transformers.Gemma3TextConfig(
        **SMALL, num_hidden_layers=4, layer_types=types, rope_parameters=rope
    )


def _hf_model(kind, seed=0):
    torch.manual_seed(seed)
    config = _hf_config(kind)
    config._attn_implementation = "eager"  # Gemma's reference attention (soft-cap, window)
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():  # random norms, so a mis-mapped or un-offset norm shows in the logits
        for _, p in model.named_parameters():
            if p.ndim == 1:
                p.copy_(0.3 * torch.randn_like(p))
    return model


@pytest.fixture(scope="module")
def mesh():
    return make_mesh(jax.devices(), {"fsdp": 4, "tensor": 2})


def _ours(graphdef, params, tokens=TOKENS):
    return rljax_logits(graphdef, params, tokens)


def _theirs(model, tokens=TOKENS):
    return hf_logits(model, tokens)


@pytest.mark.parametrize("kind", ["gemma2", "gemma3", "gemma3_linear"])
def test_logits_match_transformers(kind, mesh, tmp_path):
    model = _hf_model(kind)
    model.save_pretrained(tmp_path)
    cfg, graphdef, params = load_hf(tmp_path, mesh=mesh, rules=LEARNER_RULES)
    assert cfg.family == kind.removesuffix("_linear")
    assert cfg.sliding_window == WINDOW and cfg.query_pre_attn_scalar == 24
    assert cfg.post_norms and cfg.norm_unit_offset and cfg.scale_embeddings
    assert cfg.qk_norm == (kind != "gemma2")
    want = _theirs(model)
    assert_logits_close(_ours(graphdef, params), want)
    # The window matters at this length: the same weights with every layer global differ.
    all_global = dataclasses.replace(cfg, layer_types=())
    graphdef_global = nnx.split(abstract_decoder(all_global))[0]
    logits_global = _ours(graphdef_global, params)
    gap = np.abs(logits_global - want).max()
    assert gap > 1e-2 * np.abs(want).max(), gap


def test_layer_runs_follow_the_attention_pattern():
    gemma3 = config_from_hf(
        _hf_config("gemma3").to_dict() | {"architectures": ["Gemma3ForCausalLM"]}
    )
    assert [(s.start, s.stop, s.window) for s in segments(gemma3)] == [
        (0, 2, WINDOW),
        (2, 3, None),
        (3, 4, WINDOW),
    ]
    gemma2 = config_from_hf(
        _hf_config("gemma2").to_dict() | {"architectures": ["Gemma2ForCausalLM"]}
    )
    assert [s.window for s in segments(gemma2)] == [WINDOW, None, WINDOW, None]


def test_older_config_dialect():
    """Gemma 3's transformers-4 keys (``sliding_window_pattern``, ``rope_local_base_freq``,
    flat ``rope_theta``/``rope_scaling``) read as transformers 5's do."""
    new = config_from_hf(
        _hf_config("gemma3_linear").to_dict() | {"architectures": ["Gemma3ForCausalLM"]}
    )
    old = {
        **{k: v for k, v in SMALL.items()},
        "architectures": ["Gemma3ForCausalLM"],
        "model_type": "gemma3_text",
        "num_hidden_layers": 4,
        "sliding_window_pattern": 3,  # layers 0, 1 local, 2 global, 3 local
        "rope_theta": 1_000_000.0,
        "rope_local_base_freq": 10_000.0,
        "rope_scaling": {"rope_type": "linear", "factor": 4.0},
    }
    assert config_from_hf(old) == new


@pytest.mark.parametrize("kind,dtype", [("gemma2", "float32"), ("gemma3", "bfloat16")])
def test_export_round_trip(kind, dtype, mesh, tmp_path):
    model = _hf_model(kind)
    model.save_pretrained(tmp_path / "src")
    cfg, graphdef, params = load_hf(tmp_path / "src", mesh=mesh, rules=LEARNER_RULES, dtype=dtype)
    save_hf(tmp_path / "out", cfg, params)
    written = json.loads((tmp_path / "out" / "config.json").read_text())
    assert written["layer_types"] == list(cfg.layer_types)
    cfg2, _, params2 = load_hf(tmp_path / "out", mesh=mesh, rules=LEARNER_RULES)
    assert cfg2 == cfg
    before, after = nnx.to_pure_dict(params), nnx.to_pure_dict(params2)
    assert sorted(before) == sorted(after)
    for name in before:
        a, b = np.asarray(before[name]), np.asarray(after[name])
        assert a.dtype == b.dtype and a.tobytes() == b.tobytes(), name  # bitwise
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(
        tmp_path / "out", dtype=torch.float32, attn_implementation="eager"
    ).eval()
    if dtype == "float32":
        assert_logits_close(_theirs(reloaded), _theirs(model))
    else:  # the bf16 export, computed in f32 by both sides
        _, gd32, params32 = load_hf(
            tmp_path / "out", mesh=mesh, rules=LEARNER_RULES, dtype="float32"
        )
        assert_logits_close(_ours(gd32, params32), _theirs(reloaded))


def test_config_to_hf_refuses_a_non_gemma_shape():
    cfg = config_from_hf(_hf_config("gemma2").to_dict() | {"architectures": ["Gemma2ForCausalLM"]})
    assert config_from_hf(config_to_hf(cfg)) == cfg
    with pytest.raises(ValueError, match="has no Hugging Face architecture"):
        config_to_hf(dataclasses.replace(cfg, post_norms=False))


def test_hf_tensor_names(mesh, tmp_path):
    """Every tensor transformers writes is read, and save_hf writes the same names."""
    model = _hf_model("gemma3")
    model.save_pretrained(tmp_path / "src")
    cfg, _, params = load_hf(tmp_path / "src", mesh=mesh, rules=LEARNER_RULES)
    theirs = set(hf.SafetensorsReader(str(tmp_path / "src")).names())
    ours = {name for name, _ in hf.hf_tensors(cfg, params)}
    assert ours == theirs
    assert os.path.isfile(tmp_path / "src" / hf.WEIGHTS_FILE)
