"""The local (sliding-window) layers' own page pool, on a tiny random Gemma-3-shaped model:
greedy decoding 4x the window past the prompt gives the full forward's tokens and log-probs
(one token a call and several, prompts shorter and longer than the window); the pool holds
at most a window and a page per slot while the global one holds full lengths; a pool far
smaller than every slot at full length serves every slot without preempting; a conversation
continued on its kept pages (an extend) and a resumed request (a re-prefill) give the full
forward's tokens; a released slot gives every page back. Gemma 2's and Gemma 4's shapes decode
greedily to the full forward's tokens too, Gemma 4's with its mixture-of-experts block as well."""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from rljax.config import ModelConfig, SamplingConfig, replace
from rljax.engine.pools import pool_layout, window_page_count
from rljax.engine.sampler import Request, Sampler
from rljax.testing.engines import tiny_engine
from rljax.testing.turns import scripted

W, Z = 8, 4  # the local layers' window and the page size: a window spans 2 to 3 pages
GEMMA = ModelConfig(
    family="gemma3",
    vocab_size=64,
    hidden_size=64,
    intermediate_size=128,
    num_layers=4,
    num_heads=4,
    num_kv_heads=2,
    head_dim=16,
    layer_types=("sliding_attention", "sliding_attention", "full_attention", "sliding_attention"),
    sliding_window=W,
    qk_norm=True,
    post_norms=True,
    norm_unit_offset=True,
    scale_embeddings=True,
    hidden_act="gelu_pytorch_tanh",
    query_pre_attn_scalar=16,
    rope_local_base_freq=10_000.0,
    rope_theta=1_000_000.0,
    max_position_embeddings=128,
)
LOCAL, GLOBAL = 3, 1  # the model's local and global layers
NEW = 4 * W  # tokens decoded past each prompt
# Shorter than the window, about one window, and longer than it (16 > W: insert writes the
# early tokens of the local layers to the null page).
PROMPTS = [[3, 1, 4, 1, 5], [9, 2, 6, 5, 3, 5, 8, 9], [2, 7, 1, 8, 2, 8, 1, 8, 2, 8, 4, 5, 9]]
PROMPTS.append(list(range(40, 56)))
SLOTS = 4
SAMPLING = dict(
    temperature=0.0,
    max_new_tokens=NEW + 8,
    max_prefill_length=16,
    max_concurrent_decodes=SLOTS,
    page_size=Z,
)
# A full-length slot takes 14 pages of 4 tokens; the tight local pool holds the window's 3
# pages of every slot and the null page, less than a quarter of every slot at full length.
TIGHT_LOCAL_PAGES = SLOTS * window_page_count(W, Z) + 1


@pytest.fixture(scope="module")
def tight():
    """One token a call; a local pool with no page to spare beyond every slot's window."""
    return tiny_engine(
        model=GEMMA, seed=1, decode_steps=1, num_local_pages=TIGHT_LOCAL_PAGES, **SAMPLING
    )


@pytest.fixture(scope="module")
def multi():
    """Three tokens a call; the default pools."""
    return tiny_engine(model=GEMMA, seed=1, decode_steps=3, **SAMPLING)


@pytest.fixture(scope="module")
def sharded():
    """Two kv shards (the slots and both pools split over 'data'); the default pools."""
    devices = jax.devices()[:4]
    return tiny_engine(model=GEMMA, seed=1, decode_steps=1, devices=devices, data=2, **SAMPLING)


@pytest.fixture(scope="module")
def gemma2():
    """Gemma 2's shape: local and global layers alternating (every layer its own run), both
    soft-caps small enough to bend the scores and logits, no q/k norm; the default pools."""
    model = replace(
        GEMMA,
        family="gemma2",
        layer_types=("sliding_attention", "full_attention") * 2,
        qk_norm=False,
        rope_local_base_freq=None,
        attn_logit_softcapping=2.0,
        final_logit_softcapping=3.0,
    )
    return tiny_engine(model=model, seed=1, decode_steps=1, **SAMPLING)


