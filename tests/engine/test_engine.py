"""Engine and Sampler: paged KV decode equals full recompute, swaps, paging, bad input."""

import jax
import numpy as np
import pytest

from rljax.config import ConfigError, SamplingConfig
from rljax.engine.engine import SlotSampling
from rljax.engine.pages import OutOfPages
from rljax.engine.sampler import Request, Sampler
from rljax.testing.engines import tiny_engine


@pytest.fixture(scope="module")
def tiny():
    return tiny_engine(temperature=0.0)


def _requests(rng, n, *, samples=1):
    return [
        Request(
            list(rng.integers(1, 18, size=int(rng.integers(1, 16)))),
            num_samples=samples,
            max_new_tokens=int(rng.integers(1, 12)),
            seed=i,
        )
        for i in range(n)
    ]


def test_greedy_continuous_batching_equals_full_recompute(tiny):
    """Mixed prompt and response lengths, 4 slots reused by 8 requests x 2 samples."""
    sampler = Sampler(tiny.engine, tiny.params)
    trajs = sampler.run(_requests(np.random.default_rng(0), 8, samples=2))
    assert len(trajs) == 16
    assert sampler.stats["prefills"] == 8  # one prefill shared by each group
    assert sampler.stats["prefill_calls"] < 8  # groups that fit the free slots share a call
    for t in trajs:
        want = tiny.greedy_reference(t.prompt_tokens, len(t.response_tokens))
        assert t.response_tokens == want


def test_prefill_draws_the_first_token_and_generate_continues(tiny):
    """prefill -> device_put to the prefix destination -> insert -> generate loop -> free."""
    eng = tiny.jetstream
    state = eng.init_decode_state()
    prompt = [1, 5, 7, 9, 3]
    padded = np.zeros(8, np.int32)
    padded[: len(prompt)] = prompt
    prefix, first = eng.prefill(params=tiny.params, padded_tokens=padded, true_length=len(prompt))
    first = first.convert_to_numpy().get_result_at_slot(0)
    assert first.valid.tolist() == [[1]] and first.lengths.tolist() == [1]
    out = [int(first.tokens[0, 0])]
    prefix = jax.device_put(prefix, eng.get_prefix_destination_sharding())
    state = eng.insert(prefix, state, slot=2)
    for _ in range(5):
        state, result = eng.generate(tiny.params, state)
        result = result.convert_to_numpy()
        got = result.get_result_at_slot(2)
        assert got.valid[0, 0] and got.lengths[0] == len(out) + 1 and got.log_prob[0, 0] <= 0
        assert not result.valid[[0, 1, 3]].any()
        out.append(int(got.tokens[0, 0]))
    eng.free_resource(2)
    assert eng.native.pages.free_pages == eng.native.num_pages - 1
    assert out == tiny.greedy_reference(prompt, 6)


def test_engine_properties(tiny):
    eng = tiny.jetstream
    assert eng.max_concurrent_decodes == 4
    assert eng.max_prefill_length == 16
    assert eng.samples_per_slot == 1
    assert eng.mesh.devices.size == 1
    assert eng.colocated_cpus is None
    assert eng.use_chunked_prefill is False
    assert eng.prefill_chunk_size == eng.native.buckets[-1]


def test_swapping_in_identical_params_changes_no_token_and_tags_versions(tiny):
    reqs = lambda: _requests(np.random.default_rng(1), 4)  # noqa: E731
    plain = Sampler(tiny.engine, tiny.params).run(reqs())
    sampler = Sampler(tiny.engine, tiny.params, swap_mode="inflight", decode_steps=1)
    sampler.submit(reqs())
    swapped, steps = [], 0
    while sampler.has_work():
        swapped += sampler.step()
        steps += 1
        if steps == 3:
            sampler.set_params(tiny.params, version=1)
    key = lambda t: t.group_id  # noqa: E731
    for a, b in zip(sorted(plain, key=key), sorted(swapped, key=key), strict=True):
        assert a.response_tokens == b.response_tokens
    tagged = [v for t in swapped for v in t.versions]
    assert set(tagged) == {0, 1}
    for t in swapped:  # versions only move forward within a sequence
        assert t.versions == sorted(t.versions)


