"""Bad model directories and GGUF files: one line naming config key 'init' and the fix."""

import json
import shutil

import jax
import numpy as np
import pytest
from flax import nnx
from rljax.configs import arith_tiny

from rljax.config import ConfigError, replace
from rljax.models import hf
from rljax.models.sharding import LEARNER_RULES, make_mesh
from rljax.models.tokenizer import Tokenizer
from rljax.models.transformer import abstract_decoder
from rljax.runtime.run import Run
from rljax.testing import TINY_MODEL


@pytest.fixture(scope="module")
def tiny_hf(tmp_path_factory):
    """A Hugging Face directory of the tiny model, with the char tokenizer."""
    path = tmp_path_factory.mktemp("tiny_hf")
    # Random weights of the right shapes, straight from the abstract model: nothing compiles.
    abstract = nnx.to_pure_dict(nnx.split(abstract_decoder(TINY_MODEL))[1])
    rng = np.random.default_rng(0)
    params = {k: rng.standard_normal(v.shape).astype(v.dtype) for k, v in abstract.items()}
    hf.save_hf(path, TINY_MODEL, params, Tokenizer.char_level())
    # Undamaged, it loads: each test's damage is what its error is about.
    mesh = make_mesh(jax.devices()[:1], {"fsdp": 1, "tensor": 1})
    assert hf.load_hf(path, mesh=mesh, rules=LEARNER_RULES)[0] == TINY_MODEL
    return path


@pytest.fixture
def model_dir(tiny_hf, tmp_path):
    """A fresh copy of the tiny model directory to damage."""
    return shutil.copytree(tiny_hf, tmp_path / "model")


def _run(init, workdir, **changes):
    cfg = replace(arith_tiny.recipe("small"), init=str(init), **changes)
    return lambda: Run(cfg, str(workdir))


def _edit_config(model_dir, **edits):
    config = json.loads((model_dir / "config.json").read_text())
    config.update(edits)
    (model_dir / "config.json").write_text(json.dumps(config))


def _tensors(model_dir):
    from safetensors.numpy import load_file

    return load_file(str(model_dir / hf.WEIGHTS_FILE))


def _save_tensors(model_dir, tensors):
    from safetensors.numpy import save_file

    save_file(tensors, str(model_dir / hf.WEIGHTS_FILE), metadata={"format": "pt"})


def _no_dir(d):
    shutil.rmtree(d)


def _no_config(d):
    (d / "config.json").unlink()


def _corrupt_config(d):
    (d / "config.json").write_text('{"architectures": ["LlamaForCausalLM"], ')


def _gpt2(d):
    _edit_config(d, architectures=["GPT2LMHeadModel"], model_type="gpt2")


def _gemma4(d):
    head_dim = json.loads((d / "config.json").read_text())["head_dim"]
    _edit_config(
        d,
        architectures=["Gemma4ForCausalLM"],
        model_type="gemma4_text",
        hidden_size_per_layer_input=256,
        num_kv_shared_layers=2,
        global_head_dim=head_dim,  # built: the global layers' heads as wide as the others
    )


def _gemma4_moe_without_top_k(d):
    head_dim = json.loads((d / "config.json").read_text())["head_dim"]
    _edit_config(
        d,
        architectures=["Gemma4ForCausalLM"],
        model_type="gemma4_text",
        hidden_size_per_layer_input=0,
        global_head_dim=head_dim,
        enable_moe_block=True,
        num_experts=4,
        moe_intermediate_size=16,
    )


def _no_hidden_size(d):
    config = json.loads((d / "config.json").read_text())
    del config["hidden_size"]
    (d / "config.json").write_text(json.dumps(config))


def _gelu(d):
    _edit_config(d, hidden_act="gelu")


def _no_weights(d):
    (d / hf.WEIGHTS_FILE).unlink()


def _corrupt_weights(d):
    (d / hf.WEIGHTS_FILE).write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json")


