"""data.task='arithmetic_lookup': addition with the second operand behind a tool."""

import pytest

from rljax.config import ConfigError, DataConfig
from rljax.data.arithmetic import HIDDEN, hide_operand
from rljax.data.tasks import load_task


def test_the_second_operand_is_hidden_and_kept():
    cfg = DataConfig(task="arithmetic_lookup", train_size=50, heldout_size=10)
    train, heldout = load_task(cfg, seed=3)
    plain = load_task(DataConfig(train_size=50, heldout_size=10), seed=3)
    for ex, ref in zip(train + heldout, plain[0] + plain[1], strict=True):
        a, b = ref["prompt"].rstrip("=").split("+")
        assert ex["prompt"] == f"{a}+{HIDDEN}=" and ex["hidden"] == b
        assert ex["answer"] == ref["answer"] == str(int(a) + int(ex["hidden"]))
        assert ex["id"] == ref["id"]


def test_only_addition_can_be_hidden():
    with pytest.raises(ConfigError, match="data.ops"):
        DataConfig(task="arithmetic_lookup", ops="+-")
    with pytest.raises(ValueError, match="use data.ops='\\+'"):
        hide_operand({"id": 0, "prompt": "3*4=", "answer": "12"})


def test_the_teachers_transcripts():
    import numpy as np

    from rljax.config import RunConfig, SFTConfig
    from rljax.data.teachers import teacher_answer

    ex = hide_operand({"id": 1, "prompt": "37+45=", "answer": "82"})
    looked_up = [
        {"role": "assistant", "content": HIDDEN},
        {"role": "tool", "content": "45="},
        {"role": "assistant", "content": "82"},
    ]
    rng = np.random.default_rng(0)
    assert teacher_answer("reference", ex, 0.0, rng) == looked_up
    answers = [teacher_answer("looks_up_sometimes", ex, 0.75, rng) for _ in range(400)]
    guesses = [a for a in answers if a != looked_up]
    assert all(a == [{"role": "assistant", "content": "37"}] for a in guesses)
    assert 0.65 < len(guesses) / len(answers) < 0.85
    # The plain task's reference stays its answer text.
    assert teacher_answer("reference", {"prompt": "37+45=", "answer": "82"}, 0.0, rng) == "82"
    with pytest.raises(ConfigError, match="sft.teacher"):
        RunConfig(sft=SFTConfig(teacher="looks_up_sometimes"))
