"""Tool-call parsing in every syntax: good calls, several calls, answers without calls, and
each malformed block refused with kind malformed_tool_call and a one-line message; Gemma's
tool_code calls read as literals and its results returned in tool_output blocks."""

import json

import pytest

from rljax.envs.tool_calls import (
    FORMATS,
    ToolCall,
    ToolCallError,
    parse_tool_calls,
    tool_call_text,
    tool_results,
    tools_prompt,
)

JSON_FORMATS = ("hermes", "smollm2")  # the <tool_call> syntaxes

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


def _refused(text: str, fmt: str) -> str:
    with pytest.raises(ToolCallError) as info:
        parse_tool_calls(text, fmt)
    assert info.value.kind == "malformed_tool_call"
    assert "\n" not in info.value.message
    assert len(info.value.message) < 200
    return info.value.message


@pytest.mark.parametrize("fmt", JSON_FORMATS)
@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_is_refused_on_one_line(fmt, case):
    text, named = MALFORMED[case]
    assert named in _refused(text, fmt)


def code(*lines: str) -> str:
    return "```tool_code\n" + "\n".join(lines) + "\n```"


def test_gemma_one_call():
    text = 'Let me compute.\n```tool_code\ncalculator(expression="2+3")\n```\n'
    assert parse_tool_calls(text, "gemma") == [ADD]


def test_gemma_several_calls_in_a_block_or_in_blocks_in_order():
    calls = ['calculator(expression="2+3")', "python(code='print(1)')"]
    assert parse_tool_calls(code(*calls), "gemma") == [ADD, RUN]
    assert parse_tool_calls(code(calls[0]) + " then " + code(calls[1]), "gemma") == [ADD, RUN]


def test_gemma_arguments_are_python_literals():
    text = code("f(a=1, b=-2.5, c=True, d=None, e=[1, 'x'], g={'k': (1, 2)}, h='l\\nm')")
    (call,) = parse_tool_calls(text, "gemma")
    expected = {"a": 1, "b": -2.5, "c": True, "d": None, "e": [1, "x"], "g": {"k": (1, 2)}}
    assert call == ToolCall("f", {**expected, "h": "l\nm"})
    assert parse_tool_calls(code("now()"), "gemma") == [ToolCall("now", {})]
    multiline = code("calculator(", '    expression="2+3",', ")")
    assert parse_tool_calls(multiline, "gemma") == [ADD]


def test_gemma_other_fences_and_tool_call_tags_are_an_answer():
    assert parse_tool_calls("```python\nprint(1)\n```", "gemma") == []
    assert parse_tool_calls("```tool_output\n5\n```", "gemma") == []
    assert parse_tool_calls('<tool_call>{"name": "calculator"}</tool_call>', "gemma") == []
    # Gemma's prompt names the fence inline: a block's fence ends its line, as in Markdown.
    assert parse_tool_calls("wrap it with ```tool_code``` or not", "gemma") == []


GEMMA_MALFORMED = {
    "positional": (code('calculator("2+3")'), "write each argument of calculator as name=value"),
    "star args": (code("calculator(**kw)"), "as name=value"),
    "a name": (code("calculator(expression=x)"), "argument expression of calculator is not a"),
    "a call": (code("f(x=__import__('os').getcwd())"), "not a literal"),
    "arithmetic": (code("f(x=2**10)"), "not a literal"),
    "assignment": (code("x = calculator(expression='1')"), "calls name(argument=value"),
    "attribute": (code("os.system(command='ls')"), "calls name(argument=value"),
    "not a call": (code("calculator"), "calls name(argument=value"),
    "syntax": (code("calculator(expression='1'"), "not Python ('(' was never closed)"),
    "empty": (code(""), "the tool_code block is empty"),
    "unclosed": ("```tool_code\ncalculator(expression='1')", "never closed"),
    "unclosed after one": (code("now()") + "```tool_code\nnow()", "never closed"),
    "huge int": (code("f(x=" + "9" * 5000 + ")"), "not Python"),
}


@pytest.mark.parametrize("case", sorted(GEMMA_MALFORMED))
def test_gemma_malformed_is_refused_on_one_line(case):
    text, named = GEMMA_MALFORMED[case]
    assert named in _refused(text, "gemma")


CALLS = [
    {"name": "calculator", "arguments": {"expression": "2+3"}},
    {"name": "python", "arguments": {"code": "print('a\"b\\\\')\n", "n": [1, 2.5, None, True]}},
    {"name": "f", "arguments": {"d": {"k": "é\u2028\x00"}, "empty": ""}},
]


@pytest.mark.parametrize("fmt", FORMATS)
def test_the_call_text_reads_back(fmt):
    parsed = parse_tool_calls(tool_call_text(CALLS, fmt), fmt)
    assert [(c.name, c.arguments) for c in parsed] == [(c["name"], c["arguments"]) for c in CALLS]


def test_gemma_call_text_is_the_form_of_gemma_s_examples():
    assert tool_call_text(CALLS[:1], "gemma") == '```tool_code\ncalculator(expression="2+3")\n```'


def test_gemma_results_are_one_user_turn_of_tool_output_blocks():
    results = [
        {"role": "tool", "name": "calculator", "content": "5"},
        {"role": "tool", "content": "error: unknown_tool: there is no tool 'x'"},
    ]
    blocks = (
        "```tool_output\n5\n```\n```tool_output\nerror: unknown_tool: there is no tool 'x'\n```"
    )
    assert tool_results(results, "gemma") == [{"role": "user", "content": blocks}]
    around = [
        {"role": "user", "content": "go on"},
        *results,
        {"role": "assistant", "content": "ok"},
    ]
    assert tool_results(around, "gemma") == [
        around[0],
        {"role": "user", "content": blocks},
        around[-1],
    ]
    for fmt in JSON_FORMATS:
        assert tool_results(results, fmt) == results
    with pytest.raises(ValueError, match="gemma"):
        tool_results(results, "openai")


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


def test_gemma_prompt_lists_tools_as_python_signatures():
    search = {
        "name": "search",
        "description": "Search.",
        "parameters": {
            "properties": {
                "limit": {"type": "integer", "description": "how many"},
                "query": {"type": "string", "description": "the words"},
            },
            "required": ["query"],
        },
    }
    prompt = tools_prompt([SCHEMA, search], "gemma")
    assert "wrapped with ```tool_code```" in prompt and "```tool_output```" in prompt
    listed = prompt.split("```python\n")[1].split("\n```")[0]
    assert listed == "\n".join(
        [
            "def calculator(expression: str) -> str:",
            '    """Evaluate arithmetic.',
            "",
            "    Args:",
            "      expression:",
            '    """',
            "",
            "def search(query: str, limit: int = None) -> str:",
            '    """Search.',
            "",
            "    Args:",
            "      query: the words",
            "      limit: how many",
            '    """',
        ]
    )
    assert parse_tool_calls(prompt, "gemma") == []  # the prompt itself makes no call


def test_unknown_prompt_style_is_refused():
    with pytest.raises(ValueError, match="unknown tool-prompt style 'long'"):
        tools_prompt([SCHEMA], "hermes", "long")
