"""runtime.exchange, and the parts written once over it (runtime.prompts, runtime.scoring).

The same PromptStream and Scorer run over every transport: one process (Alone), a pod's
sampler hosts (ChannelExchange: in memory with follower threads, and on a real localhost pod
of 3 processes through the coordination service). The stream draws the sequence one process
would for any host count and from any position; scoring is shared by the owner of each group,
failures counted where they happened and summed; a conversation keeps its env's reward.
"""

from __future__ import annotations

import math

import pytest

from rljax.config import ConfigError
from rljax.data.pipeline import prompt_iterator
from rljax.engine.sampler import FINISH_STOP, Trajectory
from rljax.rewards.pool import RewardPool
from rljax.runtime import prompts, scoring
from rljax.runtime.exchange import Alone, ChannelExchange, Server, owners
from rljax.runtime.prompts import POSITION, PromptStream, owner_key, resumed_position, task_example
from rljax.runtime.scoring import Scorer
from rljax.testing import pod
from rljax.testing.pod import MemoryChannel

EXAMPLES = [{"prompt": f"{i} + 1", "answer": i + 1} for i in range(11)]
SEED, BATCH = 5, 4


class Letters:  # decodes id i as the letter 'a' + i
    vocab_size = 26

    def decode(self, ids):
        return "".join(chr(97 + i) for i in ids)


def _one_process_stream(batches: int, skip: int = 0) -> list[dict]:
    it = prompt_iterator(EXAMPLES, batch_size=BATCH, seed=SEED)
    flat = [ex for _ in range(batches + skip) for ex in next(it)]
    return flat[skip * BATCH :]


def _exchanges(hosts: int, epoch: int = 0):
    channel = MemoryChannel()
    return channel, [ChannelExchange(channel, range(hosts), h, epoch) for h in range(hosts)]


def _pod_stream(hosts: int, start: int, batches: int):
    channel, exchanges = _exchanges(hosts)
    streams = [
        PromptStream(EXAMPLES, seed=SEED, batch_size=BATCH, exchange=x, start=start, homes=True)
        for x in exchanges
    ]
    servers = [Server(x, prompts.TOPIC, s.read) for x, s in zip(exchanges[1:], streams[1:])]
    leader = streams[0]
    drawn = [ex for _ in range(batches) for ex in next(leader)]
    leader.stop()
    for s in servers:
        s.join()
    return drawn, leader, channel


def test_one_process_draws_the_grain_iterator_s_stream():
    stream = PromptStream(EXAMPLES, seed=SEED, batch_size=BATCH, exchange=Alone())
    drawn = [ex for _ in range(6) for ex in next(stream)]
    assert [task_example(ex) for ex in drawn] == _one_process_stream(6)
    assert stream.get_state() == {"position": 24}
    assert stream.home(drawn[0]) is None  # one process: any slot


