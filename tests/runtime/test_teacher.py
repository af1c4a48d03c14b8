"""opd's teacher must read the student's token ids: the same tokens with the same ids."""

import pytest

from rljax.config import ConfigError
from rljax.models.tokenizer import Tokenizer
from rljax.runtime.teacher import check_same_tokenizer


def test_the_same_tokenizer_passes():
    check_same_tokenizer(Tokenizer.char_level(), Tokenizer.char_level(), "t")


@pytest.mark.parametrize(
    "alphabet, problem",
    [("0123456789+= ", "tokens, not"), (None, "of its 18 tokens have other ids")],
)
def test_another_tokenizer_is_refused_in_one_line(alphabet, problem):
    student = Tokenizer.char_level()
    # same size, two characters swapped: every id still exists, two mean other text
    swapped = Tokenizer.char_level()._alphabet_str
    swapped = swapped[1] + swapped[0] + swapped[2:]
    teacher = Tokenizer.char_level(alphabet or swapped)
    with pytest.raises(ConfigError, match=problem) as info:
        check_same_tokenizer(student, teacher, "t")
    assert "\n" not in str(info.value)
