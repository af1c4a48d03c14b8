"""The advantage estimators against verl's own (verl.trainer.ppo.core_algos, 0.9.1).

The README's test command installs verl, without its dependencies, into build/verl (with
omegaconf), apart from the environment: verl's wheel also installs top-level ``tests`` and
``scripts`` packages, which in site-packages shadow this repository's in spawned processes. The
directory is on sys.path only while core_algos imports. Importing it pulls in ray, tensordict
and codetiming through modules the estimators never call, so those stand in as empty modules
meanwhile. The estimators themselves are verl's, run on torch.

The outcome estimators compare one number per response; the per-token ones (gae,
reinforce_plus_plus) compare every trained token of random sequences that rljax packs several
to a row, with env-token spans inside responses, against verl on one response per row.
"""

from __future__ import annotations

import importlib
import importlib.util
import pathlib
import sys
import types
from unittest import mock

import jax.numpy as jnp
import numpy as np
import pytest
import torch

from rljax.learner import token_advantages as ta
from rljax.learner.advantages import outcome_advantages
from rljax.learner.batch import TrainSequence, pack_batch

STAND_INS = ("ray", "tensordict", "tensordict.tensorclass", "codetiming")
VERL_DIR = pathlib.Path(__file__).resolve().parents[2] / "build" / "verl"
INSTALL = (
    "pip install --no-deps --target build/verl verl==0.9.1 omegaconf==2.3.0 "
    "antlr4-python3-runtime==4.9.3"
)


@pytest.fixture(scope="module")
def core_algos():
    if not (VERL_DIR / "verl").is_dir():
        pytest.fail(f"verl, the reference, is not in {VERL_DIR}; run `{INSTALL}` (README)")
    saved = {name: sys.modules.get(name) for name in STAND_INS}
    missing = [n for n in STAND_INS if importlib.util.find_spec(n.split(".")[0]) is None]
    for name in missing:
        sys.modules[name] = mock.MagicMock(name=name)  # any attribute, call or annotation
    sys.path.insert(0, str(VERL_DIR))
    try:
        yield importlib.import_module("verl.trainer.ppo.core_algos")
    finally:
        sys.path.remove(str(VERL_DIR))
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


def _sequences(seed: int, n: int):
    """Random sequences (prompt, response with env-token spans inside, a reward), the values
    of each response token, and each one's behaviour and reference log-probs."""
    rng = np.random.default_rng(seed)
    seqs, values, old, ref = [], [], [], []
    for i in range(n):
        p, r = int(rng.integers(1, 5)), int(rng.integers(1, 9))
        mask = np.ones(r, np.int32)
        if r > 3 and rng.random() < 0.5:  # an env span, never the first or last token
            a = int(rng.integers(1, r - 2))
            mask[a : a + int(rng.integers(1, r - 1 - a))] = 0
        # the carrier: each trained token's behaviour log-prob names (sequence, position)
        carrier = [-(i * 100 + j + 1) / 1e4 for j in range(r)]
        seqs.append(
            TrainSequence(
                list(rng.integers(3, 17, p + r)),
                p,
                logprobs=carrier,
                loss_mask=list(mask),
                reward=float(rng.normal()),
            )
        )
        values.append(rng.normal(size=r))
        old.append(rng.normal(-1.0, 0.3, r))
        ref.append(rng.normal(-1.0, 0.3, r))
    return seqs, values, old, ref, rng


