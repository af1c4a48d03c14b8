"""LoRA on the learner: the base is the model at step 0, only the adapters train, and the KL
reference is the base with the adapters off."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from rljax.config import LearnerConfig, LoRAConfig, ModelConfig
from rljax.learner import losses
from rljax.learner.batch import TrainSequence, pack_batch
from rljax.learner.learner import Learner
from rljax.models import lora
from rljax.models.sharding import LEARNER_RULES, make_mesh
from rljax.models.transformer import init_sharded, with_adapters

CFG = ModelConfig(
    vocab_size=32,
    hidden_size=64,
    intermediate_size=96,
    num_heads=4,
    num_kv_heads=2,
    head_dim=16,
    num_layers=2,
)
LORA = LoRAConfig(enabled=True, rank=4, alpha=8.0)


def _model(mesh, lora_cfg=LORA, seed=0):
    graphdef, base = init_sharded(CFG, mesh, LEARNER_RULES, seed)
    lgraphdef, params = with_adapters(CFG, base, lora_cfg, mesh, LEARNER_RULES, seed)
    return graphdef, base, lgraphdef, params


def _batch(dp=1):
    rng = np.random.default_rng(0)
    seqs = [
        TrainSequence(rng.integers(1, 32, 12).tolist(), 4, [-1.0] * 8, adv)
        for adv in (1.0, -1.0, 0.5, -0.5)
    ]
    return pack_batch(seqs, row_len=16, row_multiple=dp)


def _logits(graphdef, params, tokens):
    model = nnx.merge(graphdef, params)
    t = tokens.shape[1]
    hidden = model(tokens, jnp.arange(t)[None], jnp.ones((1, t), jnp.int32))
    return model.logits(hidden)


def test_step_zero_logits_equal_the_base():
    mesh = make_mesh(jax.devices()[:1], {"fsdp": 1, "tensor": 1})
    graphdef, base, lgraphdef, params = _model(mesh)
    tokens = jnp.array([[3, 7, 1, 9, 4, 2]])
    np.testing.assert_array_equal(
        _logits(graphdef, base, tokens), _logits(lgraphdef, params, tokens)
    )


@pytest.mark.parametrize("beta", [0.0, 0.1])
def test_a_step_trains_the_adapters_only(beta):
    mesh = make_mesh(jax.devices()[:2], {"fsdp": 2, "tensor": 1})
    _, base, lgraphdef, params = _model(mesh)
    before = {k: np.asarray(v) for k, v in jax.tree_util.tree_leaves_with_path(params)}
    learner = Learner(
        LearnerConfig(group_size=2, batch_groups=2, learning_rate=1e-2, beta=beta),
        lgraphdef,
        params,
        mesh,
        ref_params=params,
    )
    assert learner.lora and learner.ref_params is None
    # The optimiser holds state for the adapters alone.
    adapters, _ = lora.split_adapters(learner.params)
    n_adapter = sum(x.size for x in jax.tree.leaves(adapters))
    moments = [x for x in jax.tree.leaves(learner.opt_state) if x.ndim]
    assert sum(x.size for x in moments) == 2 * n_adapter
    # Each moment lives where its adapter does (FSDP-sharded, not replicated).
    by_shape = {x.shape: x.sharding for x in jax.tree.leaves(adapters)}
    assert all(m.sharding.is_equivalent_to(by_shape[m.shape], m.ndim) for m in moments)
    assert any(not m.sharding.is_fully_replicated for m in moments)
    metrics = learner.step(_batch(learner.dp))
    assert np.isfinite(metrics["loss"]) and metrics["grad_norm"] > 0
    after = {k: np.asarray(v) for k, v in jax.tree_util.tree_leaves_with_path(learner.params)}
    changed = {jax.tree_util.keystr(k) for k in before if not np.array_equal(before[k], after[k])}
    # Base bytes unchanged, every adapter A and B moved (B from zero).
    assert changed and all("_lora_" in k for k in changed), sorted(changed)
    assert {k for k in changed if "_lora_b" in k} == {
        jax.tree_util.keystr(k) for k in before if "_lora_b" in jax.tree_util.keystr(k)
    }
    if beta:
        assert "kl" in metrics or any("kl" in k for k in metrics)


def test_kl_reference_is_the_base():
    # With the adapters perturbed, the reference log-probs are the base model's.
    mesh = make_mesh(jax.devices()[:1], {"fsdp": 1, "tensor": 1})
    graphdef, base, lgraphdef, params = _model(mesh)
    model = nnx.merge(lgraphdef, params)
    model.wq_lora_b[...] = 0.5 * jnp.ones_like(model.wq_lora_b[...])
    params = nnx.state(model)
    cfg = LearnerConfig(group_size=2, batch_groups=2, beta=0.1)
    learner = Learner(cfg, lgraphdef, params, mesh)
    plain = Learner(cfg, graphdef, base, mesh)
    batch = _batch()
    mb = jax.tree.map(lambda x: jnp.asarray(x[0]), batch.arrays)
    ref = learner.gradients.token_stats(learner.params, mb, adapters=False)[0]
    np.testing.assert_allclose(ref, plain.gradients.token_stats(plain.params, mb)[0], atol=1e-6)
    adapted = learner.gradients.token_stats(learner.params, mb)[0]
    assert not np.allclose(adapted, ref, atol=1e-4)
    # The step's KL term reads that reference: k3 of the adapted policy against the base.
    mask = mb["mask"] > 0
    kl = np.asarray(losses.kl_k3(adapted, ref))[mask].mean()
    assert kl > 1e-4
    np.testing.assert_allclose(learner.step(batch)["kl"], kl, rtol=1e-4)


def test_dropout_draws_masks_per_step_and_none_at_evaluation():
    mesh = make_mesh(jax.devices()[:1], {"fsdp": 1, "tensor": 1})
    drop = LoRAConfig(enabled=True, rank=4, alpha=8.0, dropout=0.5)
    _, _, lgraphdef, params = _model(mesh, drop)
    model = nnx.merge(lgraphdef, params)
    model.wq_lora_b[...] = jnp.ones_like(model.wq_lora_b[...])  # so the adapters matter
    params = nnx.state(model)
    learner = Learner(LearnerConfig(group_size=2, batch_groups=2), lgraphdef, params, mesh)
    mb = jax.tree.map(lambda x: jnp.asarray(x[0]), _batch().arrays)
    plain = learner.gradients.token_stats(learner.params, mb)[0]
    k1, k2 = jax.random.key(1), jax.random.key(2)
    a = learner.gradients.token_stats(learner.params, mb, dropout_key=k1)[0]
    b = learner.gradients.token_stats(learner.params, mb, dropout_key=k2)[0]
    again = learner.gradients.token_stats(learner.params, mb, dropout_key=k1)[0]
    np.testing.assert_array_equal(a, again)  # a key's masks are fixed: resumable
    assert not np.allclose(a, b) and not np.allclose(a, plain)
    # No dropout without a key (sampling, evaluation, the proximal and reference passes).
    np.testing.assert_array_equal(plain, learner.gradients.token_stats(learner.params, mb)[0])
    metrics = learner.step(_batch())
    assert np.isfinite(metrics["loss"])


@pytest.mark.parametrize("loss", ["grpo", "dapo", "dr_grpo", "gspo", "decoupled_ppo", "sft"])
def test_every_loss_trains_the_adapters(loss):
    mesh = make_mesh(jax.devices()[:1], {"fsdp": 1, "tensor": 1})
    _, _, lgraphdef, params = _model(mesh)
    cfg = LearnerConfig(group_size=2, batch_groups=2, learning_rate=1e-2, ppo_epochs=2)
    learner = Learner(cfg, lgraphdef, params, mesh, loss=loss)
    before = lora.split_adapters(learner.params)
    before = (
        [np.asarray(x) for x in jax.tree.leaves(before[0])],
        [np.asarray(x) for x in jax.tree.leaves(before[1])],
    )
    metrics = learner.step(_batch())
    assert np.isfinite(metrics["loss"])
    adapters, base = lora.split_adapters(learner.params)
    assert any(not np.array_equal(a, b) for a, b in zip(before[0], jax.tree.leaves(adapters)))
    assert all(np.array_equal(a, b) for a, b in zip(before[1], jax.tree.leaves(base)))


def test_adapted_swiglu_equals_autodiff():
    # The hand-written backward of the adapted MLP: same values and gradients as autodiff of
    # the plain formula, and no gradient for the frozen weights.
    keys = iter(jax.random.split(jax.random.key(0), 16))
    d, f, r, scale = 24, 40, 3, 1.7

    def rand(*shape):
        return jax.random.normal(next(keys), shape)

    x, wg, wu, wd = rand(2, 5, d), rand(d, f) / 5, rand(d, f) / 5, rand(f, d) / 6
    ab = tuple(
        x / 4 for x in (rand(d, r), rand(r, f), rand(d, r), rand(r, f), rand(f, r), rand(r, d))
    )

    def plain(x, ab):
        ag, bg, au, bu, ad, bd = ab
        gate = x @ wg + scale * (x @ ag) @ bg
        up = x @ wu + scale * (x @ au) @ bu
        h = jax.nn.silu(gate) * up
        return h @ wd + scale * (h @ ad) @ bd

    def fast(x, ab):
        return lora.swiglu_adapted(scale, x, wg, wu, wd, ab)

    np.testing.assert_allclose(fast(x, ab), plain(x, ab), rtol=1e-4, atol=1e-5)
    weights = rand(2, 5, d)
    loss = lambda fn: lambda x, ab: jnp.sum(jnp.tanh(fn(x, ab)) * weights)  # noqa: E731
    got = jax.grad(loss(fast), argnums=(0, 1))(x, ab)
    want = jax.grad(loss(plain), argnums=(0, 1))(x, ab)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