@pytest.mark.parametrize("mode", ["recompute", "drain"])
def test_other_swap_modes_keep_greedy_output(tiny, mode):
    sampler = Sampler(tiny.engine, tiny.params, swap_mode=mode)
    sampler.submit(_requests(np.random.default_rng(2), 6))
    out, steps = [], 0
    while sampler.has_work():
        out += sampler.step()
        steps += 1
        if steps == 2:
            sampler.set_params(tiny.params, version=7)
    for t in out:
        assert t.response_tokens == tiny.greedy_reference(t.prompt_tokens, len(t.response_tokens))
    if mode == "recompute":  # the running sequences were prefilled again, not kept
        assert sampler.stats["prefills"] > 6
    if mode == "drain":  # nothing sampled at version 7 until the old sequences drained
        for t in out:
            assert len(set(t.versions)) == 1


def test_interrupt_and_resume_continue_from_the_prefix(tiny):
    sampler = Sampler(tiny.engine, tiny.params, decode_steps=2)  # 9 of 10 tokens in 4 steps
    (rid,) = sampler.submit([Request([3, 4, 5], max_new_tokens=10)])
    for _ in range(4):
        sampler.step()
    assert sampler.interrupt(rid) == 1
    assert not sampler.has_work()
    sampler.resume(rid)
    (t,) = sampler.run()
    assert t.response_tokens == tiny.greedy_reference([3, 4, 5], 10)


def test_paged_pool_smaller_than_contiguous_caches_runs_to_completion():
    """8 slots x 28 tokens would need 56 pages of 4; the pool has 20. Preemption copes."""
    tiny = tiny_engine(
        temperature=0.0,
        max_concurrent_decodes=8,
        num_pages=20,
        max_new_tokens=12,
        max_prefill_length=16,
    )
    eng = tiny.engine
    assert eng.num_pages * eng.sampling_cfg.page_size < 8 * eng.max_seq_len
    sampler = Sampler(eng, tiny.params)
    reqs = [Request(list(range(1, 15)), max_new_tokens=12, seed=i) for i in range(8)]
    trajs = sampler.run(reqs)
    assert len(trajs) == 8
    assert sum(len(t.prompt_tokens) + len(t.response_tokens) for t in trajs) > 20 * 4
    assert sampler.stats["preempted"] > 0
    want = tiny.greedy_reference(list(range(1, 15)), 12)
    assert all(t.response_tokens == want for t in trajs)


def test_out_of_pages_is_raised_by_insert():
    tiny = tiny_engine(num_pages=3, max_concurrent_decodes=2)
    eng = tiny.jetstream
    state = eng.init_decode_state()
    prefix, _ = eng.prefill(params=tiny.params, padded_tokens=np.arange(1, 13), true_length=12)
    with pytest.raises(OutOfPages):
        eng.insert(prefix, state, 0)


@pytest.fixture(scope="module")
def unfiltered():
    """An engine whose config asks for no filter: requests may still ask for their own."""
    return tiny_engine(temperature=0.7)


@pytest.mark.parametrize("via", ["config", "request"])
@pytest.mark.parametrize("filters", [{}, {"top_k": 5}, {"top_p": 0.6}, {"min_p": 0.2}])
def test_sampled_logprobs_are_from_the_sampled_distribution(filters, via, unfiltered):
    """Each recorded log-prob equals log_softmax(filter(logits / tau)) at the sampled token,
    whether the filter comes from the engine's config or from the request's SlotSampling."""
    tau = 0.7
    if via == "config":
        tiny, own = tiny_engine(temperature=tau, **filters), None
    else:
        tiny, own = unfiltered, SlotSampling(temperature=tau, **filters)
    request = Request([1, 2, 3], num_samples=3, seed=3, sampling=own)
    trajs = Sampler(tiny.engine, tiny.params).run([request])
    for t in trajs:
        seq = list(t.prompt_tokens)
        for token, logprob in zip(t.response_tokens, t.logprobs, strict=True):
            z = tiny.next_logits(seq).astype(np.float64) / tau
            order = np.argsort(-z)
            p = np.exp(z[order] - z.max())
            p /= p.sum()
            keep = np.ones_like(p, bool)
            if "top_k" in filters:
                keep &= np.arange(len(p)) < filters["top_k"]
            if "top_p" in filters:
                keep &= (np.cumsum(p) - p) < filters["top_p"]
            if "min_p" in filters:
                keep &= p >= filters["min_p"] * p[0]
            allowed = order[keep]
            assert token in allowed
            want = z[token] - np.log(np.sum(np.exp(z[allowed])))
            assert logprob == pytest.approx(want, abs=2e-4)
            seq.append(token)


