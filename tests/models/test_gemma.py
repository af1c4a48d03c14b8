"""Gemma 2, Gemma 3 and Gemma 4 (text): import, export and logits against transformers.

The sequences are five times the sliding window, so a local layer's attention differs from a
global one's (a test below checks that it does), and the soft-caps are small enough to bend the
scores and logits they cap. Gemma 4's value norm, layer scalars (random, not 1) and partial
RoPE each move its logits (checked by switching each one off on the same weights).
"""

import dataclasses
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from rljax.models import hf
from rljax.models.families import config_from_hf, config_to_hf
from rljax.models.hf import load_hf, save_hf
from rljax.models.layer_runs import segments
from rljax.models.sharding import LEARNER_RULES, make_mesh
from rljax.models.transformer import abstract_decoder
from rljax.testing import TINY_MODEL
from tests.models.parity import assert_logits_close, hf_logits, randomise_norms, rljax_logits

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
# Gemma 4's global layers rotate a quarter of each head: 2 of its 8 frequency pairs.
GEMMA4_GLOBAL_ROPE = {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1e6}


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
    if kind == "gemma4":  # the features built, none of those refused (unbuilt_gemma4)
        rope["full_attention"] = GEMMA4_GLOBAL_ROPE
        return transformers.Gemma4TextConfig(
            **SMALL,
            num_hidden_layers=4,
            layer_types=types[:-1] + ["full_attention"],  # transformers makes the last global
            rope_parameters=rope,
            final_logit_softcapping=1.5,
            hidden_size_per_layer_input=0,
            global_head_dim=SMALL["head_dim"],
        )
    return transformers.Gemma3TextConfig(
        **SMALL, num_hidden_layers=4, layer_types=types, rope_parameters=rope
    )


def _hf_model(kind, seed=0):
    torch.manual_seed(seed)
    config = _hf_config(kind)
    config._attn_implementation = "eager"  # Gemma's reference attention (soft-cap, window)
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    # Random norms, so a mis-mapped or un-offset norm shows in the logits (Gemma 4's scale by
    # w, so about 1), and layer scalars away from 1 (transformers starts them at 1).
    randomise_norms(model, 1.0 if kind == "gemma4" else 0.0)
    if kind == "gemma2":  # no q/k norms: at the init's scale the scores are far below the cap
        with torch.no_grad():
            for layer in model.model.layers:
                layer.self_attn.q_proj.weight.mul_(4.0)
                layer.self_attn.k_proj.weight.mul_(4.0)
    return model


@pytest.fixture(scope="module")
def mesh():
    return make_mesh(jax.devices(), {"fsdp": 4, "tensor": 2})


def _ours(graphdef, params, tokens=TOKENS):
    return rljax_logits(graphdef, params, tokens)


def _theirs(model, tokens=TOKENS):
    return hf_logits(model, tokens)


def _assert_moves(graphdef, params, want, what):
    """The logits of ``graphdef`` over ``params`` differ from ``want`` by over 1e-2 of scale."""
    gap = np.abs(_ours(graphdef, params) - want).max()
    assert gap > 1e-2 * np.abs(want).max(), (what, gap)


