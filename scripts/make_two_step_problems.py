"""Writes configs/data/two_step.jsonl: GSM8K-format two-step word problems (generated, seeded).

    python scripts/make_two_step_problems.py [--rows=640] [--seed=0] [--out=PATH]

Each row is ``{"question": ..., "answer": "<the two steps>\\n#### <number>"}``, GSM8K's own
format, so ``configs/smollm2_gsm8k_format.py`` reads it as a user's GSM8K-style file would be
read (``data.task='gsm8k'``). The problems combine two operations on one-digit numbers (a sum
then a difference, a product then a sum, ...) in eight everyday settings, small enough that
SmolLM2-135M solves some of them; the answers are non-negative integers. The file in the
repository is this script's output with the defaults.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import random

REPO = pathlib.Path(__file__).resolve().parents[1]

# (question template, first step, second step, answer) over the numbers a, b, c.
TEMPLATES = [
    (
        "{name} has {a} apples. {pron} buys {b} more and then gives {c} to a friend. "
        "How many apples does {name} have now?",
        "{a} + {b} = {ab}",
        "{ab} - {c} = {r}",
        lambda a, b, c: a + b - c,
    ),
    (
        "A shelf holds {a} rows of {b} books. {name} adds {c} more books. "
        "How many books are on the shelf?",
        "{a} * {b} = {ab}",
        "{ab} + {c} = {r}",
        lambda a, b, c: a * b + c,
    ),
    (
        "{name} reads {a} pages on Monday and {b} pages on Tuesday. The book has {c} more "
        "pages after that. How many pages does the book have?",
        "{a} + {b} = {ab}",
        "{ab} + {c} = {r}",
        lambda a, b, c: a + b + c,
    ),
    (
        "A baker makes {a} trays of {b} cookies and sells {c} cookies. How many cookies are left?",
        "{a} * {b} = {ab}",
        "{ab} - {c} = {r}",
        lambda a, b, c: a * b - c,
    ),
    (
        "{name} had {a} dollars, spent {b} dollars on lunch and then earned {c} dollars. "
        "How many dollars does {name} have now?",
        "{a} - {b} = {ab}",
        "{ab} + {c} = {r}",
        lambda a, b, c: a - b + c,
    ),
    (
        "There are {a} birds on a tree. {b} fly away and {c} more arrive. "
        "How many birds are on the tree?",
        "{a} - {b} = {ab}",
        "{ab} + {c} = {r}",
        lambda a, b, c: a - b + c,
    ),
    (
        "{name} buys {a} packs of {b} pencils and already had {c} pencils. "
        "How many pencils does {name} have?",
        "{a} * {b} = {ab}",
        "{ab} + {c} = {r}",
        lambda a, b, c: a * b + c,
    ),
    (
        "A bus has {a} passengers. At the first stop {b} get on, at the second {c} get off. "
        "How many passengers are on the bus?",
        "{a} + {b} = {ab}",
        "{ab} - {c} = {r}",
        lambda a, b, c: a + b - c,
    ),
]
NAMES = [("Ana", "She"), ("Ben", "He"), ("Chen", "He"), ("Dara", "She"), ("Eli", "He")]


def _numbers(rng: random.Random, template: int) -> tuple[int, int, int]:
    """Small operands (a product's factors 2-5, others 1-9), every step's result >= 0."""
    _, first, second, _ = TEMPLATES[template]
    if "*" in first:
        a, b = rng.randint(2, 5), rng.randint(2, 5)
        c = rng.randint(1, min(9, a * b - 1)) if "-" in second else rng.randint(1, 9)
        return a, b, c
    a = rng.randint(2, 9)
    if first.startswith("{a} - "):
        return a, rng.randint(1, a - 1), rng.randint(1, 9)
    b = rng.randint(1, 9)
    c = rng.randint(1, min(9, a + b - 1)) if "-" in second else rng.randint(1, 9)
    return a, b, c


def rows(n: int, seed: int) -> list[dict[str, str]]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        t = rng.randrange(len(TEMPLATES))
        question, first, second, answer = TEMPLATES[t]
        a, b, c = _numbers(rng, t)
        name, pron = rng.choice(NAMES)
        ab = {"+": a + b, "-": a - b, "*": a * b}[first.split()[1]]
        r = answer(a, b, c)
        assert r >= 0, (t, a, b, c)
        fill = {"a": a, "b": b, "c": c, "ab": ab, "r": r, "name": name, "pron": pron}
        steps = f"{first.format(**fill)}\n{second.format(**fill)}"
        out.append({"question": question.format(**fill), "answer": f"{steps}\n#### {r}"})
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=640)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=str(REPO / "configs" / "data" / "two_step.jsonl"))
    args = parser.parse_args(argv)
    out = pathlib.Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("".join(json.dumps(r) + "\n" for r in rows(args.rows, args.seed)))
    print(json.dumps({"rows": args.rows, "seed": args.seed, "out": str(out)}))


if __name__ == "__main__":
    main()
