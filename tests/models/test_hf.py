"""Hugging Face / GGUF import and export: parity with transformers, sharding, bad input."""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from rljax.models import hf
from rljax.models.families import config_from_hf
from rljax.models.gguf import load_gguf
from rljax.models.hf import SafetensorsReader, load_hf, load_params, save_hf
from rljax.models.sharding import LEARNER_RULES, SAMPLER_RULES, make_mesh, state_shardings
from rljax.models.tokenizer import Tokenizer
from tests.models.parity import assert_logits_close, hf_logits, rljax_logits

torch = pytest.importorskip("torch", reason="parity tests compare against transformers on torch")
transformers = pytest.importorskip("transformers", reason="parity tests need transformers")

SMALL = dict(
    vocab_size=96,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=128,
    rms_norm_eps=1e-5,
)
LLAMA3 = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    # Small, so the 40-token test sequences reach the scaled (low-frequency) band.
    "original_max_position_embeddings": 16,
}


def _hf_config(kind):
    if kind == "llama":
        return transformers.LlamaConfig(**SMALL, rope_theta=500_000.0, rope_scaling=LLAMA3)
    if kind == "smollm2":  # Llama with tied embeddings and no scaling.
        return transformers.LlamaConfig(**SMALL, rope_theta=100_000.0, tie_word_embeddings=True)
    if kind == "qwen2":
        return transformers.Qwen2Config(**SMALL, rope_theta=1e6)
    # Qwen3 sets head_dim independently of hidden_size / num_heads.
    return transformers.Qwen3Config(**SMALL, head_dim=24, rope_theta=1e6)


def _hf_model(kind, seed=0):
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(_hf_config(kind)).eval()
    with torch.no_grad():  # Random norms and biases, so a mis-mapped vector shows in the logits.
        for name, p in model.named_parameters():
            if p.ndim == 1:
                p.copy_(1.0 + 0.2 * torch.randn_like(p) if "norm" in name else torch.randn_like(p))
    return model


@pytest.fixture(scope="module")
def mesh():
    return make_mesh(jax.devices(), {"fsdp": 4, "tensor": 2})


TOKENS = np.random.RandomState(0).randint(0, SMALL["vocab_size"], (2, 40))


def _ours(graphdef, params, tokens=TOKENS):
    return rljax_logits(graphdef, params, tokens)


def _theirs(model, tokens=TOKENS):
    return hf_logits(model, tokens)


@pytest.mark.parametrize(
    "kind,shard",
    [("llama", None), ("llama", "20KB"), ("smollm2", None), ("qwen2", "20KB"), ("qwen3", None)],
)
def test_logits_match_transformers(kind, shard, mesh, tmp_path):
    model = _hf_model(kind)
    model.save_pretrained(tmp_path, **({"max_shard_size": shard} if shard else {}))
    assert os.path.isfile(tmp_path / hf.INDEX_FILE) == bool(shard)
    cfg, graphdef, params = load_hf(tmp_path, mesh=mesh, rules=LEARNER_RULES)
    assert cfg.family == ("llama" if kind == "smollm2" else kind)
    assert cfg.tie_embeddings == (kind == "smollm2")
    assert (cfg.rope_scaling is not None) == (kind == "llama")
    expected = nnx.to_pure_dict(state_shardings(params, mesh, LEARNER_RULES))
    for name, array in nnx.to_pure_dict(params).items():
        assert array.sharding == expected[name], name
    wq = nnx.to_pure_dict(params)["wq"]
    assert wq.addressable_shards[0].data.shape == (2, 16, 2, cfg.head_dim)  # really sharded
    assert_logits_close(_ours(graphdef, params), _theirs(model))


def test_reads_only_each_devices_slice(mesh, tmp_path):
    _hf_model("llama").save_pretrained(tmp_path)
    cfg = config_from_hf(hf.read_config(tmp_path))
    reads = []

    class Counting(SafetensorsReader):
        def read(self, name, index):
            out = super().read(name, index)
            reads.append((name, out.size))
            return out

    reader = Counting(str(tmp_path))
    load_params(reader, cfg, mesh=mesh, rules=LEARNER_RULES)
    # Each distinct shard is read once per layer: 7 matrices x 8 shards + 2 norms x 4 shards.
    assert len(reads) == 2 * (7 * 8 + 2 * 4) + (8 + 8 + 4)  # + embed, lm_head, final_norm
    # fsdp=4 x tensor=2 splits every matrix 8 ways (the 1-D norms 4 ways): no device reads more.
    for name, size in reads:
        shape = reader.shape(name)
        assert size * (4 if len(shape) == 1 else 8) == np.prod(shape), name