@pytest.fixture(scope="module")
def gemma4():
    """Gemma 4's shape in the per-layer weights layout (the CPU's)."""
    return _gemma4_engine("per_layer")


@pytest.fixture(scope="module")
def gemma4_stacked():
    """Gemma 4's shape in the stacked weights layout (a TPU's)."""
    return _gemma4_engine("stacked")


@pytest.fixture(scope="module")
def gemma4_moe():
    """Gemma 4's shape with its mixture-of-experts block (experts beside every layer's MLP, on
    local and global layers), in the stacked weights layout (the per-layer one serves dense
    models only)."""
    return _gemma4_engine("stacked", GEMMA4_MOE, seed=SEED_MOE)


GEMMA4_MOE = dict(enable_moe_block=True, num_experts=4, num_experts_per_tok=2)
SEED_MOE = 3


def _gemma4_engine(layout: str, block: dict | None = None, seed: int = 1):
    """Gemma 4's shape: a value norm written to the cache, partial RoPE on the global layer, an
    attention scale of 1 and norms scaled by w; its layer scalars, norms and (with ``block``,
    the mixture-of-experts block's fields) router and expert scales random (the initialiser's
    are 1), so dropping any of them moves the tokens."""
    moe = dict(block, moe_intermediate_size=32, norm_topk_prob=True) if block else {}
    model = replace(
        GEMMA,
        family="gemma4",
        norm_unit_offset=False,
        v_norm=True,
        layer_scalar=True,
        partial_rotary_factor=0.25,
        query_pre_attn_scalar=1.0,
        **moe,
    )
    tiny = tiny_engine(model=model, seed=seed, decode_steps=1, weights_layout=layout, **SAMPLING)
    rng = np.random.default_rng(0)
    state = nnx.to_pure_dict(tiny.state)
    for name, x in state.items():
        if name.endswith(("norm", "_scale")) or name == "layer_scalar":
            noise = 1 + 0.3 * rng.standard_normal(x.shape).astype(np.float32)
            state[name] = jax.device_put(x * noise, x.sharding)
    nnx.replace_by_pure_dict(tiny.state, state)
    return dataclasses.replace(tiny, params=tiny.engine.load_params(tiny.state))


def _forward_logprobs(tiny, seq: list[int]) -> np.ndarray:
    """log_softmax of the full forward's logits at every position of ``seq`` [T, V]."""
    width = tiny.engine.max_seq_len
    buf = np.zeros((1, width), np.int32)
    buf[0, : len(seq)] = seq
    return np.asarray(_logprobs(tiny.graphdef, tiny.state, jnp.asarray(buf), len(seq)))[: len(seq)]


@functools.partial(jax.jit, static_argnums=0)
def _logprobs(graphdef, params, tokens, length):
    model = nnx.merge(graphdef, params)
    pos = jnp.arange(tokens.shape[1])[None]
    seg = (pos < length).astype(jnp.int32)
    return jax.nn.log_softmax(model.logits(model(tokens, pos, seg))[0], axis=-1)


def _assert_full_forward(tiny, prompt, traj):
    """Every model token of ``traj`` is the full forward's argmax after the sequence before it
    (env tokens taken as they are), with the full forward's log-prob."""
    seq = list(prompt) + list(traj.response_tokens)
    logp = _forward_logprobs(tiny, seq)
    mask = traj.loss_mask or [1] * len(traj.response_tokens)
    for i, (token, m) in enumerate(zip(traj.response_tokens, mask, strict=True)):
        if not m:
            continue
        row = logp[len(prompt) + i - 1]
        assert token == int(np.argmax(row)), f"token {i}"
        np.testing.assert_allclose(traj.logprobs[i], row[token], rtol=1e-4, atol=1e-5)