def _truncated_weights(d):
    data = (d / hf.WEIGHTS_FILE).read_bytes()
    (d / hf.WEIGHTS_FILE).write_bytes(data[: len(data) // 2])


def _wrong_shape(d):
    _edit_config(d, intermediate_size=256)


def _missing_tensor(d):
    tensors = _tensors(d)
    del tensors["model.layers.1.mlp.up_proj.weight"]
    _save_tensors(d, tensors)


def _int_tensor(d):
    tensors = _tensors(d)
    name = "model.norm.weight"
    tensors[name] = np.ones(tensors[name].shape, np.int32)
    _save_tensors(d, tensors)


def _missing_shard(d):
    (d / hf.WEIGHTS_FILE).unlink()
    index = {"weight_map": {"model.norm.weight": "model-00001-of-00002.safetensors"}}
    (d / hf.INDEX_FILE).write_text(json.dumps(index))


MODEL_CASES = [
    ("M01", _no_dir, "point at a Hugging Face model directory"),
    ("M02", _no_config, "point at a Hugging Face model directory"),
    ("M03", _corrupt_config, "re-download it"),
    ("M04", _gpt2, "supported architectures are LlamaForCausalLM"),
    ("M05", _no_hidden_size, "re-download it or add the key"),
    ("M06", _gelu, "rljax uses SwiGLU"),
    ("M07", _no_weights, "saved with safetensors"),
    ("M08", _corrupt_weights, "re-download it"),
    ("M09", _truncated_weights, "re-download it"),
    ("M10", _wrong_shape, "re-download the checkpoint, or fix config.json"),
    ("M11", _missing_tensor, "re-download the checkpoint, or fix config.json"),
    ("M12", _int_tensor, "dequantize the checkpoint, or export it unquantized"),
    ("M13", _missing_shard, "re-download the checkpoint"),
    ("M18", _gemma4, "use a Gemma 4 text checkpoint without them, or a Gemma 2 or Gemma 3 one"),
    ("M19", _gemma4_moe_without_top_k, "without an integer top_k_experts; the file is incomplete"),
]


@pytest.mark.parametrize("row_id, damage, fix", MODEL_CASES, ids=[c[0] for c in MODEL_CASES])
def test_bad_model_directory(refused, check_row, workdir, model_dir, row_id, damage, fix):
    damage(model_dir)
    message = refused(_run(model_dir, workdir), ConfigError, workdir)
    check_row(row_id, message, fix)


def test_bad_model_directory_from_the_command_line(launch_error, check_row, model_dir):
    _gpt2(model_dir)
    message = launch_error(f"--config.init={model_dir}")
    check_row("M14", message, "supported architectures are LlamaForCausalLM")


def test_tokenizer_larger_than_the_model(refused, check_row, workdir):
    small = replace(TINY_MODEL, vocab_size=16)
    cfg = replace(arith_tiny.recipe("small"), model=small)
    message = refused(lambda: Run(cfg, str(workdir)), ConfigError, workdir)
    check_row("M15", message, "use a tokenizer that fits or a model with vocab_size >= 18")


def test_missing_expert_weight(refused, check_row, workdir, tmp_path):
    moe = replace(
        TINY_MODEL,
        family="qwen3_moe",
        qk_norm=True,
        num_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=16,
    )
    abstract = nnx.to_pure_dict(nnx.split(abstract_decoder(moe))[1])
    rng = np.random.default_rng(0)
    params = {k: rng.standard_normal(v.shape).astype(v.dtype) for k, v in abstract.items()}
    model_dir = tmp_path / "moe"
    hf.save_hf(model_dir, moe, params, Tokenizer.char_level())
    tensors = _tensors(model_dir)
    del tensors["model.layers.1.mlp.experts.3.up_proj.weight"]
    _save_tensors(model_dir, tensors)
    message = refused(_run(model_dir, workdir), ConfigError, workdir)
    check_row("M16", message, "re-download the checkpoint, or fix config.json")


def test_gemma_with_an_unknown_attention_pattern(refused, check_row, workdir, tmp_path):
    from rljax.configs import arith_gemma

    abstract = nnx.to_pure_dict(nnx.split(abstract_decoder(arith_gemma.MODEL))[1])
    rng = np.random.default_rng(0)
    params = {k: rng.standard_normal(v.shape).astype(v.dtype) for k, v in abstract.items()}
    model_dir = tmp_path / "gemma"
    hf.save_hf(model_dir, arith_gemma.MODEL, params, Tokenizer.char_level())
    types = ["sliding_attention", "chunked_attention", "full_attention"]
    _edit_config(model_dir, layer_types=types)
    message = refused(_run(model_dir, workdir), ConfigError, workdir)
    check_row("M17", message, "rljax reads one of ('sliding_attention', 'full_attention') per")


# ---- GGUF ------------------------------------------------------------------------------------


def _write_gguf(path, *, arch="llama", metadata=True, q8_1=False):
    """A GGUF header with the model metadata of the tiny model and one tensor (and with
    ``q8_1``, a tensor in Q8_1, a layout the gguf package cannot dequantise)."""
    gguf = pytest.importorskip("gguf", reason="the gguf package is not installed")
    writer = gguf.GGUFWriter(str(path), arch=arch)
    if metadata:
        writer.add_block_count(TINY_MODEL.num_layers)
        writer.add_embedding_length(TINY_MODEL.hidden_size)
        writer.add_feed_forward_length(TINY_MODEL.intermediate_size)
        writer.add_head_count(TINY_MODEL.num_heads)
        writer.add_layer_norm_rms_eps(1e-6)
    else:
        writer.add_embedding_length(TINY_MODEL.hidden_size)
    embed = np.zeros((TINY_MODEL.vocab_size, TINY_MODEL.hidden_size), np.float32)
    writer.add_tensor("token_embd.weight", embed)
    if q8_1:  # blocks of 32 values in 40 bytes
        blocks = np.zeros((TINY_MODEL.hidden_size, TINY_MODEL.hidden_size // 32 * 40), np.uint8)
        q8 = gguf.GGMLQuantizationType.Q8_1
        writer.add_tensor("blk.0.attn_q.weight", blocks, raw_dtype=q8)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _gguf_missing(tmp_path):
    return tmp_path / "missing.gguf"


def _gguf_truncated(tmp_path):
    path = _write_gguf(tmp_path / "model.gguf")
    path.write_bytes(path.read_bytes()[:64])
    return path


def _gguf_wrong_magic(tmp_path):
    path = tmp_path / "model.gguf"
    path.write_bytes(b"GGML" + bytes(60))
    return path


def _gguf_gpt2(tmp_path):
    return _write_gguf(tmp_path / "model.gguf", arch="gpt2", metadata=False)


def _gguf_incomplete(tmp_path):
    return _write_gguf(tmp_path / "model.gguf", metadata=False)


GGUF_CASES = [
    ("G01", _gguf_missing, "check the path"),
    ("G02", _gguf_truncated, "re-download it (it may be truncated or not a GGUF file)"),
    ("G03", _gguf_wrong_magic, "re-download it (it may be truncated or not a GGUF file)"),
    ("G04", _gguf_gpt2, "use a GGUF of one of those families"),
    ("G05", _gguf_incomplete, "re-download or re-convert it"),
]


@pytest.mark.parametrize("row_id, make, fix", GGUF_CASES, ids=[c[0] for c in GGUF_CASES])
def test_bad_gguf(refused, check_row, workdir, tmp_path, row_id, make, fix):
    message = refused(_run(make(tmp_path), workdir), ConfigError, workdir)
    check_row(row_id, message, fix)


def test_lora_on_a_gguf_it_cannot_dequantise(refused, check_row, workdir, tmp_path):
    path = _write_gguf(tmp_path / "model.gguf", q8_1=True)
    message = refused(_run(path, workdir, **{"lora.enabled": True}), ConfigError, workdir)
    check_row("G07", message, "convert it to a Hugging Face directory")


def test_bad_gguf_tokenizer(check_row, tmp_path):
    with pytest.raises(ValueError) as info:
        Tokenizer.from_gguf(_gguf_wrong_magic(tmp_path))
    check_row("G06", str(info.value), "re-download it (it may be truncated or not a GGUF file)")
