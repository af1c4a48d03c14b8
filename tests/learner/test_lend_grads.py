"""Trainer-on-RollPool at the Learner level: lent micro-batches give the unlent step's update.

The learner sits on devices 6-7; the lent gradients run on devices 0-5 (the sampler's chips in a
6/2 split). Equality is checked on the parameters after two steps and on the loss and gradient
norm of each step, so a lent share that is dropped, counted twice or taken at other parameters
fails (the gradient norm sees a scaled share even where Adam's update would not).
"""

import jax
import numpy as np
import pytest

from rljax.config import LearnerConfig
from rljax.learner.batch import TrainSequence, pack_batch
from rljax.learner.learner import GradLoan, Learner
from rljax.models.sharding import make_mesh
from rljax.testing.engines import tiny_engine


def _sequences(seed: int, n: int = 16) -> list[TrainSequence]:
    rng = np.random.default_rng(seed)
    seqs = []
    for _ in range(n):
        prompt, response = int(rng.integers(2, 6)), int(rng.integers(2, 8))
        tokens = rng.integers(1, 18, prompt + response).tolist()
        logprobs = (-rng.uniform(0.5, 3.0, response)).tolist()
        seqs.append(TrainSequence(tokens, prompt, logprobs, float(rng.normal()), [0] * response))
    return seqs


def _learner(tiny, **cfg) -> Learner:
    mesh = make_mesh(jax.devices()[6:8], {"fsdp": 2, "tensor": 1})
    config = LearnerConfig(group_size=4, batch_groups=4, micro_batches=4, **cfg)
    ref = tiny.state if config.beta > 0 else None
    return Learner(config, tiny.graphdef, tiny.state, mesh, ref_params=ref)


def _batches(learner: Learner):
    return [
        pack_batch(_sequences(s), row_len=16, micro_batches=4, row_multiple=learner.dp)
        for s in (1, 2)
    ]


def _assert_same_params(got, want, *, max_move: float) -> None:
    """Equal within rtol 1e-5, but for elements whose summed gradient is rounding noise.

    Adam divides by the gradient's running RMS, so where micro-batch gradients cancel to within
    rounding, the order of the sum (own micro-batches, then the lent ones) can flip the update's
    sign. Such elements are rare (<= 0.1 %) and can still move at most ``max_move``; a lost or
    doubled share moves most elements off.
    """
    got, want = (np.concatenate([np.ravel(x) for x in jax.tree.leaves(t)]) for t in (got, want))
    diff = np.abs(got - want)
    off = diff > 1e-6 + 1e-5 * np.abs(want)
    assert off.mean() <= 1e-3, f"{off.sum()} of {off.size} parameters differ"
    assert diff.max() <= max_move, f"a parameter moved {diff.max()} > {max_move}"


@pytest.mark.parametrize(
    "lent, cfg",
    [
        # Half the micro-batches on the sampler's chips is the run-level test
        # (tests/runtime/test_lending.py); here one with epochs, the proximal policy and a
        # reference model (CI time: all-lent, (4, grpo), passes too).
        (1, dict(loss="decoupled_ppo", ppo_epochs=2, beta=0.01)),  # epochs, proximal, reference
    ],
)
def test_lent_step_equals_unlent_step(lent, cfg):
    tiny = tiny_engine()
    plain, lending = _learner(tiny, **cfg), _learner(tiny, **cfg)
    loan = GradLoan(tuple(jax.devices()[:6]), lent)
    for batch in _batches(plain):
        want = plain.step(batch)
        got = lending.step(batch, loan=loan)
        for key in ("loss", "grad_norm"):
            np.testing.assert_allclose(got[key], want[key], rtol=1e-5, err_msg=key)
    assert lending.version == plain.version == 2
    lr = plain.cfg.learning_rate
    _assert_same_params(lending.params, plain.params, max_move=3 * lr * 2 * plain.cfg.ppo_epochs)
    # Compiled once for the lent devices (as many as divide a micro-batch's rows), and the
    # learner's state never left its mesh.
    rows = batch.arrays["tokens"].shape[1]
    n = max(d for d in range(1, 7) if rows % d == 0)
    lent = lending.lent_grads(jax.devices()[:n])
    assert lent is lending.lent_grads(jax.devices()[:n]) and lent.fn._cache_size() == 1
    learner_devices = set(jax.devices()[6:8])
    assert all(x.sharding.device_set == learner_devices for x in jax.tree.leaves(lending.params))


def test_loan_of_the_learners_own_devices_is_refused():
    tiny = tiny_engine()
    learner = _learner(tiny)
    batch = _batches(learner)[0]
    with pytest.raises(ValueError, match="learner's own devices"):
        learner.step(batch, loan=GradLoan(tuple(jax.devices()[5:7]), 1))
    with pytest.raises(ValueError, match="lend <= 4"):
        learner.step(batch, loan=GradLoan(tuple(jax.devices()[:2]), 5))
    with pytest.raises(ValueError, match="integer >= 1"):
        GradLoan(tuple(jax.devices()[:2]), 0)
    assert learner.version == 0
