"""Bad tokenizer files and chat templates: refused before a model is built."""

import json

import pytest
from rljax.configs import arith_tiny

from rljax.config import ConfigError, replace
from rljax.models.tokenizer import CONFIG_FILE, TOKENIZER_FILE, Tokenizer
from rljax.runtime.run import Run


@pytest.fixture
def tok_dir(tmp_path):
    """A saved char-level tokenizer directory to damage."""
    path = tmp_path / "tok"
    Tokenizer.char_level().save(path)
    return path


def _edit_config(tok_dir, **edits):
    config = json.loads((tok_dir / CONFIG_FILE).read_text())
    config.update(edits)
    (tok_dir / CONFIG_FILE).write_text(json.dumps(config))


def _no_tokenizer_json(d):
    (d / TOKENIZER_FILE).unlink()


def _corrupt_tokenizer_json(d):
    (d / TOKENIZER_FILE).write_text('{"version": "1.0", "model": {"type": "BPE", ')


def _corrupt_config(d):
    (d / CONFIG_FILE).write_text("{'eos_token': '<eos>'}")


def _no_config(d):
    (d / CONFIG_FILE).unlink()


def _no_eos(d):
    _edit_config(d, eos_token=None)


def _unknown_eos(d):
    _edit_config(d, eos_token="</s>")


FILE_CASES = [
    ("T01", _no_tokenizer_json, "or use tokenizer='char'"),
    ("T02", _corrupt_tokenizer_json, "re-download it"),
    ("T03", _corrupt_config, "re-download or fix it"),
    ("T04", _no_config, "point at a Hugging Face model or tokenizer directory"),
    ("T05", _no_eos, 'add "eos_token": "<the end token>" to it'),
    ("T06", _unknown_eos, "set eos_token in tokenizer_config.json"),
]


# A GSM8K file task; the recipe's careless-carry teacher exists only for sums.
FILE_TASK = {
    "data.task": "gsm8k",
    "sft.teacher": "reference",
    "sft.teacher_slip": 0.0,
    "sft.exact_steps": 0,
}


def _run(workdir, **changes):
    cfg = replace(arith_tiny.recipe("small"), **changes)
    return lambda: Run(cfg, str(workdir))


@pytest.mark.parametrize("row_id, damage, fix", FILE_CASES, ids=[c[0] for c in FILE_CASES])
def test_bad_tokenizer_files(refused, check_row, workdir, tok_dir, row_id, damage, fix):
    damage(tok_dir)
    message = refused(_run(workdir, tokenizer=str(tok_dir)), ConfigError, workdir)
    check_row(row_id, message, fix)


def test_chat_template_that_does_not_parse(check_row, tok_dir):
    _edit_config(tok_dir, chat_template="{% for m in messages %}{{ m['content'] }")
    tokenizer = Tokenizer.from_dir(tok_dir)
    with pytest.raises(ValueError) as info:
        tokenizer.apply_chat_template([{"role": "user", "content": "1+1="}])
    check_row("T07", str(info.value), "fix chat_template in tokenizer_config.json")


def test_chat_template_that_fails_to_render(refused, check_row, workdir, tok_dir):
    _edit_config(tok_dir, chat_template="{{ raise_exception('system message first') }}")
    call = _run(workdir, tokenizer=str(tok_dir), **{"data.prompt_format": "chat"})
    message = refused(call, ConfigError, workdir)
    check_row("T08", message, "for 'chat' one whose chat template renders")


def test_chat_format_without_a_template(refused, check_row, workdir, tok_dir):
    _edit_config(tok_dir, chat_template=None)
    call = _run(workdir, tokenizer=str(tok_dir), **{"data.prompt_format": "chat"})
    message = refused(call, ConfigError, workdir)
    check_row("T09", message, "add one to tokenizer_config.json")


def test_task_text_outside_the_alphabet(refused, check_row, workdir, tmp_path):
    rows = [{"question": f"What is {i} plus 1?", "answer": f"#### {i + 1}"} for i in range(40)]
    path = tmp_path / "gsm8k.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    call = _run(workdir, **FILE_TASK, **{"data.path": str(path)})
    message = refused(call, ConfigError, workdir)
    check_row("T10", message, "use a tokenizer that covers the task's text")


def test_prompt_longer_than_the_largest_prefill(launch_error, check_row):
    """Refused at the start, not when the sampler first meets the prompt mid-run."""
    message = launch_error("--config.sampling.max_prefill_length=4")
    check_row("T11", message, "raise it to at least 7")


def test_chat_template_rljax_does_not_ship(check_row):
    from rljax.models.chat_templates import chat_template

    with pytest.raises(ValueError) as info:
        chat_template("gemma2")
    check_row("T12", str(info.value), "the template of the model's own tokenizer_config.json")