def test_per_request_filters_apply_to_their_own_slots_only(unfiltered):
    """One batch: a top_k=1 request decodes greedily with log-prob 0 while its neighbour,
    unfiltered, keeps the full softmax's log-probs."""
    tiny, tau = unfiltered, 0.7
    picky = Request([7, 8, 9], max_new_tokens=6, sampling=SlotSampling(tau, top_k=1), seed=1)
    plain = Request([7, 8, 9], max_new_tokens=6, seed=2)
    sampler = Sampler(tiny.engine, tiny.params)
    sampler.submit([picky, plain])
    out = {}
    while sampler.has_work():
        assert sampler.busy_slots in (0, 2)  # both decode in the same generate calls
        out.update({t.group_id: t for t in sampler.step()})
    a, b = out[picky.request_id], out[plain.request_id]
    assert a.response_tokens == tiny.greedy_reference([7, 8, 9], 6)
    assert a.logprobs == pytest.approx([0.0] * 6, abs=1e-5)
    seq = [7, 8, 9]
    for token, logprob in zip(b.response_tokens, b.logprobs, strict=True):
        z = tiny.next_logits(seq).astype(np.float64) / tau
        assert logprob == pytest.approx(z[token] - np.log(np.sum(np.exp(z))), abs=2e-4)
        seq.append(token)


def test_a_full_slot_reports_invalid_tokens_and_takes_no_page(tiny):
    """JetStream's orchestrator steps a finished slot until it frees it: no error, no page."""
    eng, native = tiny.jetstream, tiny.engine
    state = eng.init_decode_state()
    prefix, _ = eng.prefill(params=tiny.params, padded_tokens=np.arange(1, 17), true_length=16)
    state = eng.insert(prefix, state, 1)
    for _ in range(native.max_seq_len - 16):  # 16 cached: fill the slot to max_seq_len
        state, result = eng.generate(tiny.params, state)
        assert result.convert_to_numpy().valid[1]
    assert native.slot_length(1) == native.max_seq_len == 28
    free = native.pages.free_pages
    for _ in range(2):
        state, result = eng.generate(tiny.params, state)
        result = result.convert_to_numpy()
        assert not result.valid[1] and result.lengths[1] == 13  # 1 from prefill + 12
    assert native.pages.free_pages == free and native.slot_length(1) == 28
    eng.free_resource(1)
    assert native.pages.free_pages == native.num_pages - 1


def test_bad_requests_fail_with_clear_errors(tiny):
    sampler = Sampler(tiny.engine, tiny.params)
    with pytest.raises(ValueError, match="longer than sampling.max_prefill_length=16"):
        sampler.submit([Request(list(range(1, 18)))])
    with pytest.raises(ValueError, match=r"max_new_tokens=0 must be in \[1, 12\]"):
        sampler.submit([Request([1, 2], max_new_tokens=0)])
    with pytest.raises(ValueError, match="prompt_tokens is empty"):
        sampler.submit([Request([])])
    with pytest.raises(ConfigError, match="'sampling.top_p'"):
        SamplingConfig(top_p=1.2)
    with pytest.raises(ConfigError, match="'sampling.max_new_tokens'"):
        SamplingConfig(max_new_tokens=0)


def test_per_request_seed_makes_sampling_reproducible_across_slots():
    tiny = tiny_engine(temperature=1.0, max_concurrent_decodes=4)
    a = Sampler(tiny.engine, tiny.params).run([Request([1, 2, 3], num_samples=3, seed=11)])
    filler = [Request([4, 5], num_samples=1, seed=99)]
    b = Sampler(tiny.engine, tiny.params).run(filler + [Request([1, 2, 3], num_samples=3, seed=11)])
    by_index = lambda ts: {t.sample_index: t.response_tokens for t in ts}  # noqa: E731
    assert by_index(a) == by_index([t for t in b if t.prompt_tokens == [1, 2, 3]])


