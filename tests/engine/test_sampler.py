"""Sampler: params swaps never decode a token of the new version over the old params' KV."""

import pytest

from rljax.engine.sampler import Request, Sampler
from rljax.testing.engines import tiny_engine

PROMPT = [3, 1, 4, 1, 5, 9, 2, 6]


@pytest.fixture(scope="module")
def old_new():
    """Two tiny engines of one config whose params (seeds 0 and 1) decode PROMPT differently."""
    old, new = tiny_engine(temperature=0.0), tiny_engine(temperature=0.0, seed=1)
    assert old.greedy_reference(PROMPT, 6) != new.greedy_reference(PROMPT, 6)
    return old, new


@pytest.mark.parametrize("mode", ["recompute", "drain"])
def test_swap_re_prefills_prefixes_waiting_for_a_slot(old_new, mode):
    """6 samples of one prompt on 4 slots: 2 wait on a prefix prefilled under the old params
    (which drew their first tokens) when the new ones are staged. Every token tagged with the
    new version must continue the sequence exactly as the new params would from a fresh
    prefill."""
    old, new = old_new
    sampler = Sampler(old.engine, old.params, swap_mode=mode)
    sampler.submit([Request(PROMPT, num_samples=6, max_new_tokens=6)])
    sampler.step()
    assert sampler.busy_slots == 4  # the other 2 wait in the pending queue
    sampler.set_params(new.params, version=1)
    trajs = sampler.run()
    assert len(trajs) == 6
    for t in trajs:
        n_old = t.versions.count(0)
        assert t.versions == [0] * n_old + [1] * (6 - n_old)
        before, after = t.response_tokens[:n_old], t.response_tokens[n_old:]
        assert before == old.greedy_reference(PROMPT, n_old)
        assert after == new.greedy_reference(PROMPT + before, 6 - n_old)
    waited = [t for t in trajs if t.versions == [0] + [1] * 5]  # only prefill's first token
    assert len(waited) >= 2


def test_inflight_swap_keeps_waiting_prefixes(old_new):
    """In-flight swaps keep KV by design: the waiting prefix is not prefilled again."""
    tiny = old_new[0]
    sampler = Sampler(tiny.engine, tiny.params, swap_mode="inflight")
    sampler.submit([Request(PROMPT, num_samples=6, max_new_tokens=3)])
    sampler.step()
    sampler.set_params(tiny.params, version=1)
    sampler.run()
    assert sampler.stats["prefills"] == 1
