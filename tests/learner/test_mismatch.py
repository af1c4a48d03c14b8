"""The train-inference mismatch the learner logs every step (``mismatch/*``)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rljax.config import LearnerConfig
from rljax.learner.batch import TrainSequence, pack_batch
from rljax.learner.learner import MISMATCH_FRESH, Learner
from rljax.learner.losses import LOSSES, train_inference_mismatch
from rljax.models.sharding import make_mesh
from rljax.testing.engines import tiny_engine

SEQS = [([1, 4, 6, 2, 3, 7, 9], 3, 1.0), ([5, 9, 8, 8, 1], 2, -1.0)] * 2  # tokens, prompt, adv


def test_per_token_mismatch_by_hand():
    logp = jnp.array([[-1.0, -2.0, -0.5, -3.0]])
    sampler = jnp.array([[-1.1, -1.5, -0.5, 0.0]])  # the last position is padding
    mask = jnp.array([[1.0, 1.0, 1.0, 0.0]])
    out = train_inference_mismatch(logp, sampler, mask)
    r = np.array([0.1, -0.5, 0.0, 0.0])
    np.testing.assert_allclose(out["abs_logp"][0], np.abs(r), atol=1e-6)
    np.testing.assert_allclose(out["k3"][0], np.exp(r) - 1 - r, atol=1e-7)
    # k3 keeps its r^2 / 2 at bf16-sized gaps, where exp(r) - 1 - r in f32 is rounding noise.
    tiny = train_inference_mismatch(jnp.array([[1e-3]]), jnp.array([[0.0]]), jnp.array([[1.0]]))
    np.testing.assert_allclose(tiny["k3"][0, 0], 1e-3**2 / 2, rtol=1e-3)


@pytest.fixture(scope="module")
def tiny():
    return tiny_engine()


@pytest.fixture(scope="module")
def learner(tiny):
    """One learner (one compile) for the tests; each sets the version it needs."""
    mesh = make_mesh(jax.devices()[:2], {"fsdp": 2, "tensor": 1})
    # A large rate: the second epoch's params differ from the first's.
    cfg = LearnerConfig(group_size=2, batch_groups=2, learning_rate=0.05, ppo_epochs=2)
    return Learner(cfg, tiny.graphdef, tiny.state, mesh)


def _batch(learner, logprobs, versions):
    seqs = [
        TrainSequence(tokens, p, lp, adv, v)
        for (tokens, p, adv), lp, v in zip(SEQS, logprobs, versions, strict=True)
    ]
    return pack_batch(seqs, row_len=16, row_multiple=learner.dp)


def _own_logprobs(learner):
    """Each sequence's response log-probs under the learner's params (its own 'sampler')."""
    probe = _batch(learner, [[0.0] * (len(t) - p) for t, p, _ in SEQS], [()] * len(SEQS))
    own = learner.token_logprobs(probe)
    out = []
    for tokens, p, _ in SEQS:  # each sequence is alone in a row: find it by its tokens
        row = next(
            i
            for i in range(own.shape[1])
            if list(probe.arrays["tokens"][0, i, : len(tokens)]) == tokens
        )
        out.append(own[0, row, p - 1 : len(tokens) - 1].tolist())
    return out


def test_own_logprobs_give_zero_mismatch_even_after_several_epochs(learner):
    # The rate moves the params in epoch 1; the logged mismatch is epoch 0's, where the
    # params are the ones that 'sampled', so it stays ~0.
    learner.version = 0
    own = _own_logprobs(learner)
    batch = _batch(learner, own, [[0] * len(lp) for lp in own])
    m = learner.step(batch)
    for key in ("mismatch/abs_logp", "mismatch/k3", *MISMATCH_FRESH):
        assert abs(m[key]) < 2e-5, (key, m[key])
    assert m["mismatch/fresh_frac"] == 1.0
    # The guard is live: the second epoch's params disagree with the first's.
    drift = learner.token_logprobs(batch) - batch.arrays["old_logprobs"]
    assert np.abs(drift[batch.arrays["mask"] > 0]).max() > 1e-3


def test_mismatch_equals_hand_computation_and_fresh_counts_only_current_version(learner):
    learner.version = 3
    own = _own_logprobs(learner)
    rng = np.random.default_rng(0)
    deltas = [rng.normal(0, 0.3, len(lp)) for lp in own]
    sampler = [list(np.asarray(lp) - d) for lp, d in zip(own, deltas, strict=True)]
    fresh = [True, False, True, False]  # versions 3 (the learner's) and 2 (one step stale)
    versions = [[3 if f else 2] * len(lp) for lp, f in zip(own, fresh, strict=True)]
    m = learner.step(_batch(learner, sampler, versions))

    r_all = np.concatenate(deltas)  # r = learner - sampler = delta
    r_fresh = np.concatenate([d for d, f in zip(deltas, fresh, strict=True) if f])
    np.testing.assert_allclose(m["mismatch/abs_logp"], np.abs(r_all).mean(), rtol=1e-4)
    np.testing.assert_allclose(m["mismatch/k3"], (np.expm1(r_all) - r_all).mean(), rtol=1e-4)
    np.testing.assert_allclose(m["mismatch/abs_logp_fresh"], np.abs(r_fresh).mean(), rtol=1e-4)
    np.testing.assert_allclose(
        m["mismatch/k3_fresh"], (np.expm1(r_fresh) - r_fresh).mean(), rtol=1e-4
    )
    np.testing.assert_allclose(m["mismatch/fresh_frac"], len(r_fresh) / len(r_all))


def test_no_fresh_token_leaves_the_fresh_keys_out(learner):
    learner.version = 5
    own = _own_logprobs(learner)
    m = learner.step(_batch(learner, own, [[4] * len(lp) for lp in own]))
    assert m["mismatch/fresh_frac"] == 0.0
    assert not set(MISMATCH_FRESH) & set(m)
    assert abs(m["mismatch/abs_logp"]) < 2e-5


def test_sft_is_not_sampled():
    # Its batch has no sampler log-probs: a mismatch against zeros would be noise.
    assert LOSSES["sft"].sampled is False
    assert all(loss.sampled for name, loss in LOSSES.items() if name != "sft")
