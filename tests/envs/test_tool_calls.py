"""Tool-call parsing in both syntaxes: good calls, several calls, answers without calls, and
each malformed block refused with kind malformed_tool_call and a one-line message."""

import json

import pytest

from rljax.envs.tool_calls import FORMATS, ToolCall, ToolCallError, parse_tool_calls, tools_prompt

ADD = ToolCall("calculator", {"expression": "2+3"})
RUN = ToolCall("python", {"code": "print(1)"})


def hermes(*objs: object) -> str:
    return "".join(f"<tool_call>\n{json.dumps(o)}\n</tool_call>\n" for o in objs)


def test_hermes_one_call():
    text = "Let me compute.\n" + hermes({"name": "calculator", "arguments": {"expression": "2+3"}})
    assert parse_tool_calls(text, "hermes") == [ADD]


def test_hermes_several_calls_in_order():
    text = hermes(
        {"name": "calculator", "arguments": {"expression": "2+3"}},
        {"name": "python", "arguments": {"code": "print(1)"}},
    )
    assert parse_tool_calls(text, "hermes") == [ADD, RUN]


def test_hermes_arguments_as_a_json_string():
    text = hermes({"name": "calculator", "arguments": json.dumps({"expression": "2+3"})})
    assert parse_tool_calls(text, "hermes") == [ADD]


def test_missing_arguments_mean_none():
    assert parse_tool_calls(hermes({"name": "now"}), "hermes") == [ToolCall("now", {})]


def test_smollm2_list_of_calls():
    calls = [
        {"name": "calculator", "arguments": {"expression": "2+3"}},
        {"name": "python", "arguments": {"code": "print(1)"}},
    ]
    text = f"<tool_call>{json.dumps(calls)}</tool_call>"
    assert parse_tool_calls(text, "smollm2") == [ADD, RUN]


def test_smollm2_single_object():
    text = '<tool_call>{"name": "calculator", "arguments": {"expression": "2+3"}}</tool_call>'
    assert parse_tool_calls(text, "smollm2") == [ADD]


def test_smollm2_empty_list_is_an_answer():
    assert parse_tool_calls("<tool_call>[]</tool_call>", "smollm2") == []


@pytest.mark.parametrize("fmt", FORMATS)
def test_no_block_is_an_answer(fmt):
    assert parse_tool_calls("The answer is 5.", fmt) == []


MALFORMED = {
    "bad json": ('<tool_call>\n{"name": "calculator", "arguments": {"expr\n</tool_call>', "JSON"),
    "unclosed": ('<tool_call>\n{"name": "calculator", "arguments": {}}', "never closed"),
    "stray close": ('{"name": "calculator"}</tool_call>', "without an opening"),
    "missing name": ('<tool_call>{"arguments": {"expression": "1"}}</tool_call>', '"name"'),
    "empty name": ('<tool_call>{"name": "", "arguments": {}}</tool_call>', '"name"'),
    "arguments a list": ('<tool_call>{"name": "c", "arguments": [1]}</tool_call>', "object"),
    "arguments a bad string": ('<tool_call>{"name": "c", "arguments": "{x"}</tool_call>', "JSON"),
    "arguments a string list": (
        '<tool_call>{"name": "c", "arguments": "[1]"}</tool_call>',
        "object",
    ),
    "not an object": ("<tool_call>42</tool_call>", "JSON object"),
}


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_is_refused_on_one_line(fmt, case):
    text, named = MALFORMED[case]
    with pytest.raises(ToolCallError) as info:
        parse_tool_calls(text, fmt)
    assert info.value.kind == "malformed_tool_call"
    assert named in info.value.message
    assert "\n" not in info.value.message
    assert len(info.value.message) < 200


def test_hermes_refuses_a_list():
    with pytest.raises(ToolCallError, match="not list"):
        parse_tool_calls('<tool_call>[{"name": "c", "arguments": {}}]</tool_call>', "hermes")


def test_unknown_format():
    with pytest.raises(ValueError, match="hermes"):
        parse_tool_calls("", "openai")


SCHEMA = {
    "name": "calculator",
    "description": "Evaluate arithmetic.",
    "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}},
}


def test_hermes_prompt_lists_one_tool_per_line():
    prompt = tools_prompt([SCHEMA, {**SCHEMA, "name": "other"}], "hermes")
    listed = prompt.split("<tools>\n")[1].split("\n</tools>")[0].splitlines()
    assert [json.loads(line) for line in listed] == [
        {"type": "function", "function": SCHEMA},
        {"type": "function", "function": {**SCHEMA, "name": "other"}},
    ]
    assert "<tool_call>" in prompt


def test_smollm2_prompt_lists_tools_as_a_json_list():
    prompt = tools_prompt([SCHEMA], "smollm2")
    listed = prompt.split("<tools>")[1].split("</tools>")[0]
    assert json.loads(listed) == [SCHEMA]
    assert "<tool_call>[" in prompt and "'[]'" in prompt


@pytest.mark.parametrize("fmt", FORMATS)
def test_brief_prompt_lists_each_tool_and_shows_a_call_that_parses(fmt):
    other = {**SCHEMA, "name": "other", "parameters": {"properties": {"a": {}, "b": {}}}}
    prompt = tools_prompt([SCHEMA, other], fmt, "brief")
    assert "- calculator(expression): Evaluate arithmetic." in prompt
    assert "- other(a, b): Evaluate arithmetic." in prompt
    assert parse_tool_calls(prompt, fmt) == [ToolCall("calculator", {"expression": "..."})]
    assert len(prompt) < len(tools_prompt([SCHEMA, other], fmt)) / 2


def test_unknown_prompt_style_is_refused():
    with pytest.raises(ValueError, match="unknown tool-prompt style 'long'"):
        tools_prompt([SCHEMA], "hermes", "long")
