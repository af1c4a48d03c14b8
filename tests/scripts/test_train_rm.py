"""scripts/train_rm.py: labelled pairs, and a few steps that write a reward model the 'model'
reward loads and scores with."""

import importlib.util
import pathlib

import numpy as np

from rljax.config import replace
from rljax.models.tokenizer import Tokenizer
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


def test_each_example_gives_a_right_and_a_wrong_answer():
    examples = [{"prompt": "5+5=", "answer": "10"}, {"prompt": "0+0=", "answer": "0"}]
    pairs = train_rm.labelled_pairs(examples, seed=0)
    assert [(a, label) for _, a, label in pairs][::2] == [("10", 1.0), ("0", 1.0)]
    for example, answer, label in pairs[1::2]:
        assert label == 0.0 and answer != example["answer"] and int(answer) >= 0


def test_a_few_steps_write_a_reward_model_the_recipe_loads(tmp_path, capsys):
    out = str(tmp_path / "rm")
    figures = train_rm.main(
        [f"--out={out}", "--steps=3", "--batch_size=8", "--eval_every=2", "--init=random"]
    )
    assert figures["steps"] == 3 and np.isfinite(figures["loss"])
    assert "held-out pairs ranked" in capsys.readouterr().out
    cfg = replace(arith_rm.recipe("small"), **{"reward.model.path": out})
    context = RewardContext(Tokenizer.char_level(), cfg.data, cfg.sampling.max_seq_len)
    reward = build_model_reward(cfg.reward.model, context)
    scores = reward(["10", "11"], [{"prompt": "5+5=", "answer": "10"}] * 2)
    assert np.isfinite(scores).all() and scores[0] != scores[1]
