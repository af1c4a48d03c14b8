"""runtime.pod_scoring: on a localhost pod of 3 processes, the leader's scoring calls are shared
by group id among the sampler hosts, each scores its share in its own RewardPool, and the
leader gets every reward back in order, failures (a verifier that raises, one that returns NaN)
counted on the host that met them and summed. A conversation keeps its env's reward."""

from __future__ import annotations

import math

from rljax.engine.sampler import FINISH_STOP, Trajectory
from rljax.rewards.pool import RewardPool
from rljax.runtime.pod_prompts import POSITION
from rljax.runtime.pod_scoring import PodScorer, ScoreServer, owners
from rljax.testing import pod
from rljax.testing.pod import MemoryChannel

_SCRIPT = """
import json, math
from rljax.mesh import distributed
distributed.maybe_initialize()
import jax
from rljax.engine.sampler import FINISH_STOP, Trajectory
from rljax.mesh.control import Channel
from rljax.rewards.pool import RewardPool
from rljax.runtime.pod_scoring import PodScorer, ScoreServer

class Letters:  # decodes id i as the letter 'a' + i
    vocab_size = 26
    def decode(self, ids):
        return "".join(chr(97 + i) for i in ids)

def verifier(completion, example):
    if completion.startswith("z"):
        raise ValueError("the verifier broke")
    if completion.startswith("y"):
        return float("nan")
    return float(len(completion) + example["bonus"])

pool = RewardPool(verifier, num_workers=2, on_failure="drop")
me, hosts = jax.process_index(), (0, 1, 2)
channel = Channel()
if me == 0:
    scorer = PodScorer(channel, hosts, 0, pool, Letters())
    def group(g):  # 3 samples; group 4 breaks the verifier once, group 7 returns NaN once
        first = {4: 25, 7: 24}.get(g, 0)
        tokens = lambda s: [first if s == 0 else 0] + [1] * (g % 5) + [0] * s
        return [
            Trajectory([1], tokens(s), [], [], FINISH_STOP, g, s, payload={"bonus": 10 * g})
            for s in range(3)
        ]
    calls = [[t for g in range(9) for t in group(g)], group(5)]
    out = []
    for trajs in calls:
        rewards, failures = scorer.score(trajs)
        out.append({"rewards": [None if math.isnan(r) else r for r in rewards.tolist()],
                    "kept": [t.reward for t in trajs], "failures": failures})
    scorer.stop()
    print("RESULT " + json.dumps({"calls": out, "scored": scorer.scored,
                                  "own": pool.stats.by_kind()}, allow_nan=True))
else:
    ScoreServer(channel, me, 0, pool, Letters()).join()
    print("RESULT " + json.dumps({"calls": pool.stats.calls, "own": pool.stats.by_kind()}))
"""


def _expected(g: int, s: int) -> float | None:
    if g in (4, 7) and s == 0:
        return None  # failed: NaN under on_failure='drop'
    length = 1 + g % 5 + s - 1  # the stop token is not part of the completion
    return float(length + 10 * g)


def test_the_sampler_hosts_share_the_scoring_and_the_leader_gathers_it(tmp_path):
    codes, logs = pod.run(["-c", _SCRIPT], processes=3, devices=1, logdir=tmp_path, timeout=180)
    assert codes == [0, 0, 0], logs
    lead, *followers = [pod.result(log) for log in logs]
    first, single = lead["calls"]
    assert first["rewards"] == [_expected(g, s) for g in range(9) for s in range(3)]
    assert single["rewards"] == [_expected(5, s) for s in range(3)]
    kept = [None if r is None or math.isnan(r) else r for r in first["kept"]]
    assert kept == first["rewards"]  # each trajectory carries its reward
    # Group g is scored by host g % 3: groups 4 and 7 fail on host 1, counted once each.
    assert followers[0]["own"]["raised"] == 1 and followers[0]["own"]["nan"] == 1
    assert lead["own"]["raised"] == lead["own"]["nan"] == 0
    assert first["failures"]["raised"] == 1 and first["failures"]["nan"] == 1
    assert single["failures"] == first["failures"]
    # 9 groups of 3 (3 groups to each host), then group 5 alone, on host 2.
    assert lead["scored"] == {"0": 9, "1": 9, "2": 12}
    assert [f["calls"] for f in followers] == [9, 12]


def test_a_trajectory_is_scored_by_its_prompt_s_reader_else_by_its_id_s_host():
    def traj(group_id, payload):
        return Trajectory([1], [2], [0.0], [0], FINISH_STOP, group_id, 0, payload=payload)

    trajs = [traj(g, {"answer": 1}) for g in (0, 0, 1, 5, 6)]  # no stream position: by id
    assert owners(trajs, 3) == [0, 0, 1, 2, 0]
    read = [traj(g, {POSITION: p}) for g, p in ((0, 7), (1, 3), (5, 5))]  # host p % 3
    assert owners(read, 3) == [1, 0, 2]


def test_a_conversation_s_reward_is_its_env_s_and_is_not_shared():
    """In one process (an in-memory channel, host 1's server on a thread): conversations keep
    the reward their home host's env gave; only single-turn trajectories go to a verifier."""

    class Letters:
        vocab_size = 26

        def decode(self, ids):
            return "".join(chr(97 + i) for i in ids)

    def traj(group_id, env_reward=None):
        t = Trajectory([1], [1, 2], [0.0, 0.0], [0, 0], FINISH_STOP, group_id, 0, payload={})
        t.env_reward = env_reward
        return t

    channel = MemoryChannel()
    pools = [RewardPool(lambda c, ex: float(len(c)), num_workers=1) for _ in range(2)]
    server = ScoreServer(channel, 1, 0, pools[1], Letters())
    scorer = PodScorer(channel, (0, 1), 0, pools[0], Letters())
    trajs = [traj(0), traj(1), traj(2, 0.5), traj(3, math.nan)]  # groups 1 and 3: host 1's
    rewards, _ = scorer.score(trajs)
    scorer.stop()
    server.join()
    assert rewards[:3].tolist() == [1.0, 1.0, 0.5] and math.isnan(rewards[3])
    assert [p.stats.calls for p in pools] == [1, 1] and scorer.scored == {0: 1, 1: 1}
    for pool in pools:
        pool.close()