def test_bf16_checkpoint(mesh, tmp_path):
    model = _hf_model("qwen3").to(torch.bfloat16)
    model.save_pretrained(tmp_path)
    sampler_mesh = make_mesh(jax.devices(), {"data": 4, "tensor": 2})
    cfg, graphdef, params = load_hf(tmp_path, mesh=sampler_mesh, rules=SAMPLER_RULES)
    assert cfg.param_dtype == "bfloat16"
    ours = nnx.to_pure_dict(params)
    assert ours["wq"].dtype == jnp.bfloat16
    q = model.model.layers[1].self_attn.q_proj.weight.detach().float().numpy()  # [N*H, D]
    got = np.asarray(ours["wq"][1], np.float32)  # [D, N, H]
    np.testing.assert_array_equal(got.reshape(cfg.hidden_size, -1).T, q)
    # The same bf16 weights computed in float32 match transformers run in float32 (loaded
    # fresh: casting the bf16 model with .float() would keep its bf16-rounded RoPE buffer).
    _, graphdef32, params32 = load_hf(tmp_path, mesh=mesh, rules=LEARNER_RULES, dtype="float32")
    reference = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32)
    assert_logits_close(_ours(graphdef32, params32), _theirs(reference.eval()))


@pytest.mark.parametrize("kind,dtype", [("llama", "float32"), ("qwen2", "bfloat16")])
def test_export_round_trip(kind, dtype, mesh, tmp_path):
    model = _hf_model(kind)
    model.save_pretrained(tmp_path / "src")
    cfg, graphdef, params = load_hf(tmp_path / "src", mesh=mesh, rules=LEARNER_RULES, dtype=dtype)
    save_hf(tmp_path / "out", cfg, params, max_shard_bytes=30_000)
    assert os.path.isfile(tmp_path / "out" / hf.INDEX_FILE)
    cfg2, _, params2 = load_hf(tmp_path / "out", mesh=mesh, rules=LEARNER_RULES)
    assert cfg2 == cfg
    before, after = nnx.to_pure_dict(params), nnx.to_pure_dict(params2)
    assert sorted(before) == sorted(after)
    for name in before:
        a, b = np.asarray(before[name]), np.asarray(after[name])
        assert a.dtype == b.dtype and a.tobytes() == b.tobytes(), name  # bitwise
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "out").eval()
    if dtype == "float32":
        assert_logits_close(_theirs(reloaded), _theirs(model))
    else:  # The bf16 export, computed in f32 by both sides.
        _, graphdef32, params32 = load_hf(
            tmp_path / "out", mesh=mesh, rules=LEARNER_RULES, dtype="float32"
        )
        reloaded = transformers.AutoModelForCausalLM.from_pretrained(
            tmp_path / "out", dtype=torch.float32
        )
        assert_logits_close(_ours(graphdef32, params32), _theirs(reloaded.eval()))


def test_export_with_tokenizer(mesh, tmp_path):
    model = _hf_model("smollm2")
    model.save_pretrained(tmp_path / "src")
    cfg, _, params = load_hf(tmp_path / "src", mesh=mesh, rules=LEARNER_RULES)
    tok = Tokenizer.char_level()
    save_hf(tmp_path / "out", cfg, params, tokenizer=tok)
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert (config["eos_token_id"], config["pad_token_id"]) == (tok.eos_id, tok.pad_id)
    assert "lm_head.weight" not in SafetensorsReader(str(tmp_path / "out"))._shapes
    assert Tokenizer.from_dir(tmp_path / "out").encode("1+2") == tok.encode("1+2")
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "out").eval()
    assert_logits_close(_theirs(reloaded), _theirs(model))


# ---- bad input -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    path = tmp_path_factory.mktemp("saved")
    _hf_model("qwen2").save_pretrained(path)
    return path


