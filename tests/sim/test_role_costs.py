"""The learner's cost with the models beside the policy (docs/algorithms.md): a critic of the
policy's size adds a forward and an update per token, a teacher its forward."""

import dataclasses

import pytest

from rljax.models.presets import PRESETS
from rljax.sim.chips import CHIPS
from rljax.sim.costs import CostModel, learner_flops_per_param


def test_each_role_adds_its_passes():
    assert learner_flops_per_param() == 6.0
    assert learner_flops_per_param(critic=True) == 14.0  # + forward 2 + update 6
    assert learner_flops_per_param(8.0, teacher=4.0) == 16.0  # a 4x teacher's forward
    assert learner_flops_per_param(reference=True) == 8.0


def test_a_critic_more_than_doubles_the_train_step():
    cost = CostModel(PRESETS["qwen2.5-0.5b"], CHIPS["tpu-v5e"])
    ppo = dataclasses.replace(cost, train_flops_per_param=learner_flops_per_param(critic=True))
    ratio = ppo.train_step_s(4096, 4) / cost.train_step_s(4096, 4)
    assert ratio == pytest.approx(14 / 6)
