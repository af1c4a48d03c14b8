"""Multi-step decode (``sampling.decode_steps``): several tokens a slot in one device call give
the tokens, log-probs, versions, finish reasons and routes of one token a call, with stops and
budgets that end slots inside a call, a weight swap at a call boundary, a page pool too short
for a whole call's lookahead, and conversations whose turns end inside a call."""

import jax
import numpy as np
import pytest

from rljax.config import SamplingConfig
from rljax.engine.paged import PagedEngine
from rljax.engine.sampler import Request, Sampler
from rljax.models.sharding import SAMPLER_RULES, make_mesh
from rljax.models.transformer import init_sharded
from rljax.testing.engines import tiny_engine
from rljax.testing.turns import scripted
from tests.engine.test_routes import MOE  # the tiny MoE whose routes that file checks

PROMPTS = [[3, 1, 4, 1, 5], [9, 2, 6], [5, 3, 5, 8, 9, 7], [2, 7, 1, 8]]
BUDGETS = [12, 5, 9, 7]  # slots end at different steps, most inside a call of 3 or 4
SAMPLING = dict(max_new_tokens=12, max_prefill_length=8, max_concurrent_decodes=8, page_size=4)


@pytest.fixture(scope="module")
def greedy():
    return tiny_engine(temperature=0.0, **SAMPLING)


@pytest.fixture(scope="module")
def seeded():
    return tiny_engine(temperature=1.0, top_k=20, **SAMPLING)


def _requests(samples=2):
    return [
        Request(p, num_samples=samples, max_new_tokens=b, seed=10 + i)
        for i, (p, b) in enumerate(zip(PROMPTS, BUDGETS, strict=True))
    ]


def _run(tiny, steps, stop_ids=(), requests=None, **kw):
    sampler = Sampler(tiny.engine, tiny.params, stop_ids=stop_ids, decode_steps=steps, **kw)
    trajs = sampler.run(requests or _requests())
    return sorted(trajs, key=lambda t: (t.group_id, t.sample_index)), sampler


def _assert_same(got, want):
    assert len(got) == len(want)
    for a, b in zip(got, want, strict=True):
        assert (a.group_id, a.sample_index) == (b.group_id, b.sample_index)
        assert a.response_tokens == b.response_tokens
        assert a.finish_reason == b.finish_reason
        assert a.versions == b.versions
        np.testing.assert_allclose(a.logprobs, b.logprobs, rtol=1e-6, atol=1e-6)


def _a_stop_inside_a_call(trajs, steps):
    """A token that, as a stop id, ends some response after 2 tokens or more, at a position
    that is not a call's last."""
    for t in trajs:
        for i, token in enumerate(t.response_tokens[2:], start=2):
            if token not in t.response_tokens[:i] and i % steps:
                return token
    raise AssertionError("no token to stop on inside a call")


@pytest.mark.parametrize("which", ["greedy", "seeded"])
@pytest.mark.parametrize("steps", [3, 4])
def test_several_tokens_a_call_equal_one_token_a_call(which, steps, request):
    tiny = request.getfixturevalue(which)
    plain, _ = _run(tiny, 1)
    stop = _a_stop_inside_a_call(plain, steps)
    want, one = _run(tiny, 1, stop_ids=[stop])
    got, many = _run(tiny, steps, stop_ids=[stop])
    _assert_same(got, want)
    reasons = {t.finish_reason for t in got}
    assert reasons == {"stop", "length"}, reasons
    lengths = {len(t.response_tokens) for t in got}
    assert len(lengths) >= 3, "slots must end at different steps"
    assert many.stats["decode_calls"] < one.stats["decode_calls"]
    # Each call runs `steps` steps; a slot that stopped early idles for the rest of it.
    assert many.stats["generate_steps"] == steps * many.stats["decode_calls"]
    assert many.stats["decode_steps_idle"] > 0
    assert one.stats["decode_steps_idle"] == 0


def test_idle_slot_steps_are_counted():
    """One sample of budget 3 on 8 slots: prefill draws token 1, a call of 4 draws 2 more."""
    tiny = tiny_engine(temperature=0.0, **SAMPLING)
    _, sampler = _run(tiny, 4, requests=[Request(PROMPTS[0], max_new_tokens=3)])
    assert sampler.stats["decode_calls"] == 1 and sampler.stats["generate_steps"] == 4
    assert sampler.stats["decode_steps_idle"] == 2


