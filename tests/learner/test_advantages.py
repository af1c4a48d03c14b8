"""Group advantages: the std they divide by, and which losses scale them at all."""

import sys

import numpy as np
import pytest
from absl import flags
from ml_collections import config_flags

from rljax.config import LearnerConfig, RunConfig, from_config_dict, to_config_dict
from rljax.config.checks import ConfigError
from rljax.learner.advantages import (
    group_advantages,
    outcome_advantages,
    reinforce_pp_baseline_advantages,
    resolve_scale,
    rloo_advantages,
)
from rljax.learner.losses import Loss, grpo


def test_group_advantages_by_hand():
    adv = group_advantages(np.array([[1.0, 0.0, 0.0, 1.0], [2.0, 2.0, 2.0, 2.0]]))
    # mean 0.5, population std 0.5 -> +-1 (minus the eps in the denominator)
    np.testing.assert_allclose(adv[0], [1, -1, -1, 1], atol=1e-5)
    np.testing.assert_array_equal(adv[1], 0.0)
    np.testing.assert_allclose(group_advantages(np.array([[3.0, 1.0]]), scale=False), [[1.0, -1.0]])
    with pytest.raises(ValueError, match="G >= 2"):
        group_advantages(np.array([[1.0]]))


def test_group_advantages_divide_by_the_population_std_plus_eps():
    rewards = np.array([[1.0, 0.0, 0.0]])  # mean 1/3; population std sqrt(2)/3, sample 1/sqrt(3)
    eps = 0.1
    adv = group_advantages(rewards, eps=eps)
    centred = rewards - 1 / 3
    np.testing.assert_allclose(adv, centred / (np.sqrt(2) / 3 + eps), rtol=1e-6)
    # Unit variance within the group (up to eps), whatever G is.
    for g in (2, 5, 16):
        r = np.random.default_rng(g).normal(size=(3, g))
        np.testing.assert_allclose(group_advantages(r, eps=0.0).var(axis=1), 1.0, rtol=1e-5)


@pytest.mark.parametrize(
    ("loss", "explicit", "want"),
    [
        ("dr_grpo", None, False),  # Dr. GRPO exists to remove the std scaling
        ("dr_grpo", True, True),  # unless the config asks for it
        ("grpo", None, True),
        ("decoupled_ppo", None, True),
        ("gspo", None, True),  # GSPO's A_i is the group-normalised (r_i - mean) / std
        ("grpo", False, False),
    ],
)
def test_resolve_scale_follows_the_loss_unless_set(loss, explicit, want):
    assert resolve_scale(LearnerConfig(loss=loss, scale_advantages=explicit)) is want


def test_group_advantages_refuse_an_unresolved_scale():
    """scale_advantages=None passed straight through would silently drop GRPO's std scaling."""
    with pytest.raises(TypeError, match="resolve_scale"):
        group_advantages(np.array([[1.0, 0.0]]), scale=LearnerConfig().scale_advantages)


def test_resolve_scale_reads_a_custom_loss_object():
    cfg = LearnerConfig()
    assert resolve_scale(cfg, Loss(grpo)) is True
    assert resolve_scale(cfg, Loss(grpo, scale_advantages=False)) is False


def test_scale_advantages_is_still_overridable_from_the_command_line(monkeypatch):
    """A None default would lock the key out of --config overrides; a placeholder does not."""
    argv = ["prog", "--config.learner.scale_advantages=False", "--config.learner.loss=dr_grpo"]
    monkeypatch.setattr(sys, "argv", argv)  # config_flags reads the overrides it defines here
    values = flags.FlagValues()
    config_flags.DEFINE_config_dict(
        "config", to_config_dict(RunConfig()), flag_values=values, lock_config=True
    )
    values(argv)
    cfg = from_config_dict(values.config)
    assert cfg.learner.scale_advantages is False
    assert from_config_dict(to_config_dict(RunConfig())).learner.scale_advantages is None


def test_scale_advantages_rejects_non_booleans():
    with pytest.raises(ValueError, match="learner.scale_advantages"):
        LearnerConfig(scale_advantages=1)


def test_rloo_is_the_leave_one_out_baseline():
    rewards = np.array([[1.0, 0.0, 0.0, 1.0], [3.0, 1.0, 2.0, 6.0]])
    others = (rewards.sum(1, keepdims=True) - rewards) / (rewards.shape[1] - 1)
    np.testing.assert_allclose(rloo_advantages(rewards), rewards - others, rtol=1e-6)


def test_reinforce_pp_baseline_weighs_each_response_by_its_tokens():
    rewards, tokens = np.array([[1.0, 0.0], [0.0, 0.0]]), np.array([[3, 1], [2, 2]])
    a = reinforce_pp_baseline_advantages(rewards, tokens)
    per_token = np.repeat(np.array([0.5, -0.5, 0.0, 0.0]), tokens.reshape(-1))
    expected = (np.array([0.5, -0.5, 0.0, 0.0]) - per_token.mean()) / per_token.std(ddof=1)
    np.testing.assert_allclose(a.reshape(-1), expected, rtol=1e-5)
    with pytest.raises(ValueError, match="at least 2"):
        reinforce_pp_baseline_advantages(np.array([[1.0, 0.0]]), np.array([[1, 0]]))


def test_the_estimator_is_chosen_by_name_and_checked_in_the_config():
    rewards, tokens = np.array([[1.0, 0.0, 0.0]]), np.array([[2, 2, 2]])
    np.testing.assert_array_equal(
        outcome_advantages("rloo", rewards, tokens), rloo_advantages(rewards)
    )
    with pytest.raises(ValueError, match="unknown advantage estimator 'gae'"):
        outcome_advantages("gae", rewards, tokens)
    with pytest.raises(ConfigError, match="'learner.advantage' = 'vtrace' is invalid"):
        LearnerConfig(advantage="vtrace")
    with pytest.raises(ConfigError, match="only grpo divides"):
        LearnerConfig(advantage="rloo", scale_advantages=True)
