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
    sampler = Sampler(old.engine, old.params, swap_mode=mode, decode_steps=1)
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


@pytest.fixture(scope="module")
def two_homes():
    """4 slots in two kv shards of 2 (data=2 on 4 devices), a 'host' being 2 devices."""
    import jax

    from rljax.engine.homes import process_homes

    tiny = tiny_engine(temperature=0.0, devices=jax.devices()[:4], data=2)
    homes = process_homes(tiny.engine, (0, 1), process_of=lambda d: d.id // 2)
    assert homes == [0, 0, 1, 1]
    return tiny, homes


def _slot_homes(sampler):
    return [(slot, s.request.home) for slot, s in enumerate(sampler._slots) if s is not None]


def test_samples_take_only_their_home_s_slots(two_homes):
    """Two groups of home 0 and one of home 1: the second home-0 group waits for home 0's slots
    without holding up home 1's, and every sample decodes what it would anywhere."""
    tiny, homes = two_homes
    sampler = Sampler(tiny.engine, tiny.params, slot_homes=homes, decode_steps=1)
    prompts = [PROMPT, PROMPT[::-1], PROMPT[2:]]
    requests = [
        Request(p, num_samples=2, max_new_tokens=5, home=h)
        for p, h in zip(prompts, [0, 0, 1], strict=True)
    ]
    ids = sampler.submit(requests)
    sampler.step()
    placed = _slot_homes(sampler)
    assert sorted(placed) == [(0, 0), (1, 0), (2, 1), (3, 1)]
    trajs = sampler.run()
    assert len(trajs) == 6
    for t in trajs:
        prompt = prompts[ids.index(t.group_id)]
        assert t.response_tokens == tiny.greedy_reference(prompt, 5)


def test_a_request_without_a_home_takes_any_slot_and_a_bad_home_is_refused(two_homes):
    tiny, homes = two_homes
    sampler = Sampler(tiny.engine, tiny.params, slot_homes=homes, decode_steps=1)
    sampler.submit([Request(PROMPT, num_samples=4, max_new_tokens=3)])
    sampler.step()
    assert sampler.busy_slots == 4
    with pytest.raises(ValueError, match="home 2 owns no slot"):
        sampler.submit([Request(PROMPT, home=2)])
    with pytest.raises(ValueError, match="names 3 slots but the engine has 4"):
        Sampler(tiny.engine, tiny.params, slot_homes=[0, 0, 1])


def test_replicated_slots_have_no_home():
    import jax

    from rljax.engine.homes import process_homes

    tiny = tiny_engine(devices=jax.devices()[:4], data=1)  # every slot on all 4 devices
    assert process_homes(tiny.engine, (0, 1), process_of=lambda d: d.id // 2) is None