def test_a_swap_at_a_call_boundary(greedy):
    """Swapped after the first call of 4 (or after four calls of 1): the same tokens and the
    same version on each."""
    new = tiny_engine(temperature=0.0, seed=1, **SAMPLING)
    runs = []
    for n in (1, 4):
        sampler = Sampler(greedy.engine, greedy.params, decode_steps=n, swap_mode="inflight")
        sampler.submit(_requests())
        done = []
        for _ in range(4 // n):
            done += sampler.step()
        sampler.set_params(new.params, version=1)
        done += sampler.run()
        runs.append(sorted(done, key=lambda t: (t.group_id, t.sample_index)))
    _assert_same(runs[1], runs[0])
    assert any(1 in t.versions and 0 in t.versions for t in runs[0])


def test_a_pool_too_short_for_a_whole_call_falls_back_to_one_token():
    """Pages for one token a slot but not for a call's lookahead: the call shrinks to one
    token instead of preempting, and the tokens are those of one token a call."""
    tight = dict(SAMPLING, max_concurrent_decodes=4, num_pages=1 + 4 * 3)
    tiny = tiny_engine(temperature=0.0, **tight)
    requests = [Request(p, max_new_tokens=b) for p, b in zip(PROMPTS, BUDGETS, strict=True)]
    want, one = _run(tiny, 1, requests=requests)
    requests = [Request(p, max_new_tokens=b) for p, b in zip(PROMPTS, BUDGETS, strict=True)]
    got, many = _run(tiny, 8, requests=requests)
    _assert_same(got, want)
    assert many.stats["decode_calls"] < one.stats["decode_calls"]
    assert many.stats["decode_calls_shortened"] > 0
    assert many.stats["preempted"] <= one.stats["preempted"]


def test_conversation_turns_end_inside_a_call(greedy):
    """A turn's stop token ends the turn inside a call; the env's tokens follow at the next."""
    plain, _ = _run(greedy, 1)
    stop = _a_stop_inside_a_call(plain, 4)
    runs = []
    for steps in (1, 4):
        factory, _ = scripted([[7, 8, 9], [10, 11], [12, 13]])
        request = Request(PROMPTS[0], num_samples=2, max_new_tokens=12, seed=3, turns=factory)
        sampler = Sampler(greedy.engine, greedy.params, stop_ids=[stop], decode_steps=steps)
        trajs = sorted(sampler.run([request]), key=lambda t: t.sample_index)
        runs.append(trajs)
    _assert_same(runs[1], runs[0])
    for a, b in zip(*runs, strict=True):
        assert a.loss_mask == b.loss_mask
    assert any(0 in t.loss_mask for t in runs[0]), "an env turn must be in the conversation"


def test_routes_of_every_step_come_back():
    mesh = make_mesh(jax.devices()[:1], {"data": 1, "tensor": -1})
    graphdef, state = init_sharded(MOE, mesh, SAMPLER_RULES, 0)
    cfg = SamplingConfig(temperature=1.0, **SAMPLING)
    engine = PagedEngine(MOE, cfg, mesh, graphdef)
    params = engine.load_params(state)
    runs = []
    for steps in (1, 4):
        sampler = Sampler(engine, params, decode_steps=steps)
        trajs = sampler.run(_requests())
        runs.append(sorted(trajs, key=lambda t: (t.group_id, t.sample_index)))
    _assert_same(runs[1], runs[0])
    for a, b in zip(*runs, strict=True):
        assert a.routes == b.routes
        assert all(len(r) == 2 * 2 for r in a.routes[:-1])  # every fed token: Lm x k ids


def test_stop_strings_decode_one_token_a_call(greedy):
    sampler = Sampler(
        greedy.engine, greedy.params, decode_steps=8, stop_strings=["x"], detokenize=str
    )
    assert sampler.decode_steps == 1


def test_decode_steps_is_checked():
    from rljax.config import ConfigError

    with pytest.raises(ConfigError, match="sampling.decode_steps"):
        SamplingConfig(decode_steps=-1)
