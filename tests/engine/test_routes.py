"""Routes recorded by the engine (a mixture-of-experts model): each model token of a response
carries the experts it was routed to when it was fed, the forward that drew the next model
token, whether that was a decode step, a resumed sample's prefill or a conversation's extend.
The reference is a full forward of the whole sequence under the params that drew that next
token (``versions``); the last token (never fed), prompt and env tokens carry none."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from rljax.config import ModelConfig, SamplingConfig
from rljax.engine.paged import PagedEngine
from rljax.engine.sampler import Request, Sampler
from rljax.engine.samples import ENV_VERSION
from rljax.models.sharding import SAMPLER_RULES, make_mesh
from rljax.models.transformer import init_sharded
from rljax.testing.turns import scripted

# 3 layers, the first dense: Lm = 2 MoE layers x k = 2 experts of 8.
MOE = ModelConfig(
    family="qwen3_moe",
    vocab_size=32,
    hidden_size=32,
    intermediate_size=64,
    num_layers=3,
    num_heads=2,
    num_kv_heads=1,
    head_dim=16,
    num_experts=8,
    num_experts_per_tok=2,
    moe_intermediate_size=16,
    mlp_only_layers=(0,),
)
WIDTH = 2 * 2
PROMPT = [3, 1, 4, 1, 5]


@pytest.fixture(scope="module")
def moe():
    """An engine over the tiny MoE model (recording routes), and two params states."""
    mesh = make_mesh(jax.devices()[:1], {"data": 1, "tensor": -1})
    graphdef, state_a = init_sharded(MOE, mesh, SAMPLER_RULES, 0)
    _, state_b = init_sharded(MOE, mesh, SAMPLER_RULES, 1)
    cfg = SamplingConfig(
        max_new_tokens=14, max_prefill_length=16, max_concurrent_decodes=4, page_size=4
    )
    engine = PagedEngine(MOE, cfg, mesh, graphdef)
    assert engine.record_routes, "a mixture-of-experts engine records routes by default"
    return engine, graphdef, (state_a, state_b)


@functools.cache
def _forward_routes(graphdef):
    @jax.jit
    def routes(state, tokens):
        model = nnx.merge(graphdef, state)
        t = tokens.shape[1]
        pos = jnp.arange(t)[None]
        _, stats = model(tokens, pos, jnp.ones_like(pos), moe_stats=True, impl="xla")
        return stats.routes[0].reshape(t, -1)

    return routes


def _check(t, graphdef, states):
    """Every model token but the last carries the routes a full forward under the params of the
    next model token's version gives at its position; the others carry none."""
    n, p = len(t.response_tokens), len(t.prompt_tokens)
    assert t.routes is not None and len(t.routes) == n
    seq = jnp.asarray([t.prompt_tokens + t.response_tokens], jnp.int32)
    full = {v: np.asarray(_forward_routes(graphdef)(states[v], seq)) for v in set(t.versions)}
    mask = t.loss_mask or [1] * n
    checked = 0
    for j in range(n):
        later = [t.versions[i] for i in range(j + 1, n) if mask[i]]
        if not mask[j] or not later:
            assert t.routes[j] == [], (j, "an env token or the last model token")
            continue
        assert len(t.routes[j]) == WIDTH
        assert t.routes[j] == full[later[0]][p + j].tolist(), j
        checked += 1
    return checked


def test_decoded_tokens_carry_their_routes(moe):
    engine, graphdef, (state_a, _) = moe
    sampler = Sampler(engine, engine.load_params(state_a))
    trajs = sampler.run([Request(PROMPT, num_samples=3, seed=5)])
    assert sum(_check(t, graphdef, [state_a]) for t in trajs) >= 3 * 12


def test_a_swap_keeps_each_token_s_first_routes(moe):
    """A swap in mode 'recompute' re-prefills the running sample under new params: the tokens
    fed before it keep their routes (old params), the ones fed after carry the new params'."""
    engine, graphdef, (state_a, state_b) = moe
    sampler = Sampler(engine, engine.load_params(state_a), swap_mode="recompute", decode_steps=1)
    sampler.submit([Request(PROMPT, num_samples=1, seed=2)])
    for _ in range(5):
        assert not sampler.step()
    sampler.set_params(engine.load_params(state_b), 1)
    (t,) = sampler.run()
    assert {0, 1} <= set(t.versions)
    assert _check(t, graphdef, [state_a, state_b]) == len(t.response_tokens) - 1


def test_a_resumed_sample_records_what_its_prefill_feeds(moe):
    engine, graphdef, (state_a, _) = moe
    sampler = Sampler(engine, engine.load_params(state_a), decode_steps=2)  # 9 of 14 tokens
    (rid,) = sampler.submit([Request(PROMPT, num_samples=1, seed=9)])
    for _ in range(4):
        sampler.step()
    assert sampler.interrupt(rid) == 1
    sampler.resume(rid)
    (t,) = sampler.run()
    assert _check(t, graphdef, [state_a]) == len(t.response_tokens) - 1


def test_a_conversation_s_extend_records_the_turn_s_last_token(moe):
    """The stop token ending a model turn is fed by the next turn's extend: it carries those
    routes; the env's tokens carry none."""
    engine, graphdef, (state_a, _) = moe
    stop = [0, 7, 12, 20]
    factory, made = scripted([[9, 8], [6]])
    sampler = Sampler(engine, engine.load_params(state_a), stop_ids=stop)
    trajs = sampler.run([Request(PROMPT, num_samples=2, seed=4, turns=factory)])
    ended = 0
    for t in trajs:
        _check(t, graphdef, [state_a])
        assert ENV_VERSION in t.versions, "the conversation must have an env turn"
        for j in range(len(t.response_tokens) - 1):
            if t.loss_mask[j] and not t.loss_mask[j + 1]:  # a model turn's stop token
                assert t.routes[j], "fed by the extend of the next turn"
                ended += 1
    assert ended >= 2


def test_a_dense_engine_records_nothing():
    with pytest.raises(ValueError, match="record_routes=True for the dense"):
        PagedEngine(
            ModelConfig(),
            SamplingConfig(max_new_tokens=4, max_prefill_length=8),
            make_mesh(jax.devices()[:1], {"data": 1, "tensor": -1}),
            None,
            record_routes=True,
        )
