"""Built-in verifiers: ``fn(completion: str, example: dict) -> float`` in ``[0, 1]``.

A verifier reads the reference answer from ``example["answer"]``. Verifiers are module-level
functions so that ``RewardPool(mode="process")`` can pickle them.
"""

from __future__ import annotations

import math
import re
from fractions import Fraction

# A number as models write it: optional sign, thousands separators, decimals, or a fraction.
NUMBER_RE = re.compile(r"-?\d[\d,]*(?:\.\d+)?(?:/\d+)?|-?\.\d+")
_HASH_ANSWER_RE = re.compile(r"####\s*([^\n]*)")
_FRAC_RE = re.compile(r"^\\[dt]?frac\{([^{}]+)\}\{([^{}]+)\}$")
_REL_TOL = 1e-6


def _answer_text(example: dict) -> str:
    if not isinstance(example, dict) or "answer" not in example:
        raise KeyError("example has no 'answer' key; verifiers need {'answer': <reference>}.")
    return str(example["answer"])


def exact_match(completion: str, example: dict) -> float:
    """Returns 1.0 iff the completion, stripped of surrounding whitespace, equals the answer."""
    return float(completion.strip() == _answer_text(example).strip())


def last_boxed(text: str) -> str | None:
    """Returns the contents of the last ``\\boxed{...}`` in ``text``, braces matched, or None."""
    start = text.rfind("\\boxed")
    while start != -1:
        i = start + len("\\boxed")
        while i < len(text) and text[i] == " ":
            i += 1
        if i < len(text) and text[i] == "{":
            depth = 0
            for j in range(i, len(text)):
                if text[j] == "{":
                    depth += 1
                elif text[j] == "}":
                    depth -= 1
                    if depth == 0:
                        return text[i + 1 : j]
        # Unclosed or brace-less \boxed: look at the previous one.
        start = text.rfind("\\boxed", 0, start)
    return None


def extract_answer(text: str) -> str | None:
    """Extracts a final answer: ``#### x`` first, then the last ``\\boxed{x}``, else the last
    number in the text. Returns None when there is none."""
    hashes = _HASH_ANSWER_RE.findall(text)
    if hashes and hashes[-1].strip():
        return hashes[-1].strip()
    boxed = last_boxed(text)
    if boxed is not None:
        return boxed.strip()
    numbers = NUMBER_RE.findall(text)
    return numbers[-1] if numbers else None


def parse_number(text: str) -> Fraction | float | None:
    """Parses ``"1,234"``, ``"$5.50"``, ``"3/4"``, ``"\\frac{3}{4}"``, ``"50%"`` into a number,
    or returns None when the text is not a single number."""
    s = text.strip().strip("$").strip()
    s = s.replace("\\!", "").replace("\\,", "").replace(",", "").replace(" ", "")
    s = s.removesuffix("\\%").removesuffix("%").rstrip(".")
    s = s.replace("\\left", "").replace("\\right", "")
    match = _FRAC_RE.match(s)
    if match:
        s = f"{match.group(1)}/{match.group(2)}"
    try:
        return Fraction(s)
    except (ValueError, ZeroDivisionError):
        pass
    try:
        value = float(s)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def _normalise_text(text: str) -> str:
    return re.sub(r"\s+", "", text).strip("$").rstrip(".")


def math_answer(completion: str, example: dict) -> float:
    """Returns 1.0 iff the completion's final answer equals ``example["answer"]``.

    The final answer is extracted with :func:`extract_answer`. Both sides are compared as
    numbers when both parse (relative tolerance 1e-6, so ``"0.5"`` matches ``"1/2"``), and as
    whitespace-free strings otherwise (for symbolic answers such as ``"\\sqrt{2}"``).
    """
    reference = _answer_text(example)
    predicted = extract_answer(completion)
    if predicted is None:
        return 0.0
    ref_value = parse_number(reference)
    pred_value = parse_number(predicted)
    if ref_value is not None and pred_value is not None:
        if ref_value == pred_value:
            return 1.0
        return float(math.isclose(float(ref_value), float(pred_value), rel_tol=_REL_TOL))
    return float(_normalise_text(predicted) == _normalise_text(reference))
