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
