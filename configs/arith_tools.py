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
from rljax.configs.arith_tiny import MODEL

from rljax.config import (
    DataConfig,
    EnvConfig,
    LearnerConfig,
    MetricsConfig,
    RunConfig,
    SamplingConfig,
    SFTConfig,
    replace,
    to_config_dict,
)

VARIANTS = ("small", "control")  # small: < 1 minute; control: the tool answers nothing


def recipe(variant: str = "") -> RunConfig:
    """The typed config of a variant ('' for the full run); ``get_config`` wraps it."""
    if variant not in ("", *VARIANTS):
        raise ValueError(
            f"unknown variant {variant!r} of configs/arith_tools.py; use one of {VARIANTS} or none"
        )
    cfg = RunConfig(
        model=MODEL,
        tokenizer="char",
        sampling=SamplingConfig(
            temperature=1.0,
            max_new_tokens=10,  # '*' + stop, the operand and '=', the answer + stop
            max_prefill_length=8,
            max_concurrent_decodes=256,
            page_size=8,
        ),
        learner=LearnerConfig(
            loss="grpo",
            group_size=8,
            batch_groups=32,
            learning_rate=1e-3,
            decay_steps=60,
            epsilon_low=0.2,
            epsilon_high=0.28,
            beta=0.0,
            grad_clip=1.0,
        ),
        sft=SFTConfig(
            steps=1200,
            batch_size=64,
            learning_rate=4e-3,
            warmup_steps=100,
            schedule="cosine",
            teacher="looks_up_sometimes",
            teacher_slip=0.8,
            exact_steps=600,
        ),
        data=DataConfig(
            task="arithmetic_lookup", num_digits=2, ops="+", train_size=4000, heldout_size=256
        ),
        env=EnvConfig(name="lookup", max_turns=2, step_timeout_s=5.0),
        metrics=MetricsConfig(progress_bar=True),
        num_steps=60,
        eval_every=20,
        eval_examples=256,
    )
    if variant == "control":
        cfg = replace(cfg, **{"env.name": "lookup_blind"})
    if variant == "small":
        cfg = replace(
            cfg,
            **{
                "sampling.max_concurrent_decodes": 32,
                "learner.batch_groups": 4,
                "sft.steps": 5,
                "sft.warmup_steps": 1,
                "sft.exact_steps": 2,
                "sft.batch_size": 16,
                "data.train_size": 200,
                "data.heldout_size": 16,
                "num_steps": 3,
                "eval_every": 0,
                "eval_examples": 16,
                "metrics.progress_bar": False,
            },
        )
    return cfg


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    return to_config_dict(recipe(arg or ""))
