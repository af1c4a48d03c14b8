"""LoRA on mixture-of-experts models: attention and Qwen2-MoE's shared expert are adapted, the
routed experts stay frozen, and the export carries the adapters to peft and to merged weights.

The model is a Qwen2-MoE of two layers with ``decoder_sparse_step=2``: layer 0 has a dense MLP,
layer 1 a mixture of 8 experts (top 2) beside a shared expert, so the MLP targets adapt the
dense MLP (stacked over layer 0) and the shared expert (stacked over layer 1) alike. Every B is
random, so an adapter written under the wrong layer, or a dropped one, moves the logits.
"""

import dataclasses
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from rljax.config import LoRAConfig, ModelConfig
from rljax.config.model import has_dense_mlp
from rljax.models import lora as lora_lib
from rljax.models.hf import load_hf, save_hf
from rljax.models.lora_export import save_merged_hf, save_peft_adapter
from rljax.models.moe import dense_layers, moe_layers
from rljax.models.sharding import LEARNER_RULES, make_mesh
from rljax.models.transformer import init_sharded, with_adapters
from tests.models.parity import F32_RTOL, assert_logits_close

CFG = ModelConfig(
    family="qwen2_moe",
    vocab_size=96,
    hidden_size=64,
    intermediate_size=96,
    num_layers=2,
    num_heads=4,
    num_kv_heads=2,
    head_dim=16,
    qkv_bias=True,
    rope_theta=1e6,
    norm_eps=1e-5,
    max_position_embeddings=128,
    num_experts=8,
    num_experts_per_tok=2,
    moe_intermediate_size=32,
    shared_expert_intermediate_size=48,
    decoder_sparse_step=2,
)
LORA = LoRAConfig(enabled=True, rank=4, alpha=8.0)
MLP_ONLY = LoRAConfig(enabled=True, rank=3, alpha=5.0, targets=("up", "down"))
TOKENS = np.random.RandomState(0).randint(0, CFG.vocab_size, (2, 24))


@pytest.fixture(scope="module")
def mesh():
    return make_mesh(jax.devices(), {"fsdp": 4, "tensor": 2})


@pytest.fixture(scope="module")
def base(mesh):
    return init_sharded(CFG, mesh, LEARNER_RULES, seed=0)[1]


def _adapted(base, lora, mesh, seed=0):
    """Base plus adapters, every B random (B starts at zero: the model would be its base)."""
    graphdef, params = with_adapters(CFG, base, lora, mesh, LEARNER_RULES, seed)
    rng = np.random.default_rng(seed)

    def one(path, x):
        if not str(path[0].key).endswith("_lora_b"):
            return x
        return jax.device_put((x + 0.3 * rng.standard_normal(x.shape)).astype(x.dtype), x.sharding)

    return graphdef, jax.tree_util.tree_map_with_path(one, params)


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


def test_adapters_follow_the_stacks_and_leave_the_routed_experts(base, mesh):
    assert (dense_layers(CFG), moe_layers(CFG)) == ((0,), (1,))
    _, params = _adapted(base, LORA, mesh)
    pure = nnx.to_pure_dict(params)
    d, r, fs, f = CFG.hidden_size, LORA.rank, CFG.shared_expert_intermediate_size, 96
    assert pure["w_gate_lora_a"].shape == (1, d, r) and pure["w_gate_lora_b"].shape == (1, r, f)
    assert pure["ws_gate_lora_a"].shape == (1, d, r) and pure["ws_gate_lora_b"].shape == (1, r, fs)
    assert pure["ws_down_lora_a"].shape == (1, fs, r) and pure["ws_down_lora_b"].shape == (1, r, d)
    assert pure["wq_lora_a"].shape == (2, d, r)
    adapters = {k for k in pure if lora_lib.is_adapter(k)}
    assert not any(k.startswith(("we_", "router", "ws_router")) for k in adapters), adapters
    assert len(adapters) == 2 * (4 + 3 + 3)  # attention, dense MLP, shared expert


