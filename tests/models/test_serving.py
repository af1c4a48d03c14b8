"""The serving layout (rljax.models.serving): the Decoder's numbers from per-layer [out, in]
weights, on one device and sharded, and the matmul operand order it exists for."""

import dataclasses
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from rljax.config import ConfigError, SamplingConfig
from rljax.engine.sampler import Request, Sampler
from rljax.models.serving import ServingDecoder, serving_converter
from rljax.models.sharding import SAMPLER_RULES, make_mesh
from rljax.models.transformer import Decoder
from rljax.testing.configs import TINY_MODEL
from rljax.testing.engines import tiny_engine

VARIANTS = {
    "llama": TINY_MODEL,
    "tied": dataclasses.replace(TINY_MODEL, tie_embeddings=True),
    "qwen2_bias": dataclasses.replace(TINY_MODEL, qkv_bias=True),
    "qwen3_qk_norm": dataclasses.replace(TINY_MODEL, qk_norm=True, num_layers=3),
}


def _random_params(params):
    """Every weight random (biases and norms too), so a misplaced one changes the output."""
    leaves, treedef = jax.tree.flatten(params)
    keys = jax.random.split(jax.random.key(1), len(leaves))
    new = [0.3 * jax.random.normal(k, x.shape, x.dtype) + 1.0 for k, x in zip(keys, leaves)]
    return jax.tree.unflatten(treedef, new)


def _both(cfg, devices, tensor):
    mesh = make_mesh(devices, {"data": 1, "tensor": tensor})
    graphdef, params = nnx.split(Decoder(cfg, rngs=nnx.Rngs(0)))
    params = _random_params(params)
    serving = serving_converter(cfg, graphdef, mesh, SAMPLER_RULES)(params)
    return nnx.merge(graphdef, params), serving


@pytest.mark.parametrize("tensor", [1, 2])
@pytest.mark.parametrize("name", list(VARIANTS))
def test_serving_forward_decode_and_logits_equal_the_decoder(name, tensor):
    cfg = VARIANTS[name]
    model, serving = _both(cfg, jax.devices()[:tensor], tensor)
    assert len(serving.layers) == cfg.num_layers
    layer = serving.layers[0]
    assert layer["wq_t"].shape == (cfg.num_heads, cfg.head_dim, cfg.hidden_size)
    assert layer["wo_t"].shape == (cfg.hidden_size, cfg.num_heads, cfg.head_dim)
    assert layer["w_down_t"].shape == (cfg.hidden_size, cfg.intermediate_size)
    assert (serving.head_t is None) == cfg.tie_embeddings
    if tensor > 1:  # the heads axis is split over 'tensor' as in the stacked layout
        assert layer["wq_t"].sharding.spec[0] == "tensor"

    rng = np.random.default_rng(0)
    tokens = jnp.asarray(rng.integers(1, cfg.vocab_size, (2, 9)), jnp.int32)
    pos = jnp.asarray(np.r_[np.arange(5), np.arange(4)][None].repeat(2, 0), jnp.int32)
    seg = jnp.asarray(np.r_[np.ones(5), 2 * np.ones(4)][None].repeat(2, 0), jnp.int32)

    def forward(m):
        hidden, kv = m(tokens, pos, seg, return_kv=True, impl="xla")
        return m.logits(hidden), kv

    want, got = jax.jit(forward)(model), jax.jit(forward)(serving)
    for w, g in zip(jax.tree.leaves(want), jax.tree.leaves(got), strict=True):
        np.testing.assert_allclose(g, w, rtol=2e-5, atol=2e-5)

    # One decode step against a small paged cache: 2 slots, pages of 4.
    shape = (cfg.num_layers, cfg.num_kv_heads, 5, 4, cfg.head_dim)
    pages = jnp.asarray(rng.standard_normal(shape), jnp.float32)
    table = jnp.asarray([[1, 2], [3, 4]], jnp.int32)

    def decode(m):
        positions = jnp.asarray([5, 2])
        hidden, kp, vp = m.decode(tokens[:, 0], positions, pages, pages, table, impl="xla")
        return m.logits(hidden), kp, vp

    want, got = jax.jit(decode)(model), jax.jit(decode)(serving)
    for w, g in zip(want, got, strict=True):
        np.testing.assert_allclose(g, w, rtol=2e-5, atol=2e-5)


def test_every_weight_is_the_left_operand_of_its_decode_matmul():
    """What the layout exists for: ``[out, in] @ [in, rows]``, never ``rows @ W^T``.

    XLA folds a transpose into a dot by swapping its operands when it can; the serving
    projections' barriers stop it. In the compiled decode step (2 slots) every dot of a weight
    (the dots without batch dimensions; attention's have them) yields [out, 2], never [2, out].
    """
    cfg = VARIANTS["tied"]
    _, serving = _both(cfg, jax.devices()[:1], 1)
    pages = jnp.zeros((cfg.num_layers, cfg.num_kv_heads, 5, 4, cfg.head_dim))
    ids = jnp.asarray([3, 4], jnp.int32)
    table = jnp.asarray([[1, 2], [3, 4]], jnp.int32)

    def step(m, pages):
        hidden, _, _ = m.decode(ids, ids, pages, pages, table, impl="xla")
        return m.logits(hidden)

    hlo = jax.jit(step).lower(serving, pages).compile().as_text()
    dots = [line for line in hlo.splitlines() if " dot(" in line and "batch_dims" not in line]
    shapes = [tuple(map(int, re.search(r"f32\[(\d+),(\d+)\]", d).groups())) for d in dots]
    # q, k, v, o, gate, up, down per layer, and the head.
    assert len(shapes) == 7 * cfg.num_layers + 1, dots
    assert all(rows == 2 and out > 2 for out, rows in shapes), shapes


def test_engine_layouts_sample_the_same_tokens_and_logprobs():
    """A sampled (not greedy) run: per_layer and stacked draw the same tokens and log-probs."""
    runs = {}
    for layout in ("stacked", "per_layer"):
        tiny = tiny_engine(temperature=1.0, top_k=5, weights_layout=layout)
        assert tiny.engine.weights_layout == layout
        assert isinstance(tiny.params, ServingDecoder) == (layout == "per_layer")
        reqs = [Request([1, 4, 6, 2, 3], num_samples=3, seed=1), Request([5, 9], 2, seed=2)]
        trajs = Sampler(tiny.engine, tiny.params).run(reqs)
        runs[layout] = sorted(trajs, key=lambda t: (t.group_id, t.sample_index))
    for a, b in zip(runs["stacked"], runs["per_layer"], strict=True):
        assert a.response_tokens == b.response_tokens
        np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-5)


def test_auto_layout_is_per_layer_on_the_cpu_and_a_sampler_swap_converts():
    tiny = tiny_engine()
    assert tiny.engine.weights_layout == "per_layer"
    sampler = Sampler(tiny.engine, tiny.state)  # the learner's layout in, the serving one used
    assert isinstance(sampler.params, ServingDecoder)
    sampler.set_params(tiny.state, version=1)
    assert isinstance(sampler.params, ServingDecoder) and sampler.version == 1
    with pytest.raises(ValueError, match="already serves"):
        tiny.engine.load_params(tiny.params)


def test_a_bad_layout_is_a_one_line_config_error():
    with pytest.raises(ConfigError, match="sampling.weights_layout") as exc:
        SamplingConfig(weights_layout="columns")
    assert "\n" not in str(exc.value)
