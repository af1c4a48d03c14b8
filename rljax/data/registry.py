"""The tasks a run can name (``data.task``): where each one's examples come from, and what it
needs of the rest of the config.

The run config derives ``data.task``'s choices from :data:`TASKS` and refuses a task whose
needs it does not meet (``rljax.needs``); :func:`rljax.data.tasks.load_task` builds the
examples as the entry says. Import-light: no JAX (the config imports this module).
"""

from __future__ import annotations

import dataclasses

from rljax.needs import NOTHING, Needs


@dataclasses.dataclass(frozen=True)
class Task:
    """``reads_file``: the examples are read from ``data.path`` (JSONL or parquet), else
    generated from the seed (``rljax.data.arithmetic``); ``hides_operand``: each example hides
    an operand that an agent looks up (``arithmetic_lookup``); ``needs``: the config it works
    with."""

    reads_file: bool = False
    hides_operand: bool = False
    needs: Needs = NOTHING


# How a file task's answer field gives the final answer (rljax.data.math_tasks.final_answer);
# 'auto': the task's own (gsm8k: '#### N', math: the last \\boxed{}).
ANSWER_FORMATS = ("auto", "gsm8k", "boxed", "number", "raw")

TASKS: dict[str, Task] = {
    "arithmetic": Task(),
    # The hidden operand is an addend: the lookup answers it, and the sum is then known.
    "arithmetic_lookup": Task(
        hides_operand=True, needs=Needs({"data.ops": "+"}, "it hides an addend")
    ),
    "gsm8k": Task(reads_file=True),
    "math": Task(reads_file=True),
}
