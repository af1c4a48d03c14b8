"""Run.resize: the real async runtime moves chips between the meshes mid-training.

Acceptance: a run that resizes 6/2 -> 4/4 -> 6/2 on the 8 fake CPU devices ends with the same
learner params as the same run without resizing, and consumes every group exactly once. With
eta = 0 the comparison is exact up to float reduction order: request ids (and so sampling seeds)
do not depend on thread timing, batches are in request-id order, and a resize at the step
boundary runs before the next batch is admitted.
"""

from __future__ import annotations

import json
import time

import jax
import numpy as np
import pytest
from jax.experimental.compilation_cache import compilation_cache
from rljax.configs import arith_tiny

from rljax.config import ConfigError, MeshConfig, replace
from rljax.engine.decode import steps_per_call
from rljax.mesh.resize import MeshCache, Reallocation, plan_resize
from rljax.policy.meter import Generate, Learn, LearnerWait, SamplerIdle, StepEnd
from rljax.policy.reallocation import PhaseStats, Split
from rljax.runtime import Run

pytestmark = pytest.mark.slow

GROUP, BATCH_GROUPS = 8, 4


@pytest.fixture(scope="module")
def shared_compiles(tmp_path_factory):
    """The runs here compile the same functions; share them through a persistent cache."""
    settings = {
        "jax_compilation_cache_dir": str(tmp_path_factory.mktemp("xla_cache")),
        "jax_persistent_cache_min_compile_time_secs": 0.0,
        "jax_persistent_cache_min_entry_size_bytes": 0,
    }
    old = {k: getattr(jax.config, k) for k in settings}
    compilation_cache.reset_cache()
    for k, v in settings.items():
        jax.config.update(k, v)
    yield
    for k, v in old.items():
        jax.config.update(k, v)
    compilation_cache.reset_cache()


def _cfg(**overrides):
    return replace(
        arith_tiny.recipe("small"),
        **{
            "mode": "async",
            "buffer.max_staleness": 0,
            "mesh.mode": "split",
            "mesh.sampler_devices": 6,
            "mesh.learner_devices": 2,
            "sft.steps": 0,
            "eval_examples": 4,
            "metrics.trace": True,
            "num_steps": 3,
            **overrides,
        },
    )


def _length_reward(text: str, example: dict) -> float:
    # Varies within a group, so every step has a gradient to compare.
    return len(text) / 5.0


class Recorder:
    """Wraps a Run's request and batch builders to see every dispatched and consumed group."""

    def __init__(self, run: Run):
        self.dispatched: list[int] = []
        self.batches: list[list[int]] = []
        self.groups: dict[int, list] = {}
        make_request, make_batch = run.make_request, run.make_batch

        def request(example, rid, *, greedy=False):
            if not greedy:  # greedy ones are held-out evaluation
                self.dispatched.append(rid)
            return make_request(example, rid, greedy=greedy)

        def batch(groups):
            self.batches.append([g.request_id for g in groups])
            for g in groups:
                self.groups[g.request_id] = g.trajectories
            return make_batch(groups)

        run.make_request, run.make_batch = request, batch

    def check_complete(self) -> list[int]:
        """Every consumed group once, with all of its samples; returns the consumed ids."""
        consumed = [rid for b in self.batches for rid in b]
        assert len(consumed) == len(set(consumed)), "a group was consumed twice"
        for rid, trajs in self.groups.items():
            assert sorted(t.sample_index for t in trajs) == list(range(GROUP)), rid
            for t in trajs:
                assert len(t.versions) == len(t.logprobs) == len(t.response_tokens) > 0
        return consumed


def _records(workdir, phase):
    lines = (workdir / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["phase"] == phase]


def _train(cfg, workdir, plan=None, **kwargs):
    run = Run(cfg, str(workdir), **kwargs)
    recorder = Recorder(run)
    if plan:
        run.step_hooks.append(lambda r, step: r.resize(plan[step]) if step in plan else None)
    try:
        run.train()
    finally:
        run.close()
    return run, recorder


def _host(tree):
    return jax.tree.leaves(jax.device_get(tree))


