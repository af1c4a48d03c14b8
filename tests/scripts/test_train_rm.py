"""scripts/train_rm.py: wrong answers of every kind, drawn anew for every batch; a policy's own
answers sampled as the engine would; and a few steps that write a reward model the 'model'
reward loads and scores with."""

import argparse
import importlib.util
import pathlib
import random
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from rljax.configs import arith_tiny

from rljax.config import replace
from rljax.data.tasks import encode_prompt
from rljax.models.sharding import LEARNER_RULES, make_mesh
from rljax.models.tokenizer import Tokenizer
from rljax.models.transformer import init_sharded
from rljax.rewards.model import RewardContext, build_model_reward

_PATH = pathlib.Path(__file__).resolve().parents[2] / "scripts" / "train_rm.py"
_SPEC = importlib.util.spec_from_file_location("train_rm", _PATH)
train_rm = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(train_rm)
# configs/arith_rm.py by its path: rljax.configs is the installed copy of configs/ when rljax is
# installed from another checkout.
_CFG = importlib.util.spec_from_file_location(
    "arith_rm", _PATH.parents[1] / "configs" / "arith_rm.py"
)
arith_rm = importlib.util.module_from_spec(_CFG)
_CFG.loader.exec_module(arith_rm)

EXAMPLES = [
    {"id": 505, "prompt": "5+5=", "answer": "10"},
    {"id": 0, "prompt": "0+0=", "answer": "0"},
    {"id": 9999, "prompt": "99+99=", "answer": "198"},
]


@pytest.mark.parametrize("kind", [None, *train_rm.WRONG_KINDS])
def test_each_example_gives_a_right_and_a_wrong_answer(kind):
    rng = random.Random(0)
    for _ in range(50):
        pairs = train_rm.labelled_pairs(EXAMPLES, rng, kind)
        assert [(a, label) for _, a, label in pairs][::2] == [("10", 1.0), ("0", 1.0), ("198", 1.0)]
        for example, answer, label in pairs[1::2]:
            assert label == 0.0 and answer != example["answer"]
            assert answer == "" or answer.isdigit()


def test_one_digit_changes_exactly_one_place():
    rng = random.Random(0)
    for _ in range(100):
        wrong = train_rm.one_digit("198", rng)
        assert len(wrong) == 3 and sum(a != b for a, b in zip(wrong, "198", strict=True)) == 1


def test_a_policys_wrong_answers_stand_in_at_their_share():
    sampled = {505: ["1+"], 9999: ["19=", "= "]}  # what no made-up kind writes
    rng = random.Random(0)
    pairs = train_rm.labelled_pairs(EXAMPLES, rng, sampled=sampled, sampled_share=1.0)
    assert pairs[1][1] == "1+" and pairs[5][1] in ("19=", "= ")
    assert pairs[3][1] != "0"  # no sample of 0+0: a made-up wrong answer
    never = train_rm.labelled_pairs(EXAMPLES * 20, rng, sampled=sampled, sampled_share=0.0)
    assert all(a == "" or a.isdigit() for _, a, _ in never)


def _args(**changes):
    defaults = dict(seed=0, sampled_share=0.5, sampled_from="", samples=1)
    return argparse.Namespace(**{**defaults, **changes})


def test_every_batch_draws_new_wrong_answers():
    # A fixed wrong answer per problem is learnt by heart; each batch must draw new ones.
    cfg = arith_tiny.recipe("small")
    data = train_rm.Pairs(_args(), cfg, Tokenizer.char_level(), mesh=None)
    size = len(data.train)
    first, second = data.batch(size), data.batch(size)
    assert set(first[2]) == {0.0, 1.0} and len(first[0]) == 2 * size

    def wrong(batch):
        tokens, lengths, labels = batch
        return {tuple(tokens[i, : lengths[i]]) for i in np.flatnonzero(labels == 0.0)}

    shared = wrong(first) & wrong(second)
    assert len(shared) < size // 2, f"{len(shared)} of {size} wrong answers repeated"


def _policy():
    cfg = arith_tiny.recipe("small")
    mesh = make_mesh(jax.devices()[:1], {"fsdp": 1, "tensor": 1})
    graphdef, params = init_sharded(cfg.model, mesh, LEARNER_RULES, 0)
    return cfg, graphdef, params


def test_greedy_answers_match_decoding_each_prompt_alone():
    # The batched sampler pads prompts of different lengths on the right; each row must read
    # its own last token and stop at its own stop token, as decoding it alone does.
    cfg, graphdef, params = _policy()
    char = Tokenizer.char_level()
    prompts = [encode_prompt(char, cfg.data, e) for e in EXAMPLES]
    key = jax.random.key(0)
    free = train_rm.sample_answers(graphdef, params, prompts, char, 5, key, temperature=0)
    # A stop token the random policy writes: the second token of the first answer.
    stop = free[0][1]
    tokenizer = types.SimpleNamespace(stop_ids=frozenset({char.eos_id, stop}), pad_id=0)
    got = train_rm.sample_answers(graphdef, params, prompts, tokenizer, 5, key, temperature=0)
    assert got[0] == free[0][:1]
    model = nnx.merge(graphdef, params)
    for prompt, answer in zip(prompts, got, strict=True):
        seq, want = list(prompt), []
        for _ in range(5):
            t = len(seq)
            hidden = model(jnp.asarray([seq]), jnp.arange(t)[None], jnp.ones((1, t), jnp.int32))
            token = int(jnp.argmax(model.logits(hidden[0, -1])))
            if token in tokenizer.stop_ids:
                break
            seq.append(token)
            want.append(token)
        assert answer == want


def test_a_few_steps_write_a_reward_model_the_recipe_loads(tmp_path, capsys):
    out = str(tmp_path / "rm")
    figures = train_rm.main(
        [
            f"--out={out}",
            "--steps=3",
            "--batch_size=8",
            "--eval_every=2",
            "--init=random",
            "--sampled_from=",
        ]
    )
    assert figures["steps"] == 3 and np.isfinite(figures["loss"])
    assert set(figures["heldout_pairs_ranked_by_kind"]) == set(train_rm.WRONG_KINDS)
    assert "held-out pairs ranked" in capsys.readouterr().out
    cfg = replace(arith_rm.recipe("small"), **{"reward.model.path": out})
    context = RewardContext(Tokenizer.char_level(), cfg.data, cfg.sampling.max_seq_len)
    reward = build_model_reward(cfg.reward.model, context)
    scores = reward(["10", "11"], [{"prompt": "5+5=", "answer": "10"}] * 2)
    assert np.isfinite(scores).all() and scores[0] != scores[1]
