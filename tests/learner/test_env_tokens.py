"""Conversations in the learner: the ids it trains on are the engine's model tokens and the
env's ids, every turn; env tokens carry no loss and no gradient whatever their recorded
behaviour log-probs, for every registered loss; the aggregations count model tokens only."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rljax.config import LearnerConfig
from rljax.engine.sampler import Request, Sampler
from rljax.learner.batch import TrainSequence, pack_batch
from rljax.learner.learner import Learner
from rljax.learner.losses import LOSSES
from rljax.models.sharding import make_mesh
from rljax.runtime.rollout import train_sequence
from rljax.testing.engines import tiny_engine
from rljax.testing.turns import scripted

PROMPT = [3, 1, 4, 1, 5]
SCRIPT = [[7, 8, 9], [10, 11], [12, 13, 14]]
STOP = [0, 12]  # the tiny model (seed 0) emits them every few tokens: turns end
BUDGET = 30


@pytest.fixture(scope="module")
def conversations():
    """Two groups of two sampled conversations, their envs' scripts and the engine."""
    tiny = tiny_engine(temperature=1.0, max_new_tokens=BUDGET, max_prefill_length=8)
    made = {}
    requests = []
    for seed in (1, 2):
        factory, made[seed] = scripted(SCRIPT)
        requests.append(
            Request(PROMPT, num_samples=2, max_new_tokens=BUDGET, seed=seed, turns=factory)
        )
    sampler = Sampler(tiny.engine, tiny.params, stop_ids=STOP)
    trajs = sorted(sampler.run(requests), key=lambda t: (t.group_id, t.sample_index))
    assert all(0 in t.loss_mask for t in trajs), "every conversation must have an env turn"
    seeds = dict(zip((r.request_id for r in requests), (1, 2), strict=True))
    envs = {(t.group_id, t.sample_index): made[seeds[t.group_id]][t.sample_index] for t in trajs}
    return tiny, trajs, envs


def _rows(batch, i_seq):
    """Sequence ``i_seq``'s (tokens, mask of the tokens predicted) read back from the batch."""
    a = {k: v.reshape(-1, v.shape[-1]) for k, v in batch.arrays.items()}
    found = []
    for row in range(a["tokens"].shape[0]):
        for seg in np.unique(a["segment_ids"][row]):
            if seg:
                where = a["segment_ids"][row] == seg
                found.append((a["tokens"][row][where], a["mask"][row][where]))
    return found[i_seq] if len(found) > i_seq else None


def test_learner_trains_on_the_engine_s_tokens_and_the_env_s_ids(conversations):
    """Each packed sequence is prompt + every turn's model tokens (as the engine decoded and
    the env saw them) + the env's ids, in order; the mask trains exactly the model's."""
    _, trajs, turns = conversations
    seqs = [train_sequence(t, 1.0) for t in trajs]
    batch = pack_batch(seqs, row_len=64)
    by_tokens = {}
    for i in range(len(seqs)):
        tokens, mask = _rows(batch, i)
        by_tokens[tuple(tokens.tolist())] = mask
    for t in trajs:
        seen = turns[(t.group_id, t.sample_index)].turns_seen
        expected, model = list(PROMPT), []
        for k, m in enumerate(seen):
            model += range(len(expected), len(expected) + len(m))
            expected += m
            if k < len(SCRIPT) and len(expected) - len(PROMPT) < len(t.response_tokens):
                expected += SCRIPT[k]
        # The last model turn when the budget cut it before the env saw it.
        tail = t.response_tokens[len(expected) - len(PROMPT) :]
        model += range(len(expected), len(expected) + len(tail))
        expected += tail
        mask = by_tokens[tuple(expected)]
        # Position p's mask says whether token p + 1 is trained.
        assert {p + 1 for p in np.flatnonzero(mask)} == set(model)


def _loss_and_grads(learner, batch):
    arrays = {k: jnp.asarray(v) for k, v in batch.arrays.items()}
    accumulate = jax.jit(learner.gradients.accumulate)
    grads, loss, _ = accumulate(learner.params, None, arrays, jnp.int32(1))
    return float(loss), grads


@pytest.mark.parametrize("name", sorted(LOSSES))
def test_env_tokens_behaviour_logprobs_change_no_loss_or_gradient(conversations, name):
    """Perturbing env tokens' behaviour log-probs (and versions) leaves the loss and every
    gradient bit-identical; perturbing a model token's changes them (for sampled losses)."""
    tiny, trajs, _ = conversations
    cfg = LearnerConfig(loss=name, group_size=2, batch_groups=2, truncated_is=2.0)
    mesh = make_mesh(jax.devices()[:1], {"fsdp": 1, "tensor": 1})
    learner = Learner(cfg, tiny.graphdef, tiny.state, mesh)
    rng = np.random.default_rng(0)

    def batch(perturb_env=False, perturb_model=False):
        seqs = []
        for i, t in enumerate(trajs):
            s = train_sequence(t, 1.0 if i % 2 else -1.0)
            lp = np.asarray(s.logprobs, np.float32)
            versions = np.asarray(s.versions)
            env = np.asarray(s.loss_mask) == 0
            if perturb_env:
                lp = np.where(env, rng.normal(0, 5, lp.shape), lp)
                versions = np.where(env, 7, versions)
            if perturb_model:
                lp = np.where(env, lp, lp - 0.5)
            seqs.append(
                TrainSequence(
                    s.tokens, s.prompt_len, lp.tolist(), s.advantage, versions.tolist(), s.loss_mask
                )
            )
        return pack_batch(
            seqs, row_len=64, aggregation=learner.loss.aggregation, max_new_tokens=BUDGET
        )

    loss, grads = _loss_and_grads(learner, batch())
    loss_env, grads_env = _loss_and_grads(learner, batch(perturb_env=True))
    assert loss_env == loss
    for g, h in zip(jax.tree.leaves(grads), jax.tree.leaves(grads_env), strict=True):
        np.testing.assert_array_equal(np.asarray(g), np.asarray(h))
    if learner.loss.sampled:
        loss_model, _ = _loss_and_grads(learner, batch(perturb_model=True))
        assert loss_model != loss


def test_aggregations_count_model_tokens_only():
    """token_mean weighs 1 / (model tokens), seq_mean 1 / (sequences * its model tokens);
    env tokens weigh 0."""
    seqs = [
        TrainSequence([1, 2, 3, 4, 5, 6], 1, [-1.0] * 5, 1.0, [0] * 5, [1, 1, 0, 0, 1]),
        TrainSequence([1, 2, 3], 1, [-1.0] * 2, 1.0, [0] * 2, [1, 1]),
    ]
    a = pack_batch(seqs, row_len=16).arrays
    assert a["mask"].sum() == 5
    np.testing.assert_allclose(a["weights"][a["mask"] > 0], 1 / 5)
    assert (a["weights"][a["mask"] == 0] == 0).all()
    b = pack_batch(seqs, row_len=16, aggregation="seq_mean_token_mean").arrays
    np.testing.assert_allclose(sorted(set(b["weights"][b["mask"] > 0])), [1 / 6, 1 / 4], rtol=1e-6)
    with pytest.raises(ValueError, match="loss_mask must hold one 0 or 1 per response token"):
        pack_batch([TrainSequence([1, 2, 3], 1, loss_mask=[1])], row_len=8)