def test_only_the_adapters_get_gradients_and_they_reach_the_shared_expert(base, mesh):
    graphdef, params = _adapted(base, LORA, mesh)
    adapters, frozen = lora_lib.split_adapters(params)

    def loss(adapters):
        model = nnx.merge(graphdef, lora_lib.join(frozen, adapters))
        positions = jnp.tile(jnp.arange(TOKENS.shape[1]), (TOKENS.shape[0], 1))
        hidden = model(jnp.asarray(TOKENS), positions, jnp.ones(TOKENS.shape, jnp.int32))
        return jnp.mean(model.logits(hidden) ** 2)

    grads = nnx.to_pure_dict(jax.grad(loss)(adapters))
    for name in ("ws_gate_lora_a", "ws_down_lora_b", "w_up_lora_b", "wq_lora_a"):
        assert float(jnp.abs(grads[name]).max()) > 0, name


@pytest.mark.parametrize("lora", [LORA, MLP_ONLY], ids=["all", "mlp"])
def test_merged_export_reloads(lora, base, mesh, tmp_path):
    graphdef, params = _adapted(base, lora, mesh, seed=1)
    ours = _ours(graphdef, params)
    without = _ours(graphdef, params, adapters=False)
    assert np.abs(ours - without).max() > 1000 * F32_RTOL * np.abs(ours).max()
    save_merged_hf(tmp_path, CFG, params, lora)
    cfg2, graphdef2, merged = load_hf(tmp_path, mesh=mesh, rules=LEARNER_RULES)
    assert cfg2 == CFG and not lora_lib.has_adapters(merged)
    assert_logits_close(_ours(graphdef2, merged), ours)


@pytest.mark.parametrize("lora", [LORA, MLP_ONLY], ids=["all", "mlp"])
def test_peft_adapter_matches_rljax(lora, base, mesh, tmp_path):
    torch = pytest.importorskip("torch", reason="the reference is transformers on torch")
    transformers = pytest.importorskip("transformers", reason="the reference is transformers")
    peft = pytest.importorskip("peft", reason="the adapter is loaded by peft")
    graphdef, params = _adapted(base, lora, mesh, seed=2)
    ours = _ours(graphdef, params)
    base_dir, adapter_dir = tmp_path / "base", tmp_path / "adapter"
    save_hf(base_dir, CFG, lora_lib.split_adapters(params)[1])
    save_peft_adapter(adapter_dir, CFG, params, lora, base_model_name_or_path=str(base_dir))
    model = transformers.AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    adapted = peft.PeftModel.from_pretrained(model, adapter_dir).eval()
    # peft adapted the dense MLP of layer 0 and the shared expert of layer 1, no routed expert.
    names = [n for n, _ in adapted.named_modules() if n.endswith(".lora_A")]
    assert any(".layers.0.mlp.down_proj" in n for n in names)
    assert any(".layers.1.mlp.shared_expert.down_proj" in n for n in names)
    assert not any(".experts" in n for n in names)
    with torch.no_grad():
        theirs = adapted(torch.tensor(TOKENS)).logits.float().numpy()
    assert_logits_close(theirs, ours)


def test_mlp_targets_on_a_model_without_a_shared_expert():
    """Qwen3-MoE with one dense layer: 'gate' adapts that layer's MLP only."""
    cfg = ModelConfig(
        family="qwen3_moe",
        num_layers=3,
        num_experts=4,
        moe_intermediate_size=16,
        mlp_only_layers=(1,),
    )
    assert lora_lib.adapted_weights(LORA, cfg) == (
        "wq",
        "wk",
        "wv",
        "wo",
        "w_gate",
        "w_up",
        "w_down",
    )
    shapes = lora_lib.adapter_shapes(cfg, LORA)
    assert shapes["w_gate_lora_a"][0] == 1 and shapes["wq_lora_a"][0] == 3
    shared = dataclasses.replace(CFG, decoder_sparse_step=1)
    assert lora_lib.adapted_weights(MLP_ONLY, shared) == ("ws_up", "ws_down")


@pytest.mark.parametrize(
    "layers, step, mlp_only", itertools.product([1, 2, 4], [1, 2, 3, 5], [(), (0,), (1,)])
)
def test_the_configs_dense_layer_rule_is_the_models(layers, step, mlp_only):
    mlp_only = tuple(i for i in mlp_only if i < layers)
    cfg = ModelConfig(
        family="qwen3_moe",
        num_layers=layers,
        num_experts=4,
        moe_intermediate_size=16,
        decoder_sparse_step=step,
        mlp_only_layers=mlp_only,
    )
    assert has_dense_mlp(cfg) == bool(dense_layers(cfg))
