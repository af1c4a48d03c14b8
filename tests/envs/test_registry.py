"""The env registry: names build factories from the run config; research code registers its own."""

import pytest

from rljax.config import ConfigError, RunConfig, replace
from rljax.envs import ENVS, LookupEnv, Step, ToolEnv, register_env
from rljax.envs.registry import env_factory


def test_tools_env_phrases_the_task_as_the_prompt_template_says():
    cfg = replace(
        RunConfig(),
        **{
            "env.name": "tools",
            "env.tool_format": "smollm2",
            "data.prompt_template": "What is {question}? Use the calculator.",
        },
    )
    env = env_factory(cfg, lambda answer, ex: 1.0)()
    assert isinstance(env, ToolEnv) and env.fmt == "smollm2"
    system, user = env.reset({"prompt": "12*34=", "answer": "408"})
    assert user == {"role": "user", "content": "What is 12*34? Use the calculator."}
    assert "calculator" in system["content"]
    assert env.step("408").reward == 1.0


def test_tools_env_offers_the_configured_tools_in_the_configured_prompt():
    keys = {"env.name": "tools", "env.tool_format": "smollm2", "env.tools": ("calculator",)}
    for style in ("card", "brief"):
        cfg = replace(RunConfig(), **keys, **{"env.tool_prompt": style})
        env = env_factory(cfg, lambda answer, ex: 0.0)()
        system, _ = env.reset({"prompt": "12*34=", "answer": "408"})
        assert "calculator" in system["content"] and "python" not in system["content"]
        assert ("- calculator(expression):" in system["content"]) == (style == "brief")
        step = env.step('<tool_call>[{"name": "python", "arguments": {"code": "1"}}]</tool_call>')
        assert step.info == {"tool_calls": 1, "tool_errors/unknown_tool": 1}
        assert "the tools are calculator" in step.observation[0]["content"]


def test_lookup_and_its_blind_control():
    example = {"prompt": "37+*=", "hidden": "45", "answer": "82"}
    for name, seen in (("lookup", "45="), ("lookup_blind", "")):
        env = env_factory(replace(RunConfig(), **{"env.name": name}), lambda a, ex: 0.0)()
        assert isinstance(env, LookupEnv)
        env.reset(example)
        assert env.step(" * ").observation == [{"role": "tool", "content": seen}]


def test_register_env_and_unknown_names():
    class Mine:
        def reset(self, example):
            return [{"role": "user", "content": "hi"}]

        def step(self, action):
            return Step(done=True)

    register_env("mine_for_test", lambda cfg, reward: Mine)
    try:
        assert env_factory(replace(RunConfig(), **{"env.name": "mine_for_test"}), None) is Mine
    finally:
        del ENVS["mine_for_test"]
    with pytest.raises(ConfigError, match="Unknown env 'gone'"):
        env_factory(replace(RunConfig(), **{"env.name": "gone"}), None)
    with pytest.raises(ValueError, match="non-empty str"):
        register_env("", lambda cfg, reward: Mine)
