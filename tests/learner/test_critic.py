"""The learner's roles beside the policy: gae's critic (trained, warmed up, checkpointed and
moved with the learner; with LoRA, adapters on the policy's base), opd's teacher and
reinforce_plus_plus's KL in the reward (scored at learn time)."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from rljax.checkpoint import Checkpointer
from rljax.config import CheckpointConfig, CriticConfig, LearnerConfig, LoRAConfig, ModelConfig
from rljax.learner.batch import TrainSequence, pack_batch
from rljax.learner.critic import Critic
from rljax.learner.learner import GradLoan, Learner
from rljax.mesh.resize import MeshCache, move_learner
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
GAE = LearnerConfig(advantage="gae", group_size=2, batch_groups=4, learning_rate=1e-3)
CRITIC = CriticConfig(enabled=True, learning_rate=3e-3)


def _mesh(first=0, n=2):
    return make_mesh(jax.devices()[first : first + n], {"fsdp": n, "tensor": 1})


def _batch(dp=2, seed=0):
    rng = np.random.default_rng(seed)
    seqs = [
        TrainSequence(rng.integers(1, 32, 12).tolist(), 4, [-3.0] * 8, reward=float(r))
        for r in (1.0, 0.0, 1.0, 1.0, 0.0, 0.0, 1.0, 0.0)
    ]
    return pack_batch(seqs, row_len=16, row_multiple=dp)


def _learner(mesh, cfg=GAE, critic=CRITIC, **kw):
    graphdef, params = init_sharded(CFG, mesh, LEARNER_RULES, 0)
    return Learner(cfg, graphdef, params, mesh, critic=critic, **kw)


def _leaves(tree):
    return [np.asarray(x) for x in jax.tree.leaves(jax.device_get(tree))]


def _equal(a, b):
    return all(np.array_equal(x, y) for x, y in zip(_leaves(a), _leaves(b), strict=True))


def test_the_critic_learns_the_returns_beside_the_policy():
    learner = _learner(_mesh())
    batch = _batch()
    policy0 = _leaves(learner.params)
    first = learner.step(batch)
    for _ in range(30):
        last = learner.step(batch)
    assert first["critic/values"] == 0.0  # the head starts at zero
    assert last["critic/value_loss"] < 0.1 * first["critic/value_loss"]
    assert last["critic/explained_var"] > 0.5
    assert not _equal(policy0, learner.params)  # the policy trained too
    assert np.isfinite(last["loss"]) and "advantages/abs" in last


def test_the_warm_up_trains_the_critic_alone():
    learner = _learner(_mesh(), critic=CriticConfig(enabled=True, warmup_steps=2))
    batch = _batch()
    policy0, critic0 = _leaves(learner.params), _leaves(learner.opt_state["critic"])
    for _ in range(2):
        learner.step(batch)
    assert _equal(policy0, learner.params)
    assert not _equal(critic0, learner.opt_state["critic"])
    learner.step(batch)
    assert not _equal(policy0, learner.params)
    assert learner.version == 3


def test_a_checkpoint_holds_the_critic_bitwise(tmp_path):
    mesh = _mesh()
    learner = _learner(mesh)
    learner.step(_batch())
    with Checkpointer(tmp_path / "ckpt", CheckpointConfig(enabled=True, async_save=False)) as c:
        c.write(1, params=learner.saved_params, opt_state=learner.opt_state, meta={"version": 1})
        target = Learner.abstract(GAE, learner.graphdef, learner.params, mesh, critic=CRITIC)
        params, opt_state, _ = c.restore(
            abstract_params=target.saved_params, abstract_opt_state=target.opt_state
        )
    assert _equal(opt_state, learner.opt_state) and _equal(params, learner.params)
    resumed = Learner(
        GAE, learner.graphdef, params, mesh, critic=CRITIC, opt_state=opt_state, version=1
    )
    batch = _batch(seed=1)
    assert learner.step(batch) == resumed.step(batch)  # the same step, to the bit
    assert _equal(learner.opt_state, resumed.opt_state)


def test_a_move_to_another_mesh_carries_the_critic():
    learner = _learner(_mesh())
    learner.step(_batch())
    critic = _leaves(learner.opt_state["critic"])
    moved = move_learner(learner, _mesh(4, 4), MeshCache())
    assert moved.critic is not None and _equal(critic, moved.opt_state["critic"])
    metrics = moved.step(_batch(dp=4))
    assert np.isfinite(metrics["critic/value_loss"])


def test_a_lora_critic_trains_its_own_adapters_on_the_policy_base():
    mesh = _mesh()
    _, base = init_sharded(CFG, mesh, LEARNER_RULES, 0)
    graphdef, params = with_adapters(
        CFG, base, LoRAConfig(enabled=True, rank=4, alpha=8.0), mesh, LEARNER_RULES, 0
    )
    learner = Learner(GAE, graphdef, params, mesh, critic=CRITIC)
    decoder = learner.opt_state["critic"]["trainable"]["decoder"]
    assert lora.has_adapters(decoder) and not lora.split_adapters(decoder)[1]  # no base copy
    before = _leaves(learner.opt_state["critic"]["trainable"])
    for _ in range(3):
        learner.step(_batch())
    assert not _equal(before, learner.opt_state["critic"]["trainable"])


def _scored(learner, batch):
    arrays = jax.device_put(batch.arrays, learner._batch_sharding)
    critic = None if learner.critic is None else learner.opt_state["critic"]
    out, metrics = learner._score_fn(
        learner.params, critic, learner.ref_params, learner.roles.teacher_params, arrays
    )
    return {k: np.asarray(v) for k, v in out.items()}, metrics


def test_opd_advantages_are_the_teacher_log_probs_less_the_students():
    mesh = _mesh()
    graphdef, params = init_sharded(CFG, mesh, LEARNER_RULES, 0)
    t_graphdef, t_params = init_sharded(CFG, mesh, LEARNER_RULES, 7)
    cfg = LearnerConfig(advantage="opd", group_size=2, batch_groups=4)
    learner = Learner(cfg, graphdef, params, mesh, teacher=(t_graphdef, t_params))
    teacher = Learner(cfg, t_graphdef, t_params, mesh, teacher=(t_graphdef, t_params))
    batch = _batch()
    out, metrics = _scored(learner, batch)
    mask = batch.arrays["mask"] > 0
    expected = teacher.token_logprobs(batch) - batch.arrays["old_logprobs"]
    np.testing.assert_allclose(out["advantages"][mask], expected[mask], rtol=1e-5, atol=1e-5)
    assert not out["advantages"][~mask].any()
    # the student's own log-probs as the behaviour's, the teacher the student: no signal
    same = Learner(cfg, graphdef, params, mesh, teacher=(graphdef, params))
    own = pack_batch(
        [TrainSequence(s, 4, list(lp)) for s, lp in _student_samples(same, batch)],
        row_len=16,
        row_multiple=2,
    )
    out, metrics = _scored(same, own)
    assert abs(float(metrics["opd/reverse_kl"])) < 1e-5


def _student_samples(learner, batch):
    """Each packed sequence's tokens and the learner's own log-probs of its response."""
    logp = learner.token_logprobs(batch)
    a = batch.arrays
    out = []
    for mb, row in zip(*np.nonzero(a["segment_ids"].max(-1) > 0), strict=True):
        seg = a["segment_ids"][mb, row]
        for s in set(seg[seg > 0].tolist()):
            at = np.flatnonzero(seg == s)
            on = at[a["mask"][mb, row, at] > 0]
            out.append((a["tokens"][mb, row, at].tolist(), logp[mb, row, on]))
    return out


@pytest.mark.parametrize("kl_reward", [0.0, 0.5])
def test_reinforce_pp_puts_the_kl_to_the_reference_in_the_reward(kl_reward):
    mesh = _mesh()
    graphdef, params = init_sharded(CFG, mesh, LEARNER_RULES, 0)
    _, ref = init_sharded(CFG, mesh, LEARNER_RULES, 3)
    cfg = LearnerConfig(
        advantage="reinforce_plus_plus", kl_reward=kl_reward, group_size=2, batch_groups=4
    )
    learner = Learner(cfg, graphdef, params, mesh, ref_params=ref)
    assert (learner.ref_params is not None) == (kl_reward > 0)
    batch = _batch()
    out, metrics = _scored(learner, batch)
    a, mask = batch.arrays, batch.arrays["mask"] > 0
    rewards = a["rewards"].astype(np.float64)
    if kl_reward:
        ref_logp = Learner(cfg, graphdef, ref, mesh, ref_params=ref).token_logprobs(batch)
        rewards = rewards - kl_reward * (a["old_logprobs"] - ref_logp) * mask
        assert float(metrics["kl_reward/k1"]) != 0.0
    # gamma = 1: each token's return is the sum of the rewards from it to its sequence's end
    returns = np.zeros_like(rewards)
    for mb, row in np.ndindex(*a["mask"].shape[:2]):
        seg, running = a["segment_ids"][mb, row], 0.0
        for t in reversed(range(seg.shape[0])):
            if t + 1 == seg.shape[0] or seg[t + 1] != seg[t]:
                running = 0.0
            if mask[mb, row, t]:
                running += rewards[mb, row, t]
                returns[mb, row, t] = running
    on = returns[mask]
    expected = (on - on.mean()) / np.sqrt(on.var(ddof=1) + 1e-8)
    np.testing.assert_allclose(out["advantages"][mask], expected, rtol=1e-4, atol=1e-5)


def test_a_lent_step_trains_the_critic_on_the_learner():
    """Lending a step's micro-batches to other chips (the policy's gradients) leaves the critic's
    update to the learner's own: the same critic as an unlent step's, within float tolerance."""
    cfg = LearnerConfig(
        advantage="gae", group_size=2, batch_groups=4, micro_batches=2, learning_rate=1e-3
    )
    mesh = make_mesh(jax.devices()[6:8], {"fsdp": 2, "tensor": 1})
    lent, plain = _learner(mesh, cfg), _learner(mesh, cfg)
    batch = pack_batch(
        [
            TrainSequence(
                np.random.default_rng(i).integers(1, 32, 12).tolist(),
                4,
                [-3.0] * 8,
                reward=float(i % 2),
            )
            for i in range(8)
        ],
        row_len=16,
        micro_batches=2,
        row_multiple=2,
    )
    got = lent.step(batch, GradLoan(tuple(jax.devices()[:2]), 1))
    want = plain.step(batch)
    assert got["critic/value_loss"] == pytest.approx(want["critic/value_loss"], rel=1e-5)
    for a, b in zip(
        _leaves(lent.opt_state["critic"]), _leaves(plain.opt_state["critic"]), strict=True
    ):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)


class _GivenValues(Critic):
    """A critic whose values are its trainable array: the clipped value loss, its gradient and
    its metrics without a decoder in the way (``micro_loss`` and ``update`` are the real ones)."""

    def values(self, trainable, policy_params, mb):
        del policy_params, mb
        return trainable["values"]


# PPO's clipped value loss with c = 0.5 on two rows, each token chosen for one branch.
# Columns: V (the critic's value now), V_old (the batch was scored with), R (the return).
_VALUE_CASES = [
    # row 0
    (1.3, 1.0, 0.2),  # inside the band: both terms equal, the plain squared error
    (1.0, 0.0, 2.0),  # above the band, R above V: the clipped value 0.5 is further, it wins
    (1.0, 0.0, 0.0),  # above the band, R below: the unclipped error is larger
    (1.0, 2.0, 0.0),  # below the band, R below V: the clipped value 1.5 is further, it wins
    (5.0, 0.0, 9.0),  # padding (mask 0): it would be clipped, and must count nowhere
    # row 1
    (-2.0, -1.0, -1.0),  # below the band, R above: the unclipped error is larger
    (0.5, 0.5, -0.5),  # V = V_old
    (0.7, 0.0, 0.65),  # above the band, R between V_old + c and V: the clipped value loses less
    (3.0, 0.0, 0.0),  # padding
    (-4.0, 0.0, 1.0),  # padding
]
_VALUE_MASK = [1, 1, 1, 1, 0, 1, 1, 1, 0, 0]
_VALUE_WEIGHTS = [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0]


def _value_batch():
    v, old, ret = (np.asarray(col, np.float32).reshape(2, 5) for col in zip(*_VALUE_CASES))
    mb = {
        "values": old,
        "returns": ret,
        "mask": np.asarray(_VALUE_MASK, np.float32).reshape(2, 5),
        "weights": np.asarray(_VALUE_WEIGHTS, np.float32).reshape(2, 5),
    }
    return v, mb


def _value_loss_by_hand(v, old, ret, c):
    """PPO (Schulman et al. 2017; baselines ppo2) per token: 1/2 max((V - R)^2,
    (V_old + clip(V - V_old, -c, c) - R)^2), whether the clipped term is the larger, and
    d/dV, which is 0 where the clipped term wins (V_old +- c does not move with V)."""
    v, old, ret = (np.asarray(a, np.float64) for a in (v, old, ret))
    v_clip = np.minimum(np.maximum(v, old - c), old + c)
    plain, clipped = (v - ret) ** 2, (v_clip - ret) ** 2
    clip_wins = clipped > plain
    return 0.5 * np.maximum(plain, clipped), clip_wins, np.where(clip_wins, 0.0, v - ret)


def test_the_clipped_value_loss_and_its_gradient_by_hand():
    critic = _GivenValues(CriticConfig(enabled=True, value_clip=0.5), None, None, 0)
    v, mb = _value_batch()
    per_token, clip_wins, dloss_dv = _value_loss_by_hand(v, mb["values"], mb["returns"], 0.5)
    mask, weights = mb["mask"], mb["weights"]
    # the cases hit every branch: both sides of the band, each term winning, and padding
    assert clip_wins[mask > 0].tolist() == [False, True, False, True, False, False, True]
    assert np.abs(v - mb["values"])[clip_wins].min() > 0.5
    (loss, sums), grads = jax.value_and_grad(critic.micro_loss, has_aux=True)(
        {"values": v}, None, mb
    )
    assert float(loss) == pytest.approx(np.sum(per_token * weights * mask), rel=1e-6)
    assert float(sums["critic/value_loss"]) == pytest.approx(np.sum(per_token * mask), rel=1e-6)
    assert float(sums["critic/clip_frac"]) == 3.0
    np.testing.assert_allclose(grads["values"], dloss_dv * weights * mask, rtol=1e-6, atol=1e-7)


def test_no_value_inside_the_band_counts_as_clipped():
    """clip_frac counts the tokens whose clipped term wins; inside the band the clipped value is
    V itself, so none of 20,000 random in-band tokens may count. Written V_old + clip(V - V_old),
    float32 rounding left it an ulp from V and counted about 1 % of them (e.g. V = -0.030041875,
    V_old = 0.36159506, R = -1.2891856 at c = 0.5)."""
    critic = _GivenValues(CriticConfig(enabled=True, value_clip=0.5), None, None, 0)
    rng = np.random.default_rng(0)
    old = rng.normal(0.0, 1.0, (100, 200)).astype(np.float32)
    v = (old + rng.uniform(-0.49, 0.49, old.shape)).astype(np.float32)
    ret = rng.normal(0.0, 2.0, old.shape).astype(np.float32)
    v[0, 0], old[0, 0], ret[0, 0] = -0.030041875, 0.36159506, -1.2891856
    ones = np.ones(old.shape, np.float32)
    mb = {"values": old, "returns": ret, "mask": ones, "weights": ones}
    _, sums = critic.micro_loss({"values": v}, None, mb)
    assert float(sums["critic/clip_frac"]) == 0.0


def test_the_critic_update_logs_value_loss_and_clip_frac_per_trained_token():
    """``update`` divides the metric sums by the trained tokens (7 of 10): clip_frac is the
    share of trained tokens whose clipped term won; a padded token never counts."""
    tx = optax.sgd(1.0)
    critic = _GivenValues(CriticConfig(enabled=True, value_clip=0.5), None, tx, 0)
    v, mb = _value_batch()
    state = {"trainable": {"values": jnp.asarray(v)}, "opt": tx.init({"values": v})}
    batch = {k: x[None] for k, x in mb.items()}  # one micro-batch
    new, metrics = critic.update(state, None, batch)
    per_token, _, dloss_dv = _value_loss_by_hand(v, mb["values"], mb["returns"], 0.5)
    on = mb["mask"] > 0
    assert float(metrics["critic/clip_frac"]) == pytest.approx(3 / 7)
    assert float(metrics["critic/value_loss"]) == pytest.approx(per_token[on].mean(), rel=1e-6)
    assert float(metrics["critic/values"]) == pytest.approx(v[on].mean(), rel=1e-6)
    # plain SGD at rate 1: V moves by minus the weighted gradient, not at all where clipped
    step = dloss_dv * mb["weights"] * mb["mask"]
    np.testing.assert_allclose(new["trainable"]["values"], v - step, rtol=1e-6, atol=1e-7)
