"""The calculator tool: arithmetic on ints and floats, parsed with ``ast`` and a whitelist.

The expression is parsed, never evaluated by Python: only number literals, ``+ - * / // % **``,
unary ``+``/``-`` and parentheses are walked; a name, call, attribute, string or any other node
is refused. Integers stay exact (``1234*5678`` is ``7006652``); ``/`` gives a float, as in
Python. Work is bounded before it is done: an expression longer than
:data:`MAX_EXPRESSION_CHARS`, an integer of more than :data:`MAX_DIGITS` digits, or a power
whose result would have more (``9**9**9``) is refused at once, so no call can hang or fill
memory.
"""

from __future__ import annotations

import ast
import math
import operator
from collections.abc import Callable
from typing import Any

from rljax.envs.tool_calls import ToolError, excerpt

MAX_EXPRESSION_CHARS = 500
MAX_DIGITS = 1000  # of any integer operand or result

_BINARY: dict[type, Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
}
_UNARY: dict[type, Callable[[Any], Any]] = {ast.UAdd: operator.pos, ast.USub: operator.neg}

Number = int | float


def _digits(n: int) -> float:
    """How many decimal digits ``n`` has; inf when it surely has more than MAX_DIGITS (then
    its digits are not worth counting: more than 4 bits per digit)."""
    if n.bit_length() > 4 * MAX_DIGITS:
        return math.inf
    return len(str(abs(n)))


def _checked(value: object, expression: str) -> Number:
    """``value`` if it is a finite int or float of bounded size; a ToolError otherwise."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ToolError(f"the result of {excerpt(expression)} is not a real number")
    if isinstance(value, int) and _digits(value) > MAX_DIGITS:
        raise ToolError(f"the result of {excerpt(expression)} has more than {MAX_DIGITS} digits")
    if isinstance(value, float) and not math.isfinite(value):
        raise ToolError(f"the result of {excerpt(expression)} is too large for a float")
    return value


def _power(base: Number, exponent: Number, expression: str) -> object:
    # Bound the result's size from the operands before computing it: 9**387420489 would take
    # minutes and gigabytes. |base| <= 1 never grows, and float powers overflow cheaply. The
    # estimate may be a digit short; _checked counts the result's digits exactly.
    if (
        isinstance(base, int)
        and isinstance(exponent, int)
        and exponent > 0
        and abs(base) > 1
        and (exponent > 4 * MAX_DIGITS or exponent * math.log10(abs(base)) > MAX_DIGITS)
    ):
        raise ToolError(
            f"{excerpt(expression)} would have more than {MAX_DIGITS} digits; use a smaller "
            "exponent"
        )
    return base**exponent


def _evaluate(node: ast.AST, expression: str) -> Number:
    if isinstance(node, ast.Expression):
        return _evaluate(node.body, expression)
    if isinstance(node, ast.Constant):
        if isinstance(node.value, bool) or not isinstance(node.value, int | float):
            raise ToolError(f"{node.value!r} is not a number; the calculator takes only numbers")
        return _checked(node.value, expression)
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _checked(_UNARY[type(node.op)](_evaluate(node.operand, expression)), expression)
    if isinstance(node, ast.BinOp) and (type(node.op) in _BINARY or isinstance(node.op, ast.Pow)):
        left = _evaluate(node.left, expression)
        right = _evaluate(node.right, expression)
        try:
            if isinstance(node.op, ast.Pow):
                value = _power(left, right, expression)
            else:
                value = _BINARY[type(node.op)](left, right)
        except ZeroDivisionError:
            raise ToolError(f"division by zero in {excerpt(expression)}") from None
        except OverflowError:
            raise ToolError(f"{excerpt(expression)} is too large for a float") from None
        return _checked(value, expression)
    what = type(node).__name__
    raise ToolError(
        f"{what} is not allowed in {excerpt(expression)}; the calculator takes numbers, "
        "+ - * / // % ** and parentheses"
    )


def calculator(expression: str) -> str:
    """The value of the arithmetic ``expression``, as text (``"1234*5678"`` -> ``"7006652"``).

    Raises :class:`~rljax.envs.tool_calls.ToolError` (a one-line message) for anything that is
    not bounded arithmetic on numbers: names, calls, attributes, strings, division by zero,
    results of more than :data:`MAX_DIGITS` digits or beyond a float's range.
    """
    if not isinstance(expression, str):
        raise ToolError(f"expression must be a string, got {type(expression).__name__}")
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise ToolError(
            f"the expression has {len(expression)} characters; the calculator takes at most "
            f"{MAX_EXPRESSION_CHARS}"
        )
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except (SyntaxError, ValueError) as e:
        # ValueError: an integer literal past Python's own digit limit.
        raise ToolError(f"{excerpt(expression)} is not an arithmetic expression ({e})") from None
    except (RecursionError, MemoryError):
        raise ToolError(f"{excerpt(expression)} is nested too deeply") from None
    try:
        return repr(_evaluate(tree, expression))
    except RecursionError:
        raise ToolError(f"{excerpt(expression)} is nested too deeply") from None
