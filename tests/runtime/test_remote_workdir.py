"""A run on a non-local workdir (gs://, served by a GCS emulator on 127.0.0.1): it writes its
metrics, TensorBoard event files and checkpoints there, and a second run resumes from them."""

from __future__ import annotations

import json

from rljax.configs import arith_tiny

from rljax import io
from rljax.config import replace
from rljax.runtime import run
from rljax.testing.filesystems import gcs_workdir


def test_run_writes_to_and_resumes_from_a_gcs_workdir():
    cfg = replace(
        arith_tiny.recipe("small"),
        **{
            "num_steps": 2,
            "checkpoint.enabled": True,
            "checkpoint.every_steps": 1,
            "metrics.progress_bar": False,
        },
    )
    with gcs_workdir() as workdir:
        first = run(cfg, workdir)
        assert first["steps"] == 2
        second = run(replace(cfg, num_steps=3), workdir)  # resumes at step 2, trains one more
        assert second["steps"] == 3
        rows = [
            json.loads(line)
            for line in io.read_text(io.join(workdir, "metrics.jsonl")).splitlines()
        ]
        # One line per step: the resumed run rewound to the checkpoint's offset and went on.
        assert [r["step"] for r in rows if r["phase"] == "train"] == [0, 1, 2]
        assert sum(r["phase"] == "eval_initial" for r in rows) == 1
        names = io.listdir(io.join(workdir, "checkpoints"))
        steps = sorted(int(n) for n in names if n.isdigit())
        assert steps[-1] == 3
        board = io.join(workdir, "tensorboard")
        events = [
            name
            for phase in io.listdir(board)
            for name in io.listdir(io.join(board, phase))
            if "tfevents" in name
        ]
        assert events, "no TensorBoard event file in the workdir"
