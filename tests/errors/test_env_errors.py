"""Envs that cannot work: refused by the launcher or rljax.Run before any step (docs/errors.md
rows E01-E08); what an env does wrong at run time is counted instead (tests/envs)."""

import pytest
from rljax.configs import arith_tools

from rljax.config import ConfigError, replace
from rljax.envs import Step, ToolEnv
from rljax.models.tokenizer import Tokenizer
from rljax.runtime import agents
from rljax.runtime.run import Run

TOOLS = arith_tools.__file__ + ":small"
CFG = arith_tools.recipe("small")


class Echo:
    def reset(self, example):
        return [{"role": "user", "content": example["prompt"]}]

    def step(self, action):
        return Step(done=True)


def test_unknown_env_name(check_row, launch_error):
    message = launch_error(f"--config={TOOLS}", "--config.env.name=nope")
    check_row("E01", message, "register yours with rljax.envs.register_env")


def test_env_object_instead_of_a_factory(refused, check_row, workdir):
    message = refused(lambda: Run(CFG, str(workdir), env=Echo()), TypeError, workdir)
    check_row("E02", message, "a class works")


def test_factory_that_makes_no_env(refused, check_row, workdir):
    message = refused(lambda: Run(CFG, str(workdir), env=lambda: 42), TypeError, workdir)
    check_row("E03", message, "return an rljax.envs.Env")


def test_env_budget_above_the_engine_s(check_row, launch_error):
    message = launch_error(f"--config={TOOLS}", "--config.env.max_tokens=64")
    check_row("E04", message, "raise it too")


def test_unknown_built_in_tool(check_row, launch_error):
    message = launch_error(f"--config={TOOLS}", "--config.env.tools=calc")
    check_row("E05", message, "register an env for others")


def test_unknown_tool_call_format(check_row, launch_error):
    message = launch_error(f"--config={TOOLS}", "--config.env.tool_format=gemma3")
    check_row("E07", message, "expected one of hermes, smollm2, gemma")


def test_tool_env_with_an_unknown_format_is_refused(check_row):
    with pytest.raises(ValueError) as e:
        ToolEnv(fmt="json")
    check_row("E08", str(e.value), "use one of ('hermes', 'smollm2', 'gemma')")


def test_an_env_on_processes_that_share_both_meshes(check_row, monkeypatch):
    """On several processes an env needs a pod (split meshes: each conversation's env runs on
    its home sampler host); processes that share both meshes would each step their own."""
    monkeypatch.setattr(agents.jax, "process_count", lambda: 2)
    with pytest.raises(ConfigError) as e:
        agents.build(CFG, Tokenizer.char_level(), lambda c, ex: 0.0, None)
    check_row("E06", str(e.value), "set mesh.mode='split'")
    split = replace(
        CFG, **{"mesh.mode": "split", "mesh.sampler_devices": 4, "mesh.learner_devices": 4}
    )
    built = agents.build(split, Tokenizer.char_level(), lambda c, ex: 0.0, None)
    assert built is not None
    built.close()
