"""The mixture-of-experts layer: dropless experts, forced routes, layer segments, statistics and
expert parallelism, at the model level (tests/models/test_moe_hf.py checks against transformers).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from rljax.config import ModelConfig
from rljax.models import layer_runs, moe
from rljax.models.sharding import LEARNER_RULES, SAMPLER_RULES, make_mesh, state_shardings
from rljax.models.transformer import Decoder

CFG = ModelConfig(
    family="qwen2_moe",
    vocab_size=64,
    hidden_size=32,
    intermediate_size=48,
    num_layers=3,
    num_heads=4,
    num_kv_heads=2,
    head_dim=8,
    num_experts=8,
    num_experts_per_tok=2,
    moe_intermediate_size=16,
    shared_expert_intermediate_size=24,
    mlp_only_layers=(1,),
)
B, T = 4, 9


def _inputs(b=B, t=T):
    tokens = jax.random.randint(jax.random.key(1), (b, t), 0, CFG.vocab_size)
    positions = jnp.broadcast_to(jnp.arange(t), (b, t))
    segments = jnp.ones((b, t), jnp.int32).at[-1, -3:].set(0)  # three padding tokens
    return tokens, positions, segments


def _every_expert(x, ids, weights, wg, wu, wd):
    """Each token through all E experts, weighed by a dense [N, E] gate: the definition."""
    outs = jnp.stack(
        [(jax.nn.silu(x @ wg[e]) * (x @ wu[e])) @ wd[e] for e in range(wg.shape[0])], axis=1
    )
    gate = (
        jnp.zeros((x.shape[0], wg.shape[0])).at[jnp.arange(x.shape[0])[:, None], ids].add(weights)
    )
    return jnp.einsum("NED,NE->ND", outs, gate)


@pytest.mark.parametrize("pairs", ["tiled", "ragged_dot", "pallas", "gathered"])
def test_dropless_experts_equal_every_expert_dense_with_empty_experts(pairs):
    m = Decoder(CFG, rngs=nnx.Rngs(0))
    wg, wu, wd = (getattr(m, k)[...][0] for k in ("we_gate", "we_up", "we_down"))
    x = jax.random.normal(jax.random.key(2), (20, CFG.hidden_size))
    # Experts 0, 4 and 7 receive no token; expert 2 most of them (uneven groups).
    ids = jnp.asarray(np.random.default_rng(0).choice([1, 2, 2, 2, 3, 5, 6], (20, 2)), jnp.int32)
    weights = jax.random.uniform(jax.random.key(3), (20, 2))
    want = _every_expert(x, ids, weights, wg, wu, wd)
    if pairs == "gathered":
        got = moe.experts_gathered(x, ids, weights, wg, wu, wd)
    elif pairs == "pallas":
        got = moe.experts_sorted(x, ids, weights, wg, wu, wd, impl="pallas")
    else:
        got = moe.experts_sorted(x, ids, weights, wg, wu, wd, impl="xla", xla_form=pairs)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("tile", [None, 4, 8])
def test_fused_tiles_equal_three_grouped_matmuls_with_other_shards_experts(tile):
    """experts_tiled (the CPU's path) against experts_sorted through ragged_dot, values and
    gradients, on local experts 2..5 of 8 (an expert shard): pairs of experts 0, 1, 6, 7 add
    nothing, expert 4 gets none, tiles of 4 split groups over several tiles."""
    m = Decoder(CFG, rngs=nnx.Rngs(0))
    wg, wu, wd = (getattr(m, k)[...][0][2:6] for k in ("we_gate", "we_up", "we_down"))
    x = jax.random.normal(jax.random.key(4), (18, CFG.hidden_size))
    ids = jnp.asarray(np.random.default_rng(1).choice([0, 2, 2, 3, 5, 5, 5, 6], (18, 2)), jnp.int32)
    weights = jax.random.uniform(jax.random.key(5), (18, 2))

    def loss(fn, x, weights, wg, wu, wd):
        out = fn(x, ids, weights, wg, wu, wd, first=2)
        return jnp.sum(out * jnp.cos(out)), out

    tiled = lambda *a, **kw: moe.experts_tiled(*a, **kw, tile=tile)  # noqa: E731
    ragged = lambda *a, **kw: moe.experts_sorted(*a, **kw, xla_form="ragged_dot")  # noqa: E731
    args = (x, weights, wg, wu, wd)
    (_, got), got_grads = jax.value_and_grad(loss, argnums=(1, 2, 3, 4, 5), has_aux=True)(
        tiled, *args
    )
    (_, want), want_grads = jax.value_and_grad(loss, argnums=(1, 2, 3, 4, 5), has_aux=True)(
        ragged, *args
    )
    assert float(jnp.abs(want).max()) > 0.1
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    for g, w in zip(got_grads, want_grads, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)
    assert float(jnp.abs(want_grads[2][2]).max()) == 0.0  # local expert 2 (expert 4): no pair


def test_segments_follow_the_sparse_step_and_the_dense_layers():
    assert moe.moe_layers(CFG) == (0, 2)
    assert [tuple(s) for s in layer_runs.segments(CFG)] == [
        (0, 1, True, 0, None, False, 0),
        (1, 2, False, 1, None, True, 0),
        (2, 3, True, 1, None, False, 1),
    ]
    step2 = ModelConfig(
        **{**CFG.__dict__, "mlp_only_layers": (), "decoder_sparse_step": 2, "num_layers": 4}
    )
    assert moe.moe_layers(step2) == (1, 3)
    m = Decoder(CFG, rngs=nnx.Rngs(0))
    assert m.w_gate.shape[0] == 1 and m.we_gate.shape[:2] == (2, 8) and m.router.shape == (2, 32, 8)


def test_forced_routes_are_used_and_the_router_still_learns():
    """A learner whose router is perturbed routes differently; forcing the recorded routes gives
    the recorded experts back, and the router still gets a gradient."""
    m = Decoder(CFG, rngs=nnx.Rngs(0))
    tokens, positions, segments = _inputs()
    _, recorded = m(tokens, positions, segments, moe_stats=True)
    m.router[...] = m.router[...] + 0.5 * jax.random.normal(jax.random.key(9), m.router.shape)
    _, free = m(tokens, positions, segments, moe_stats=True)
    forced = jnp.ones((B, T), bool)
    _, replayed = m(tokens, positions, segments, routes=(recorded.routes, forced), moe_stats=True)
    assert not np.array_equal(free.routes, recorded.routes)
    np.testing.assert_array_equal(replayed.routes, recorded.routes)
    # Only where forced: the last row routes afresh.
    part = forced.at[-1].set(False)
    _, mixed = m(tokens, positions, segments, routes=(recorded.routes, part), moe_stats=True)
    np.testing.assert_array_equal(mixed.routes[:-1], recorded.routes[:-1])
    np.testing.assert_array_equal(mixed.routes[-1], free.routes[-1])

    graphdef, params = nnx.split(m)

    def loss(p):
        model = nnx.merge(graphdef, p)
        h = model(tokens, positions, segments, routes=(recorded.routes, forced))
        return (model.logits(h) ** 2).mean()

    assert float(jnp.abs(jax.grad(loss)(params)["router"][...]).sum()) > 0


def test_statistics_count_valid_tokens_and_match_the_definitions():
    m = Decoder(CFG, rngs=nnx.Rngs(0))
    tokens, positions, segments = _inputs()
    _, stats = m(tokens, positions, segments, moe_stats=True)
    valid = int((segments > 0).sum())
    assert stats.routes.shape == (B, T, 2, 2) and stats.routes.dtype == jnp.int32
    np.testing.assert_allclose(stats.load.sum(-1), [valid * 2] * 2)
    # The load is the count of each expert among the valid tokens' routes.
    r = np.asarray(stats.routes)[np.asarray(segments) > 0]  # [valid, Lm, k]
    for layer in range(2):
        np.testing.assert_allclose(stats.load[layer], np.bincount(r[:, layer].ravel(), minlength=8))
    assert float(stats.aux_loss) > 0 and float(stats.z_loss) > 0


def _forward_and_grads(params, graphdef, mesh, rules, shape=(B, T)):
    tokens, positions, segments = _inputs(*shape)
    params = jax.device_put(params, state_shardings(params, mesh, rules))

    def loss(p):
        model = nnx.merge(graphdef, p)
        h, stats = model(
            tokens, positions, segments, moe_stats=True, sharding=(mesh, rules), impl="xla"
        )
        return (model.logits(h) ** 2).mean() + stats.aux_loss, (model.logits(h), stats.routes)

    (_, (logits, routes)), grads = jax.jit(jax.value_and_grad(loss, has_aux=True))(params)
    return np.asarray(logits), np.asarray(routes), jax.tree.map(np.asarray, grads)


@pytest.mark.parametrize("ep", [2, 4])
@pytest.mark.parametrize(
    "role, shape",
    [
        ("learner", (B, T)),
        ("sampler", (B, T)),
        # A decode-sized batch: 8 tokens x top 2 = 16 (token, expert) pairs, so each expert
        # shard gathers its pairs' weights (experts_gathered) instead of sorting them.
        ("sampler", (2, 4)),
    ],
)
def test_expert_parallel_matches_one_device(ep, role, shape):
    graphdef, params = nnx.split(Decoder(CFG, rngs=nnx.Rngs(0)))
    one = make_mesh(jax.devices()[:1], {"fsdp": 1, "tensor": 1})
    want = _forward_and_grads(params, graphdef, one, LEARNER_RULES, shape)
    data = "fsdp" if role == "learner" else "data"
    rules = LEARNER_RULES if role == "learner" else SAMPLER_RULES
    mesh = make_mesh(jax.devices()[:8], {"expert": ep, data: 8 // ep // 2, "tensor": 2})
    tokens = shape[0] * shape[1]
    assert moe._expert_axes((mesh, rules), 8, tokens) is not None  # the shard_map path
    gathered = tokens * CFG.num_experts_per_tok <= moe.GATHER_MAX_PAIRS
    assert gathered == (shape != (B, T))  # each shape takes the path its comment names
    logits, routes, grads = _forward_and_grads(params, graphdef, mesh, rules, shape)
    np.testing.assert_allclose(logits, want[0], rtol=1e-4, atol=1e-5)
    np.testing.assert_array_equal(routes, want[1])
    for got, ref in zip(jax.tree.leaves(grads), jax.tree.leaves(want[2]), strict=True):
        np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-6)


def test_an_expert_count_the_expert_axis_does_not_divide_is_refused():
    mesh = make_mesh(jax.devices()[:8], {"expert": 8, "fsdp": 1, "tensor": 1})
    with pytest.raises(ValueError, match="set mesh.expert_parallel to a divisor"):
        moe._expert_axes((mesh, LEARNER_RULES), 6, 16)
