"""Gemma 4's mixture-of-experts block (``enable_moe_block``) against transformers.

A tiny random ``Gemma4ForCausalLM`` with the block on every layer (local and global layers, a
sequence five times the window), its norms, router scales and per-expert scales random (their
initialisers' are 1), loads through ``load_hf`` with logits within float32's precision of
transformers', and each part of the block moves them (checked by undoing it on the same
weights). ``save_hf`` writes the tensors transformers writes (the experts fused) and
transformers reads them back to the same logits. Gradients of every tensor match torch's.
Forcing the routes a forward recorded gives its logits back after the router moved (rollout
routing replay), and forcing other routes changes them.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from rljax.config import MeshConfig
from rljax.mesh.topology import build_topology
from rljax.models import hf
from rljax.models.families import config_from_hf, config_to_hf
from rljax.models.hf import load_hf, save_hf
from rljax.models.hf_fused import fused_tensors
from rljax.models.sharding import LEARNER_RULES, make_mesh
from rljax.models.transformer import abstract_decoder
from tests.models.parity import assert_logits_close, hf_logits, randomise_norms, rljax_logits

torch = pytest.importorskip("torch", reason="parity tests compare against transformers on torch")
transformers = pytest.importorskip("transformers", reason="parity tests need transformers")

WINDOW, EXPERTS, TOP_K = 8, 8, 2
TOKENS = np.random.RandomState(0).randint(1, 96, (2, 5 * WINDOW))  # no pad id: see the grads


def _hf_model(seed=0):
    config = transformers.Gemma4TextConfig(
        vocab_size=96,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        global_head_dim=16,  # built: the global layers' heads as wide as the local ones'
        hidden_size_per_layer_input=0,
        max_position_embeddings=128,
        rms_norm_eps=1e-5,
        sliding_window=WINDOW,
        layer_types=["sliding_attention", "sliding_attention", "full_attention", "full_attention"],
        final_logit_softcapping=1.5,
        enable_moe_block=True,
        num_experts=EXPERTS,
        top_k_experts=TOP_K,
        moe_intermediate_size=24,
    )
    config._attn_implementation = "eager"
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    randomise_norms(model, 1.0)  # norms, router and expert scales about 1 but not 1
    return model


@pytest.fixture(scope="module")
def mesh():
    return make_mesh(jax.devices(), {"fsdp": 4, "tensor": 2})


@pytest.fixture(scope="module")
def loaded(mesh, tmp_path_factory):
    """(transformers' model, its directory, rljax's cfg, graphdef, params)."""
    model = _hf_model()
    path = tmp_path_factory.mktemp("gemma4_moe")
    model.save_pretrained(path)
    return (model, path, *load_hf(path, mesh=mesh, rules=LEARNER_RULES))


def test_logits_match_transformers_and_each_part_of_the_block_moves_them(loaded):
    model, _, cfg, graphdef, params = loaded
    assert cfg.family == "gemma4" and cfg.enable_moe_block and cfg.norm_topk_prob
    assert (cfg.num_experts, cfg.num_experts_per_tok, cfg.moe_intermediate_size) == (8, 2, 24)
    want = hf_logits(model, TOKENS)
    assert_logits_close(rljax_logits(graphdef, params, TOKENS), want)

    def assert_moves(p, what, graph=graphdef):
        gap = np.abs(rljax_logits(graph, p, TOKENS) - want).max()
        assert gap > 1e-2 * np.abs(want).max(), (what, gap)

    pure = nnx.to_pure_dict(params)
    for name in ("router_scale", "expert_scale", "dense_post_norm", "moe_norm", "moe_post_norm"):
        assert_moves(pure | {name: np.ones_like(pure[name])}, name)
    assert_moves(pure | {"we_down": np.zeros_like(pure["we_down"])}, "the experts")
    unrenormalised = dataclasses.replace(cfg, norm_topk_prob=False)
    assert_moves(params, "norm_topk_prob", nnx.split(abstract_decoder(unrenormalised))[0])


@pytest.mark.parametrize("ep", [2, 4])
def test_expert_parallel_logits_match(loaded, ep):
    """The experts split over an 'expert' mesh axis of 2 or 4 (each device holding E / ep
    whole experts, GeGLU run per shard) give transformers' logits too."""
    model, path, *_ = loaded
    mesh = build_topology(MeshConfig(learner_tensor=2, expert_parallel=ep)).learner
    _, graphdef, params = load_hf(path, mesh=mesh, rules=LEARNER_RULES)
    assert nnx.to_pure_dict(params)["we_up"].addressable_shards[0].data.shape[1] == EXPERTS // ep
    m = nnx.merge(graphdef, params)
    positions = jnp.broadcast_to(jnp.arange(TOKENS.shape[1]), TOKENS.shape)
    segments = jnp.ones(TOKENS.shape, jnp.int32)
    # sharding=: the experts run under shard_map over the expert axis, as the learner's do.
    hidden = m(jnp.asarray(TOKENS), positions, segments, sharding=(mesh, LEARNER_RULES))
    assert_logits_close(np.asarray(m.logits(hidden)), hf_logits(model, TOKENS))