def _packed(seed: int, n: int):
    """rljax's packed batch (several sequences a row) with values and the per-token KL in
    place (noise on every untrained position), and verl's [n, L] response-aligned inputs."""
    seqs, values, old, ref, rng = _sequences(seed, n)
    arrays = pack_batch(seqs, row_len=24).arrays
    on = arrays["mask"] > 0
    code = np.rint(-arrays["old_logprobs"] * 1e4).astype(int) - 1
    where = {(c // 100, c % 100): idx for idx, c in zip(zip(*np.nonzero(on)), code[on])}
    packed_v = rng.normal(size=arrays["mask"].shape)  # noise wherever nothing is trained
    packed_kl = rng.normal(size=arrays["mask"].shape)
    length = max(s.response_len for s in seqs)
    level = np.zeros((n, length))
    v_bl, kl_bl, mask_bl = (np.zeros((n, length)) for _ in range(3))
    for i, s in enumerate(seqs):
        m = np.asarray(s.loss_mask)
        mask_bl[i, : len(m)] = m
        v_bl[i, : len(m)] = values[i]
        kl_bl[i, : len(m)] = old[i] - ref[i]
        level[i, np.flatnonzero(m)[-1]] = s.reward
        for j in np.flatnonzero(m):
            packed_v[where[(i, j)]] = values[i][j]
            packed_kl[where[(i, j)]] = old[i][j] - ref[i][j]
    assert len(where) == int(mask_bl.sum())  # every trained token found once
    ours = {k: arrays[k] for k in ("rewards", "mask", "segment_ids")}
    ours |= {"values": packed_v, "kl": packed_kl}
    verl = {"level": level, "values": v_bl, "kl": kl_bl, "mask": mask_bl, "old": old, "ref": ref}
    return ours, verl, where, seqs


def _unpack(packed: np.ndarray, where: dict, seqs) -> np.ndarray:
    """A packed per-token array back in verl's [n, L] layout (0 off the trained tokens)."""
    out = np.zeros((len(seqs), max(s.response_len for s in seqs)))
    for (i, j), idx in where.items():
        out[i, j] = packed[idx]
    return out


TOKEN_CASES = [(0, 6, 1.0, 1.0), (1, 9, 0.99, 0.95), (2, 4, 0.9, 0.5), (3, 12, 1.0, 0.0)]


@pytest.mark.parametrize("seed,n,gamma,lam", TOKEN_CASES)
def test_gae_equals_verl_on_packed_batches(core_algos, seed, n, gamma, lam):
    ours, verl, where, seqs = _packed(seed, n)
    adv, returns = ta.gae_advantages(
        jnp.asarray(ours["rewards"]),
        jnp.asarray(ours["values"], jnp.float32),
        jnp.asarray(ours["mask"]),
        jnp.asarray(ours["segment_ids"]),
        gamma,
        lam,
    )
    t = {k: torch.tensor(verl[k], dtype=torch.float32) for k in ("level", "values", "mask")}
    theirs_adv, theirs_ret = core_algos.compute_gae_advantage_return(
        t["level"], t["values"], t["mask"], gamma, lam
    )
    m = verl["mask"] > 0
    np.testing.assert_allclose(
        _unpack(np.asarray(adv), where, seqs)[m], theirs_adv.numpy()[m], rtol=1e-4, atol=1e-5
    )
    np.testing.assert_allclose(
        _unpack(np.asarray(returns), where, seqs)[m], theirs_ret.numpy()[m], rtol=1e-4, atol=1e-5
    )


@pytest.mark.parametrize("seed,n,gamma,kl_reward", [(4, 7, 1.0, 0.0), (5, 10, 0.95, 0.1)])
def test_reinforce_pp_equals_verl_with_the_kl_in_the_reward(core_algos, seed, n, gamma, kl_reward):
    ours, verl, where, seqs = _packed(seed, n)
    adv, returns = ta.reinforce_pp_advantages(
        jnp.asarray(ours["rewards"]),
        jnp.asarray(ours["mask"]),
        jnp.asarray(ours["segment_ids"]),
        gamma,
        jnp.asarray(ours["kl"], jnp.float32),
        kl_reward,
    )
    mask = torch.tensor(verl["mask"], dtype=torch.float32)
    # verl's apply_kl_penalty: the k1 estimate ("kl") of the behaviour against the reference,
    # on the response mask, times beta, off the scores
    old, ref = (torch.zeros_like(mask) for _ in range(2))
    for i, (o, r) in enumerate(zip(verl["old"], verl["ref"], strict=True)):
        old[i, : len(o)], ref[i, : len(r)] = torch.tensor(o), torch.tensor(r)
    kld = core_algos.kl_penalty(old, ref, "kl") * mask
    level = torch.tensor(verl["level"], dtype=torch.float32) - kl_reward * kld
    config = types.SimpleNamespace(gamma=gamma)
    theirs_adv, theirs_ret = core_algos.compute_reinforce_plus_plus_outcome_advantage(
        level, mask, config=config
    )
    m = verl["mask"] > 0
    np.testing.assert_allclose(
        _unpack(np.asarray(adv), where, seqs)[m], theirs_adv.numpy()[m], rtol=1e-4, atol=1e-5
    )
    np.testing.assert_allclose(
        _unpack(np.asarray(returns), where, seqs)[m], theirs_ret.numpy()[m], rtol=1e-4, atol=1e-5
    )