def _copy(src, dst, drop=None, config_edit=None):
    from safetensors.numpy import load_file, save_file

    os.makedirs(dst)
    tensors = load_file(os.path.join(src, hf.WEIGHTS_FILE))
    tensors.pop(drop, None)
    save_file(tensors, os.path.join(dst, hf.WEIGHTS_FILE), metadata={"format": "pt"})
    with open(os.path.join(src, "config.json")) as f:
        config = json.load(f)
    config.update(config_edit or {})
    with open(os.path.join(dst, "config.json"), "w") as f:
        json.dump(config, f)
    return dst


def test_error_missing_tensor(saved, mesh, tmp_path):
    path = _copy(saved, tmp_path / "m", drop="model.layers.1.self_attn.k_proj.bias")
    message = (
        r"m/model\.safetensors: tensor model\.layers\.1\.self_attn\.k_proj\.bias is missing "
        r"\(expected shape \[32\] from .*m/config\.json\); the checkpoint does not match"
    )
    with pytest.raises(ValueError, match=message):
        load_hf(path, mesh=mesh, rules=LEARNER_RULES)


def test_error_shape_mismatch(saved, mesh, tmp_path):
    path = _copy(saved, tmp_path / "m", config_edit={"intermediate_size": 80})
    message = (
        r"m/model\.safetensors: tensor model\.layers\.0\.mlp\.down_proj\.weight has shape "
        r"\[64, 96\] but .*m/config\.json implies \[64, 80\]; the checkpoint does not match"
    )
    with pytest.raises(ValueError, match=message):
        load_hf(path, mesh=mesh, rules=LEARNER_RULES)


def test_error_unsupported_architecture(saved, mesh, tmp_path):
    path = _copy(saved, tmp_path / "m", config_edit={"architectures": ["GPT2LMHeadModel"]})
    message = (
        r"m/config\.json: unsupported architecture GPT2LMHeadModel; supported architectures "
        r"are LlamaForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM, Qwen3MoeForCausalLM, "
        r"Qwen2MoeForCausalLM, Gemma2ForCausalLM, Gemma3ForCausalLM, Gemma4ForCausalLM$"
    )
    with pytest.raises(ValueError, match=message):
        load_hf(path, mesh=mesh, rules=LEARNER_RULES)


def test_error_files(saved, mesh, tmp_path):
    path = _copy(saved, tmp_path / "m")
    (path / hf.WEIGHTS_FILE).write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json")
    with pytest.raises(ValueError, match=r"safetensors file .*model\.safetensors is corrupt"):
        load_hf(path, mesh=mesh, rules=LEARNER_RULES)
    os.remove(path / hf.WEIGHTS_FILE)
    with pytest.raises(FileNotFoundError, match=r"has neither model\.safetensors nor model\."):
        load_hf(path, mesh=mesh, rules=LEARNER_RULES)
    index = {"weight_map": {"model.norm.weight": "model-00001-of-00002.safetensors"}}
    (path / hf.INDEX_FILE).write_text(json.dumps(index))
    with pytest.raises(FileNotFoundError, match=r"model-00001-of-00002\.safetensors \(listed in"):
        load_hf(path, mesh=mesh, rules=LEARNER_RULES)
    os.remove(path / "config.json")
    with pytest.raises(FileNotFoundError, match=r"config\.json does not exist"):
        load_hf(path, mesh=mesh, rules=LEARNER_RULES)


def test_config_rejects_unsupported_features():
    base = _hf_config("llama").to_dict() | {"architectures": ["LlamaForCausalLM"]}
    cases = [
        ({"hidden_act": "gelu"}, "hidden_act='gelu' is not supported"),
        ({"attention_bias": True}, "attention_bias=true .* is not supported"),
        ({"rope_scaling": {"rope_type": "yarn", "factor": 2.0}}, "rope type 'yarn' is not"),
    ]
    for edit, message in cases:
        with pytest.raises(ValueError, match=f"x.json: {message}"):
            config_from_hf(base | edit | {"rope_parameters": None}, source="x.json")


# ---- GGUF (tiny files written here; the real SmolLM2 file is in test_smollm2.py) -----------


