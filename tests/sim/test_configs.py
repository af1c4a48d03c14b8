"""Every configs/sim file builds, and its model, chip and lengths are valid simulator inputs."""

import importlib.util
import pathlib

import pytest

from rljax.models.presets import get_preset
from rljax.policy.lending import LendingConfig
from rljax.sim.chips import get_chip
from rljax.sim.costs import CostModel, Efficiencies
from rljax.sim.workload import LengthModel

CONFIGS = sorted(pathlib.Path(__file__).parents[2].joinpath("configs", "sim").glob("*.py"))


def load(path):
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("path", CONFIGS, ids=[p.stem for p in CONFIGS])
@pytest.mark.parametrize("arg", ["", "small"])
def test_config_builds(path, arg):
    c = load(path).get_config(arg)
    cost = CostModel(
        get_preset(c.model), get_chip(c.chip), tp=c.tp, efficiencies=Efficiencies(**c.efficiencies)
    )
    assert cost.kv_slots(c.prompt_tokens + c.lengths.median, c.max_slots) >= c.group_size
    LengthModel(**c.lengths.to_dict())
    assert set(c.train_flops_per_param.keys()) == {"sync", "async_"}
    assert c.tails or c.validation.enabled or c.growth.median > 0 or "lend" in c
    if "lend" in c:  # scripts/sim_lending.py's workloads
        assert c.lend.splits and all(0 < n < c.total_chips for n in c.lend.splits)
        assert all(n % cost.tp == 0 for n in c.lend.splits)
        LendingConfig(enabled=True, **c.lend.lending)


def test_configs_found():
    assert {p.stem for p in CONFIGS} >= {"pod_compare", "verl_async_h20", "lend_short"}
