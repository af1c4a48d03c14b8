"""Conversations (multi-turn samples): the KV kept across turns gives what re-prefilling the
whole history gives, env tokens are the env's ids untouched, a waiting conversation does not
hold up other slots, swaps between turns follow the swap mode, and interrupt / resume and page
preemption continue a conversation as if nothing happened."""

import json

import numpy as np
import pytest

from rljax.engine.sampler import Request, Sampler
from rljax.engine.samples import ENV_VERSION
from rljax.testing.engines import tiny_engine
from rljax.testing.turns import scripted

PROMPT = [3, 1, 4, 1, 5]
SCRIPT = [[7, 8, 9], [10, 11], [12, 13, 14, 15, 16, 17, 7, 8, 9], [11]]
BUDGET = 40
STOP = [0, 12]  # tokens the tiny model (seed 0) emits every few tokens after PROMPT: turns end
SAMPLING = dict(max_new_tokens=BUDGET, max_prefill_length=16, max_concurrent_decodes=4)


@pytest.fixture(scope="module")
def greedy():
    return tiny_engine(temperature=0.0, **SAMPLING)


@pytest.fixture(scope="module")
def seeded():
    return tiny_engine(temperature=1.0, **SAMPLING)


def _conversation(tiny, stop, *, keep_kv=True, samples=2, seed=0, manual=False, **kw):
    factory, made = scripted(SCRIPT, manual=manual)
    sampler = Sampler(tiny.engine, tiny.params, stop_ids=stop, keep_kv=keep_kv, **kw)
    request = Request(PROMPT, num_samples=samples, max_new_tokens=BUDGET, seed=seed, turns=factory)
    return sampler, request, made


def _run(tiny, stop, **kw):
    sampler, request, made = _conversation(tiny, stop, **kw)
    trajs = sorted(sampler.run([request]), key=lambda t: t.sample_index)
    return trajs, sampler, made


def _model_turns(t):
    """The trajectory split back into (model turn, env turn) pairs by its loss mask."""
    turns, k = [], 0
    mask = t.loss_mask
    while k < len(mask):
        j = k
        while j < len(mask) and mask[j] == 1:
            j += 1
        e = j
        while e < len(mask) and mask[e] == 0:
            e += 1
        turns.append((t.response_tokens[k:j], t.response_tokens[j:e]))
        k = e
    return turns


@pytest.mark.parametrize("which", ["greedy", "seeded"])
def test_keeping_the_kv_equals_re_prefilling_the_history(which, request):
    """Tokens and log-probs with the KV kept (only new turns prefilled) equal those of a
    re-prefill of the whole history every turn; greedy ones also equal a full forward pass."""
    tiny = request.getfixturevalue(which)
    stop = STOP
    kept, s_kept, made = _run(tiny, stop, keep_kv=True, seed=5)
    again, s_again, _ = _run(tiny, stop, keep_kv=False, seed=5)
    assert s_kept.stats["turn_kv_kept"] >= 6, "the conversations must span several turns"
    assert s_kept.stats["turn_re_prefills"] == 0 and s_again.stats["turn_kv_kept"] == 0
    assert s_again.stats["turn_re_prefills"] == s_kept.stats["turn_kv_kept"]
    for a, b in zip(kept, again, strict=True):
        assert a.response_tokens == b.response_tokens
        assert a.loss_mask == b.loss_mask
        np.testing.assert_allclose(a.logprobs, b.logprobs, atol=2e-5)
        assert 0 in a.loss_mask, "an env turn must be in the conversation"
    saved = s_kept.stats["prefill_tokens_saved"]
    assert saved > 0
    assert s_again.stats["prefill_tokens"] - s_kept.stats["prefill_tokens"] == saved
    if which == "greedy":  # each model token is the argmax after the whole sequence so far
        t = kept[0]
        seq = list(PROMPT)
        for token, m in zip(t.response_tokens, t.loss_mask, strict=True):
            if m:
                assert token == int(np.argmax(tiny.next_logits(seq)))
            seq.append(token)


