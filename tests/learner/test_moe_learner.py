"""The learner on a mixture-of-experts model: with routing replay every forward that computes
log-probs (current, reference, the loss's) uses the batch's recorded experts, without it none
does; the router losses join the loss; the routing metrics are logged.

The recorded routes are chosen to differ from the model's own at every (token, layer): each of
the learner's own experts shifted by one, so forcing them changes the log-probs."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from rljax.config import LearnerConfig, ModelConfig, MoEConfig
from rljax.learner.batch import TrainSequence, pack_batch
from rljax.learner.learner import Learner
from rljax.learner.routing import (
    disagreement,
    forced_routes,
    replay_effect_metrics,
    replay_effect_sums,
    router_training,
)
from rljax.models.sharding import LEARNER_RULES, make_mesh
from rljax.models.transformer import init_sharded

# 3 layers, the first dense: MoE layers 1 and 2, k = 2 of 8 experts.
MOE = ModelConfig(
    family="qwen3_moe",
    vocab_size=32,
    hidden_size=32,
    intermediate_size=64,
    num_layers=3,
    num_heads=2,
    num_kv_heads=1,
    head_dim=16,
    num_experts=8,
    num_experts_per_tok=2,
    moe_intermediate_size=16,
    mlp_only_layers=(0,),
    router_aux_loss_coef=0.5,
    router_z_loss_coef=0.1,
)
K, W = 2, 4
CFG = LearnerConfig(group_size=2, batch_groups=2, micro_batches=2, beta=0.1, loss="grpo")


def _direct_logprobs(graphdef, state, arrays, routes):
    """Log-probs of every target by a plain forward per micro-batch, forcing ``routes``."""
    model = nnx.merge(graphdef, state)
    out = []
    for m in range(arrays["tokens"].shape[0]):
        kw = {} if routes is None else {"routes": forced_routes(jnp.asarray(routes[m]), K)}
        hidden = model(arrays["tokens"][m], arrays["positions"][m], arrays["segment_ids"][m], **kw)
        logp = jax.nn.log_softmax(model.logits(hidden).astype(jnp.float32), -1)
        out.append(jnp.take_along_axis(logp, arrays["targets"][m][..., None], -1)[..., 0])
    return np.asarray(jnp.stack(out))


@pytest.fixture(scope="module")
def setup():
    """The model, and a batch whose recorded routes differ from the model's own everywhere
    they are recorded, with old log-probs those of the forced forward."""
    mesh = make_mesh(jax.devices()[:1], {"fsdp": 1, "tensor": 1})
    graphdef, state = init_sharded(MOE, mesh, LEARNER_RULES, 0)
    rng = np.random.default_rng(0)
    seqs = []
    for i, (p, n) in enumerate([(3, 6), (2, 5), (4, 4), (1, 7)]):
        tokens = rng.integers(1, 32, p + n).tolist()
        routes = [[0] * W] * (n - 1) + [[]]  # placeholders: the last token was never fed
        seqs.append(TrainSequence(tokens, p, [-1.0] * n, (-1.0) ** i, [0] * n, routes=routes))
    batch = pack_batch(seqs, row_len=16, micro_batches=2)
    a = batch.arrays
    model = nnx.merge(graphdef, state)
    own = np.stack(
        [
            np.asarray(
                model(a["tokens"][m], a["positions"][m], a["segment_ids"][m], moe_stats=True)[
                    1
                ].routes
            ).reshape(*a["tokens"].shape[1:], W)
            for m in range(2)
        ]
    )
    forced = a["routes"][..., :1] >= 0
    a["routes"] = np.where(forced, (own + 1) % MOE.num_experts, -1).astype(np.int32)
    forced_logp = _direct_logprobs(graphdef, state, a, a["routes"])
    mask = a["mask"] > 0
    a["old_logprobs"] = np.where(mask, forced_logp, 0.0).astype(np.float32)
    free_logp = _direct_logprobs(graphdef, state, a, None)
    assert np.abs(forced_logp - free_logp)[mask].max() > 1e-2, "forcing must change log-probs"
    return mesh, graphdef, state, batch, forced_logp, free_logp


def _learner(setup, replay: str, every: int = 2) -> Learner:
    mesh, graphdef, state, *_ = setup
    router = router_training(MOE, MoEConfig(router_replay=replay, disagreement_every=every))
    return Learner(CFG, graphdef, state, mesh, ref_params=state, router=router)


def test_replay_forces_the_recorded_experts_in_every_log_prob_forward(setup):
    *_, batch, forced_logp, free_logp = setup
    mask = batch.arrays["mask"] > 0
    learner = _learner(setup, "rollout")
    np.testing.assert_allclose(learner.token_logprobs(batch)[mask], forced_logp[mask], atol=1e-4)
    first = learner.step(batch)
    # the loss's forward: the old log-probs are the forced forward's
    assert first["mismatch/abs_logp"] < 1e-4
    # the reference's forward: forced like the current one, so no KL
    assert abs(first["kl"]) < 1e-5
    # version 0: the extra unforced forward finds every recorded set differs
    assert first["moe/router_disagreement"] == pytest.approx(1.0)
    # and, on the same batch and params, the mismatch with and without the forced routes: every
    # recorded token flipped (a prompt's last position is trained but carries no routes)
    gap = np.abs(free_logp - forced_logp)
    flipped = mask & (batch.arrays["routes"][..., 0] >= 0)
    assert first["moe/flipped_tokens"] == flipped.sum() < mask.sum()
    for key in ("moe/abs_logp_forced", "moe/abs_logp_forced/flipped"):
        assert first[key] < 1e-4
    assert first["moe/abs_logp_unforced"] == pytest.approx(gap[mask].mean(), rel=1e-3)
    assert first["moe/abs_logp_unforced/flipped"] == pytest.approx(gap[flipped].mean(), rel=1e-3)
    assert "moe/router_disagreement" not in learner.step(batch)  # every 2 steps


def test_without_replay_nothing_is_forced_and_disagreement_is_measured(setup):
    *_, batch, forced_logp, free_logp = setup
    mask = batch.arrays["mask"] > 0
    learner = _learner(setup, "off")
    np.testing.assert_allclose(learner.token_logprobs(batch)[mask], free_logp[mask], atol=1e-4)
    metrics = learner.step(batch)
    assert metrics["mismatch/abs_logp"] > 1e-3
    assert metrics["moe/router_disagreement"] == pytest.approx(1.0)
    assert metrics["moe/load_max_over_mean"] >= 1.0
    layers = {k for k in metrics if k.startswith("moe/load_max_over_mean/")}
    assert layers == {"moe/load_max_over_mean/layer_1", "moe/load_max_over_mean/layer_2"}
    assert metrics["moe/aux_loss"] > 0 and metrics["moe/z_loss"] > 0


def test_the_router_losses_join_the_loss(setup):
    mesh, graphdef, state, batch, *_ = setup
    learner = _learner(setup, "rollout")
    grads = learner.gradients
    mb = {k: jnp.asarray(v[0]) for k, v in batch.arrays.items()}
    plain = dataclasses.replace(
        grads, router=dataclasses.replace(grads.router, aux_loss_coef=0.0, z_loss_coef=0.0)
    )
    loss, sums = grads.micro_loss(state, state, mb, jnp.int32(0))
    loss0, _ = plain.micro_loss(state, state, mb, jnp.int32(0))
    extra = (0.5 * sums["moe/aux_loss"] + 0.1 * sums["moe/z_loss"]) / CFG.micro_batches
    assert float(extra) > 0
    np.testing.assert_allclose(float(loss - loss0), float(extra), rtol=1e-4)


def test_a_dense_model_has_no_router_training():
    assert router_training(ModelConfig(), MoEConfig()) is None


def test_disagreement_compares_expert_sets_where_recorded():
    used = jnp.asarray([[[[1, 2], [3, 4]], [[5, 6], [7, 0]], [[1, 2], [3, 4]]]])  # [1, 3, 2, 2]
    recorded = jnp.asarray([[[2, 1, 3, 5], [5, 6, 0, 7], [-1, -1, -1, -1]]])  # [1, 3, 4]
    differ, pairs = disagreement(used, recorded)
    assert (float(differ), float(pairs)) == (1.0, 4.0)  # one of 4 (token, layer) pairs


def test_replay_effect_compares_forced_and_free_mismatch_on_the_flipped_tokens():
    used = jnp.asarray([[[[1, 2], [3, 4]], [[5, 6], [7, 0]], [[1, 2], [3, 4]]]])  # [1, 3, 2, 2]
    mb = {
        "routes": jnp.asarray([[[2, 1, 3, 5], [5, 6, 0, 7], [-1, -1, -1, -1]]]),  # [1, 3, 4]
        "mask": jnp.asarray([[1.0, 1.0, 1.0]]),
        "old_logprobs": jnp.asarray([[-1.0, -2.0, -3.0]]),
    }
    forced = jnp.asarray([[-1.0, -2.5, -3.0]])
    free = jnp.asarray([[-1.5, -2.0, -2.0]])
    sums = replay_effect_sums(forced, free, used, mb)
    m = {k: float(v) for k, v in replay_effect_metrics(sums).items()}
    # token 0 flipped (layer 1 differs); token 1 agrees; token 2 has no routes
    assert (m["moe/router_disagreement"], m["moe/flipped_tokens"]) == (0.25, 1.0)
    assert m["moe/abs_logp_forced"] == pytest.approx(0.5 / 3)
    assert m["moe/abs_logp_unforced"] == pytest.approx(1.5 / 3)
    assert (m["moe/abs_logp_forced/flipped"], m["moe/abs_logp_unforced/flipped"]) == (0.0, 0.5)


def test_the_memory_plan_lowers_a_batch_with_routes(setup):
    mesh, graphdef, state, *_ = setup
    abstract = nnx.eval_shape(lambda: state)
    router = router_training(MOE, MoEConfig(router_replay="rollout"))
    learner = Learner.abstract(CFG, graphdef, abstract, mesh, router=router)
    lowered = learner.lower_step(learner.batch_shape(4, 16))
    batch = lowered.args_info[0][3]
    assert batch["routes"].shape == (*batch["tokens"].shape, W)
