"""ToolEnv end to end: the opening messages, a calculator call answered by a tool message, each
failing call answered with an error the model can read and counted by kind, and the final
answer scored and ending the conversation."""

import json

import pytest

from rljax.envs import BUILTIN_TOOLS, CALCULATOR, Env, Step, Tool, ToolEnv, ToolError
from rljax.envs.base import check_step

EXAMPLE = {"prompt": "What is 1234 * 5678?", "answer": "7006652"}


def call(name: str, **arguments) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


def reward(answer: str, example: dict) -> float:
    return float(example["answer"] in answer)


def started(**kwargs) -> ToolEnv:
    env = ToolEnv(answer_reward=reward, **kwargs)
    env.reset(EXAMPLE)
    return env


def test_is_an_env_and_opens_with_the_tools_and_the_prompt():
    env = ToolEnv(system_prompt="Be brief.")
    assert isinstance(env, Env)
    system, user = env.reset(EXAMPLE)
    assert system["role"] == "system" and system["content"].startswith("Be brief.\n\n# Tools")
    for tool in BUILTIN_TOOLS.values():
        assert json.dumps({"type": "function", "function": tool.schema()}) in system["content"]
    assert user == {"role": "user", "content": EXAMPLE["prompt"]}


def test_smollm2_opening_lists_the_tools():
    system, _ = ToolEnv(fmt="smollm2").reset(EXAMPLE)
    listed = system["content"].split("<tools>")[1].split("</tools>")[0]
    assert json.loads(listed) == [t.schema() for t in BUILTIN_TOOLS.values()]


def test_calculator_call_is_answered_by_a_tool_message():
    step = started().step("I will compute.\n" + call("calculator", expression="1234*5678"))
    assert check_step(step) == Step(
        observation=[{"role": "tool", "name": "calculator", "content": "7006652"}],
        reward=0.0,
        done=False,
        info={"tool_calls": 1},
    )


def test_smollm2_calls_run_in_order():
    env = started(fmt="smollm2")
    calls = [
        {"name": "calculator", "arguments": {"expression": "2+3"}},
        {"name": "python", "arguments": {"code": "print('hi')"}},
    ]
    step = env.step(f"<tool_call>{json.dumps(calls)}</tool_call>")
    assert [m["content"] for m in step.observation] == ["5", "hi\n"]
    assert [m["name"] for m in step.observation] == ["calculator", "python"]
    assert step.info == {"tool_calls": 2} and not step.done


def gemma_call(*lines: str) -> str:
    return "```tool_code\n" + "\n".join(lines) + "\n```"


def test_gemma_opening_lists_the_tools_as_python_signatures():
    system, user = ToolEnv(fmt="gemma").reset(EXAMPLE)
    assert "wrapped with ```tool_code```" in system["content"]
    assert "def calculator(expression: str) -> str:" in system["content"]
    assert "def python(code: str) -> str:" in system["content"]
    assert user == {"role": "user", "content": EXAMPLE["prompt"]}


def test_gemma_calls_are_answered_in_one_user_turn_of_tool_output_blocks():
    """Gemma's template has no tool role and makes the roles alternate: a turn's results come
    back as one user message, a ```tool_output block per call, in order."""
    env = started(fmt="gemma")
    step = check_step(
        env.step(
            "Let me compute.\n"
            + gemma_call('calculator(expression="1234*5678")', "python(code=\"print('hi')\")")
        )
    )
    assert step.observation == [
        {"role": "user", "content": "```tool_output\n7006652\n```\n```tool_output\nhi\n\n```"}
    ]
    assert step.info == {"tool_calls": 2} and not step.done
    assert env.step("The answer is 7006652.") == Step(reward=1.0, done=True)


@pytest.mark.parametrize(
    "turn, kind, says",
    [
        (gemma_call('calculator("1+1")'), "malformed_tool_call", "as name=value"),
        (gemma_call("calculator(expression=x)"), "malformed_tool_call", "not a literal"),
        (gemma_call("calculator(expression='1'"), "malformed_tool_call", "not Python"),
        ("```tool_code\ncalculator(expression='1')", "malformed_tool_call", "never closed"),
        (gemma_call("search(query='x')"), "unknown_tool", "there is no tool 'search'"),
        (gemma_call("calculator(expression='1/0')"), "tool_error", "division by zero"),
    ],
)
def test_a_bad_gemma_call_is_answered_in_a_tool_output_block(turn, kind, says):
    step = check_step(started(fmt="gemma").step(turn))
    assert not step.done and step.reward == 0.0
    assert step.info == {"tool_calls": 1, f"tool_errors/{kind}": 1}
    (message,) = step.observation
    assert message["role"] == "user"
    inner = message["content"].removeprefix("```tool_output\n").removesuffix("\n```")
    assert inner.startswith(f"error: {kind}: ") and says in inner and "\n" not in inner


