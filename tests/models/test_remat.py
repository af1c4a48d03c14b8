"""Activation rematerialisation changes memory, never numbers: loss and grads match 'none'."""

import functools

import jax
import jax.extend
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from rljax.configs import arith_moe

from rljax.config import REMAT, ConfigError, LearnerConfig
from rljax.learner.batch import TrainSequence, pack_batch
from rljax.learner.learner import Learner
from rljax.models.call_paths import REMAT_POLICIES
from rljax.models.sharding import LEARNER_RULES, make_mesh
from rljax.models.transformer import Decoder, init_sharded
from rljax.testing.configs import TINY_MODEL


def test_every_config_choice_has_a_policy():
    assert set(REMAT) == {"none", *REMAT_POLICIES}


# A tiny mixture of experts (configs/arith_moe.py's): its blocks take the MoE call through the
# checkpoint too.
MODELS = {"dense": TINY_MODEL, "moe": arith_moe.MODEL}


def _checkpoint_policies(jaxpr) -> list:
    """The policy of every ``jax.checkpoint`` in ``jaxpr``, searching nested jaxprs (the layer
    scan's body)."""
    found = []
    for eqn in jaxpr.eqns:
        if eqn.primitive.name in ("checkpoint", "remat2"):
            found.append(eqn.params["policy"])
        for sub in jax.extend.core.jaxprs_in_params(eqn.params):
            found.extend(_checkpoint_policies(sub))
    return found


@functools.cache
def _loss_and_grads(remat: str, model_name: str = "dense"):
    model = Decoder(MODELS[model_name], rngs=nnx.Rngs(0))
    graphdef, params = nnx.split(model)
    rng = np.random.default_rng(0)
    vocab = MODELS[model_name].vocab_size
    tokens = jnp.asarray(rng.integers(1, vocab, size=(2, 12)), jnp.int32)
    positions = jnp.asarray(np.tile(np.r_[np.arange(7), np.arange(5)], (2, 1)), jnp.int32)
    segments = jnp.asarray(np.tile(np.r_[np.ones(7), 2 * np.ones(5)], (2, 1)), jnp.int32)

    def loss(p):
        hidden = nnx.merge(graphdef, p)(tokens, positions, segments, impl="xla", remat=remat)
        logits = nnx.merge(graphdef, p).logits(hidden)
        return jnp.mean(jax.nn.logsumexp(logits, -1) - logits[..., 3])

    policies = _checkpoint_policies(jax.make_jaxpr(loss)(params).jaxpr)
    return (*jax.jit(jax.value_and_grad(loss))(params), policies)


@pytest.mark.parametrize("model_name", sorted(MODELS))
@pytest.mark.parametrize("remat", sorted(REMAT_POLICIES))
def test_decoder_loss_and_grads_match_without_remat(remat, model_name):
    want_loss, want_grads, none = _loss_and_grads("none", model_name)
    got_loss, got_grads, policies = _loss_and_grads(remat, model_name)
    # The blocks really ran under jax.checkpoint with this policy: else the match is vacuous.
    assert not none and policies and set(policies) == {REMAT_POLICIES[remat]}, policies
    np.testing.assert_allclose(got_loss, want_loss, rtol=1e-6)
    flat_want = jax.tree.leaves(want_grads)
    flat_got = jax.tree.leaves(got_grads)
    assert len(flat_got) == len(flat_want) > 10
    for g, w in zip(flat_got, flat_want, strict=True):
        assert np.abs(w).max() > 0  # every weight gets a gradient: the test is not vacuous
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-7)


def test_learner_step_with_full_remat_matches_none():
    """Same metrics and the same updated params after two sharded, micro-batched steps."""
    mesh = make_mesh(jax.devices()[:4], {"fsdp": 2, "tensor": 2})
    graphdef, params = init_sharded(TINY_MODEL, mesh, LEARNER_RULES, seed=0)
    seqs = [
        TrainSequence([1, 3, 5, 7, 9, 11], 2, [-1.0, -2.0, -0.5, -1.5], advantage=1.0),
        TrainSequence([1, 4, 8, 12], 1, [-0.3, -2.2, -1.1], advantage=-1.0),
    ] * 2
    out = {}
    for remat in ("none", "full"):
        cfg = LearnerConfig(
            group_size=2, batch_groups=2, micro_batches=2, learning_rate=1e-2, remat=remat
        )
        # Cross-entropy: never clipped, so both steps have gradients whatever the init.
        learner = Learner(cfg, graphdef, params, mesh, loss="sft")
        batch = pack_batch(seqs, row_len=8, micro_batches=2, row_multiple=learner.dp)
        # The learner's forward (the step's too) passes its remat to the model.
        jaxpr = jax.make_jaxpr(learner.gradients.batch_logprobs)(learner.params, batch.arrays)
        policies = _checkpoint_policies(jaxpr.jaxpr)
        assert (policies == []) if remat == "none" else (set(policies) == {REMAT_POLICIES[remat]})
        metrics = [learner.step(batch) for _ in range(2)]
        out[remat] = metrics, jax.device_get(learner.params)
    (m_none, p_none), (m_full, p_full) = out["none"], out["full"]
    for a, b in zip(m_none, m_full, strict=True):
        assert a.keys() == b.keys()
        for key in a:
            np.testing.assert_allclose(b[key], a[key], rtol=1e-5, atol=1e-7, err_msg=key)
    assert m_none[1]["grad_norm"] > 0
    # Adam turns float-rounding differences of near-zero grads into differences of up to
    # lr * 1e-3 (g / sqrt(v) ~ sign(g)): compare the params to a small fraction of one step.
    for g, w in zip(jax.tree.leaves(p_full), jax.tree.leaves(p_none), strict=True):
        np.testing.assert_allclose(g, w, rtol=0, atol=1e-2 * cfg.learning_rate)


def test_bad_remat_is_a_one_line_config_error():
    with pytest.raises(ConfigError, match="learner.remat.*'everything'.*dots_saveable") as exc:
        LearnerConfig(remat="everything")
    assert "\n" not in str(exc.value)
