"""Agents on the embedded tiny model: addition whose second operand only a tool reveals.

    rljax --config=configs/arith_tools.py --workdir=/tmp/rljax/arith_tools
    rljax --config=configs/arith_tools.py:small --workdir=/tmp/rljax/tools_small  # < 1 minute
    rljax --config=configs/arith_tools.py:control --workdir=/tmp/rljax/tools_control

The prompt hides the second operand (``'37+*='``, data.task='arithmetic_lookup'). A model turn
that is just ``'*'`` calls the lookup tool (rljax.envs.lookup.LookupEnv), which answers
``'45='`` as a tool message; the next turn is the answer, scored by exact match. Without the
tool the answer is a guess. Each conversation is two model turns and one observation, the KV
kept across them (only the observation's tokens are prefilled for the second turn).

The warm start first imitates the reference (always look up, then add), then a teacher that
looks up only a fifth of the time and otherwise answers the visible operand: greedy decoding
then rarely calls the tool and scores near zero, while sampling calls it often enough for GRPO
to reinforce the call. ``control`` is the same run with a blind tool (it answers nothing), so
calling it cannot help: what the main run gains comes from what the env returns.
"""

import ml_collections
from rljax.configs import arith_tiny

from rljax.config import RunConfig, replace, to_config_dict

VARIANTS = ("small", "control")  # small: < 1 minute; control: the tool answers nothing


def recipe(variant: str = "") -> RunConfig:
    """The typed config of a variant ('' for the full run); ``get_config`` wraps it."""
    if variant not in ("", *VARIANTS):
        raise ValueError(
            f"unknown variant {variant!r} of configs/arith_tools.py; use one of {VARIANTS} or none"
        )
    # The default recipe's model, sampling, GRPO and warm-start settings, on the lookup task.
    base = arith_tiny.recipe("small" if variant == "small" else "")
    changes = {
        "sampling.max_new_tokens": 10,  # '*' + stop, the operand and '=', the answer + stop
        "data.task": "arithmetic_lookup",
        "env.name": "lookup_blind" if variant == "control" else "lookup",
        "env.max_turns": 2,
        "env.step_timeout_s": 5.0,
        "sft.teacher": "looks_up_sometimes",
    }
    if variant != "small":  # the small variant keeps the default's shrunk schedule
        changes |= {
            "learner.decay_steps": 60,
            "sft.steps": 1200,
            "num_steps": 60,
            "eval_every": 20,
        }
    return replace(base, **changes)


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    return to_config_dict(recipe(arg or ""))
