"""What a run asks of its task: train and held-out examples, prompt text, teachers' answers.

Examples are dicts ``{"id", "prompt", "answer"}`` (see ``rljax.data.arithmetic`` and
``rljax.data.math_tasks``).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from rljax.config import ConfigError
from rljax.data.arithmetic import HIDDEN, ArithmeticTask, careless_sum, hide_operand

# A teacher's answer: the completion's text, or for an agent task a transcript of messages
# ({"role": "assistant" | "tool", "content"}) that a conversation with its env would hold.
Answer = str | list[dict]
# name -> answer(example, slip, rng): the targets a supervised warm start imitates.
Teacher = Callable[[dict, float, np.random.Generator], Answer]
TEACHERS: dict[str, Teacher] = {
    # An arithmetic_lookup example's reference is the conversation that looks the operand up.
    "reference": lambda example, slip, rng: (
        lookup_transcript(example, 0.0, rng) if "hidden" in example else example["answer"]
    ),
    # Addition only: forgets each carry with probability ``slip`` (rljax.config.SFTConfig).
    "drops_carries": lambda example, slip, rng: careless_sum(example["prompt"], slip, rng),
    # arithmetic_lookup: looks the hidden operand up and adds (the transcript of a tool call)
    # with probability 1 - slip, else answers the visible operand alone without a call.
    "looks_up_sometimes": lambda example, slip, rng: lookup_transcript(example, slip, rng),
    # env.name='tools' on a product: asks the calculator and repeats its result with
    # probability 1 - slip, else guesses a wrong product (a*b with b's last digit dropped) in
    # words that always open the same way ("The answer is"): the guess's first token then
    # takes slip of the mass, where a bare number's spreads over nine digits, so greedy
    # decoding guesses (for slip > 1/2) while sampling still calls about 1 - slip of the time.
    "calls_calculator_sometimes": lambda example, slip, rng: calculator_transcript(
        example, slip, rng
    ),
}


def load_task(data_cfg, seed: int) -> tuple[list[dict], list[dict]]:
    """(train, held-out) examples for ``data_cfg.task``."""
    if data_cfg.task in ("arithmetic", "arithmetic_lookup"):
        task = ArithmeticTask(
            num_digits=data_cfg.num_digits,
            ops=data_cfg.ops,
            train_size=data_cfg.train_size,
            heldout_size=data_cfg.heldout_size,
            seed=seed,
        )
        train, heldout = task.splits()
        if data_cfg.task == "arithmetic_lookup":
            train, heldout = [hide_operand(e) for e in train], [hide_operand(e) for e in heldout]
        return train, heldout
    from rljax import io
    from rljax.data import math_tasks

    with io.input_error("data.path", data_cfg.path):
        return math_tasks.load_splits(data_cfg)


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


def lookup_transcript(example: dict, slip: float, rng: np.random.Generator) -> Answer:
    """A teacher's conversation on an ``arithmetic_lookup`` example (see ``TEACHERS``)."""
    if "hidden" not in example:
        raise ValueError(
            "teacher 'looks_up_sometimes' needs data.task='arithmetic_lookup' (examples with a "
            "hidden operand)"
        )
    if rng.random() < slip:
        return [{"role": "assistant", "content": example["prompt"].split("+")[0]}]
    return [
        {"role": "assistant", "content": HIDDEN},
        {"role": "tool", "content": example["hidden"] + "="},
        {"role": "assistant", "content": example["answer"]},
    ]


def calculator_transcript(example: dict, slip: float, rng: np.random.Generator) -> Answer:
    """A teacher's conversation on a product ``"a*b="`` with the calculator tool (see
    ``TEACHERS``); the call is a message's ``tool_calls``, written in the run's tool format
    when the transcript is encoded."""
    a, op, b = example["prompt"].rstrip("= ").partition("*")
    if not op or not (a.isdigit() and b.isdigit()):
        raise ValueError(
            "teacher 'calls_calculator_sometimes' needs products like '123*456=' (data.task="
            f"'arithmetic', data.ops='*'), got {example['prompt']!r}"
        )
    answer = str(int(a) * int(b))
    if rng.random() < slip:
        return [{"role": "assistant", "content": f"The answer is {int(a) * (int(b) // 10)}."}]
    call = {"name": "calculator", "arguments": {"expression": f"{a}*{b}"}}
    return [
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "name": "calculator", "content": answer},
        {"role": "assistant", "content": answer},
    ]


def teacher_answer(teacher: str, example: dict, slip: float, rng: np.random.Generator) -> Answer:
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
