"""Batched prefill: many prompts per call equal one call each, and warm-up ends compilation."""

import dataclasses

import jax
import numpy as np
import pytest

from rljax.config import ConfigError
from rljax.engine.prefill import PrefillRequest, warm_up
from rljax.engine.sampler import Request, Sampler
from rljax.testing.engines import tiny_engine

PROMPTS = ([3, 1, 4], [1, 5, 9, 2, 6, 5, 3, 5, 8, 9], [7], [2, 7, 1, 8, 2])


@pytest.fixture(scope="module")
def sampled():
    return tiny_engine(temperature=1.0, prefill_batch=4, max_concurrent_decodes=8)


def _keys(seed, n):
    return jax.random.split(jax.random.key(seed), n)


def test_batched_prefill_equals_one_prefill_per_prompt(sampled):
    """Same KV, first tokens and log-probs as prefill_multisampling of each prompt alone."""
    eng, params = sampled.engine, sampled.params
    counts = (2, 1, 3, 2)
    reqs = [PrefillRequest(p, n, _keys(i, n)) for i, (p, n) in enumerate(zip(PROMPTS, counts))]
    batched = eng.prefill_batch(params=params, requests=reqs)
    for r, (prefix, result) in zip(reqs, batched, strict=True):
        want_prefix, want = eng.prefill_multisampling(
            params=params,
            padded_tokens=np.asarray(r.tokens, np.int32),
            true_length=len(r.tokens),
            rng=r.rng,
            num_samples=r.num_samples,
        )
        want = want.convert_to_numpy()
        assert int(prefix.length) == len(r.tokens) and prefix.num_samples == r.num_samples
        np.testing.assert_array_equal(result.tokens, want.tokens)
        np.testing.assert_allclose(result.logprobs, want.logprobs, atol=1e-5)
        np.testing.assert_array_equal(np.asarray(prefix.keys), np.asarray(want_prefix.keys))
        n = len(r.tokens)  # the two pad to different buckets: compare the cached tokens
        for got, ref in ((prefix.k, want_prefix.k), (prefix.v, want_prefix.v)):
            np.testing.assert_allclose(np.asarray(got)[:, :n], np.asarray(ref)[:, :n], atol=1e-5)


def test_sampler_batches_prefills_and_keeps_every_sample(sampled):
    """Sampled groups through batched prefills give what one prompt per call gives."""
    eng = sampled.engine
    cfg = eng.sampling_cfg

    def run(prefill_batch):
        eng.sampling_cfg = dataclasses.replace(cfg, prefill_batch=prefill_batch)
        try:
            sampler = Sampler(eng, sampled.params)
            reqs = [
                Request(p, num_samples=2, max_new_tokens=6, seed=i) for i, p in enumerate(PROMPTS)
            ]
            out = sampler.run(reqs)
        finally:
            eng.sampling_cfg = cfg
        key = lambda tr: (tr.group_id, tr.sample_index)  # noqa: E731
        rows = [(key(tr), tr.response_tokens) for tr in sorted(out, key=key)]
        return rows, [tr.logprobs for tr in sorted(out, key=key)], sampler.stats

    batched, logprobs, stats = run(4)
    single, single_logprobs, single_stats = run(1)
    assert batched == single and len(batched) == 8
    np.testing.assert_allclose(sum(logprobs, []), sum(single_logprobs, []), atol=1e-5)
    assert stats["prefills"] == single_stats["prefills"] == 4
    assert single_stats["prefill_calls"] == 4 and stats["prefill_calls"] == 1


def test_warm_up_compiles_every_shape_once():
    """After warm_up, a sampler over mixed prompt lengths and group counts compiles nothing."""
    t = tiny_engine(
        temperature=1.0,
        prefill_batch=2,
        max_prefill_length=8,
        max_new_tokens=4,
        max_concurrent_decodes=2,
    )
    eng, steps = t.engine, t.engine.steps
    shapes = warm_up(eng, t.params, num_samples=1)
    assert eng.buckets == (8, 12) and shapes == 2 * 2  # 1 and 2 prompts per call
    jitted = (steps.prefill, steps.prefill_many, steps.insert, steps.generate(None))
    before = [f._cache_size() for f in jitted]
    rng = np.random.default_rng(0)
    reqs = [
        Request(list(rng.integers(1, 18, size=int(rng.integers(1, 9)))), 1, seed=i)
        for i in range(7)
    ]
    sampler = Sampler(eng, t.params)
    assert len(sampler.run(reqs)) == 7 and sampler.stats["prefill_calls"] < 7
    assert [f._cache_size() for f in jitted] == before


def test_bad_batches_are_one_line_errors_and_take_no_page(sampled):
    eng, params = sampled.engine, sampled.params
    free = eng.pages.free_pages
    cases = [
        ([PrefillRequest([1])] * 5, "more than sampling.prefill_batch=4"),
        ([PrefillRequest([1]), PrefillRequest([])], "request 1 has an empty prompt"),
        ([PrefillRequest([1], 0)], "num_samples=0 must be an int >= 1"),
        ([PrefillRequest([1] * 100)], "exceeds the largest prefill bucket"),
        ([], "got no requests"),
    ]
    for requests, message in cases:
        with pytest.raises(ValueError, match=message) as err:
            eng.prefill_batch(params=params, requests=requests)
        assert "\n" not in str(err.value)
        assert eng.pages.free_pages == free
    with pytest.raises(ConfigError, match="sampling.prefill_batch"):
        tiny_engine(prefill_batch=0)