@pytest.mark.parametrize("hosts", [1, 2, 3])
def test_the_pod_draws_the_one_process_stream(hosts):
    drawn, leader, channel = _pod_stream(hosts, start=0, batches=6)
    assert [task_example(ex) for ex in drawn] == _one_process_stream(6)
    assert [ex[POSITION] for ex in drawn] == list(range(24))
    assert leader.get_state() == {"position": 24}
    assert all(leader.read_by[h] == 24 // hosts + (h < 24 % hosts) for h in range(hosts))
    assert [leader.home(ex) for ex in drawn[:4]] == [p % hosts for p in range(4)]
    assert channel.store == {}  # every message read and deleted, every server told to stop
    assert channel.failed is None


def test_a_resumed_or_resized_pod_goes_on_from_the_position_reached():
    drawn, _, _ = _pod_stream(3, start=8, batches=3)  # saved at position 8 by a pod of 2
    assert [ex[POSITION] for ex in drawn] == list(range(8, 20))
    assert [ex["prompt"] for ex in drawn] == [ex["prompt"] for ex in _one_process_stream(3, 2)]


def test_owners_follow_the_prompt_s_position_else_the_group_id():
    assert owner_key({"prompt": "x", POSITION: 10}, 3) == 10
    assert owner_key({"prompt": "x"}, 3) == 3  # an evaluation prompt: by its group id
    assert owners([10, 3, 5, 6], 4) == [2, 3, 1, 2]
    assert task_example({"prompt": "x", POSITION: 10}) == {"prompt": "x"}  # what a reward sees


def test_a_checkpoint_without_a_stream_position_is_refused():
    assert resumed_position(None) == 0
    assert resumed_position({"data": {"position": 12}}) == 12
    with pytest.raises(ConfigError, match="not a position in the stream"):
        resumed_position({"data": {"next_index": 3}})


def test_a_reader_that_cannot_read_fails_the_pod():
    class Broken:
        def __getitem__(self, position):
            raise OSError(f"cannot read position {position}")

    channel, (leader, follower) = _exchanges(2)
    stream = PromptStream(EXAMPLES, seed=SEED, batch_size=2, exchange=follower)
    stream.dataset = Broken()
    server = Server(follower, prompts.TOPIC, stream.read)
    leader.scatter(prompts.TOPIC, [[0], [1]])
    with pytest.raises(OSError, match="cannot read position 1"):
        server.join()
    assert isinstance(channel.failed, OSError)  # the leader stops waiting for its prompts


def _traj(group_id, payload=None, env_reward=None):
    t = Trajectory([1], [1, 2], [0.0, 0.0], [0, 0], FINISH_STOP, group_id, 0, payload=payload)
    t.env_reward = env_reward
    return t


def test_a_conversation_s_reward_is_its_env_s_and_is_not_shared():
    """An in-memory channel, host 1's server on a thread: conversations keep the reward their
    home host's env gave; only single-turn trajectories go to a verifier, at their owner."""
    channel, (lead, follower) = _exchanges(2)
    pools = [RewardPool(lambda c, ex: float(len(c)), num_workers=1) for _ in range(2)]
    server = Server(follower, scoring.TOPIC, Scorer(follower, pools[1], Letters()).score_share)
    scorer = Scorer(lead, pools[0], Letters())
    trajs = [_traj(0, {}), _traj(1, {}), _traj(2, {}, 0.5), _traj(3, {}, math.nan)]
    rewards, _ = scorer.score(trajs)
    scorer.stop()
    server.join()
    assert rewards[:3].tolist() == [1.0, 1.0, 0.5] and math.isnan(rewards[3])
    assert [p.stats.calls for p in pools] == [1, 1] and scorer.scored == {0: 1, 1: 1}
    assert channel.store == {}
    for pool in pools:
        pool.close()


def test_one_process_scores_everything_itself():
    pool = RewardPool(lambda c, ex: float(len(c) + ex["bonus"]), num_workers=1)
    trajs = [_traj(g, {"bonus": g, POSITION: 7 + g}) for g in range(3)]
    rewards, failures = Scorer(Alone(), pool, Letters()).score(trajs)
    assert rewards.tolist() == [1.0, 2.0, 3.0] and [t.reward for t in trajs] == [1.0, 2.0, 3.0]
    assert sum(failures.values()) == 0
    pool.close()


_SCRIPT = """
import json, math
from rljax.mesh import distributed
distributed.maybe_initialize()
import jax
from rljax.engine.sampler import FINISH_STOP, Trajectory
from rljax.mesh.control import Channel
from rljax.rewards.pool import RewardPool
from rljax.runtime import scoring
from rljax.runtime.exchange import ChannelExchange, Server
from rljax.runtime.scoring import Scorer

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
me = jax.process_index()
exchange = ChannelExchange(Channel(), (0, 1, 2), me, 0)
scorer = Scorer(exchange, pool, Letters())
if me == 0:
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
    Server(exchange, scoring.TOPIC, scorer.score_share).join()
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
