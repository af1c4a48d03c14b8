"""Deterministic synthetic arithmetic task: prompts like ``"37+45="`` with answer ``"82"``.

The problem space is every ``(a, op, b)`` with ``0 <= a, b < 10**num_digits`` and ``op`` in
``ops``. Each problem has a stable integer id (its index in that space). Train and held-out
splits are drawn without replacement from one seeded stream, so they are disjoint by
construction.

The stream is SplitMix64 written in pure Python rather than ``numpy.random`` or ``hash()``:
NumPy does not promise identical ``Generator`` streams across versions and ``hash()`` of
strings is salted per process, while every host of a multi-host job must see the same splits.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

SUPPORTED_OPS = "+-*"
MAX_DIGITS = 9
_MASK64 = (1 << 64) - 1


def _splitmix64(seed: int) -> Iterator[int]:
    """Yields an endless, platform-independent stream of 64-bit integers."""
    state = seed & _MASK64
    while True:
        state = (state + 0x9E3779B97F4A7C15) & _MASK64
        z = state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
        yield z ^ (z >> 31)


def _apply(op: str, a: int, b: int) -> int:
    if op == "+":
        return a + b
    if op == "-":
        return a - b
    return a * b


@dataclasses.dataclass(frozen=True)
class ArithmeticTask:
    """Seeded arithmetic problems split into disjoint train and held-out sets.

    Attributes:
      num_digits: maximum number of digits of each operand (operands are drawn uniformly from
        ``[0, 10**num_digits)``), 1 to 9.
      ops: the operators to draw from, a non-empty subset of ``"+-*"``. ``"-"`` may produce
        negative answers such as ``"-12"``.
      train_size: number of training problems.
      heldout_size: number of held-out problems, disjoint from the training ones.
      seed: seed of the split; the same seed gives the same splits on every machine.
    """

    num_digits: int = 2
    ops: str = "+"
    train_size: int = 1000
    heldout_size: int = 100
    seed: int = 0

    def __post_init__(self):
        if isinstance(self.num_digits, bool) or not isinstance(self.num_digits, int):
            raise TypeError(f"num_digits must be an int, got {type(self.num_digits).__name__}.")
        if not 1 <= self.num_digits <= MAX_DIGITS:
            raise ValueError(
                f"num_digits={self.num_digits} is out of range; use 1 to {MAX_DIGITS}."
            )
        if not isinstance(self.ops, str) or not self.ops:
            raise ValueError(f"ops={self.ops!r} must be a non-empty string of {SUPPORTED_OPS!r}.")
        bad = sorted(set(self.ops) - set(SUPPORTED_OPS))
        if bad:
            raise ValueError(
                f"ops={self.ops!r} has unsupported operator(s) {bad}; use only {SUPPORTED_OPS!r}."
            )
        if len(set(self.ops)) != len(self.ops):
            raise ValueError(f"ops={self.ops!r} repeats an operator; list each one once.")
        for name in ("train_size", "heldout_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{name}={value!r} must be a non-negative int.")
        if self.train_size + self.heldout_size > self.space_size:
            raise ValueError(
                f"train_size + heldout_size = {self.train_size + self.heldout_size} exceeds the "
                f"{self.space_size} distinct problems with num_digits={self.num_digits} and "
                f"ops={self.ops!r}; lower the sizes or raise num_digits."
            )

    @property
    def space_size(self) -> int:
        """Number of distinct problems this task can generate."""
        return len(self.ops) * (10**self.num_digits) ** 2

    def problem(self, problem_id: int) -> dict:
        """Returns the example dict ``{"id", "prompt", "answer"}`` for a problem id."""
        if not 0 <= problem_id < self.space_size:
            raise ValueError(
                f"problem_id={problem_id} is out of range; use 0 to {self.space_size - 1}."
            )
        base = 10**self.num_digits
        op_index, rest = divmod(problem_id, base * base)
        a, b = divmod(rest, base)
        op = self.ops[op_index]
        return {"id": problem_id, "prompt": f"{a}{op}{b}=", "answer": str(_apply(op, a, b))}

    def _draw_ids(self) -> list[int]:
        """Draws ``train_size + heldout_size`` distinct problem ids from the seeded stream."""
        wanted = self.train_size + self.heldout_size
        space = self.space_size
        stream = _splitmix64(self.seed)
        if wanted * 2 > space:
            # Dense request: rejection sampling would stall, so shuffle the whole space
            # (Fisher-Yates driven by the same stream) and take a prefix.
            ids = list(range(space))
            for i in range(space - 1, 0, -1):
                j = next(stream) % (i + 1)
                ids[i], ids[j] = ids[j], ids[i]
            return ids[:wanted]
        seen: set[int] = set()
        ids = []
        while len(ids) < wanted:
            candidate = next(stream) % space
            if candidate not in seen:
                seen.add(candidate)
                ids.append(candidate)
        return ids

    def splits(self) -> tuple[list[dict], list[dict]]:
        """Returns ``(train, heldout)`` example lists; disjoint and fixed by the seed."""
        ids = self._draw_ids()
        train = [self.problem(i) for i in ids[: self.train_size]]
        heldout = [self.problem(i) for i in ids[self.train_size :]]
        return train, heldout

    def train(self) -> list[dict]:
        """Returns the training examples."""
        return self.splits()[0]

    def heldout(self) -> list[dict]:
        """Returns the held-out examples."""
        return self.splits()[1]


def careless_sum(prompt: str, slip: float, rng) -> str:
    """The answer to ``"a+b="`` from a teacher that forgets each carry with probability ``slip``.

    Column addition from the units up; whenever a column carries, ``rng.random() < slip`` drops
    the carry. With ``slip=0`` this is the exact sum. ``rng`` is a ``random.Random`` or a NumPy
    ``Generator``.
    """
    question = prompt.rstrip("= ")
    a_text, plus, b_text = question.partition("+")
    if not plus or not a_text.isdigit() or not b_text.isdigit():
        raise ValueError(f"careless_sum needs a prompt like '37+45=', got {prompt!r}.")
    a, b = int(a_text), int(b_text)
    digits, carry = [], 0
    while a or b or carry:
        column = a % 10 + b % 10 + carry
        digits.append(column % 10)
        carry = column // 10
        if carry and rng.random() < slip:
            carry = 0
        a, b = a // 10, b // 10
    return "".join(str(d) for d in reversed(digits)).lstrip("0") or "0"


HIDDEN = "*"  # stands for the operand an agent must look up (a character the char tokenizer has)


def hide_operand(example: dict) -> dict:
    """The lookup variant of an addition problem: ``"37+45="`` becomes ``"37+*="``.

    The second operand is kept in ``hidden``: only a tool call reveals it
    (:class:`rljax.envs.lookup.LookupEnv`), so the answer is out of reach without the tool.
    """
    question = example["prompt"].rstrip("= ")
    a, plus, b = question.partition("+")
    if not plus or not a.isdigit() or not b.isdigit():
        raise ValueError(
            f"the lookup task hides the second operand of an addition like '37+45=', got "
            f"{example['prompt']!r}; use data.ops='+'"
        )
    return {**example, "prompt": f"{a}+{HIDDEN}=", "hidden": b}