@pytest.mark.parametrize("kind", ["gemma2", "gemma3", "gemma3_linear", "gemma4"])
def test_logits_match_transformers(kind, mesh, tmp_path):
    model = _hf_model(kind)
    model.save_pretrained(tmp_path)
    cfg, graphdef, params = load_hf(tmp_path, mesh=mesh, rules=LEARNER_RULES)
    four = kind == "gemma4"
    assert cfg.family == kind.removesuffix("_linear")
    # Gemma 4 reads no query_pre_attn_scalar: its scale is 1 whatever the file holds.
    assert cfg.sliding_window == WINDOW and cfg.query_pre_attn_scalar == (1 if four else 24)
    assert cfg.post_norms and cfg.norm_unit_offset != four and cfg.scale_embeddings
    assert cfg.qk_norm == (kind != "gemma2")
    assert (cfg.v_norm, cfg.layer_scalar, cfg.partial_rotary_factor) == (
        (True, True, 0.25) if four else (False, False, 1.0)
    )
    want = _theirs(model)
    assert_logits_close(_ours(graphdef, params), want)
    # The window matters at this length: the same weights with every layer global differ.
    all_global = dataclasses.replace(cfg, layer_types=())
    _assert_moves(nnx.split(abstract_decoder(all_global))[0], params, want, "window")
    if kind == "gemma2":  # and so does the attention soft-cap
        uncapped = dataclasses.replace(cfg, attn_logit_softcapping=None)
        _assert_moves(nnx.split(abstract_decoder(uncapped))[0], params, want, "attention cap")
    if four:  # and so does each Gemma 4 feature, on the same weights
        for change in (dict(v_norm=False), dict(partial_rotary_factor=1.0)):
            other = nnx.split(abstract_decoder(dataclasses.replace(cfg, **change)))[0]
            _assert_moves(other, params, want, change)
        unit = nnx.to_pure_dict(params)
        unit["layer_scalar"] = np.ones_like(unit["layer_scalar"])
        _assert_moves(graphdef, unit, want, "layer_scalar")


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


@pytest.mark.parametrize(
    "kind,dtype", [("gemma2", "float32"), ("gemma3", "bfloat16"), ("gemma4", "float32")]
)
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


def test_gemma4_gradients_match_torch(mesh, tmp_path):
    """The learner's path (flash attention's windowed backward, GeGLU's hand-written backward)
    differentiates Gemma 4's value norm, partial RoPE and layer scalars as torch does: every
    tensor's gradient of one weighted sum of the logits, the layer scalars' included."""
    model = _hf_model("gemma4")
    model.save_pretrained(tmp_path)
    cfg, graphdef, params = load_hf(tmp_path, mesh=mesh, rules=LEARNER_RULES)
    # No pad token (id 0): torch's embedding never differentiates its row, rljax's does.
    tokens = np.where(TOKENS == 0, 1, TOKENS)
    weights = np.random.RandomState(1).standard_normal((*tokens.shape, SMALL["vocab_size"]))
    weights = weights.astype(np.float32)

    def loss(p):
        m = nnx.merge(graphdef, p)
        positions = jnp.broadcast_to(jnp.arange(tokens.shape[1]), tokens.shape)
        hidden = m(jnp.asarray(tokens), positions, jnp.ones(tokens.shape, jnp.int32), impl="xla")
        return jnp.sum(m.logits(hidden) * weights)

    ours = dict(hf.hf_tensors(cfg, jax.jit(jax.grad(loss))(params)))
    for layer in model.model.layers:  # a buffer in transformers: made a parameter to get its grad
        scalar = layer._buffers.pop("layer_scalar")
        layer.layer_scalar = torch.nn.Parameter(scalar.clone())
    (model(torch.tensor(tokens)).logits * torch.tensor(weights)).sum().backward()
    theirs = {name: p.grad.numpy() for name, p in model.named_parameters()}
    assert set(ours) == set(theirs)  # the layer scalars too; the tied head is the embedding

    def scalars_as_one(grads):  # the last layer's is about 0 (the final norm undoes a scale)
        scalars = [grads.pop(f"model.layers.{i}.layer_scalar") for i in range(cfg.num_layers)]
        return grads | {"layer scalars": np.concatenate(scalars)}

    ours, theirs = scalars_as_one(ours), scalars_as_one(theirs)
    for name, grad in theirs.items():  # f32 gradients summed in another order, at each scale
        assert_logits_close(ours[name], grad, rtol=1e-4, err_msg=name)


def _gemma4_json(**edits):
    config = _hf_config("gemma4").to_dict() | {"architectures": ["Gemma4ForCausalLM"]}
    return {k: v for k, v in (config | edits).items() if v is not DROP}


