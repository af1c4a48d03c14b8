"""Rollout routing replay's data path: a trajectory's routes reach the packed batch at the
positions of their input tokens, survive a checkpoint's JSON, and a dense run's batches are
unchanged (no ``routes`` field)."""

import json

import numpy as np
import pytest

from rljax.engine.samples import Request, Sample, Trajectory
from rljax.learner.batch import TrainSequence, pack_batch
from rljax.runtime.rollout import decode_group, encode_group, make_group, train_sequence

W = 6  # Lm * k: 3 MoE layers x 2 experts


def _route(j: int) -> list[int]:
    return [100 * j + e for e in range(W)]


def _traj(prompt: list[int], n: int, *, mask: list[int] | None = None, routes=True) -> Trajectory:
    """A trajectory whose response token j has routes ``_route(j)`` (none for the last one,
    never fed, and none for env tokens)."""
    mask = mask or [1] * n
    recorded = [_route(j) if j < n - 1 and mask[j] else [] for j in range(n)]
    return Trajectory(
        prompt,
        list(range(10, 10 + n)),
        [-0.5] * n,
        [0] * n,
        "stop",
        group_id=1,
        sample_index=0,
        loss_mask=mask if 0 in mask else None,
        routes=recorded if routes else None,
    )


def _segments(batch):
    """Each packed sequence's (tokens, routes) rows, read back in packing order."""
    tokens = batch.arrays["tokens"].reshape(-1, batch.shape[-1])
    segs = batch.arrays["segment_ids"].reshape(tokens.shape)
    routes = batch.arrays["routes"].reshape(*tokens.shape, -1)
    out = []
    for r in range(tokens.shape[0]):
        for seg in np.unique(segs[r]):
            if seg:
                where = segs[r] == seg
                out.append((tokens[r][where].tolist(), routes[r][where]))
    return out


def test_response_token_j_routes_sit_at_position_prompt_len_plus_j():
    trajs = [_traj([1, 2, 3], 5), _traj([4, 5], 4, mask=[1, 0, 0, 1]), _traj([6], 3)]
    seqs = [train_sequence(t, 1.0) for t in trajs]
    batch = pack_batch(seqs, row_len=16, micro_batches=2)
    assert batch.arrays["routes"].shape == (*batch.shape, W)
    assert batch.arrays["routes"].dtype == np.int32
    found = {tuple(tokens): routes for tokens, routes in _segments(batch)}
    for t in trajs:
        routes = found[tuple(t.prompt_tokens + t.response_tokens)]
        p = len(t.prompt_tokens)
        assert (routes[:p] == -1).all(), "prompt tokens are never forced"
        for j, expected in enumerate(t.routes):
            want = expected if expected else [-1] * W
            assert routes[p + j].tolist() == want, (t.prompt_tokens, j)
    # padding is never forced either
    segs = batch.arrays["segment_ids"]
    assert (batch.arrays["routes"][segs == 0] == -1).all()


def test_a_dense_run_s_batch_is_unchanged():
    """No routes anywhere: the same arrays as before routes existed, and no ``routes`` key."""
    trajs = [_traj([1, 2, 3], 5, routes=False), _traj([6], 3, routes=False)]
    seqs = [train_sequence(t, 1.0) for t in trajs]
    assert all(s.routes == () for s in seqs)
    batch = pack_batch(seqs, row_len=16)
    assert "routes" not in batch.arrays
    plain = [
        TrainSequence(s.tokens, s.prompt_len, s.logprobs, s.advantage, s.versions) for s in seqs
    ]
    ref = pack_batch(plain, row_len=16)
    assert set(batch.arrays) == set(ref.arrays)
    for k, v in ref.arrays.items():
        np.testing.assert_array_equal(batch.arrays[k], v)


def test_a_sequence_without_routes_beside_recorded_ones_is_never_forced():
    seqs = [train_sequence(_traj([1, 2], 4), 1.0), train_sequence(_traj([3], 3, routes=False), 1.0)]
    batch = pack_batch(seqs, row_len=8)
    by_tokens = {tuple(tokens): routes for tokens, routes in _segments(batch)}
    assert (by_tokens[(3, 10, 11, 12)] == -1).all()
    assert (by_tokens[(1, 2, 10, 11, 12, 13)][2] == _route(0)).all()


@pytest.mark.parametrize(
    "routes, match",
    [([[1] * W], "1 routes for 3 response tokens"), ([[1] * W, [1] * 4, []], "widths")],
)
def test_bad_routes_are_refused(routes, match):
    with pytest.raises(ValueError, match=match):
        pack_batch([TrainSequence([1, 2, 3, 4], 1, routes=routes)], row_len=8)


def test_routes_survive_a_checkpoint_round_trip():
    trajs = [_traj([1, 2, 3], 5), _traj([4, 5], 4, mask=[1, 0, 0, 1])]
    for i, t in enumerate(trajs):
        t.sample_index = i
    group = make_group({"prompt": "p"}, trajs, [1.0, 0.0])
    back = decode_group(json.loads(json.dumps(encode_group(group))))
    assert [t.routes for t in back.trajectories] == [t.routes for t in trajs]
    assert back.trajectories == trajs


def test_an_old_checkpoint_without_routes_loads():
    group = make_group({"prompt": "p"}, [_traj([1, 2], 3, routes=False)], [1.0])
    encoded = json.loads(json.dumps(encode_group(group)))
    for t in encoded["trajectories"]:
        del t["routes"]  # written before routes were recorded
    back = decode_group(encoded)
    assert back.trajectories[0].routes is None
    assert train_sequence(back.trajectories[0], 1.0).routes == ()


def test_a_sample_keeps_the_routes_of_a_token_s_first_feed():
    """A token fed again (a re-prefill, new params) keeps its first routes; env tokens and
    prompt positions take none; the last token (never fed) has none."""
    s = Sample(Request([1, 2, 3]), 0)
    s.tokens += [10, 11]
    s.feed_routes(0, [[1] * W])  # a decode step fed token 0
    s.tokens += [12]
    s.feed_routes(-3, [[9] * W] * 6)  # a re-prefill feeds the prompt and tokens 0..2
    t = s.to_trajectory("stop")
    assert t.routes == [[1] * W, [9] * W, [9] * W]
    s.tokens += [13]
    t = s.to_trajectory("stop")
    assert t.routes[3] == []
    conv = Sample(Request([1]), 0)
    conv.tokens += [5, 6, 7]
    conv.loss_mask += [1, 0, 1]
    conv.feed_routes(0, [[2] * W] * 3)
    assert conv.to_trajectory("stop").routes == [[2] * W, [], [2] * W]
    assert Sample(Request([1]), 0).to_trajectory("stop").routes is None