def _write_gguf(path, model, qtype_name):
    """A llama.cpp-style GGUF of ``model``: q/k rows permuted, matrices quantized."""
    gguf = pytest.importorskip("gguf", reason="the gguf package is not installed")
    cfg = model.config
    writer = gguf.GGUFWriter(str(path), arch="llama")
    writer.add_block_count(cfg.num_hidden_layers)
    writer.add_embedding_length(cfg.hidden_size)
    writer.add_feed_forward_length(cfg.intermediate_size)
    writer.add_head_count(cfg.num_attention_heads)
    writer.add_head_count_kv(cfg.num_key_value_heads)
    writer.add_rope_freq_base(cfg.rope_parameters["rope_theta"])
    writer.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    writer.add_context_length(cfg.max_position_embeddings)
    from rljax.models.gguf import gguf_name

    qtype = getattr(gguf.GGMLQuantizationType, qtype_name)
    for name, tensor in model.state_dict().items():
        if name == "lm_head.weight" and cfg.tie_word_embeddings:
            continue  # llama.cpp writes no output.weight for tied models
        data = tensor.float().numpy()
        heads = {"q_proj": cfg.num_attention_heads, "k_proj": cfg.num_key_value_heads}
        for proj, n in heads.items():
            if f"{proj}.weight" in name:
                data = data.reshape(n, 2, -1, data.shape[-1]).swapaxes(1, 2).reshape(data.shape)
        if data.ndim == 2 and qtype_name != "F32":
            writer.add_tensor(gguf_name(name), gguf.quants.quantize(data, qtype), raw_dtype=qtype)
        else:
            writer.add_tensor(gguf_name(name), data)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return str(path)


def test_gguf_matches_safetensors(mesh, tmp_path):
    model = _hf_model("smollm2")
    model.save_pretrained(tmp_path / "hf")
    _, _, want = load_hf(tmp_path / "hf", mesh=mesh, rules=LEARNER_RULES)
    cfg, graphdef, got = load_gguf(
        _write_gguf(tmp_path / "f32.gguf", model, "F32"), mesh=mesh, rules=LEARNER_RULES
    )
    assert cfg.tie_embeddings and cfg.norm_eps == 1e-5 and cfg.rope_theta == 100_000.0
    for name, array in nnx.to_pure_dict(want).items():  # exact: the permutation is undone
        np.testing.assert_array_equal(np.asarray(nnx.to_pure_dict(got)[name]), array, name)
    # Cut to its first block: that block's weights and nothing of the others.
    path = tmp_path / "f32.gguf"
    cut_cfg, _, cut = load_gguf(path, mesh=mesh, rules=LEARNER_RULES, num_layers=1)
    assert cut_cfg.num_layers == 1
    full, first = nnx.to_pure_dict(got), nnx.to_pure_dict(cut)
    assert jax.tree.structure(full) == jax.tree.structure(first)
    for x, y in zip(jax.tree.leaves(full), jax.tree.leaves(first)):
        np.testing.assert_array_equal(np.asarray(y), np.asarray(x)[:1] if x.shape != y.shape else x)
    with pytest.raises(ValueError, match=r"num_layers=5 but GGUF file .* has 2 blocks"):
        load_gguf(path, mesh=mesh, rules=LEARNER_RULES, num_layers=5)
    # Q8_0 rounds each weight to a multiple of its 32-weight block's largest / 127 (an error of
    # up to 1/254 of it), so the logits have that precision, not f32's: 5e-3 of their scale
    # measured, bounded at 2e-2.
    cfg, graphdef, q8 = load_gguf(
        _write_gguf(tmp_path / "q8.gguf", model, "Q8_0"), mesh=mesh, rules=LEARNER_RULES
    )
    assert_logits_close(_ours(graphdef, q8), _theirs(model), rtol=2e-2)


def test_gguf_errors(mesh, tmp_path):
    with pytest.raises(FileNotFoundError, match=r"GGUF file .*nope\.gguf does not exist"):
        load_gguf(tmp_path / "nope.gguf", mesh=mesh, rules=LEARNER_RULES)
    (tmp_path / "junk.gguf").write_bytes(b"not a gguf file")
    with pytest.raises(ValueError, match=r"junk\.gguf could not be read"):
        load_gguf(tmp_path / "junk.gguf", mesh=mesh, rules=LEARNER_RULES)
    gguf = pytest.importorskip("gguf", reason="the gguf package is not installed")
    writer = gguf.GGUFWriter(str(tmp_path / "gpt2.gguf"), arch="gpt2")
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(ValueError, match=r"unsupported architecture 'gpt2'; supported are llama"):
        load_gguf(tmp_path / "gpt2.gguf", mesh=mesh, rules=LEARNER_RULES)
