"""runtime.pod_prompts: the sampler hosts of a pod each read their stride of the one prompt
stream; the leader draws exactly the sequence one process would, from any position and for
any host count, and stops every feeder with nothing left in the store."""

from __future__ import annotations

import pytest

from rljax.config import ConfigError
from rljax.data.pipeline import prompt_dataset, prompt_iterator
from rljax.runtime.pod_prompts import (
    POSITION,
    PodPrompts,
    PromptFeeder,
    chunk_size,
    first_position,
    home,
    resumed_position,
    task_example,
)
from rljax.testing.pod import MemoryChannel

EXAMPLES = [{"prompt": f"{i} + 1", "answer": i + 1} for i in range(11)]
SEED, BATCH = 5, 4


def _one_process_stream(batches: int, skip: int = 0) -> list[dict]:
    it = prompt_iterator(EXAMPLES, batch_size=BATCH, seed=SEED)
    flat = [ex for _ in range(batches + skip) for ex in next(it)]
    return flat[skip * BATCH :]


def _pod_stream(hosts: int, start: int, batches: int, epoch: int = 0):
    channel, dataset = MemoryChannel(), prompt_dataset(EXAMPLES, seed=SEED)
    chunk = chunk_size(BATCH, hosts)
    feeders = [
        PromptFeeder(dataset, channel, h, hosts, epoch, start, chunk) for h in range(1, hosts)
    ]
    leader = PodPrompts(dataset, channel, hosts, epoch, start, BATCH)
    drawn = [ex for _ in range(batches) for ex in next(leader)]
    leader.stop()
    for f in feeders:
        f.join()
    return drawn, leader, channel


@pytest.mark.parametrize("hosts", [1, 2, 3])
def test_the_pod_draws_the_one_process_stream(hosts):
    drawn, leader, channel = _pod_stream(hosts, start=0, batches=6)
    assert [{k: v for k, v in ex.items() if k != POSITION} for ex in drawn] == (
        _one_process_stream(6)
    )
    assert [ex[POSITION] for ex in drawn] == list(range(24))
    assert leader.get_state() == {"position": 24}
    assert sorted(leader.read_by_host) == list(range(hosts))
    assert all(leader.read_by_host[h] == 24 // hosts + (h < 24 % hosts) for h in range(hosts))
    assert channel.store == {}  # every chunk taken or withdrawn, every ack read
    assert channel.failed is None


def test_a_resumed_or_resized_pod_goes_on_from_the_position_reached():
    drawn, _, _ = _pod_stream(3, start=8, batches=3)  # saved at position 8 by a pod of 2
    assert [ex[POSITION] for ex in drawn] == list(range(8, 20))
    assert [ex["prompt"] for ex in drawn] == [ex["prompt"] for ex in _one_process_stream(3, 2)]


def test_each_host_reads_its_stride_and_each_example_names_its_home():
    assert [first_position(10, h, 4) for h in range(4)] == [12, 13, 10, 11]
    assert home({"prompt": "x", POSITION: 10}, 4) == 2
    assert home({"prompt": "x"}, 4) is None
    assert task_example({"prompt": "x", POSITION: 10}) == {"prompt": "x"}  # what a reward sees


def test_a_checkpoint_without_a_stream_position_is_refused():
    assert resumed_position(None) == 0
    assert resumed_position({"data": {"position": 12}}) == 12
    with pytest.raises(ConfigError, match="not a pod's"):
        resumed_position({"data": {"next_index": 3}})


def test_a_feeder_that_cannot_read_fails_the_pod():
    class Broken:
        def __getitem__(self, position):
            raise OSError(f"cannot read position {position}")

    channel = MemoryChannel()
    feeder = PromptFeeder(Broken(), channel, 1, 2, 0, 0, 2)
    with pytest.raises(OSError, match="cannot read position 1"):
        feeder.join()
    assert isinstance(channel.failed, OSError)  # the leader stops waiting for its prompts
