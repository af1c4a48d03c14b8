"""What a run asks of its task: train and held-out examples and prompt text.

Examples are dicts ``{"id", "prompt", "answer"}`` (see ``rljax.data.arithmetic`` and
``rljax.data.math_tasks``); which tasks there are is ``rljax.data.registry.TASKS``, and the
teachers' answers are ``rljax.data.teachers``.
"""

from __future__ import annotations

from rljax.config import ConfigError
from rljax.data.arithmetic import ArithmeticTask, hide_operand
from rljax.data.registry import TASKS


def load_task(data_cfg, seed: int, skipped=None) -> tuple[list[dict], list[dict]]:
    """(train, held-out) examples for ``data_cfg.task``; a file task's rows that cannot be
    used are counted into ``skipped`` (a Counter, by reason)."""
    if not TASKS[data_cfg.task].reads_file:
        task = ArithmeticTask(
            num_digits=data_cfg.num_digits,
            ops=data_cfg.ops,
            train_size=data_cfg.train_size,
            heldout_size=data_cfg.heldout_size,
            seed=seed,
        )
        train, heldout = task.splits()
        if TASKS[data_cfg.task].hides_operand:
            train, heldout = [hide_operand(e) for e in train], [hide_operand(e) for e in heldout]
        return train, heldout
    from rljax import io
    from rljax.data import math_tasks

    with io.input_error("data.path", data_cfg.path):
        return math_tasks.load_splits(data_cfg, skipped)


def check_prompts(
    tokenizer, data_cfg, examples: list[dict], max_prefill_length: int | None = None
) -> None:
    """Encodes every example's prompt, so that a prompt the tokenizer cannot take (a character
    outside a char-level alphabet, a chat template that fails) or one longer than the largest
    prefill refuses the run before it starts, not when the sampler first meets it."""
    longest, longest_id = 0, None
    for example in examples:
        try:
            n = len(encode_prompt(tokenizer, data_cfg, example))
        except (ValueError, TypeError, KeyError) as e:
            message = " ".join(str(e).split())
            raise ConfigError(
                f"the tokenizer (config key 'tokenizer') cannot encode the prompt of example "
                f"{example.get('id')!r} of data.task={data_cfg.task!r} with data.prompt_format="
                f"{data_cfg.prompt_format!r} ({message}); use a tokenizer that covers the task's "
                "text, and for 'chat' one whose chat template renders a user turn"
            ) from e
        if n > longest:
            longest, longest_id = n, example.get("id")
    if max_prefill_length is not None and longest > max_prefill_length:
        raise ConfigError(
            f"config key 'sampling.max_prefill_length' = {max_prefill_length} is shorter than the "
            f"longest prompt of data.task={data_cfg.task!r} ({longest} tokens, example "
            f"{longest_id!r}); raise it to at least {longest}, or shorten the prompts "
            "(data.prompt_template)"
        )


def encode_prompt(tokenizer, data_cfg, example: dict) -> list[int]:
    """The prompt tokens for ``example``: the template filled in, chat-formatted if configured."""
    content = data_cfg.prompt_template.format(
        prompt=example["prompt"], question=example.get("question", example["prompt"].rstrip("= "))
    )
    if data_cfg.prompt_format == "chat":
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": content}], add_generation_prompt=True
        )
        return tokenizer.encode(text, add_bos=False)
    return tokenizer.encode(content, add_bos=tokenizer.bos_id is not None)
