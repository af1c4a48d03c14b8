"""Qwen3-MoE and Qwen2-MoE checkpoints: parity with transformers, expert parallelism, export.

Tiny random models built by transformers from their config classes (no download), saved with
``save_pretrained`` (the Hub's layout: one tensor per expert and matrix), loaded by ``load_hf``
onto meshes whose 'expert' axis is 1, 2 or 4 of the 8 CPU devices.
"""

import json
import os
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from rljax.config import MeshConfig
from rljax.mesh.topology import build_topology
from rljax.models import hf
from rljax.models.hf import SafetensorsReader, load_hf, save_hf
from rljax.models.moe import dense_layers, moe_layers
from rljax.models.sharding import LEARNER_RULES
from tests.models.parity import assert_logits_close

torch = pytest.importorskip("torch", reason="parity tests compare against transformers on torch")
transformers = pytest.importorskip("transformers", reason="parity tests need transformers")

SMALL = dict(
    vocab_size=96,
    hidden_size=64,
    intermediate_size=96,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=128,
    rms_norm_eps=1e-5,
    rope_theta=1e6,
    num_experts=8,
    num_experts_per_tok=2,
    moe_intermediate_size=32,
)
# name -> (config class, its fields beyond SMALL, MoE layers)
CASES = {
    # Qwen3-30B-A3B's routing: renormalised top-k; Qwen3 sets head_dim on its own.
    "qwen3_moe": ("Qwen3MoeConfig", dict(num_hidden_layers=2, head_dim=24, norm_topk_prob=True)),
    # A dense first layer, then MoE layers (two scan segments).
    "qwen3_moe_dense0": (
        "Qwen3MoeConfig",
        dict(num_hidden_layers=3, head_dim=24, norm_topk_prob=True, mlp_only_layers=[0]),
    ),
    # Qwen1.5-MoE's routing: top-k keeps its softmax mass; a shared expert behind a sigmoid.
    "qwen2_moe": (
        "Qwen2MoeConfig",
        dict(num_hidden_layers=2, norm_topk_prob=False, shared_expert_intermediate_size=48),
    ),
    # Every second layer MoE: dense, MoE, dense, MoE.
    "qwen2_moe_step2": (
        "Qwen2MoeConfig",
        dict(num_hidden_layers=4, decoder_sparse_step=2, shared_expert_intermediate_size=48),
    ),
}
MOE_LAYERS = {"qwen3_moe": (0, 1), "qwen3_moe_dense0": (1, 2), "qwen2_moe": (0, 1)}
MOE_LAYERS["qwen2_moe_step2"] = (1, 3)
# The logits are compared at F32_RTOL (tests/models/parity.py): measured on an AMD EPYC, each
# side is 1.8e-7 to 4e-7 of the logits' scale from a float64 run of transformers, and they are
# 3.8e-7 apart. The expert-parallel gradients are 2e-7 to 5e-6 of each gradient's own scale from
# the unsharded ones; the largest are the q/k weights' and biases', whose gradients are 1000x
# smaller than the rest (the rounding of the larger sums they come from is not), so their bound
# is 5e-5, 10x over the worst.
GRAD_RTOL = 5e-5
TOKENS = np.random.RandomState(0).randint(0, SMALL["vocab_size"], (2, 40))


def _hf_model(case, seed=0):
    """A random transformers model of ``case`` with every weight away from its init: norms near
    1, token embeddings that outweigh the q/k/v biases (or every token would pick the same
    experts), a router sharp enough that no top-k choice is a near tie, experts that matter."""
    cls, fields = CASES[case]
    config = getattr(transformers, cls)(**SMALL, **fields)
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim == 1:
                p.copy_(1.0 + 0.2 * torch.randn_like(p) if "norm" in name else torch.randn_like(p))
            elif name == "model.embed_tokens.weight":
                p.copy_(torch.randn_like(p))
            elif name.endswith(("mlp.gate.weight", "shared_expert_gate.weight")):
                p.copy_(0.5 * torch.randn_like(p))
            elif ".experts." in name:
                p.copy_(0.1 * torch.randn_like(p))
    return model


