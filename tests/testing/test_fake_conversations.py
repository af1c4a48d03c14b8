"""The fake sampler's conversations: model turns, the env's tokens between, waits in the slot."""

import time

from rljax.engine.sampler import Request
from rljax.testing import fake_sampler
from rljax.testing.fake_sampler import FakeSampler, lognormal_lengths


def _sampler(turns, obs_tokens=3, slots=2):
    return FakeSampler(
        slots=slots,
        step_cost_s=lambda active: 0.0,
        length_sampler=lognormal_lengths(8, 0.0, 64),
        turns=lambda rng: turns,
        obs_tokens=obs_tokens,
    )


def test_a_conversation_interleaves_model_and_env_tokens():
    sampler = _sampler([(3, 0.0), (2, 0.0), (1, 0.0)])
    sampler.submit([Request([1, 2], num_samples=1, request_id=0)])
    out = []
    while sampler.has_work():
        out += sampler.step()
    (t,) = out
    assert t.loss_mask == [1, 1, 1, 0, 0, 0, 1, 1, 0, 0, 0, 1]
    assert len(t.response_tokens) == len(t.logprobs) == len(t.versions) == 12
    assert [v for v, m in zip(t.versions, t.loss_mask) if not m] == [-1] * 6
    assert all(lp == 0.0 for lp, m in zip(t.logprobs, t.loss_mask) if not m)
    assert t.min_version == 0 and t.finish_reason == "stop"
    assert sampler.stats["tokens"] == 6  # decode steps advance model tokens only


def test_the_budget_cuts_a_conversation():
    sampler = _sampler([(3, 0.0), (4, 0.0)])
    sampler.submit([Request([1], num_samples=1, request_id=0, max_new_tokens=5)])
    out = []
    while sampler.has_work():
        out += sampler.step()
    (t,) = out
    assert t.finish_reason == "length" and t.loss_mask == [1, 1, 1, 0, 0]


def test_a_waiting_conversation_holds_its_slot_and_decodes_nothing(monkeypatch):
    slept = []  # the step's sleeps, recorded instead of slept
    monkeypatch.setattr(fake_sampler, "sleep_cost", slept.append)
    sampler = _sampler([(1, 3600.0), (1, 0.0)], slots=2)  # an env step that never returns here
    sampler.submit([Request([1], num_samples=1, request_id=0)])
    sampler.submit([Request([1], num_samples=1, request_id=1)])
    sampler.step()  # both decode their first turn; both now wait for their env
    assert sampler.busy_slots == 2 and sampler.free_slots == 0
    # Both hold their slot (live), and neither decodes while it waits.
    assert sampler._load(0) == 2 and sampler._load(0, now=time.perf_counter()) == 0
    assert sampler.stats["tokens"] == 2
    # A step while both wait waits for the first env to answer and advances neither.
    assert sampler.step() == []
    assert sampler.stats["tokens"] == 2 and sampler.stats["env_wait_steps"] == 1
    assert sampler.busy_slots == 2 and slept[-1] > 3500.0
