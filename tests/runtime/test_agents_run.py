"""A whole run with an env (configs/arith_tools.py:small): conversations are sampled with the KV
kept across turns, scored by their env steps, trained on with env tokens masked, and counted in
the metrics; a research env passed as ``env=`` and a broken one, which never stops the run."""

import json

import numpy as np
import pytest
from rljax.configs import arith_tools

from rljax.config import ConfigError, replace
from rljax.envs import Conversations, LookupEnv, Step
from rljax.envs.render import ChatRenderer
from rljax.models.tokenizer import Tokenizer
from rljax.runtime import agents
from rljax.runtime.run import Run

SMALL = replace(arith_tools.recipe("small"), num_steps=2, eval_examples=4)


class HalfPerTurn:
    """A research env: every turn earns 0.5 and gets the tool message '7='; two turns."""

    def reset(self, example):
        return [{"role": "user", "content": example["prompt"]}]

    def step(self, action):
        return Step([{"role": "tool", "content": "7="}], reward=0.5, info={"tool_calls": 1})


class Broken:
    def reset(self, example):
        return [{"role": "user", "content": example["prompt"]}]

    def step(self, action):
        raise RuntimeError("this env always fails")


def _records(workdir, phase="train"):
    with open(f"{workdir}/metrics.jsonl") as f:
        return [r for r in map(json.loads, f) if r["phase"] == phase]


def test_env_factory_rewards_and_metrics(tmp_path):
    seen, trained = [], []
    run = Run(SMALL, str(tmp_path), env=HalfPerTurn)
    make_batch = run.make_batch

    def spy(groups):
        trajs = [t for g in groups for t in g.trajectories]
        seen.extend(trajs)
        batch = make_batch(groups)
        # The batch trains each response's model tokens and none of its env tokens.
        model_tokens = sum(
            sum(t.loss_mask) if t.loss_mask else len(t.response_tokens) for t in trajs
        )
        trained.append((int(batch.arrays["mask"].sum()), model_tokens))
        return batch

    run.make_batch = spy
    try:
        summary = run.train()
    finally:
        run.close()
    assert summary["steps"] == 2 and seen
    assert trained and all(got == want for got, want in trained), trained
    for t in seen:
        mask = np.array(t.loss_mask)
        env = np.flatnonzero(mask == 0)
        # max_turns=2: a first turn ended on its stop token, then '7=' from the env.
        if len(env):
            assert [t.response_tokens[i] for i in env] == run.tokenizer.encode("7=")
            assert all(t.versions[i] == -1 and t.logprobs[i] == 0.0 for i in env)
        assert t.reward == pytest.approx(t.env_reward)
        assert t.env_reward == pytest.approx(0.5 * t.env_info["turns"])
    last = _records(tmp_path)[-1]
    assert 1 <= last["turns_per_conversation"] <= 2
    assert last["tool_calls"] > 0 and last["env_errors/raised"] == 0
    assert last["prefill_tokens_saved"] > 0  # second turns went onto kept KV


def test_an_env_that_always_raises_is_counted_and_the_run_goes_on(tmp_path):
    run = Run(replace(SMALL, num_steps=1), str(tmp_path), env=Broken)
    try:
        summary = run.train()
    finally:
        run.close()
    assert summary["steps"] == 1
    last = summary["last"]  # the step's conversations: each failed at its first env step
    assert last["env_errors/raised"] > 0 and last["reward"] == 0.0


def test_unknown_env_name_and_bad_factory_are_refused(tmp_path):
    with pytest.raises(ConfigError, match="Unknown env 'nope'.*register_env"):
        Run(replace(SMALL, **{"env.name": "nope"}), str(tmp_path / "a"))
    with pytest.raises(TypeError, match="zero-argument callable"):
        Run(SMALL, str(tmp_path / "b"), env=HalfPerTurn())


def test_teacher_transcript_is_what_a_conversation_holds():
    """The warm start trains on the ids a rollout of the same conversation holds."""
    tok = Tokenizer.char_level()
    example = {"prompt": "37+*=", "hidden": "45", "answer": "82"}
    convs = Conversations(lambda: LookupEnv(lambda c, ex: 0.0), ChatRenderer(tok))
    transcript = [
        {"role": "assistant", "content": "*"},
        {"role": "tool", "content": "45="},
        {"role": "assistant", "content": "82"},
    ]
    seq = agents.transcript_sequence(convs, example, transcript, tok)
    prompt = convs.prompt(example)
    turn1 = tok.encode("*") + [tok.eos_id]
    conv = convs.turns(example, prompt)(0)
    env_ids = conv.next_turn(turn1).result(timeout=30)
    response = turn1 + env_ids + tok.encode("82") + [tok.eos_id]
    assert list(seq.tokens) == prompt + response and seq.prompt_len == len(prompt)
    assert list(seq.loss_mask) == [1, 1, 0, 0, 0, 1, 1, 1]
    with pytest.raises(ConfigError, match="needs an env to render it"):
        agents.transcript_sequence(None, example, transcript, tok)
    with pytest.raises(ValueError, match="must end with an assistant message"):
        agents.transcript_sequence(convs, example, transcript[:2], tok)
    convs.close()