def _mesh(ep):
    """The learner's mesh of a colocated run on the 8 CPU devices: 'expert' (when ep > 1),
    then fsdp x tensor=2 over the rest."""
    return build_topology(MeshConfig(learner_tensor=2, expert_parallel=ep)).learner


def _ours(graphdef, params, mesh, tokens=TOKENS):
    """(logits [B, T, V], the experts each token used [B*T, Lm, k] sorted, the tokens each
    expert got [Lm, E]), the forward run as the learner runs it on ``mesh``: with
    ``sharding=``, so an 'expert' axis over 1 takes the expert-parallel path (each device its
    experts' tokens, then a psum), not GSPMD's partitioning of the unsharded one."""
    model = nnx.merge(graphdef, params)
    positions = np.tile(np.arange(tokens.shape[1]), (tokens.shape[0], 1))
    hidden, stats = model(
        jnp.asarray(tokens),
        jnp.asarray(positions),
        jnp.ones(tokens.shape, jnp.int32),
        moe_stats=True,
        sharding=(mesh, LEARNER_RULES),
    )
    routes = np.sort(np.asarray(stats.routes), -1)
    return np.asarray(model.logits(hidden)), routes.reshape(-1, *routes.shape[2:]), stats.load


def _theirs(model, tokens=TOKENS):
    """(logits [B, T, V], the experts each token used [B*T, Lm, k] sorted)."""
    with torch.no_grad():
        out = model(torch.tensor(tokens), output_router_logits=True)
    k = model.config.num_experts_per_tok
    routes = [torch.topk(layer, k, -1).indices.numpy() for layer in out.router_logits]
    return out.logits.float().numpy(), np.sort(np.stack(routes, 1), -1)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """``checkpoints(case)``: (the transformers model, its save_pretrained directory, its
    logits and routes), made once per case."""
    made = {}

    def get(case):
        if case not in made:
            model = _hf_model(case)
            path = tmp_path_factory.mktemp(case)
            model.save_pretrained(path)
            made[case] = model, path, _theirs(model)
        return made[case]

    return get


@pytest.fixture(params=list(CASES))
def saved(request, checkpoints):
    """(case, the transformers model, its save_pretrained directory, its logits and routes),
    every case."""
    return (request.param, *checkpoints(request.param))


def test_config_and_layer_kinds(saved):
    case, model, path, _ = saved
    cfg = load_hf(path, mesh=_mesh(1), rules=LEARNER_RULES)[0]
    assert cfg.family == case.split("_moe")[0] + "_moe"
    assert (cfg.num_experts, cfg.num_experts_per_tok, cfg.moe_intermediate_size) == (8, 2, 32)
    assert cfg.norm_topk_prob == model.config.norm_topk_prob
    assert cfg.qk_norm == cfg.family.startswith("qwen3")
    assert cfg.qkv_bias == cfg.family.startswith("qwen2")
    want = MOE_LAYERS[case]
    assert moe_layers(cfg) == want
    kinds = [type(layer.mlp).__name__.endswith("SparseMoeBlock") for layer in model.model.layers]
    assert tuple(i for i, moe in enumerate(kinds) if moe) == want
    assert dense_layers(cfg) == tuple(i for i, moe in enumerate(kinds) if not moe)


@pytest.mark.parametrize("ep", [1, 2, 4])
def test_logits_match_transformers(saved, ep):
    case, model, path, theirs = saved
    mesh = _mesh(ep)
    cfg, graphdef, params = load_hf(path, mesh=mesh, rules=LEARNER_RULES)
    pure = nnx.to_pure_dict(params)
    lm, e, d, fe = len(MOE_LAYERS[case]), 8, SMALL["hidden_size"], SMALL["moe_intermediate_size"]
    assert pure["we_gate"].shape == (lm, e, d, fe) and pure["we_down"].shape == (lm, e, fe, d)
    assert pure["router"].shape == (lm, d, e)
    n_dense = cfg.num_layers - lm
    assert ("w_gate" in pure) == bool(n_dense)
    if n_dense:
        assert pure["w_gate"].shape == (n_dense, d, SMALL["intermediate_size"])
    # Each device holds its expert shard's experts only.
    assert pure["we_up"].addressable_shards[0].data.shape[1] == e // ep
    logits, routes, load = _ours(graphdef, params, mesh)
    # The same experts for every token, and every expert of every layer has tokens (so the
    # logits check every expert's weights).
    np.testing.assert_array_equal(routes, theirs[1])
    assert np.all(np.asarray(load) > 0), load
    assert_logits_close(logits, theirs[0])


