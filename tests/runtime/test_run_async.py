"""The real async runtime on a 6/2 device split: staleness bound, checkpoint and resume."""

import json

from rljax.configs import arith_tiny

from rljax.config import replace
from rljax.runtime import Run


def _cfg(steps):
    return replace(
        arith_tiny.recipe("small"),
        **{
            "mode": "async",
            "buffer.max_staleness": 1,
            "learner.loss": "decoupled_ppo",
            "mesh.mode": "split",
            "mesh.sampler_devices": 6,
            "mesh.learner_devices": 2,
            "checkpoint.enabled": True,
            "checkpoint.every_steps": 1,
            "checkpoint.async_save": False,
            "metrics.trace": True,
            "num_steps": steps,
        },
    )


def _train_records(workdir):
    lines = (workdir / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["phase"] == "train"]


def test_async_run_respects_eta_and_resumes(tmp_path, monkeypatch):
    run = Run(_cfg(3), str(tmp_path))
    try:
        summary = run.train()
    finally:
        run.close()
    assert summary["steps"] == 3
    assert run.topology.sampler_devices == 6 and run.topology.learner_devices == 2
    records = _train_records(tmp_path)
    assert [r["step"] for r in records] == [0, 1, 2]
    for r in records:
        assert r["staleness_max"] <= 1
        assert sum(r["staleness_hist"].values()) == 4  # every consumed batch is full
        assert r["sync_bytes"] > 0
    assert (tmp_path / "trace.json").exists()

    # A longer run on the same workdir resumes at step 3 with the buffered groups intact, and
    # the prompts in flight at the checkpoint (there always are some: held groups or pending
    # prompts) queued again.
    run = Run(_cfg(5), str(tmp_path))
    saved = run.resumed_meta["driver"]
    held = [(b["version"], g) for b in saved["buffer"]["buffers"] for g in b["groups"]]
    assert held or saved["pending"]
    started = []
    make_driver = run._make_driver

    def recording_driver():
        driver = make_driver()
        started.append(json.loads(json.dumps(driver.checkpoint_state())))  # as saved
        return driver

    monkeypatch.setattr(run, "_make_driver", recording_driver)
    try:
        run.train()
    finally:
        run.close()
    first = started[0]
    assert [(b["version"], g) for b in first["buffer"]["buffers"] for g in b["groups"]] == held
    assert first["pending"] == saved["pending"]
    assert first["next_request_id"] == saved["next_request_id"]
    assert [r["step"] for r in _train_records(tmp_path)] == [0, 1, 2, 3, 4]
    assert all(r["staleness_max"] <= 1 for r in _train_records(tmp_path))