def test_save_hf_writes_transformers_tensors_and_reloads(loaded, tmp_path):
    model, path, cfg, _, params = loaded
    save_hf(tmp_path, cfg, params)
    theirs = hf.SafetensorsReader(str(path))
    ours = hf.SafetensorsReader(str(tmp_path))
    assert set(ours.names()) == set(theirs.names())  # the experts fused, as transformers has
    for name in theirs.names():
        whole = tuple(slice(0, n) for n in theirs.shape(name))
        np.testing.assert_array_equal(ours.read(name, whole), theirs.read(name, whole), name)
    assert config_from_hf(config_to_hf(cfg)) == cfg
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert_logits_close(hf_logits(reloaded, TOKENS), hf_logits(model, TOKENS))


def test_gradients_match_torch(loaded):
    """Every tensor's gradient of one weighted sum of the logits, the router's scales and the
    fused experts' included (routing is discrete: the chosen experts' weights carry it)."""
    model, _, cfg, graphdef, params = loaded
    weights = np.random.RandomState(1).standard_normal((*TOKENS.shape, 96)).astype(np.float32)

    def loss(p):
        m = nnx.merge(graphdef, p)
        positions = jnp.broadcast_to(jnp.arange(TOKENS.shape[1]), TOKENS.shape)
        hidden = m(jnp.asarray(TOKENS), positions, jnp.ones(TOKENS.shape, jnp.int32), impl="xla")
        return jnp.sum(m.logits(hidden) * weights)

    grads = jax.jit(jax.grad(loss))(params)
    ours = dict(fused_tensors(hf.hf_tensors(cfg, grads), cfg.num_experts))
    for layer in model.model.layers:  # a buffer in transformers: made a parameter for its grad
        scalar = layer._buffers.pop("layer_scalar")
        layer.layer_scalar = torch.nn.Parameter(scalar.clone())
    model.zero_grad()
    (model(torch.tensor(TOKENS)).logits * torch.tensor(weights)).sum().backward()
    theirs = {name: p.grad.numpy() for name, p in model.named_parameters()}
    assert set(ours) == set(theirs)
    scalars = [f"model.layers.{i}.layer_scalar" for i in range(cfg.num_layers)]
    ours["scalars"] = np.concatenate([ours.pop(n) for n in scalars])
    theirs["scalars"] = np.concatenate([theirs.pop(n) for n in scalars])
    for name, grad in theirs.items():  # f32 gradients summed in another order, at each scale
        assert_logits_close(ours[name], grad, rtol=1e-4, err_msg=name)


def test_forced_routes_replay_the_recorded_experts(loaded):
    _, _, cfg, graphdef, params = loaded
    model = nnx.merge(graphdef, params)
    tokens = jnp.asarray(TOKENS)
    positions = jnp.broadcast_to(jnp.arange(TOKENS.shape[1]), TOKENS.shape)
    segments = jnp.ones(TOKENS.shape, jnp.int32)
    hidden, stats = model(tokens, positions, segments, moe_stats=True)
    assert stats.routes.shape == (*TOKENS.shape, cfg.num_layers, TOP_K)
    # The learner's router has moved since the rollout: it routes many tokens elsewhere.
    moved = nnx.to_pure_dict(params)
    scale = moved["router_scale"]
    moved["router_scale"] = scale * (1 + jax.random.normal(jax.random.key(3), scale.shape))
    learner = nnx.merge(graphdef, moved)
    _, free = learner(tokens, positions, segments, moe_stats=True)
    assert np.mean(np.asarray(free.routes) != np.asarray(stats.routes)) > 0.05
    forced = jnp.ones(TOKENS.shape, bool)
    replayed, again = learner(
        tokens, positions, segments, routes=(stats.routes, forced), moe_stats=True
    )
    np.testing.assert_array_equal(again.routes, stats.routes)
    shifted = (stats.routes + 1) % cfg.num_experts
    elsewhere = learner(tokens, positions, segments, routes=(shifted, forced))
    gap = np.abs(np.asarray(elsewhere - replayed)).max()
    assert gap > 1e-2 * np.abs(np.asarray(hidden)).max()