def test_weights_are_where_transformers_has_them(saved):
    case, model, path, _ = saved
    cfg, _, params = load_hf(path, mesh=_mesh(2), rules=LEARNER_RULES)
    pure = {k: np.asarray(v) for k, v in nnx.to_pure_dict(params).items()}
    fe = cfg.moe_intermediate_size
    for j, i in enumerate(moe_layers(cfg)):
        mlp = model.model.layers[i].mlp
        gate_up = mlp.experts.gate_up_proj.detach().numpy()  # [E, 2*Fe, D]
        down = mlp.experts.down_proj.detach().numpy()  # [E, D, Fe]
        np.testing.assert_array_equal(pure["we_gate"][j], gate_up[:, :fe].transpose(0, 2, 1))
        np.testing.assert_array_equal(pure["we_up"][j], gate_up[:, fe:].transpose(0, 2, 1))
        np.testing.assert_array_equal(pure["we_down"][j], down.transpose(0, 2, 1))
        np.testing.assert_array_equal(pure["router"][j], mlp.gate.weight.detach().numpy().T)
        if cfg.shared_expert_intermediate_size:
            gate = mlp.shared_expert_gate.weight.detach().numpy()  # [1, D]
            np.testing.assert_array_equal(pure["ws_router"][j], gate[0])
            up = mlp.shared_expert.up_proj.weight.detach().numpy()
            np.testing.assert_array_equal(pure["ws_up"][j], up.T)
    for j, i in enumerate(dense_layers(cfg)):
        down = model.model.layers[i].mlp.down_proj.weight.detach().numpy()
        np.testing.assert_array_equal(pure["w_down"][j], down.T)


def test_a_mis_mapped_expert_shows(saved):
    """The parity test fails on the bug it guards: the experts' down projections shifted by
    one expert (the router and gate/up projections still right)."""
    case, _, path, theirs = saved
    cfg, graphdef, params = load_hf(path, mesh=_mesh(1), rules=LEARNER_RULES)
    pure = nnx.to_pure_dict(params)
    nnx.replace_by_pure_dict(params, {**pure, "we_down": jnp.roll(pure["we_down"], 1, axis=1)})
    with pytest.raises(AssertionError):
        assert_logits_close(_ours(graphdef, params, _mesh(1))[0], theirs[0])


def _grads(path, ep, batch):
    tokens, targets = (jnp.asarray(a) for a in batch)
    mesh = _mesh(ep)
    cfg, graphdef, params = load_hf(path, mesh=mesh, rules=LEARNER_RULES)
    positions = jnp.broadcast_to(jnp.arange(tokens.shape[1]), tokens.shape)
    segments = jnp.ones(tokens.shape, jnp.int32)

    def loss(p):
        model = nnx.merge(graphdef, p)
        logits = model.logits(model(tokens, positions, segments, sharding=(mesh, LEARNER_RULES)))
        logp = jax.nn.log_softmax(logits.astype(jnp.float32))
        return jnp.mean(jnp.take_along_axis(logp, targets[..., None], -1))

    grads = jax.jit(jax.grad(loss))(params)
    return {k: np.asarray(v) for k, v in nnx.to_pure_dict(grads).items()}


