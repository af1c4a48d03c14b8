"""The outcome advantage estimators against verl's own (verl.trainer.ppo.core_algos, 0.9.1).

verl is installed without its dependencies (the README's test command); importing core_algos
pulls in ray, tensordict and codetiming through modules the estimators never call, so those
stand in as empty modules while it imports. The estimators themselves are verl's, run on torch.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from unittest import mock

import numpy as np
import pytest
import torch

from rljax.learner.advantages import outcome_advantages

STAND_INS = ("ray", "tensordict", "tensordict.tensorclass", "codetiming")


@pytest.fixture(scope="module")
def core_algos():
    saved = {name: sys.modules.get(name) for name in STAND_INS}
    missing = [n for n in STAND_INS if importlib.util.find_spec(n.split(".")[0]) is None]
    for name in missing:
        sys.modules[name] = mock.MagicMock(name=name)  # any attribute, call or annotation
    try:
        yield importlib.import_module("verl.trainer.ppo.core_algos")
    finally:
        for name, module in saved.items():
            if module is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module


def _batch(seed: int, groups: int, g: int, binary: bool):
    """verl's inputs (the score on each response's last token, the response mask, the group
    index, in shuffled order) and rljax's ([groups, G] rewards and trained tokens)."""
    rng = np.random.default_rng(seed)
    rewards = rng.integers(0, 2, (groups, g)) if binary else rng.normal(size=(groups, g))
    rewards = rewards.astype(np.float64)
    tokens = rng.integers(1, 12, (groups, g))
    order = rng.permutation(groups * g)  # verl's batch need not keep a group together
    flat_r, flat_t = rewards.reshape(-1)[order], tokens.reshape(-1)[order]
    mask = (np.arange(12)[None, :] < flat_t[:, None]).astype(np.float32)
    level = np.zeros_like(mask)
    level[np.arange(len(order)), flat_t - 1] = flat_r
    index = np.asarray([f"prompt-{i // g}" for i in order], dtype=object)
    verl_in = (torch.tensor(level), torch.tensor(mask), index)
    return verl_in, rewards, tokens, order


def _per_response(adv_bl: torch.Tensor, mask: torch.Tensor) -> np.ndarray:
    """verl's token-level advantages, one value per response (constant over its tokens)."""
    a, m = adv_bl.numpy().astype(np.float64), mask.numpy() > 0
    values = np.asarray([row[on][0] for row, on in zip(a, m, strict=True)])
    for row, on, v in zip(a, m, values, strict=True):
        np.testing.assert_allclose(row[on], v, rtol=1e-6)  # constant over the response
        assert not row[~on].any()  # zero past it
    return values


CASES = [(0, 3, 4, True), (1, 5, 8, False), (2, 1, 2, True), (3, 4, 3, False)]


@pytest.mark.parametrize("seed,groups,g,binary", CASES)
def test_rloo_equals_verl(core_algos, seed, groups, g, binary):
    (level, mask, index), rewards, tokens, order = _batch(seed, groups, g, binary)
    theirs, _ = core_algos.compute_rloo_outcome_advantage(level, mask, index)
    ours = outcome_advantages("rloo", rewards, tokens).reshape(-1)[order]
    np.testing.assert_allclose(ours, _per_response(theirs, mask), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("seed,groups,g,binary", CASES)
def test_reinforce_pp_baseline_equals_verl(core_algos, seed, groups, g, binary):
    (level, mask, index), rewards, tokens, order = _batch(seed, groups, g, binary)
    theirs, _ = core_algos.compute_reinforce_plus_plus_baseline_outcome_advantage(
        level, mask, index
    )
    ours = outcome_advantages("reinforce_plus_plus_baseline", rewards, tokens).reshape(-1)[order]
    np.testing.assert_allclose(ours, _per_response(theirs, mask), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("seed,groups,g,binary", CASES)
def test_grpo_equals_verl_but_for_the_documented_std(core_algos, seed, groups, g, binary):
    """Without std scaling (Dr. GRPO) the two agree; with it, rljax divides by the population
    std (ddof=0) where verl divides by the sample std (ddof=1): a factor sqrt(G / (G - 1))."""
    (level, mask, index), rewards, tokens, order = _batch(seed, groups, g, binary)
    plain, _ = core_algos.compute_grpo_outcome_advantage(
        level, mask, index, norm_adv_by_std_in_grpo=False
    )
    ours = outcome_advantages("grpo", rewards, tokens, scale=False).reshape(-1)[order]
    np.testing.assert_allclose(ours, _per_response(plain, mask), rtol=1e-5, atol=1e-6)
    scaled, _ = core_algos.compute_grpo_outcome_advantage(level, mask, index)
    ours = outcome_advantages("grpo", rewards, tokens).reshape(-1)[order]
    theirs = _per_response(scaled, mask)
    varied = np.repeat(rewards.std(axis=1) > 1e-3, g)[order]  # eps matters only in flat groups
    np.testing.assert_allclose(ours[varied], theirs[varied] * np.sqrt(g / (g - 1)), rtol=1e-4)
