"""ToolEnv: a conversation in which the model may call tools before it answers.

``reset(example)`` opens with a system message listing the tools (in the syntax of ``fmt``,
:func:`rljax.envs.tool_calls.tools_prompt`) and the example's prompt as the user's message.
Each model turn is then either

- tool calls: each is run and its result returned as a ``{"role": "tool", "name", "content"}``
  message (for ``fmt='gemma'``, the turn's results as one user message of ``tool_output``
  blocks: :func:`rljax.envs.tool_calls.tool_results`); the conversation goes on. A call that
  fails (no such tool, bad arguments, the tool raised, the block could not be read) is answered
  with ``"error: ..."`` as the content, so the model can recover, and counted in ``Step.info``
  as ``tool_errors/<kind>``;
- or the answer (a turn without a call block): the conversation ends, scored by
  ``answer_reward(answer, example)`` (0.0 without one).

One ToolEnv plays one conversation (``rljax.run(..., env=factory)`` makes one per
conversation); tools are shared between envs and threads, so a tool's ``fn`` must be
reentrant.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping

from rljax.envs.base import Step
from rljax.envs.calculator import calculator
from rljax.envs.sandbox import python_tool
from rljax.envs.tool_calls import (
    FORMATS,
    PROMPT_STYLES,
    ToolCall,
    ToolCallError,
    ToolError,
    parse_tool_calls,
    tool_results,
    tools_prompt,
)

# The kinds a tool call's failure is counted under (``tool_errors/<kind>`` in Step.info).
ERROR_KINDS = ("malformed_tool_call", "unknown_tool", "tool_error", "too_many_tool_calls")


@dataclasses.dataclass(frozen=True)
class Tool:
    """A tool the model may call: ``fn(**arguments) -> str``, described to the model by its
    ``name``, ``description`` and ``parameters`` (a JSON schema of the arguments object)."""

    name: str
    description: str
    parameters: dict
    fn: Callable[..., str]

    def schema(self) -> dict:
        """The JSON-schema description the system prompt lists."""
        return {"name": self.name, "description": self.description, "parameters": self.parameters}


CALCULATOR = Tool(
    name="calculator",
    description=(
        "Evaluate an arithmetic expression exactly: integers and decimals with + - * / // % ** "
        "and parentheses."
    ),
    parameters={
        "type": "object",
        "properties": {
            "expression": {"type": "string", "description": "e.g. (1234 + 5) * 678"},
        },
        "required": ["expression"],
    },
    fn=calculator,
)

PYTHON = Tool(
    name="python",
    description=(
        "Run a Python program (standard library only, no network, a few seconds at most) and "
        "return what it prints."
    ),
    parameters={
        "type": "object",
        "properties": {
            "code": {"type": "string", "description": "the program; print the result"},
        },
        "required": ["code"],
    },
    fn=python_tool,
)

BUILTIN_TOOLS: Mapping[str, Tool] = {t.name: t for t in (CALCULATOR, PYTHON)}


_ERROR_CHARS = 500


def _error(kind: str, message: str, name: str | None = None) -> tuple[dict, str]:
    """A tool message telling the model ``message`` (on one line, cut short), and ``kind``."""
    line = " ".join(message.split())
    if len(line) > _ERROR_CHARS:
        line = line[: _ERROR_CHARS - 3] + "..."
    msg = {"role": "tool", "content": f"error: {line}"}
    if name is not None:
        msg["name"] = name
    return msg, kind


class ToolEnv:
    """An :class:`~rljax.envs.base.Env` whose model calls ``tools`` (default
    :data:`BUILTIN_TOOLS`) in the ``fmt`` syntax (``"hermes"``, ``"smollm2"`` or ``"gemma"``)
    before it answers.

    Args:
      tools: name -> :class:`Tool`; each key must be its tool's name.
      fmt: the tool-call syntax, one of :data:`rljax.envs.tool_calls.FORMATS`.
      system_prompt: text put before the tool list in the system message.
      prompt_style: how the system message lists the tools: 'card' (the model family's own
        wording) or 'brief' (:func:`rljax.envs.tool_calls.tools_prompt`).
      answer_reward: ``reward(answer, example) -> float`` for the final turn; 0.0 if None.
      max_tool_calls_per_turn: calls run per turn; the rest are answered with an error
        (``too_many_tool_calls``).
    """

    def __init__(
        self,
        tools: Mapping[str, Tool] | None = None,
        *,
        fmt: str = "hermes",
        system_prompt: str | None = None,
        prompt_style: str = "card",
        answer_reward: Callable[[str, dict], float] | None = None,
        max_tool_calls_per_turn: int = 4,
    ):
        tools = BUILTIN_TOOLS if tools is None else tools
        if fmt not in FORMATS:
            raise ValueError(
                f"ToolEnv(fmt={fmt!r}): unknown tool-call format; use one of {FORMATS}, the "
                "syntax the model was trained on"
            )
        for key, tool in tools.items():
            if not isinstance(tool, Tool) or tool.name != key:
                raise ValueError(
                    f"ToolEnv(tools=...): the entry {key!r} must be a rljax.envs.Tool named "
                    f"{key!r}, got {tool!r}"
                )
        if prompt_style not in PROMPT_STYLES:
            raise ValueError(f"ToolEnv(prompt_style={prompt_style!r}): use one of {PROMPT_STYLES}")
        if max_tool_calls_per_turn < 1:
            raise ValueError(
                f"ToolEnv(max_tool_calls_per_turn={max_tool_calls_per_turn}): expected >= 1"
            )
        self.tools = dict(tools)
        self.fmt = fmt
        self.system_prompt = system_prompt
        self.prompt_style = prompt_style
        self.answer_reward = answer_reward
        self.max_tool_calls_per_turn = max_tool_calls_per_turn
        self._example: dict | None = None

    def reset(self, example: dict) -> list[dict]:
        """The system message (``system_prompt`` and the tool list) and the example's
        ``"prompt"`` as the user's message."""
        self._example = example
        schemas = [t.schema() for t in self.tools.values()]
        listing = tools_prompt(schemas, self.fmt, self.prompt_style)
        system = listing if self.system_prompt is None else f"{self.system_prompt}\n\n{listing}"
        return [
            {"role": "system", "content": system},
            {"role": "user", "content": example["prompt"]},
        ]

    def step(self, action: str) -> Step:
        """Run the turn's tool calls, or score it as the answer if it has none."""
        if self._example is None:
            raise RuntimeError("ToolEnv.step before reset: call reset(example) first")
        try:
            calls = parse_tool_calls(action, self.fmt)
        except ToolCallError as e:
            msg, _ = _error(e.kind, f"{e.kind}: {e.message}")
            observation = tool_results([msg], self.fmt)
            return Step(observation, info={"tool_calls": 1, f"tool_errors/{e.kind}": 1})
        if not calls:
            reward = 0.0
            if self.answer_reward is not None:
                reward = float(self.answer_reward(action, self._example))
            return Step(reward=reward, done=True)
        info: dict = {"tool_calls": len(calls)}
        observation = []
        for i, call in enumerate(calls):
            kind: str | None
            if i < self.max_tool_calls_per_turn:
                msg, kind = self._run(call)
            else:
                msg, kind = _error(
                    "too_many_tool_calls",
                    f"too_many_tool_calls: at most {self.max_tool_calls_per_turn} calls are run "
                    "per turn; this one was not",
                    call.name,
                )
            observation.append(msg)
            if kind is not None:
                info[f"tool_errors/{kind}"] = info.get(f"tool_errors/{kind}", 0) + 1
        return Step(tool_results(observation, self.fmt), info=info)

    def _run(self, call: ToolCall) -> tuple[dict, str | None]:
        """The tool message answering ``call``, and its error kind (None if it succeeded)."""
        tool = self.tools.get(call.name)
        if tool is None:
            return _error(
                "unknown_tool",
                f"unknown_tool: there is no tool {call.name!r}; the tools are "
                f"{', '.join(sorted(self.tools))}",
                call.name,
            )
        try:
            result = tool.fn(**call.arguments)
        except ToolError as e:
            return _error("tool_error", f"tool_error: {e}", call.name)
        except TypeError as e:
            # Most often arguments the tool does not take; a TypeError from inside it reads
            # the same to the model, who can only change the arguments.
            return _error(
                "tool_error", f"tool_error: bad arguments for {call.name} ({e})", call.name
            )
        except Exception as e:
            return _error("tool_error", f"tool_error: {type(e).__name__}: {e}", call.name)
        if not isinstance(result, str):
            return _error(
                "tool_error",
                f"tool_error: the tool returned {type(result).__name__}, not text",
                call.name,
            )
        return {"role": "tool", "name": call.name, "content": result}, None