def test_resize_62_44_62_matches_a_run_without_resizing(tmp_path, shared_compiles):
    cfg = _cfg()
    base, base_rec = _train(cfg, tmp_path / "base", reward_fn=_length_reward)
    # To 4/4 from a step hook after step 0 (Run.resize), back to 6/2 by mesh.resize_schedule
    # at version 2 (after step 1).
    plan = {0: Split(4, 4)}
    scheduled = replace(cfg, **{"mesh.resize_schedule": "2:6/2"})
    run, rec = _train(scheduled, tmp_path / "resized", plan, reward_fn=_length_reward)

    # Same data, same steps, nothing lost or duplicated: ids 0..11 in three batches of four.
    expected = [list(range(i * BATCH_GROUPS, (i + 1) * BATCH_GROUPS)) for i in range(3)]
    assert base_rec.batches == rec.batches == expected
    rec.check_complete()
    for rid, trajs in rec.groups.items():
        assert [t.response_tokens for t in trajs] == [
            t.response_tokens for t in base_rec.groups[rid]
        ]
    assert [r["grad_norm"] > 0 for r in _records(tmp_path / "resized", "train")] == [True] * 3

    assert run.learner.version == base.learner.version == 3
    for a, b in zip(_host(run.learner.params), _host(base.learner.params), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    for a, b in zip(_host(run.learner.opt_state), _host(base.learner.opt_state), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)

    # Back on 6/2 the first engine and learner are reused: only 4/4 was ever built anew.
    assert run.topology.split == Split(6, 2)
    assert run.engines.builds == run.learners.builds == 1
    assert len(run.engines) == len(run.learners) == 2
    # Compiled once each, by the first 6/2 engine and learner, though used again after 4/4.
    per_call = steps_per_call(cfg.sampling.decode_steps, run.parts.engine.mesh)
    steps = run.parts.engine.steps
    decode = steps.generate(None) if per_call == 1 else steps.generate_steps(None, per_call)
    assert decode._cache_size() == 1
    assert run.learner._step_fn._cache_size() == 1
    resizes = _records(tmp_path / "resized", "resize")
    assert [(r["from"], r["to"], r["step"]) for r in resizes] == [
        ("6/2", "4/4", 1),
        ("4/4", "6/2", 2),
    ]
    assert [r["cause"] for r in resizes] == ["api", "schedule"]
    assert all(r["seconds"] > 0 for r in resizes)
    assert [r["interrupted_requests"] for r in resizes] == [0, 0]  # eta = 0: none in flight
    trace = json.loads((tmp_path / "resized" / "trace.json").read_text())["traceEvents"]
    assert [e["args"]["to"] for e in trace if e["name"] == "resize"] == ["4/4", "6/2"]


class ScriptedPolicy:
    """Stands in for the Reallocator: records each measured phase and answers the next split
    of its script at the first boundary where the sampler has sequences in its slots, so that
    each resize must interrupt requests in flight."""

    def __init__(self, run: Run, splits: list[Split]):
        self.run, self.splits = run, list(splits)
        self.phases: list[PhaseStats] = []
        self.answered: list[int] = []  # phase index of each move

    def decide(self, stats: PhaseStats) -> Split | None:
        self.phases.append(stats)
        deadline = time.monotonic() + 1.0
        while self.splits and time.monotonic() < deadline:
            if self.run.sampler.busy_slots:
                self.answered.append(len(self.phases) - 1)
                return self.splits.pop(0)
            time.sleep(0.002)
        return None


def test_reallocation_resizes_with_requests_in_flight(tmp_path, shared_compiles):
    eta = 2
    cfg = _cfg(
        **{
            "buffer.max_staleness": eta,
            "mesh.reallocate": True,
            "mesh.reallocate_every": 1,
            "num_steps": 6,
            # One token a sampler step, so a batch takes several steps (see slow_step).
            "sampling.decode_steps": 1,
        }
    )
    run = Run(cfg, str(tmp_path))
    rec = Recorder(run)
    policy = ScriptedPolicy(run, [Split(4, 4), Split(6, 2)])
    run.reallocation.policy = policy
    step = run.sampler.step

    def slow_step():
        # A slower sampler than learner keeps requests in flight at step boundaries. A batch
        # takes ~5 decode steps, so 0.1 s each keeps it slower than the learner even when
        # other jobs load the machine (at 0.02 s a loaded learner fell behind, the sampler
        # waited on the staleness bound, and nothing was in flight at a resize).
        time.sleep(0.1)
        return step()

    run.sampler.step = slow_step
    try:
        run.train()
    finally:
        run.close()

    # The policy saw one measured phase per step, on the split in force at the time.
    first, second = policy.answered
    splits = [p.split for p in policy.phases]
    assert len(splits) == 6
    assert splits[: first + 1] == [Split(6, 2)] * (first + 1)
    assert splits[first + 1 : second + 1] == [Split(4, 4)] * (second - first)
    assert splits[second + 1 :] == [Split(6, 2)] * (5 - second)
    resizes = _records(tmp_path, "resize")
    assert [(r["from"], r["to"], r["cause"]) for r in resizes] == [
        ("6/2", "4/4", "reallocator"),
        ("4/4", "6/2", "reallocator"),
    ]
    assert policy.phases[first + 1].switch_cost_s == pytest.approx(resizes[0]["seconds"])
    for p in policy.phases:
        # A sampler held back by the staleness bound for a whole phase is idle all of it.
        assert p.sampler_busy_s + p.sampler_idle_s > 0 and p.learner_busy_s > 0
        assert 0 <= p.sampler_occupancy <= 1 and p.granularity == 1
    # A generate call still running when a one-step phase ends is reported in the next phase,
    # so a phase can close with no decode measured; most phases measure one.
    assert sum(p.sampler_occupancy > 0 for p in policy.phases) >= len(policy.phases) // 2

    # Requests were in flight at each move, and every one of them came through whole.
    assert all(r["interrupted_requests"] > 0 for r in resizes)
    assert run.driver.counters["interrupted_samples"] > 0
    consumed = rec.check_complete()
    assert len(consumed) == 6 * BATCH_GROUPS
    state = run.driver.buffer.state_dict()
    still_held = {
        item["request_id"] for b in state["buffers"] for item in b["groups"] + b["reservations"]
    }
    assert set(rec.dispatched) == set(consumed) | still_held
    assert not set(consumed) & still_held
    assert len(rec.dispatched) == len(set(rec.dispatched))
    for r in _records(tmp_path, "train"):
        assert r["staleness_max"] <= eta
        assert sum(r["staleness_hist"].values()) == BATCH_GROUPS


def test_resize_round_trip_before_training_reuses_mesh_objects(tmp_path):
    run = Run(_cfg(**{"mode": "sync", "learner.beta": 0.05}), str(tmp_path))
    try:
        engine, learner = run.parts.engine, run.learner
        params, opt = _host(learner.params), _host(learner.opt_state)
        ref = _host(learner.ref_params)
        record = run.resize(Split(4, 4))
        assert record["from"] == "6/2" and record["to"] == "4/4"
        assert run.topology.sampler_devices == 4 and run.learner.dp == 4
        learner_devices = set(run.topology.learner.devices.flat)
        for tree in (run.learner.params, run.learner.opt_state, run.learner.ref_params):
            assert all(x.sharding.device_set == learner_devices for x in jax.tree.leaves(tree))
        assert all(
            x.sharding.device_set == set(run.topology.sampler.devices.flat)
            for x in jax.tree.leaves(run.sampler.params)
        )
        assert run.learner is not learner and learner.params is None  # old chips let go
        assert run.sampler.engine is run.parts.engine is not engine
        assert run.resize(Split(4, 4)) is None  # already there
        run.resize(Split(6, 2))
        assert (
            run.parts.engine is engine and run.learner is learner and run.sampler.engine is engine
        )
        assert run.engines.builds == run.learners.builds == 1
        for a, b in zip(_host(run.learner.params), params, strict=True):
            np.testing.assert_array_equal(a, b)
        for a, b in zip(_host(run.learner.opt_state), opt, strict=True):
            np.testing.assert_array_equal(a, b)
        for a, b in zip(_host(run.learner.ref_params), ref, strict=True):
            np.testing.assert_array_equal(a, b)
        assert run.sampler.version == run.learner.version == 0
        assert [r["to"] for r in _records(tmp_path, "resize")] == ["4/4", "6/2"]

        # A bad split fails in one line and leaves the run where it was.
        with pytest.raises(ConfigError, match="needs 10 devices and the run has 8"):
            run.resize(Split(6, 4))
        with pytest.raises(ConfigError, match="splits a batch 3 ways"):
            run.resize(Split(5, 3))
        assert run.topology.split == Split(6, 2) and run.learner is learner
    finally:
        run.close()


@pytest.mark.parametrize(
    "split, error, match",
    [
        (Split(7, 2), ConfigError, r"needs 9 devices and the run has 8; keep sampler \+ learner"),
        (Split(5, 3), ConfigError, r"learner.batch_groups \* learner.group_size = 32 is not a"),
        ((6, 2), TypeError, r"resize takes a Split\(sampler_chips, learner_chips\)"),
    ],
)
def test_plan_resize_rejects_splits_that_cannot_work(split, error, match):
    cfg = MeshConfig(mode="split", sampler_devices=6, learner_devices=2)
    with pytest.raises(error, match=match):
        plan_resize(cfg, split, jax.devices(), batch=GROUP * BATCH_GROUPS)


def test_plan_resize_builds_the_new_topology():
    cfg = MeshConfig(mode="split", sampler_devices=6, learner_devices=2)
    topology = plan_resize(cfg, Split(4, 4), jax.devices(), batch=32)
    assert topology.split == Split(4, 4)
    assert [d.id for d in topology.learner.devices.flat] == [4, 5, 6, 7]
    with pytest.raises(ConfigError, match="mesh.mode' = 'split'"):
        plan_resize(MeshConfig(), Split(4, 4), jax.devices(), batch=32)
    fixed = MeshConfig(mode="split", sampler_devices=6, learner_devices=2, learner_fsdp=2)
    with pytest.raises(ConfigError, match="mesh.learner_"):
        plan_resize(fixed, Split(5, 3), jax.devices(), batch=32)


def test_split_needs_a_chip_on_each_side():
    with pytest.raises(ValueError, match="at least one chip per role"):
        Split(8, 0)


@pytest.mark.parametrize(
    "changes, match",
    [
        ({"reallocate": True}, "mesh.reallocate' = True is invalid: expected False in colocated"),
        ({"mode": "split", "sampler_devices": 6, "learner_devices": 2, "reallocate": 1}, "True or"),
        ({"reallocate_every": 0}, "mesh.reallocate_every' = 0"),
        ({"reallocate_granularity": -1}, "mesh.reallocate_granularity' = -1"),
    ],
)
def test_mesh_config_validates_reallocation(changes, match):
    with pytest.raises(ConfigError, match=match):
        MeshConfig(**changes)


def test_reallocation_needs_async_mode():
    with pytest.raises(ConfigError, match="'mesh.reallocate' = True needs mode='async'"):
        _cfg(**{"mode": "sync", "mesh.reallocate": True})


def test_mesh_cache_builds_once_per_mesh():
    cfg = MeshConfig(mode="split", sampler_devices=6, learner_devices=2)
    a = plan_resize(cfg, Split(6, 2), jax.devices(), batch=32)
    b = plan_resize(cfg, Split(4, 4), jax.devices(), batch=32)
    again = plan_resize(cfg, Split(6, 2), jax.devices(), batch=32)
    cache, built = MeshCache(), []

    def build(name):
        built.append(name)
        return name

    assert cache.get(a.sampler, lambda: build("62")) == "62"
    assert cache.get(b.sampler, lambda: build("44")) == "44"
    assert cache.get(again.sampler, lambda: build("62 again")) == "62"
    assert built == ["62", "44"] and cache.builds == 2 and len(cache) == 2
    assert cache.peek(again.learner) is None


def test_reallocation_turns_a_phase_of_meter_events_into_stats():
    cfg = MeshConfig(mode="split", sampler_devices=6, learner_devices=2, reallocate=True)
    r = Reallocation(replace(cfg, reallocate_every=2, reallocate_granularity=2), max_staleness=1)
    rows = [
        {"version": 3, "reserved": 1, "occupied": 2},
        {"version": 4, "reserved": 2, "occupied": 1},
    ]
    # Two steps of 2 s on 4 slots: the policies held 2 slots back for 1 s in the first.
    r.meter.record(Generate(0.0, 1.0, busy_slots=4, total_slots=4, steps=10))
    r.meter.record(Generate(1.0, 2.0, busy_slots=2, total_slots=4, steps=10))
    r.meter.record(SamplerIdle(1.0, 2.0, slots=2))
    r.meter.record(LearnerWait(0.0, 1.5))
    r.meter.record(Learn(1.5, 2.0, tokens=64))
    r.meter.record(StepEnd(2.0))
    assert not r.due
    r.meter.record(Generate(2.0, 4.0, busy_slots=4, total_slots=4, steps=20))
    r.meter.record(Learn(2.0, 4.0, tokens=64))
    r.meter.record(StepEnd(4.0))
    assert r.due
    stats = r.phase(
        split=Split(6, 2), slots=4, buffer_rows=rows, batch_groups=4, estimated_switch_s=0.3
    )
    assert (stats.sampler_busy_s, stats.sampler_idle_s) == (3.5, 0.5)
    assert (stats.learner_busy_s, stats.learner_idle_s) == (2.5, 1.5)
    assert stats.sampler_occupancy == pytest.approx((4 * 1 + 2 * 1 + 4 * 2) / (3.5 * 4))
    assert stats.decode_step_s == pytest.approx(0.1)
    assert (stats.buffer_fill, stats.queued_groups) == (3 / 8, 3)
    assert stats.switch_cost_s == 0.3 and stats.granularity == 2
    assert not r.due  # a new phase began
    r.switch_cost_s = 1.25  # a resize was measured: it replaces the estimate
    r.meter.record(StepEnd(5.0))
    r.meter.record(StepEnd(6.0))
    stats = r.phase(
        split=Split(6, 2), slots=4, buffer_rows=rows, batch_groups=4, estimated_switch_s=0.3
    )
    assert stats.switch_cost_s == 1.25
    assert r.phases[-1] is stats and len(r.phases) == 2
