"""A run trained on a learned reward is judged on the task: reward.heldout's verifier scores the
held-out answers, and the record says how often the training reward agreed with it."""

import numpy as np

from rljax.config import RewardConfig, RewardModelConfig
from rljax.engine.sampler import FINISH_STOP, Trajectory
from rljax.models.tokenizer import Tokenizer
from rljax.runtime.evaluation import heldout_scores


def _traj(tok, text, answer):
    ids = tok.encode(text) + [tok.eos_id]
    return Trajectory(
        prompt_tokens=[1],
        response_tokens=ids,
        logprobs=[0.0] * len(ids),
        versions=[0] * len(ids),
        finish_reason=FINISH_STOP,
        group_id=0,
        sample_index=0,
        payload={"prompt": "1+1=", "answer": answer},
    )


def test_the_verifier_scores_and_the_agreement_is_counted():
    tok = Tokenizer.char_level()
    answers = [("2", "2"), ("3", "2"), ("12", "12"), ("1", "9")]
    trajs = [_traj(tok, text, answer) for text, answer in answers]
    model_scores = np.array([1.5, 0.7, -0.2, -3.0])  # logits: right, wrong, wrong, right
    cfg = RewardConfig(name="model", heldout="exact_match", model=RewardModelConfig(path="/rm"))
    scores, extra = heldout_scores(cfg, tok, trajs, model_scores)
    np.testing.assert_array_equal(scores, [1.0, 0.0, 1.0, 0.0])
    assert extra["heldout_reward_agreement"] == 0.5
    assert extra["heldout_train_reward"] == np.mean(model_scores)
    same, none = heldout_scores(RewardConfig(), tok, trajs, model_scores)
    assert same is model_scores and none == {}
