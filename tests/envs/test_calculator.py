"""The calculator: exact integer arithmetic with Python's precedence, and everything outside
bounded arithmetic on numbers refused with a ToolError, quickly."""

import pytest

from rljax.envs.calculator import MAX_DIGITS, MAX_EXPRESSION_CHARS, calculator
from rljax.envs.tool_calls import ToolError


@pytest.mark.parametrize(
    "expression, value",
    [
        ("1234*5678", "7006652"),
        ("2 + 3 * 4", "14"),
        ("(2 + 3) * 4", "20"),
        ("2 ** 3 ** 2", "512"),  # right-associative
        ("-2 ** 2", "-4"),  # unary minus binds looser than **
        ("+7 - -3", "10"),
        ("7 / 2", "3.5"),
        ("7 // 2", "3"),
        ("-7 // 2", "-4"),
        ("7 % 3", "1"),
        ("0.1 + 0.2", "0.30000000000000004"),
        ("2 ** -1", "0.5"),
        ("123456789 * 987654321 * 1000000007", str(123456789 * 987654321 * 1000000007)),
        ("2 ** 1000", str(2**1000)),  # exact, 302 digits
        (" 1 +\t1 ", "2"),
    ],
)
def test_values(expression, value):
    assert calculator(expression) == value


@pytest.mark.parametrize(
    "expression, named",
    [
        ("__import__('os').system('true')", "Call"),
        ("x + 1", "Name"),
        ("(1).real", "Attribute"),
        ("'a' * 3", "not a number"),
        ("True + 1", "not a number"),
        ("1j * 2", "not a number"),
        ("[1, 2]", "List"),
        ("1 if 2 else 3", "IfExp"),
        ("1 < 2", "Compare"),
        ("1 & 3", "BinOp"),
        ("lambda: 1", "Lambda"),
        ("1 +", "not an arithmetic expression"),
        ("import os", "not an arithmetic expression"),
        ("1 / 0", "division by zero"),
        ("1 // 0", "division by zero"),
        ("1 % 0", "division by zero"),
        ("0 ** -1", "division by zero"),
        ("9**9**9", "digits"),
        ("(10 ** 999) ** (10 ** 999)", "digits"),
        ("2 ** (10 ** 999)", "digits"),
        ("10 ** 1001", "digits"),
        ("(10 ** 600) * (10 ** 600)", "digits"),
        ("10.0 ** 400", "too large"),
        ("1e308 * 10", "too large"),
        ("10 ** 500 / 3", "too large"),
        ("(-8) ** 0.5", "not a real number"),
    ],
)
def test_refused(expression, named):
    with pytest.raises(ToolError) as info:
        calculator(expression)
    assert named in str(info.value)
    assert "\n" not in str(info.value)


def test_bounds_hold_at_the_limit():
    assert len(calculator(f"10 ** {MAX_DIGITS - 1}")) == MAX_DIGITS
    with pytest.raises(ToolError, match="digits"):
        calculator(f"10 ** {MAX_DIGITS}")
    with pytest.raises(ToolError, match="digits"):
        calculator(f"10 ** {MAX_DIGITS - 1} * 10")
    assert calculator("-" * (MAX_EXPRESSION_CHARS - 1) + "1") == "-1"  # deep but short
    with pytest.raises(ToolError, match="characters"):
        calculator("1+" * MAX_EXPRESSION_CHARS + "1")


def test_not_a_string():
    with pytest.raises(ToolError, match="string"):
        calculator(12)
