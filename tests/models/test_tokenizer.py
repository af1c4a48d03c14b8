"""Tests for rljax.models.tokenizer."""

import json
import os

import pytest

from rljax.models.tokenizer import Tokenizer


@pytest.fixture(scope="module")
def char_tok():
    return Tokenizer.char_level()


def test_char_level_ids_and_round_trip(char_tok):
    assert (char_tok.pad_id, char_tok.bos_id, char_tok.eos_id) == (0, 1, 2)
    assert char_tok.vocab_size == 3 + len("0123456789+-*= ")
    assert char_tok.stop_ids == {2}
    ids = char_tok.encode("37+45=82")
    assert len(ids) == 8 and ids[0] == 3 + 3 and ids[2] == 3 + 10
    assert char_tok.decode(ids) == "37+45=82"
    assert char_tok.encode("1", add_bos=True) == [1, 4]
    with_specials = [char_tok.bos_id, *ids, char_tok.eos_id, char_tok.pad_id]
    assert char_tok.decode(with_specials) == "37+45=82"
    assert char_tok.decode(with_specials, skip_special_tokens=False) == "<bos>37+45=82<eos><pad>"
    assert char_tok.encode_batch(["1 2", "="]) == [[4, 17, 5], [16]]


def test_char_level_unknown_character(char_tok):
    with pytest.raises(ValueError, match=r"Character 'x' is not in the tokenizer alphabet"):
        char_tok.encode("12x")
    with pytest.raises(ValueError, match=r"Character '/' is not in the tokenizer alphabet"):
        char_tok.encode_batch(["1", "4/2"])


def test_char_level_custom_alphabet_with_newline():
    tok = Tokenizer.char_level("ab\n")
    assert tok.decode(tok.encode("a\nb")) == "a\nb"
    with pytest.raises(ValueError, match=r"alphabet repeats character\(s\) \['a'\]"):
        Tokenizer.char_level("aba")


def test_char_level_chat_template(char_tok):
    messages = [{"role": "system", "content": "ignored"}, {"role": "user", "content": "1+1="}]
    assert char_tok.apply_chat_template(messages) == "1+1="
    with pytest.raises(ValueError, match="messages must be a list of"):
        char_tok.apply_chat_template([{"content": "1"}])


def test_save_round_trip(char_tok, tmp_path):
    char_tok.save(tmp_path)
    loaded = Tokenizer.from_dir(tmp_path)
    assert (loaded.vocab_size, loaded.bos_id, loaded.eos_id, loaded.pad_id) == (18, 1, 2, 0)
    assert loaded.encode("12+3=") == char_tok.encode("12+3=")
    assert loaded.apply_chat_template([{"role": "user", "content": "9"}]) == "9"
    with pytest.raises(ValueError, match="Character 'q'"):
        loaded.encode("q")


def _write_hf_dir(tmp_path, config, chat_template_file=None, generation=None):
    Tokenizer.char_level("abc <>|/").save(tmp_path)
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    if chat_template_file is not None:
        (tmp_path / "chat_template.jinja").write_text(chat_template_file)
    if generation is not None:
        (tmp_path / "generation_config.json").write_text(json.dumps(generation))
    return tmp_path


def test_from_dir_pad_falls_back_to_eos_and_named_templates(tmp_path):
    config = {
        "eos_token": {"content": "<eos>", "special": True},
        "chat_template": [
            {"name": "tool_use", "template": "TOOLS"},
            {
                "name": "default",
                "template": "{{ bos_token }}{{ messages[0]['content'] }}"
                "{% if add_generation_prompt %}|{% endif %}",
            },
        ],
    }
    tok = Tokenizer.from_dir(_write_hf_dir(tmp_path, config, generation={"eos_token_id": [2, 3]}))
    assert tok.bos_id is None and tok.pad_id == tok.eos_id == 2
    assert tok.stop_ids == {2, 3}
    assert tok.apply_chat_template([{"role": "user", "content": "ab"}]) == "ab|"
    assert (
        tok.apply_chat_template([{"role": "user", "content": "ab"}], add_generation_prompt=False)
        == "ab"
    )
    with pytest.raises(ValueError, match="has no bos_token"):
        tok.encode("a", add_bos=True)


def test_from_dir_template_file_and_raise_exception(tmp_path):
    template = (
        "{% if messages[0]['role'] != 'user' %}{{ raise_exception('user first') }}{% endif %}"
    )
    tok = Tokenizer.from_dir(
        _write_hf_dir(tmp_path, {"eos_token": "<eos>", "chat_template": "x"}, template)
    )
    with pytest.raises(Exception, match="user first"):
        tok.apply_chat_template([{"role": "assistant", "content": "a"}])


def test_from_dir_errors_name_the_file(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"tokenizer\.json does not exist"):
        Tokenizer.from_dir(tmp_path)
    Tokenizer.char_level().save(tmp_path)
    (tmp_path / "tokenizer_config.json").write_text("{not json")
    with pytest.raises(ValueError, match=r"tokenizer_config\.json is not valid JSON"):
        Tokenizer.from_dir(tmp_path)
    os.remove(tmp_path / "tokenizer_config.json")
    with pytest.raises(FileNotFoundError, match=r"tokenizer_config\.json does not exist"):
        Tokenizer.from_dir(tmp_path)
    (tmp_path / "tokenizer_config.json").write_text('{"eos_token": "<eos>"}')
    (tmp_path / "tokenizer.json").write_text('{"version": "1.0"')
    with pytest.raises(ValueError, match=r"tokenizer\.json could not be parsed"):
        Tokenizer.from_dir(tmp_path)


def test_from_dir_unknown_special_token(tmp_path):
    _write_hf_dir(tmp_path, {"eos_token": "</s>"})
    with pytest.raises(ValueError, match=r"eos_token '</s>' is not in the tokenizer vocabulary"):
        Tokenizer.from_dir(tmp_path)


def test_check_fits(char_tok):
    char_tok.check_fits(18)
    char_tok.check_fits(256)
    with pytest.raises(
        ValueError, match="Tokenizer has 18 ids but the model embedding has only 16"
    ):
        char_tok.check_fits(16)


def test_decode_rejects_out_of_range(char_tok):
    with pytest.raises(ValueError, match=r"id 99 is outside the vocabulary \[0, 18\)"):
        char_tok.decode([4, 99])