def _bound_checked_run(tiny, sampler, requests, *, min_steps=NEW):
    """Step ``sampler`` through ``requests`` (and whatever it has), checking the page
    accounting after each of its at least ``min_steps`` decode steps: the local pool holds at
    most a window and a call's lookahead per slot, the global pool every slot's tokens and its
    call's."""
    engine, steps = tiny.engine, sampler.decode_steps
    sampler.submit(requests)
    out, checked = [], 0
    while sampler.has_work():
        out += sampler.step()
        usage = engine.page_usage()
        pages = engine.pages
        positions = pages.positions[pages.active]
        assert usage["local_pages_held"] <= len(positions) * window_page_count(W, Z, steps)
        last = np.minimum(positions + steps, engine.max_seq_len) - 1
        assert usage["global_pages_held"] <= int(np.sum(last // Z + 1))
        if steps == 1:  # the figure: (window + a page) x local + length x global
            held = Z * (LOCAL * usage["local_pages_held"] + GLOBAL * usage["global_pages_held"])
            assert held <= int(np.sum(LOCAL * (W + Z) + GLOBAL * Z * (positions // Z + 1)))
        checked += bool(len(positions))
    assert checked >= min_steps // steps - 2  # prefill draws the first token; the last frees
    return sorted(out, key=lambda t: t.group_id)


@pytest.mark.parametrize(
    "which", ["tight", "multi", "sharded", "gemma2", "gemma4", "gemma4_stacked", "gemma4_moe"]
)
def test_greedy_past_the_window_is_the_full_forward_and_holds_a_window_of_pages(which, request):
    tiny = request.getfixturevalue(which)
    sampler = Sampler(tiny.engine, tiny.params)
    assert sampler.decode_steps == (3 if which == "multi" else 1)
    assert tiny.engine.kv_shards == (2 if which == "sharded" else 1)
    requests = [Request(p, max_new_tokens=NEW) for p in PROMPTS]
    trajs = _bound_checked_run(tiny, sampler, requests)
    for prompt, t in zip(PROMPTS, trajs, strict=True):
        assert len(t.response_tokens) == NEW
        assert len(set(t.response_tokens)) > 4, "the tokens must depend on what is attended"
        _assert_full_forward(tiny, prompt, t)
    # Out-of-window pages went back: no preemption and no call shortened, in a pool less than
    # a quarter of every slot at full length (tight; without freeing, these requests preempt).
    assert sampler.stats["preempted"] == 0 and sampler.stats["decode_calls_shortened"] == 0
    usage = tiny.engine.page_usage()
    assert usage["local_pages_held"] == usage["global_pages_held"] == 0
    local, shards = tiny.engine.pool_layout.pages_per_shard[1], tiny.engine.kv_shards
    if which == "tight":
        assert 4 * (local - 1) < SLOTS * tiny.engine.pages_per_slot
    assert usage["local_pages_free"] == shards * (local - 1)
    state = sampler.state  # the local pool is laid out as the global one
    assert state.local_k_pages.sharding == state.k_pages.sharding
    assert state.local_page_table.sharding == state.page_table.sharding


def test_a_released_slot_gives_back_its_local_pages(tight):
    engine = tight.engine
    state = engine.init_decode_state()
    prompt = PROMPTS[2]
    prefix, _ = engine.prefill_multisampling(
        params=tight.params, padded_tokens=prompt, true_length=len(prompt)
    )
    state = engine.bulk_insert(prefix, state, [1])
    # The insert took only the window's pages: positions [13 - 7, 13] are pages 1 to 3.
    assert engine.pages.pools[1].held_pages == 3 and engine.pages.pools[1].table[1, 0] == 0
    for _ in range(2 * W):
        state, _ = engine.generate(tight.params, state)
    usage = engine.page_usage()
    assert usage["local_pages_held"] <= window_page_count(W, Z)
    assert usage["global_pages_held"] == (len(prompt) + 2 * W) // Z + 1
    engine.free_resource(1)
    usage = engine.page_usage()
    assert usage["local_pages_held"] == usage["global_pages_held"] == 0
    assert usage["local_pages_free"] == TIGHT_LOCAL_PAGES - 1
    assert not engine.pages.pools[1].table.any()


@pytest.mark.parametrize("which", ["multi", "sharded"])
def test_a_conversation_continued_on_its_kept_pages_is_the_full_forward(which, request):
    """A model turn ends past the window; the env's answer (longer than the window) is
    prefilled onto the slot's kept pages, which hold only its window: every later model token
    is still the full forward's over the whole conversation."""
    multi = request.getfixturevalue(which)
    prompt = PROMPTS[0]
    (plain,) = Sampler(multi.engine, multi.params).run([Request(prompt, max_new_tokens=NEW)])
    tokens = plain.response_tokens
    k = next(i for i in range(W + 2, NEW) if tokens[i] not in tokens[:i])
    factory, _ = scripted([[60, 61, 62, 63, 60, 61, 62, 63, 10, 11, 12], [13, 14]])
    sampler = Sampler(multi.engine, multi.params, stop_ids=[tokens[k]])
    # Three samples take slots 0 to 2: both kv shards when there are two.
    request = Request(prompt, num_samples=3, max_new_tokens=NEW + 8, turns=factory)
    trajs = sampler.run([request])
    assert sampler.stats["turn_kv_kept"] >= 3 and sampler.stats["turn_re_prefills"] == 0
    for t in trajs:
        assert 0 in t.loss_mask and t.response_tokens[: k + 1] == tokens[: k + 1]
        assert len(t.response_tokens) > k + 1 + 11 + W, "the next turn must outrun the window"
        _assert_full_forward(multi, prompt, t)
    assert multi.engine.page_usage()["local_pages_held"] == 0


def test_a_resumed_request_re_prefills_and_is_the_full_forward(tight):
    """Interrupted past the window (its out-of-window pages long given back) and resumed: it is
    prefilled again from its tokens, so nothing depends on the pages it gave back."""
    sampler = Sampler(tight.engine, tight.params)
    request = Request(PROMPTS[1], max_new_tokens=NEW)
    sampler.submit([request])
    for _ in range(2 * W):
        sampler.step()
    assert sampler.interrupt(request.request_id) == 1
    assert tight.engine.page_usage()["local_pages_held"] == 0
    sampler.resume(request.request_id)
    (t,) = _bound_checked_run(tight, sampler, [], min_steps=NEW - 2 * W - 1)
    assert len(t.response_tokens) == NEW and sampler.stats["interrupted"] == 1
    _assert_full_forward(tight, PROMPTS[1], t)


def test_pool_sizes_and_refusals():
    """Default local pool, per shard: every slot's window and call (3 pages a slot at one
    token a call, 4 at three) plus one slot at full length (14 pages) and the null page; a
    window covering a slot gives the one pool; a local pool refused in one line."""
    cfg = SamplingConfig(**{**SAMPLING, "temperature": 1.0})
    layout = pool_layout(GEMMA, cfg, kv_shards=2, decode_steps=1)
    assert layout.layers == ((2,), (0, 1, 3)) and layout.window == W
    assert layout.pages_per_shard == (29, 2 * 3 + 14 + 1)
    assert pool_layout(GEMMA, cfg, kv_shards=2, decode_steps=3).pages_per_shard[1] == 23
    assert pool_layout(GEMMA, replace(cfg, num_local_pages=41), 2, 1).pages_per_shard[1] == 21
    covering = replace(GEMMA, sliding_window=cfg.max_seq_len)
    assert pool_layout(covering, cfg, 2, 1).layers == ((0, 1, 2, 3),)
    with pytest.raises(ValueError, match="num_local_pages' = 9 sizes a local layers' pool"):
        pool_layout(covering, replace(cfg, num_local_pages=9), 2, 1)
    with pytest.raises(ValueError, match=r"leaves each of the 2 kv shards 3 local pages, fewer"):
        pool_layout(GEMMA, replace(cfg, num_local_pages=6), 2, 1)
