"""rljax.metrics: JSONL records, TensorBoard event files and the trace, locally and on gs://."""

import json
import struct

import pytest
from tensorboardX.proto import event_pb2

from rljax import io, metrics
from rljax.testing.filesystems import gcs_workdir


def read_events(logdir) -> list[list]:
    """The events of each event file under ``logdir`` (any filesystem), files in name order."""
    files = []
    for name in io.listdir(logdir):
        data, events, i = io.read_bytes(io.join(logdir, name)), [], 0
        while i < len(data):
            (n,) = struct.unpack("<Q", data[i : i + 8])
            events.append(event_pb2.Event.FromString(data[i + 12 : i + 12 + n]))
            i += 12 + n + 4
        files.append(events)
    return files


def scalar_points(logdir) -> dict[str, list[tuple[int, float]]]:
    out: dict[str, list] = {}
    for events in read_events(logdir):
        for e in events:
            for v in e.summary.value:
                out.setdefault(v.tag, []).append((e.step, v.simple_value))
    return out


def test_scalars_flatten_numeric_fields():
    record = {
        "step": 3, "phase": "train", "time": 1.0, "reward": 0.5, "n": 2, "ok": True,
        "loss": {"pg": 1.5, "kl": {"low": 0.25}}, "name": "x", "ids": [1, 2], "none": None,
    }  # fmt: skip
    assert metrics.scalars(record) == {
        "train/reward": 0.5, "train/n": 2.0, "train/ok": 1.0,
        "train/loss/pg": 1.5, "train/loss/kl/low": 0.25,
    }  # fmt: skip


def test_tensorboard_event_files(tmp_path):
    writer = metrics.MetricsWriter(tmp_path, progress_bar=False)
    writer.write(0, "train", {"reward": 0.25, "loss": {"pg": 1.0}, "mode": "sync"})
    writer.write(1, "train", {"reward": 0.75})
    writer.write(1, "eval", {"heldout_accuracy": 0.5})
    writer.close()
    assert sorted(io.listdir(tmp_path / "tensorboard")) == ["eval", "train"]
    points = scalar_points(tmp_path / "tensorboard" / "train")
    assert points == {"train/reward": [(0, 0.25), (1, 0.75)], "train/loss/pg": [(0, 1.0)]}
    assert scalar_points(tmp_path / "tensorboard" / "eval") == {"eval/heldout_accuracy": [(1, 0.5)]}


def test_rewind_purges_tensorboard_from_the_first_rewound_step(tmp_path):
    writer = metrics.MetricsWriter(tmp_path, progress_bar=False)
    for step in range(3):
        writer.write(step, "train", {"reward": step})
    offset = writer.offset()
    # Past the checkpoint: two steps, and a phase first logged there (no step of it is kept,
    # so its purge starts at its first rewound step, 3, not its last).
    for step in (3, 4):
        writer.write(step, "train", {"reward": step})
        writer.write(step, "eval_final", {"heldout_accuracy": 1})
    writer.close()

    resumed = metrics.MetricsWriter(tmp_path, progress_bar=False)
    resumed.rewind(offset)
    resumed.write(3, "train", {"reward": 30})
    resumed.write(3, "eval_final", {"heldout_accuracy": 0.5})
    resumed.close()
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(x)["reward"] for x in lines if "reward" in x] == [0, 1, 2, 30]
    for phase in ("train", "eval_final"):
        first, second = read_events(tmp_path / "tensorboard" / phase)
        starts = [(e.step, e.session_log.status) for e in second if e.HasField("session_log")]
        # TensorBoard drops the first file's events from step 3 on.
        assert starts == [(3, event_pb2.SessionLog.START)], phase
        assert [e.step for e in first if e.summary.value][-2:] == [3, 4], phase


def test_metrics_trace_and_tensorboard_on_gcs():
    with gcs_workdir() as workdir:
        writer = metrics.MetricsWriter(workdir, progress_bar=False, upload_every_s=None)
        writer.write(0, "train", {"reward": 0.5})
        path = io.join(workdir, "metrics.jsonl")
        assert not io.exists(path)  # uploads wait for the interval, a flush or the cursor
        offset = writer.offset()  # a checkpoint's cursor is durable
        assert len(io.read_bytes(path)) == offset
        writer.write(1, "train", {"reward": 1.0})
        writer.close()
        records = [json.loads(x) for x in io.read_text(path).splitlines()]
        assert [r["reward"] for r in records] == [0.5, 1.0]
        points = scalar_points(io.join(workdir, "tensorboard", "train"))
        assert points == {"train/reward": [(0, 0.5), (1, 1.0)]}

        resumed = metrics.MetricsWriter(workdir, progress_bar=False, upload_every_s=None)
        resumed.rewind(offset)
        resumed.write(1, "train", {"reward": 2.0})
        resumed.close()
        assert [json.loads(x)["reward"] for x in io.read_text(path).splitlines()] == [0.5, 2.0]

        timeline = metrics.Timeline()
        with timeline.span("learn", track="learner"):
            pass
        timeline.write(io.join(workdir, "trace.json"))
        trace = json.loads(io.read_text(io.join(workdir, "trace.json")))
        assert [e["name"] for e in trace["traceEvents"]] == ["learn"]


@pytest.mark.parametrize("tensorboard", [False])
def test_tensorboard_off_writes_no_events(tmp_path, tensorboard):
    writer = metrics.MetricsWriter(tmp_path, progress_bar=False, tensorboard=tensorboard)
    writer.write(0, "train", {"reward": 1.0})
    writer.close()
    assert io.listdir(tmp_path) == ["metrics.jsonl"]