def test_slot_sampling_overrides_config(tiny):
    sampler = Sampler(tiny.engine, tiny.params)
    greedy = SlotSampling(temperature=0.0)
    (t,) = sampler.run([Request([7, 8], sampling=greedy, max_new_tokens=5)])
    assert t.response_tokens == tiny.greedy_reference([7, 8], 5)


def test_pallas_paged_attention_engine_matches_reference():
    """The TPU kernel path (interpret mode here) decodes exactly like the full recompute."""
    tiny = tiny_engine(temperature=0.0, impl="pallas", max_new_tokens=4, max_prefill_length=8)
    (t,) = Sampler(tiny.engine, tiny.params).run([Request([1, 4, 6, 2, 3], max_new_tokens=4)])
    assert t.response_tokens == tiny.greedy_reference([1, 4, 6, 2, 3], 4)


@pytest.mark.parametrize("impl", ["xla", "pallas"])
def test_kv_pool_sharded_over_data_decodes_like_full_recompute(impl):
    """data=2 x tensor=2: each data shard owns half the slots and half the page pool."""
    tiny = tiny_engine(
        temperature=0.0,
        impl=impl,
        devices=jax.devices()[:4],
        data=2,
        max_concurrent_decodes=4,
        max_new_tokens=6,
        max_prefill_length=8,
    )
    eng = tiny.engine
    assert eng.kv_shards == 2 and eng.slots_per_shard == 2
    assert eng.num_pages == 2 * eng.pages_per_shard
    state = eng.init_decode_state()
    spec = state.k_pages.sharding.spec
    assert spec[1] == "tensor" and spec[2] == "data"  # [L, K, P, Z, H]: K and P both split
    shard_bytes = {s.data.nbytes for s in state.k_pages.addressable_shards}
    assert shard_bytes == {state.k_pages.nbytes // 4}
    # A group of 3 spans both shards; 5 samples over 4 slots reuse freed slots.
    requests = [
        Request([1, 4, 6, 2, 3], max_new_tokens=6, num_samples=3),
        Request([5, 9, 7, 7, 7, 2, 8], max_new_tokens=5, num_samples=2),
    ]
    sampler = Sampler(eng, tiny.params)
    trajs = sampler.run(requests)
    assert len(trajs) == 5
    for t in trajs:
        assert t.response_tokens == tiny.greedy_reference(t.prompt_tokens, len(t.response_tokens))
    assert eng.pages.free_pages == eng.num_pages - eng.kv_shards  # every shard got its pages back


def test_sharded_pool_runs_out_of_pages_per_shard():
    """A slot grows from its own shard's pages only, even while another shard has some free."""
    tiny = tiny_engine(devices=jax.devices()[:2], data=2, num_pages=8, max_concurrent_decodes=2)
    eng, native = tiny.jetstream, tiny.engine
    assert native.kv_shards == 2 and native.pages_per_shard == 4  # 3 usable pages per shard
    state = eng.init_decode_state()
    long, _ = eng.prefill(params=tiny.params, padded_tokens=np.arange(1, 10), true_length=9)
    short, _ = eng.prefill(params=tiny.params, padded_tokens=np.arange(1, 3), true_length=2)
    state = eng.insert(long, state, 0)  # 9 cached tokens + the next: 3 pages of shard 0
    state = eng.insert(short, state, 1)  # 1 page of shard 1
    assert [a.free_count for a in native.allocators] == [0, 2]
    for _ in range(3):  # slot 0 fills positions 9..11, its third page; slot 1 takes a second
        state, _ = eng.generate(tiny.params, state)
    with pytest.raises(OutOfPages) as exc:
        eng.generate(tiny.params, state)
    assert exc.value.slots == [0]
    assert [a.free_count for a in native.allocators] == [0, 1]  # shard 1's page cannot help