def test_a_gemma_call_s_arguments_are_never_run():
    """The arguments are read as literals: a call whose argument would run code is refused
    before anything runs (the tool is never called)."""
    ran = []
    tool = Tool("t", "A tool.", {"type": "object"}, lambda **a: ran.append(a) or "ok")
    env = ToolEnv({"t": tool}, fmt="gemma")
    env.reset(EXAMPLE)
    step = env.step(gemma_call("t(x=__import__('os').system('echo hi'))"))
    assert step.info == {"tool_calls": 1, "tool_errors/malformed_tool_call": 1} and not ran


def test_the_answer_ends_the_conversation_with_its_reward():
    env = started()
    env.step(call("calculator", expression="1234*5678"))
    assert env.step("The answer is 7006652.") == Step(reward=1.0, done=True)
    env = started()
    assert env.step("The answer is 7.") == Step(reward=0.0, done=True)


def test_without_answer_reward_the_answer_scores_zero():
    env = ToolEnv()
    env.reset(EXAMPLE)
    assert env.step("7006652") == Step(reward=0.0, done=True)


@pytest.mark.parametrize(
    "turn, kind, says",
    [
        (call("search", query="x"), "unknown_tool", "there is no tool 'search'"),
        ("<tool_call>\n{'name': 'calculator'}\n</tool_call>", "malformed_tool_call", "JSON"),
        ('<tool_call>{"name": "calculator", "arguments": {}}', "malformed_tool_call", "closed"),
        ('<tool_call>{"arguments": {}}</tool_call>', "malformed_tool_call", '"name"'),
        (call("calculator", expression="1/0"), "tool_error", "division by zero"),
        (call("calculator", expression="__import__('os')"), "tool_error", "Call"),
        (call("calculator", expr="1+1"), "tool_error", "bad arguments for calculator"),
        (call("calculator"), "tool_error", "bad arguments for calculator"),
        (call("python", code="import socket; socket.socket()"), "tool_error", "refused"),
    ],
)
def test_a_failed_call_is_answered_with_an_error_and_counted(turn, kind, says):
    step = check_step(started().step(turn))
    assert not step.done and step.reward == 0.0
    assert step.info == {"tool_calls": 1, f"tool_errors/{kind}": 1}
    (message,) = step.observation
    assert message["role"] == "tool"
    assert message["content"].startswith(f"error: {kind}: ")
    assert says in message["content"] and "\n" not in message["content"]


def test_the_conversation_goes_on_after_an_error():
    env = started()
    env.step(call("calculator", expression="1234*"))
    step = env.step(call("calculator", expression="1234*5678"))
    assert step.observation[0]["content"] == "7006652"
    assert env.step("7006652") == Step(reward=1.0, done=True)


def broken(**_) -> str:
    raise KeyError("the tool's own bug")


def returns_int(**_) -> str:
    return 5  # type: ignore[return-value]


def refuses(**_) -> str:
    raise ToolError("no\nthanks")


@pytest.mark.parametrize(
    "fn, says",
    [
        (broken, 'KeyError: "the tool\'s own bug"'),
        (returns_int, "the tool returned int, not text"),
        (refuses, "no thanks"),
    ],
)
def test_a_failing_tool_is_a_tool_error(fn, says):
    tool = Tool("t", "A tool.", {"type": "object", "properties": {}}, fn)
    env = ToolEnv({"t": tool})
    env.reset(EXAMPLE)
    step = env.step(call("t"))
    assert step.info == {"tool_calls": 1, "tool_errors/tool_error": 1}
    assert step.observation == [
        {"role": "tool", "name": "t", "content": f"error: tool_error: {says}"}
    ]


def test_calls_past_the_limit_are_not_run():
    ran = []
    tool = Tool("t", "A tool.", {"type": "object"}, lambda: ran.append(1) or "ok")
    env = ToolEnv({"t": tool}, max_tool_calls_per_turn=2)
    env.reset(EXAMPLE)
    step = env.step(call("t") * 3)
    assert len(ran) == 2
    assert [m["content"][:30] for m in step.observation] == [
        "ok",
        "ok",
        "error: too_many_tool_calls: at",
    ]
    assert step.info == {"tool_calls": 3, "tool_errors/too_many_tool_calls": 1}


def test_errors_of_several_kinds_are_counted_apart():
    step = started().step(call("nope") + call("calculator", expression="1/0") + call("nope"))
    assert step.info == {
        "tool_calls": 3,
        "tool_errors/unknown_tool": 2,
        "tool_errors/tool_error": 1,
    }


def test_bad_construction_is_refused():
    with pytest.raises(ValueError, match="hermes.*gemma"):
        ToolEnv(fmt="openai")
    with pytest.raises(ValueError, match="named 'calc'"):
        ToolEnv({"calc": CALCULATOR})
    with pytest.raises(ValueError, match=">= 1"):
        ToolEnv(max_tool_calls_per_turn=0)
    with pytest.raises(RuntimeError, match="reset"):
        ToolEnv().step("hi")
