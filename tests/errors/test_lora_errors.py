"""LoRA settings a model cannot take: the launcher prints one line and touches nothing."""

import pytest
from rljax.configs import arith_moe

from rljax.config import replace

CASES = [
    (
        "C29",
        ["--config=configs/arith_moe.py:small", "--config.lora.enabled=True"],
        """set lora.targets='("q","k","v","o")'""",
    ),
]


@pytest.mark.parametrize("row_id, args, fix", CASES, ids=[c[0] for c in CASES])
def test_bad_lora_config(launch_error, check_row, row_id, args, fix):
    check_row(row_id, launch_error(*args), fix)


def test_attention_targets_on_the_same_model_pass():
    cfg = replace(
        arith_moe.recipe("small"), **{"lora.enabled": True, "lora.targets": ("q", "k", "v", "o")}
    )
    assert cfg.lora.targets == ("q", "k", "v", "o")
