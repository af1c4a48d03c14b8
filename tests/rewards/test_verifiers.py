"""Tests for the built-in verifiers and the reward registry."""

import pytest

from rljax.rewards import registry, verifiers


@pytest.mark.parametrize(
    "completion, answer, expected",
    [
        ("82", "82", 1.0),
        ("  82\n", "82", 1.0),
        ("82 ", " 82", 1.0),
        ("81", "82", 0.0),
        ("", "82", 0.0),
        ("082", "82", 0.0),
    ],
)
def test_exact_match(completion, answer, expected):
    assert verifiers.exact_match(completion, {"answer": answer}) == expected


@pytest.mark.parametrize(
    "completion, answer, expected",
    [
        ("She has 3 + 4 = 7 apples.\n#### 7", "7", 1.0),
        ("#### 1,234", "1234", 1.0),
        ("so the answer is \\boxed{42}.", "42", 1.0),
        ("\\boxed{1} then \\boxed{\\frac{1}{2}}", "0.5", 1.0),
        ("\\boxed{\\frac{1}{2}}", "\\frac{1}{2}", 1.0),
        ("\\boxed{\\sqrt{2}}", "\\sqrt{2}", 1.0),
        ("\\boxed{\\sqrt{3}}", "\\sqrt{2}", 0.0),
        ("I computed 12 then 15", "15", 1.0),
        ("I computed 15 then 12", "15", 0.0),
        ("the cost is $5.50.", "5.5", 1.0),
        ("#### -3", "-3", 1.0),
        ("no number here", "3", 0.0),
        ("#### 8", "7", 0.0),
        ("\\boxed{50\\%}", "50", 1.0),
    ],
)
def test_math_answer(completion, answer, expected):
    assert verifiers.math_answer(completion, {"answer": answer}) == expected


def test_last_boxed_matches_nested_braces_and_skips_unclosed():
    assert verifiers.last_boxed("\\boxed{a{b}c} and \\boxed{d") == "a{b}c"
    assert verifiers.last_boxed("nothing") is None


def test_parse_number():
    assert verifiers.parse_number("3/4") == verifiers.parse_number("\\frac{3}{4}") == 0.75
    assert verifiers.parse_number("x+1") is None


def test_missing_answer_key():
    with pytest.raises(KeyError, match="example has no 'answer' key"):
        verifiers.exact_match("1", {"prompt": "1="})


def test_registry():
    assert registry.get_reward("exact_match") is verifiers.exact_match
    assert set(registry.REWARDS) == {"exact_match", "math_answer"}
    with pytest.raises(ValueError, match=r"Unknown reward 'f1'; valid names are \['exact_match'"):
        registry.get_reward("f1")