@pytest.mark.parametrize("case", ["qwen3_moe_dense0", "qwen2_moe_step2"])
def test_gradients_agree_across_expert_parallelism(checkpoints, case):
    _, path, _ = checkpoints(case)
    targets = np.random.RandomState(1).randint(0, SMALL["vocab_size"], TOKENS.shape)
    one, four = _grads(path, 1, (TOKENS, targets)), _grads(path, 4, (TOKENS, targets))
    assert set(one) == set(four)
    for name, want in one.items():
        assert np.abs(want).max() > 0, name  # every weight, the router included, is trained
        assert_logits_close(four[name], want, rtol=GRAD_RTOL, err_msg=name)


def test_export_round_trip(saved, tmp_path):
    case, model, path, theirs = saved
    mesh = _mesh(2)
    cfg, graphdef, params = load_hf(path, mesh=mesh, rules=LEARNER_RULES)
    save_hf(tmp_path, cfg, params, max_shard_bytes=100_000)
    assert os.path.isfile(tmp_path / hf.INDEX_FILE)
    # The same tensor names and shapes as transformers' own save_pretrained.
    ours, reference = SafetensorsReader(str(tmp_path)), SafetensorsReader(str(path))
    assert ours._shapes == reference._shapes
    cfg2, _, params2 = load_hf(tmp_path, mesh=mesh, rules=LEARNER_RULES)
    assert cfg2 == cfg
    before, after = nnx.to_pure_dict(params), nnx.to_pure_dict(params2)
    assert sorted(before) == sorted(after)
    for name in before:
        a, b = np.asarray(before[name]), np.asarray(after[name])
        assert a.dtype == b.dtype and a.tobytes() == b.tobytes(), name  # bitwise
    config = json.loads((tmp_path / hf.CONFIG_FILE).read_text())
    assert config["architectures"] == [type(model).__name__]
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    for key in ("num_experts", "mlp_only_layers", "decoder_sparse_step", "norm_topk_prob"):
        assert getattr(reloaded.config, key) == getattr(model.config, key), key
    assert_logits_close(_theirs(reloaded)[0], theirs[0])


def test_fused_experts_on_disk(checkpoints, tmp_path):
    """transformers 5's in-memory layout saved as it is (save_original_format=False): each
    layer's experts in one gate_up_proj [E, 2*Fe, D] and one down_proj [E, D, Fe]."""
    model, path, _ = checkpoints("qwen2_moe_step2")
    model.save_pretrained(tmp_path, save_original_format=False)
    names = SafetensorsReader(str(tmp_path))._shapes
    assert "model.layers.1.mlp.experts.gate_up_proj" in names
    assert "model.layers.1.mlp.experts.0.up_proj.weight" not in names
    mesh = _mesh(2)
    _, _, want = load_hf(path, mesh=mesh, rules=LEARNER_RULES)
    _, _, got = load_hf(tmp_path, mesh=mesh, rules=LEARNER_RULES)
    want, got = nnx.to_pure_dict(want), nnx.to_pure_dict(got)
    assert sorted(want) == sorted(got)
    for name in want:
        np.testing.assert_array_equal(np.asarray(got[name]), np.asarray(want[name]), name)


def test_missing_expert_weight_is_refused(checkpoints, tmp_path):
    from safetensors.numpy import load_file, save_file

    case = "qwen2_moe_step2"
    _, path, _ = checkpoints(case)
    layer = MOE_LAYERS[case][-1]
    name = f"model.layers.{layer}.mlp.experts.5.up_proj.weight"
    tensors = load_file(os.path.join(path, hf.WEIGHTS_FILE))
    del tensors[name]
    save_file(tensors, str(tmp_path / hf.WEIGHTS_FILE), metadata={"format": "pt"})
    (tmp_path / hf.CONFIG_FILE).write_text((path / hf.CONFIG_FILE).read_text())
    message = (
        rf"model\.safetensors: tensor {re.escape(name)} \(expert 5 of 8 in layer "
        rf"{layer}\) is missing \(expected shape \[32, 64\] from .*config\.json\); the "
        r"checkpoint does not match its config: re-download the checkpoint"
    )
    with pytest.raises(ValueError, match=message):
        load_hf(tmp_path, mesh=_mesh(1), rules=LEARNER_RULES)