def test_env_tokens_are_the_env_s_ids_and_model_tokens_the_engine_s(greedy):
    """Every turn: the model's tokens are what the env was shown (stop token included), the
    env's are the scripted ids, in order; env tokens carry log-prob 0, version -1."""
    stop = STOP
    trajs, _, made = _run(greedy, stop)
    for t in trajs:
        turns = _model_turns(t)
        seen = made[t.sample_index].turns_seen
        assert [m for m, _ in turns][: len(seen)] == seen
        assert [e for _, e in turns if e] == SCRIPT[: len([e for _, e in turns if e])]
        for m, _ in turns[: len(seen)]:
            assert m[-1] in stop
        for lp, v, mask in zip(t.logprobs, t.versions, t.loss_mask, strict=True):
            if not mask:
                assert (lp, v) == (0.0, ENV_VERSION)
        assert t.min_version == 0
        assert t.env_reward == float(len(seen)) and t.env_info == {"turns": len(seen)}


def test_a_waiting_conversation_does_not_stop_other_slots(greedy):
    """While a conversation waits for an env future nobody has resolved, another request
    decodes to the end; the conversation then continues as an uninterrupted one."""
    stop = STOP
    sampler, conv, made = _conversation(greedy, stop, samples=1, manual=True)
    sampler.submit([conv])
    while not sampler.waiting_conversations:
        assert not sampler.step()
    turns = made[0]
    assert len(turns.pending) == 1 and sampler.stats["conversations_waiting"] == 1
    other = Request([9, 2, 6], max_new_tokens=10)
    sampler.submit([other])
    done = []
    while not done:
        done = sampler.step()
    assert [t.group_id for t in done] == [other.request_id]
    ref = greedy.greedy_reference([9, 2, 6], 10)
    cut = next((i + 1 for i, tok in enumerate(ref) if tok in stop), len(ref))
    assert done[0].response_tokens == ref[:cut]
    assert sampler.stats["generate_steps"] >= cut - 1, "it decoded while the other waited"
    assert len(turns.pending) == 1, "the conversation is still waiting"
    out = []
    while sampler.has_work():
        while turns.pending:
            turns.answer()
        out += sampler.step()
    (unblocked,) = out
    (reference,), _, _ = _run(greedy, stop, samples=1)
    assert unblocked.response_tokens == reference.response_tokens


@pytest.mark.parametrize("mode", ["inflight", "recompute", "drain"])
def test_a_swap_between_turns_follows_the_swap_mode(greedy, mode):
    """New params staged while a conversation waits: inflight keeps its KV (no re-prefill);
    recompute and drain prefill the whole history again under the new params. Every model
    token after the swap is tagged with the new version, env tokens with -1."""
    other = tiny_engine(temperature=0.0, seed=1, **SAMPLING)
    stop = STOP
    sampler, conv, made = _conversation(greedy, stop, samples=1, manual=True, swap_mode=mode)
    sampler.submit([conv])
    while not sampler.waiting_conversations:
        sampler.step()
    before = len(made[0].turns_seen[0])
    sampler.set_params(other.params, version=1)
    made[0].answer()
    out = []
    while sampler.has_work():
        while made[0].pending:
            made[0].answer()
        out += sampler.step()
    (t,) = out
    assert t.versions[:before] == [0] * before
    env = len(SCRIPT[0])
    assert t.versions[before : before + env] == [ENV_VERSION] * env
    assert set(t.versions[before + env :]) <= {1, ENV_VERSION}
    history = PROMPT + t.response_tokens[: before + env]
    if mode == "inflight":
        assert sampler.stats["turn_re_prefills"] == 0 and sampler.stats["turn_kv_kept"] >= 1
    else:
        assert sampler.stats["turn_re_prefills"] >= 1
        # Re-prefilled under the new params: its first token is the new model's argmax.
        assert t.response_tokens[before + env] == int(np.argmax(other.next_logits(history)))


