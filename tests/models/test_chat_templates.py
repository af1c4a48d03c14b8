"""The chat templates rljax ships (rljax.models.chat_templates): Gemma 3's, byte for byte as
published, rendered by rljax's Tokenizer exactly as transformers' apply_chat_template renders
it (text and token ids) on a Gemma-style tokenizer, with the system message folded into the
first user turn."""

import hashlib

import pytest

from rljax.envs.render import ChatRenderer
from rljax.models.chat_templates import TEMPLATES, chat_template
from rljax.models.tokenizer import Tokenizer
from rljax.testing.gemma_tokenizer import write_gemma_style_tokenizer

# sha256 of Gemma 3's published chat_template (see rljax/models/chat_templates/__init__.py).
GEMMA3_SHA256 = "7de1c58e208eda46e9c7f86397df37ec49883aeece39fb961e0a6b24088dd3c4"

SYSTEM = {"role": "system", "content": "You are brief.\nAnswer in one line."}
CONVERSATIONS = {
    "user": [{"role": "user", "content": "What is 2+2?"}],
    "user and model": [
        {"role": "user", "content": "Hi there"},
        {"role": "assistant", "content": "Hello! How can I help?"},
    ],
    "system folded": [SYSTEM, {"role": "user", "content": "Sum 1 and 2."}],
    "multi-turn": [
        SYSTEM,
        {"role": "user", "content": "  What is 1234*5678?  "},  # Gemma trims each message
        {"role": "assistant", "content": '```tool_code\ncalculator(expression="1234*5678")\n```'},
        {"role": "user", "content": "```tool_output\n7006652\n```"},
        {"role": "assistant", "content": "It is 7006652 (naïve check: ✓)."},
        {"role": "user", "content": "Thanks"},
    ],
    "text parts": [{"role": "user", "content": [{"type": "text", "text": "Hi "}]}],
}


@pytest.fixture(scope="module")
def gemma_dir(tmp_path_factory):
    return write_gemma_style_tokenizer(tmp_path_factory.mktemp("gemma"))


@pytest.fixture(scope="module")
def gemma(gemma_dir):
    return Tokenizer.from_dir(gemma_dir)


@pytest.fixture(scope="module")
def hf_gemma(gemma_dir):
    transformers = pytest.importorskip("transformers", reason="transformers is not installed")
    return transformers.AutoTokenizer.from_pretrained(gemma_dir)


def test_the_shipped_gemma3_template_is_the_published_one():
    assert TEMPLATES == {"gemma3": "gemma3.jinja"}
    text = chat_template("gemma3")
    assert hashlib.sha256(text.encode()).hexdigest() == GEMMA3_SHA256
    with pytest.raises(ValueError, match="use one of \\['gemma3'\\]"):
        chat_template("gemma2")


def test_system_is_folded_into_the_first_user_turn(gemma):
    """Gemma has no system role: its text, a blank line, then the user's, in the first user
    turn; the assistant is 'model'. Written out, so that a template that lost the folding
    fails here even though transformers would render it alike."""
    text = gemma.apply_chat_template(CONVERSATIONS["system folded"], add_generation_prompt=True)
    assert text == (
        "<bos><start_of_turn>user\nYou are brief.\nAnswer in one line.\n\n"
        "Sum 1 and 2.<end_of_turn>\n<start_of_turn>model\n"
    )
    text = gemma.apply_chat_template(CONVERSATIONS["user and model"], add_generation_prompt=False)
    assert text == (
        "<bos><start_of_turn>user\nHi there<end_of_turn>\n"
        "<start_of_turn>model\nHello! How can I help?<end_of_turn>\n"
    )


@pytest.mark.parametrize("add_generation_prompt", [True, False])
@pytest.mark.parametrize("case", sorted(CONVERSATIONS))
def test_rljax_renders_gemma3_as_transformers_does(gemma, hf_gemma, case, add_generation_prompt):
    messages = CONVERSATIONS[case]
    expected = hf_gemma.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=add_generation_prompt
    )
    text = gemma.apply_chat_template(messages, add_generation_prompt=add_generation_prompt)
    assert text == expected
    expected_ids = hf_gemma.apply_chat_template(
        messages, tokenize=True, add_generation_prompt=add_generation_prompt, return_dict=False
    )
    assert gemma.encode(text) == list(expected_ids)
    # The template writes <bos> itself: an env's prompt (text messages) starts with just one.
    if add_generation_prompt and case != "text parts":
        prompt = ChatRenderer(gemma).prompt_ids(messages)
        assert prompt == list(expected_ids) and prompt.count(gemma.bos_id) == 1


def test_roles_must_alternate_as_in_transformers(gemma, hf_gemma):
    import jinja2

    two_users = [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]
    with pytest.raises(jinja2.exceptions.TemplateError, match="must alternate"):
        hf_gemma.apply_chat_template(two_users, tokenize=False)
    with pytest.raises(ValueError, match="must alternate user/assistant"):
        gemma.apply_chat_template(two_users)


def test_gemma_turns_end_with_end_of_turn(gemma, hf_gemma):
    """<end_of_turn> stops generation (generation_config.json, as Gemma 3's), and is the stop
    token a turn written for the model ends with; <eos> still stops too."""
    end = gemma.vocab()["<end_of_turn>"]
    assert gemma.stop_ids == {gemma.eos_id, end}
    assert (gemma.bos_id, gemma.eos_id, gemma.pad_id) == (
        hf_gemma.bos_token_id,
        hf_gemma.eos_token_id,
        hf_gemma.pad_token_id,
    )
    assert ChatRenderer(gemma).turn_end_id == end
