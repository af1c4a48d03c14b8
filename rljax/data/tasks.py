"""What a run asks of its task: train and held-out examples, prompt text, teachers' answers.

Examples are dicts ``{"id", "prompt", "answer"}`` (see ``rljax.data.arithmetic`` and
``rljax.data.math_tasks``).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from rljax.config import ConfigError
from rljax.data.arithmetic import ArithmeticTask, careless_sum

# name -> answer(example, slip, rng): the targets a supervised warm start imitates.
Teacher = Callable[[dict, float, np.random.Generator], str]
TEACHERS: dict[str, Teacher] = {
    "reference": lambda example, slip, rng: example["answer"],
    # Addition only: forgets each carry with probability ``slip`` (rljax.config.SFTConfig).
    "drops_carries": lambda example, slip, rng: careless_sum(example["prompt"], slip, rng),
}


def load_task(data_cfg, seed: int) -> tuple[list[dict], list[dict]]:
    """(train, held-out) examples for ``data_cfg.task``."""
    if data_cfg.task == "arithmetic":
        task = ArithmeticTask(
            num_digits=data_cfg.num_digits,
            ops=data_cfg.ops,
            train_size=data_cfg.train_size,
            heldout_size=data_cfg.heldout_size,
            seed=seed,
        )
        return task.train(), task.heldout()
    from rljax import io
    from rljax.data import math_tasks

    with io.input_error("data.path", data_cfg.path):
        return math_tasks.load_splits(data_cfg)


def check_prompts(tokenizer, data_cfg, examples: list[dict]) -> None:
    """Encodes the first example, so a prompt the tokenizer cannot take (a character outside
    a char-level alphabet, a chat template that fails) refuses the run before it starts."""
    if not examples:
        return
    try:
        encode_prompt(tokenizer, data_cfg, examples[0])
    except (ValueError, TypeError, KeyError) as e:
        message = " ".join(str(e).split())
        raise ConfigError(
            f"the tokenizer (config key 'tokenizer') cannot encode the first prompt of "
            f"data.task={data_cfg.task!r} with data.prompt_format={data_cfg.prompt_format!r} "
            f"({message}); use a tokenizer that covers the task's text, and for 'chat' one "
            "whose chat template renders a user turn"
        ) from e


def teacher_answer(teacher: str, example: dict, slip: float, rng: np.random.Generator) -> str:
    """The answer ``teacher`` gives for ``example`` (a name from :data:`TEACHERS`)."""
    return TEACHERS[teacher](example, slip, rng)


def encode_prompt(tokenizer, data_cfg, example: dict) -> list[int]:
    """The prompt tokens for ``example``: the template filled in, chat-formatted if configured."""
    content = data_cfg.prompt_template.format(
        prompt=example["prompt"], question=example["prompt"].rstrip("= ")
    )
    if data_cfg.prompt_format == "chat":
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": content}], add_generation_prompt=True
        )
        return tokenizer.encode(text, add_bos=False)
    return tokenizer.encode(content, add_bos=tokenizer.bos_id is not None)
