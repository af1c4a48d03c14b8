"""The config's choices are the registries' keys, and one rule refuses an entry's unmet needs."""

import subprocess
import sys

import pytest

from rljax import config as C
from rljax.config import checks
from rljax.data.registry import TASKS
from rljax.data.teachers import TEACHERS
from rljax.envs.tool_env import BUILTIN_TOOLS
from rljax.learner.loss_names import LOSS_NEEDS
from rljax.learner.losses import LOSSES
from rljax.models import lora
from rljax.needs import Needs


def test_each_choice_list_is_its_registrys_keys():
    assert tuple(TASKS) == C.TASKS
    assert tuple(TEACHERS) == C.SFT_TEACHERS
    assert tuple(BUILTIN_TOOLS) == checks.BUILTIN_TOOL_NAMES
    assert tuple(lora.TARGET_WEIGHTS) == checks.LORA_TARGETS
    # The losses are declared apart from their JAX code: both list the same names.
    assert C.LOSSES == tuple(LOSS_NEEDS) == tuple(LOSSES)
    assert C.EnvConfig().tools == tuple(BUILTIN_TOOLS)
    assert C.LoRAConfig().targets == tuple(lora.TARGET_WEIGHTS)


@pytest.mark.parametrize("name", sorted(TEACHERS))
def test_each_teacher_is_accepted_where_its_needs_are_met(name):
    needs = TEACHERS[name].needs
    changes = {"sft.teacher": name, **dict(needs.values)}
    if name != "reference":
        changes["sft.teacher_slip"] = 0.5
    if needs.values.get("data.task") in ("gsm8k", "math"):  # a file task names its file
        changes["data.path"] = "task.jsonl"  # not read while the config is checked
    C.replace(C.RunConfig(), **changes)  # accepted


@pytest.mark.parametrize("name", [n for n in TEACHERS if TEACHERS[n].needs.values])
def test_a_teacher_whose_needs_are_unmet_is_refused_with_the_need_and_the_fix(name):
    needs = TEACHERS[name].needs
    met = {"sft.teacher": name, "sft.teacher_slip": 0.5, **dict(needs.values)}
    # Another valid value for each needed key (an arithmetic_lookup task needs data.ops='+').
    other = {
        "data.ops": {"data.ops": "+-"},
        "env.name": {"env.name": "lookup"},
        "data.task": {"data.task": "arithmetic_lookup", "data.ops": "+"},
    }
    for key, need in needs.values.items():
        if need == "arithmetic_lookup":
            unmet = {**met, "data.task": "arithmetic"}
        else:
            unmet = {**met, **other[key]}
        with pytest.raises(C.ConfigError) as exc:
            C.replace(C.RunConfig(), **unmet)
        msg = str(exc.value)
        assert msg.startswith(f"config key 'sft.teacher' = {name!r} needs {needs}")
        assert f"({needs.why}); set {needs}, or sft.teacher='reference'" in msg
        assert "\n" not in msg


def test_a_task_need_is_checked_in_its_section_and_named_there():
    needs = TASKS["arithmetic_lookup"].needs
    assert dict(needs.values) == {"data.ops": "+"}
    with pytest.raises(
        C.ConfigError, match=r"'data.task' = 'arithmetic_lookup' needs data.ops='\+'"
    ):
        C.DataConfig(task="arithmetic_lookup", ops="+-")


def test_the_one_rule_reads_any_key_and_leaves_unseen_ones_to_the_whole_config():
    needs = Needs({"data.ops": "*", "env.name": "tools"}, "why")
    data = C.DataConfig(ops="*")
    # The data section sees data.ops (met) but not env.name: nothing to refuse there.
    checks.check_needs("x", 1, needs, checks.value_in(data, "data."), 0)
    run = C.RunConfig(data=data)
    with pytest.raises(C.ConfigError, match=r"'x' = 1 needs data.ops='\*' and env.name='tools'"):
        checks.check_needs("x", 1, needs, checks.value_in(run), 0)
    assert str(Needs({"a": 1})) == "a=1" and str(Needs()) == ""


def test_the_config_imports_without_jax_numpy_or_grain():
    code = (
        "import sys\n"
        "for name in ('jax', 'jaxlib', 'flax', 'numpy', 'grain'):\n"
        "    sys.modules[name] = None\n"
        "import rljax.config\n"
        "rljax.config.RunConfig()\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]
