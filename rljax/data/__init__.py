"""Data: prompt tasks (synthetic arithmetic, GSM8K/MATH files) and grain pipelines."""

from rljax.data.arithmetic import ArithmeticTask
from rljax.data.math_tasks import chat_prompt_builder, load_math_examples, plain_prompt
from rljax.data.pipeline import process_shard, prompt_dataset, prompt_iterator

__all__ = [
    "ArithmeticTask",
    "chat_prompt_builder",
    "load_math_examples",
    "plain_prompt",
    "process_shard",
    "prompt_dataset",
    "prompt_iterator",
]