DROP = object()  # a key _gemma4_json leaves out
# Each Gemma 4 feature not built, turned on in an otherwise loadable config.json, and how the
# refusal names it.
UNBUILT = [
    (dict(hidden_size_per_layer_input=256), "per-layer inputs (hidden_size_per_layer_input=256)"),
    (dict(num_kv_shared_layers=2), "shared KV layers (num_kv_shared_layers=2)"),
    (dict(per_layer_config={"3": {"head_dim": 32}}), "per-layer head_dim (32 on layer 3, not"),
    (dict(per_layer_config={"2": {"num_key_value_heads": 1}}), "per-layer num_key_value_heads"),
    (dict(per_layer_config=DROP, global_head_dim=32), "per-layer head_dim (32 on every global"),
    (dict(per_layer_config=DROP), "per-layer head_dim (512 on every global layer"),  # its default
    (dict(attention_k_eq_v=True), "keys as values (attention_k_eq_v=true)"),
    (dict(use_double_wide_mlp=True, num_kv_shared_layers=2), "the double-wide MLP"),
    (dict(use_bidirectional_attention="all"), "bidirectional attention"),
]


@pytest.mark.parametrize("edits,named", UNBUILT, ids=[u[1].split(" (")[0] for u in UNBUILT])
def test_gemma4_features_not_built_are_refused_by_name(edits, named):
    with pytest.raises(ValueError) as info:
        config_from_hf(_gemma4_json(**edits), source="g4/config.json")
    message = str(info.value)
    assert "\n" not in message and message.startswith("g4/config.json: this Gemma 4 uses ")
    assert named in message and "docs/gemma.md lists what is built" in message


def test_gemma4_options_that_change_nothing_load():
    """Per-layer overrides equal to the base values, the global head width equal to head_dim,
    and options that only act with a feature refused (the double-wide MLP on the shared KV
    layers, bidirectional image tokens) read as the plain config."""
    plain = config_from_hf(_gemma4_json())
    same = dict(head_dim=SMALL["head_dim"], num_key_value_heads=SMALL["num_key_value_heads"])
    for edits in (
        dict(per_layer_config={"2": same, "3": same}),
        dict(per_layer_config=DROP, global_head_dim=SMALL["head_dim"]),
        dict(use_double_wide_mlp=True),
        dict(use_bidirectional_attention="vision"),
    ):
        assert config_from_hf(_gemma4_json(**edits)) == plain, edits


def test_config_to_hf_refuses_a_non_gemma_shape():
    cfg = config_from_hf(_hf_config("gemma2").to_dict() | {"architectures": ["Gemma2ForCausalLM"]})
    assert config_from_hf(config_to_hf(cfg)) == cfg
    with pytest.raises(ValueError, match="has no Hugging Face architecture"):
        config_to_hf(dataclasses.replace(cfg, post_norms=False))
    with pytest.raises(ValueError, match="has no Hugging Face architecture"):
        config_to_hf(dataclasses.replace(cfg, v_norm=True))
    four = config_from_hf(_gemma4_json())
    assert config_from_hf(config_to_hf(four)) == four
    with pytest.raises(ValueError, match="'gemma4' with \\['layer_scalar'\\] differing"):
        config_to_hf(dataclasses.replace(four, layer_scalar=False))
    llama = dataclasses.replace(TINY_MODEL, partial_rotary_factor=0.5)
    with pytest.raises(ValueError, match="Gemma 4's partial_rotary_factor has no Hugging Face"):
        config_to_hf(llama)


@pytest.mark.parametrize("kind", ["gemma3", "gemma4"])
def test_hf_tensor_names(kind, mesh, tmp_path):
    """Every tensor transformers writes is read (Gemma 4's layer scalars too), and save_hf
    writes the same names."""
    model = _hf_model(kind)
    model.save_pretrained(tmp_path / "src")
    cfg, _, params = load_hf(tmp_path / "src", mesh=mesh, rules=LEARNER_RULES)
    theirs = set(hf.SafetensorsReader(str(tmp_path / "src")).names())
    ours = {name for name, _ in hf.hf_tensors(cfg, params)}
    assert ours == theirs
    assert os.path.isfile(tmp_path / "src" / hf.WEIGHTS_FILE)
