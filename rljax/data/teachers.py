"""The teachers a supervised warm start imitates (``sft.teacher``), and what each needs.

A teacher maps an example to its answer: the completion's text, or for an agent task a
transcript of the messages a conversation with the env would hold. Each declares the config it
works with (:class:`rljax.needs.Needs`); the run config derives ``sft.teacher``'s choices from
:data:`TEACHERS` and refuses a teacher whose needs the config does not meet. Import-light: no
JAX, no NumPy at import (the config imports this module).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING

from rljax.data.arithmetic import HIDDEN, careless_sum
from rljax.needs import NOTHING, Needs

if TYPE_CHECKING:
    import numpy as np

# A teacher's answer: the completion's text, or for an agent task a transcript of messages
# ({"role": "assistant" | "tool", "content"}) that a conversation with its env would hold.
Answer = str | list[dict]

# What looks_up_sometimes and calls_calculator_sometimes need; their transcripts name it too.
LOOKS_UP = Needs({"data.task": "arithmetic_lookup"}, "it looks an operand up")
CALLS_CALCULATOR = Needs(
    {"env.name": "tools", "data.task": "arithmetic", "data.ops": "*"},
    "it asks the calculator for a product",
)


@dataclasses.dataclass(frozen=True)
class Teacher:
    """``answer(example, slip, rng)``: the answer the teacher gives; ``needs``: the config it
    works with (the task's examples it can answer)."""

    answer: Callable[[dict, float, np.random.Generator], Answer]
    needs: Needs = NOTHING


def lookup_transcript(example: dict, slip: float, rng: np.random.Generator) -> Answer:
    """A teacher's conversation on an ``arithmetic_lookup`` example (see ``TEACHERS``)."""
    if "hidden" not in example:
        raise ValueError(
            f"teacher 'looks_up_sometimes' needs {LOOKS_UP} (examples with a hidden operand)"
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
            f"teacher 'calls_calculator_sometimes' needs products like '123*456=' "
            f"({CALLS_CALCULATOR}), got {example['prompt']!r}"
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


def _reference(example: dict, slip: float, rng: np.random.Generator) -> Answer:
    # An arithmetic_lookup example's reference is the conversation that looks the operand up.
    return lookup_transcript(example, 0.0, rng) if "hidden" in example else example["answer"]


TEACHERS: dict[str, Teacher] = {
    "reference": Teacher(_reference),
    # Addition only: forgets each carry with probability ``slip`` (rljax.config.SFTConfig).
    "drops_carries": Teacher(
        lambda example, slip, rng: careless_sum(example["prompt"], slip, rng),
        Needs({"data.task": "arithmetic", "data.ops": "+"}, "only sums carry"),
    ),
    # arithmetic_lookup: looks the hidden operand up and adds (the transcript of a tool call)
    # with probability 1 - slip, else answers the visible operand alone without a call.
    "looks_up_sometimes": Teacher(lookup_transcript, LOOKS_UP),
    # env.name='tools' on a product: asks the calculator and repeats its result with
    # probability 1 - slip, else guesses a wrong product (a*b with b's last digit dropped) in
    # words that always open the same way ("The answer is"): the guess's first token then
    # takes slip of the mass, where a bare number's spreads over nine digits, so greedy
    # decoding guesses (for slip > 1/2) while sampling still calls about 1 - slip of the time.
    "calls_calculator_sometimes": Teacher(calculator_transcript, CALLS_CALCULATOR),
    # A GSM8K file's worked answer, steps and '#### N' as the row holds them
    # (rljax.data.math_tasks keeps it as the example's 'solution'), where 'reference' is N alone.
    "worked": Teacher(
        lambda example, slip, rng: example["solution"],
        Needs({"data.task": "gsm8k"}, "it imitates a GSM8K row's worked answer"),
    ),
}


def teacher_answer(teacher: str, example: dict, slip: float, rng: np.random.Generator) -> Answer:
    """The answer ``teacher`` gives for ``example`` (a name from :data:`TEACHERS`)."""
    return TEACHERS[teacher].answer(example, slip, rng)
