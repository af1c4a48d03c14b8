"""scripts/eval_recipe.py: the carry patterns its per-carry table splits accuracy by."""

import importlib.util
import pathlib

import pytest
from rljax.configs import arith_tiny

from rljax.config import replace

_PATH = pathlib.Path(__file__).resolve().parents[2] / "scripts" / "eval_recipe.py"
_SPEC = importlib.util.spec_from_file_location("eval_recipe", _PATH)
eval_recipe = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(eval_recipe)


@pytest.mark.parametrize(
    "prompt,pattern",
    [
        ("12+34=", "none"),
        ("50+60=", "tens"),
        ("95+5=", "both"),  # 5+5 carries into 9+0+1 = 10
        ("18+5=", "units"),
        ("99+99=", "both"),
        ("0+0=", "none"),
        ("45+55=", "both"),
        ("41+69=", "both"),
        ("70+30=", "tens"),
    ],
)
def test_carry_pattern(prompt, pattern):
    assert eval_recipe.carry_pattern(prompt) == pattern


def test_by_pattern_counts_every_example_once():
    scored = [({"prompt": "12+34="}, 1.0), ({"prompt": "18+5="}, 0.0), ({"prompt": "19+5="}, 1.0)]
    table = eval_recipe.by_pattern(scored)
    assert sum(row["n"] for row in table.values()) == 3
    assert table["units"] == {"n": 2, "acc": 0.5}
    assert table["tens"] == {"n": 0, "acc": 0.0}


def test_the_control_config_is_valid():
    # The control trains with the RL learning rate at 0, which the config must accept.
    cfg = replace(arith_tiny.recipe(), **{"learner.learning_rate": 0.0})
    assert cfg.learner.learning_rate == 0.0