@pytest.mark.parametrize("at", ["mid_turn", "waiting"])
def test_interrupt_and_resume_of_a_conversation_draw_what_uninterrupted_draws(seeded, at):
    """Seeded sampling: a conversation interrupted mid-turn (or while waiting for its env)
    and resumed, re-prefilled from its whole prefix, gives the uninterrupted tokens."""
    stop = STOP
    (reference, *_), _, _ = _run(seeded, stop, samples=1, seed=3)
    # Two tokens a call: the interrupt lands inside the second model turn.
    sampler, conv, made = _conversation(
        seeded, stop, samples=1, seed=3, manual=True, decode_steps=2
    )
    sampler.submit([conv])
    turn_started = False
    while True:
        sampler.step()
        waiting = sampler.waiting_conversations
        if at == "waiting" and waiting:
            break
        if at == "mid_turn" and turn_started and not waiting:
            break  # a token or so into the second model turn
        if waiting:
            made[0].answer()
            turn_started = True
    assert sampler.interrupt(conv.request_id) == 1
    assert sampler.busy_slots == 0
    sampler.resume(conv.request_id)
    out = []
    while sampler.has_work():
        while made[0].pending:
            made[0].answer()
        out += sampler.step()
    (t,) = out
    assert t.response_tokens == reference.response_tokens
    np.testing.assert_allclose(t.logprobs, reference.logprobs, atol=2e-5)
    assert sampler.stats["interrupted"] == 1


def test_pool_exhaustion_preempts_waiting_conversations_first(greedy):
    """A pool too small for every conversation's pages while sample k's env takes k + 1
    steps to answer (so some wait while others decode): waiting ones give theirs back first
    and are prefilled again from their whole prefix; the tokens are unchanged."""
    stop = STOP
    (reference, *_), _, _ = _run(greedy, stop, samples=1)
    small = tiny_engine(temperature=0.0, num_pages=16, **SAMPLING)
    sampler, conv, made = _conversation(small, stop, samples=4, manual=True)
    sampler.submit([conv])
    out, steps = [], 0
    while sampler.has_work():
        out += sampler.step()
        steps += 1
        for k, turns in made.items():
            if turns.pending and steps % (k + 1) == 0:
                turns.answer()
    assert sampler.stats["preempted_waiting"] >= 1, dict(sampler.stats)
    assert len(out) == 4
    for t in out:
        assert t.response_tokens == reference.response_tokens


def test_a_replica_stepping_with_another_s_answers_gives_its_trajectories(seeded):
    """The poll as an input (a pod's followers): a sampler that applies, at each step, the
    answers another one polled (``ready_turns``, through JSON as a tick carries them) makes
    the same trajectories, though its own envs never answer; a wrong answer is refused."""
    stop = STOP
    sampler, conv, made = _conversation(seeded, stop, samples=4, seed=7, manual=True)
    sampler.submit([conv])
    log, polled, steps = [], [], 0
    while sampler.has_work():
        log.append(json.loads(json.dumps(sampler.ready_turns())))
        polled += sampler.step()  # the polling path: it takes the same snapshot itself
        steps += 1
        for k, turns in made.items():  # sample k's env answers after k + 1 steps
            if turns.pending and steps % (k + 1) == 0:
                turns.answer()
    answers = [a for step in log for a in step]
    assert any(ids is None for *_, ids in answers) and any(ids for *_, ids in answers)
    assert sum(1 for step in log if step) > 1, "answers came at several steps"

    replica, conv, never = _conversation(seeded, stop, samples=4, seed=7, manual=True)
    replica.submit([conv])
    replayed = []
    for step in log:
        replayed += replica.step(step)
    assert not replica.has_work()
    for k, turns in never.items():  # its envs were asked the same turns and never answered
        assert turns.turns_seen == made[k].turns_seen and len(turns.pending) == len(
            turns.turns_seen
        )
    key = lambda t: t.sample_index  # noqa: E731
    for a, b in zip(sorted(polled, key=key), sorted(replayed, key=key), strict=True):
        assert (a.response_tokens, a.loss_mask, a.versions) == (
            b.response_tokens,
            b.loss_mask,
            b.versions,
        )
        assert a.logprobs == b.logprobs and a.finish_reason == b.finish_reason
        assert 0 in a.loss_mask, "an env turn must be in the conversation"

    other, conv, _ = _conversation(seeded, stop, samples=1, manual=True)
    other.submit([conv])
    while not other.waiting_conversations:
        other.step()
    with pytest.raises(RuntimeError, match="request 0 sample 3, which is not waiting for its env"):
        other.step([[0, 3, [7]]])
