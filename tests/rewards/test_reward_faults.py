"""Faulty rewards through the real driver: every kind counted, the run goes on, each failed
group scored as ``reward.on_failure`` says (0.0, or dropped and replaced), no prompt lost.

The driver, buffer and controller are the real ones; the sampler, learner and weight sync are
rljax.testing.fakes with zero costs. The verifier fails deterministically by (group, sample);
its hangs wait on an event that is only set when the test ends, so a timeout is a timeout.
"""

from __future__ import annotations

import collections
import json
import math
import threading

import numpy as np
import pytest
from rljax.configs import arith_tiny

import rljax
from rljax.rewards.pool import FAILURE_KINDS, RewardPool, failure_metrics
from rljax.testing.drivers import NumberedPrompts, fake_driver, run_with_watchdog
from rljax.testing.fakes import FakeLearner, FakeSampler, constant_cost, lognormal_lengths

GROUP, BATCH, SLOTS, STEPS = 3, 2, 8, 4
WATCHDOG_S = 60.0
# Every 4th call fails, as the next kind in turn; a run scores at least STEPS * BATCH * GROUP
# = 24 completions, so every kind comes up.
FAULTS = ("raised", "nan", "inf", "type", "timeout", "type")
MAX_HANGS = 2  # each costs timeout_s


class Verifier:
    """Fails every 4th call as the next kind; remembers what it did to each (group, sample)."""

    def __init__(self):
        self.done: collections.Counter = collections.Counter()
        self.kinds: dict[tuple[int, int], str | None] = {}
        self.calls = 0
        self.lock = threading.Lock()
        self.release = threading.Event()

    def __call__(self, completion: str, example: dict) -> object:
        gid, index = map(int, completion.split(":"))
        with self.lock:
            n, self.calls = self.calls, self.calls + 1
            kind = FAULTS[(n // 4) % len(FAULTS)] if n % 4 == 0 else None
            if kind == "timeout" and self.done["timeout"] >= MAX_HANGS:
                kind = None
            self.done[kind or "ok"] += 1
            self.kinds[gid, index] = kind
        if kind == "raised":
            raise ZeroDivisionError("the verifier divided by zero")
        if kind == "timeout":
            self.release.wait(WATCHDOG_S)
        value = {"nan": math.nan, "inf": -math.inf, "type": [None, "1", [1.0]][n % 3]}
        return value.get(kind, float((gid + index) % 2))


@pytest.mark.parametrize("lockstep", [True, False])
@pytest.mark.parametrize("on_failure", ["zero", "drop"])
def test_reward_faults_through_the_driver(lockstep, on_failure):
    verifier, prompts = Verifier(), NumberedPrompts(BATCH)
    learner = FakeLearner(constant_cost(0.0))
    dynamic = on_failure == "drop"  # a NaN must never reach has_signal
    eta = 0 if lockstep else 1
    failed_groups, no_signal, steps = set(), set(), []

    pool = RewardPool(verifier, num_workers=3, timeout_s=0.3, on_failure=on_failure)

    def score(trajs):
        rewards = pool.score([f"{t.group_id}:{t.sample_index}" for t in trajs], [{}] * len(trajs))
        by_group = collections.defaultdict(list)
        for t, r in zip(trajs, rewards, strict=True):
            by_group[t.group_id].append(r)
        for gid, rs in by_group.items():
            if np.isnan(rs).any():
                failed_groups.add(gid)
            elif dynamic and len(set(rs)) == 1:
                no_signal.add(gid)
        return rewards

    def check_rewards(groups):
        for g in groups:
            for t, r in zip(g.trajectories, g.rewards, strict=True):
                assert np.isfinite(r), "a failed reward reached the learner"
                if verifier.kinds[t.group_id, t.sample_index] is not None:
                    assert r == 0.0, "a failed sample scored other than 0.0"

    def on_step(step, metrics):
        steps.append({**metrics, **failure_metrics(pool.stats.by_kind())})

    driver, record = fake_driver(
        sampler=FakeSampler(
            slots=SLOTS, step_cost_s=constant_cost(0.0), length_sampler=lognormal_lengths(3, 1, 8)
        ),
        learner=learner,
        group_size=GROUP,
        batch_groups=BATCH,
        num_steps=STEPS,
        score=score,
        eta=eta,
        max_concurrent=SLOTS // GROUP,
        prompt=(1, 2),
        prompts=prompts,
        on_batch=check_rewards,
        lockstep=lockstep,
        dynamic_sampling=dynamic,
        on_step=on_step,
    )
    consumed, examples = record.consumed, record.dispatched
    try:
        run_with_watchdog(driver, WATCHDOG_S)
    finally:
        verifier.release.set()
        pool.close()

    assert learner.version == STEPS, "the run did not go on"
    stats = pool.stats
    # Every kind the verifier produced is counted as that kind, completion by completion.
    assert stats.by_kind() == {k: verifier.done[k] for k in FAILURE_KINDS}
    assert all(verifier.done[k] for k in ("raised", "nan", "inf", "type", "timeout"))
    last = steps[-1]
    assert last["reward_errors"] == sum(last[f"reward_errors/{k}"] for k in FAILURE_KINDS) > 0
    # Lock-step scores everything before it learns; threaded, the reward thread may still score
    # groups after the last step's metrics were written.
    for k in FAILURE_KINDS:
        assert last[f"reward_errors/{k}"] == verifier.done[k] or (
            not lockstep and last[f"reward_errors/{k}"] <= verifier.done[k]
        )
    counters = driver.counters
    if on_failure == "drop":
        assert counters["dropped_reward_failure"] == len(failed_groups) > 0
        assert counters["dropped_no_signal"] == len(no_signal)
        assert not {examples[g] for g in failed_groups} & set(consumed)
    else:
        assert counters["dropped_reward_failure"] == 0 and not failed_groups
    # Nothing lost: every prompt drawn is consumed, dropped, still pending or buffered.
    assert counters["surplus_aborted"] == 0  # no overprovision: no prompt leaves as surplus
    state = driver.checkpoint_state()
    pending = [e["id"] for e in state["pending"]]
    buffered = [g.example["id"] for b in driver.buffer._slots.values() for _, _, g in b.groups]
    dropped = [examples[g] for g in failed_groups | no_signal]
    accounted = consumed + dropped + pending + buffered
    assert sorted(accounted) == sorted(set(accounted)), "a prompt was used twice"
    assert set(accounted) == set(prompts.issued), "a prompt was lost"
    assert len(consumed) == STEPS * BATCH


class RunVerifier:
    """The tiny real run's reward: of every 40 calls, the first 6 fail (one of each kind, two
    of the wrong type), so most groups of 8 are clean and a sync run can fill its batch."""

    CYCLE = ("raised", "nan", "inf", "type", "type", "timeout") + (None,) * 34

    def __init__(self):
        self.done: collections.Counter = collections.Counter()
        self.calls = 0
        self.lock = threading.Lock()
        self.release = threading.Event()

    def __call__(self, completion: str, example: dict) -> object:
        with self.lock:
            kind = self.CYCLE[self.calls % len(self.CYCLE)]
            if kind == "timeout" and self.done["timeout"] >= MAX_HANGS:
                kind = None
            self.calls += 1
            self.done[kind or "ok"] += 1
        if kind == "raised":
            raise ValueError("bad answer format")
        if kind == "timeout":
            self.release.wait(WATCHDOG_S)
        if kind in ("nan", "inf"):
            return float(kind)
        if kind == "type":
            return None if self.calls % 2 else "1.0"
        return float(completion.strip() == example["answer"])


@pytest.mark.slow
@pytest.mark.parametrize("on_failure", ["drop"])
def test_reward_faults_in_a_tiny_real_run(tmp_path, on_failure):
    verifier = RunVerifier()
    cfg = rljax.replace(
        arith_tiny.recipe("small"),
        **{
            "num_steps": 2,
            "reward.on_failure": on_failure,
            "reward.timeout_s": 2.0,
            "checkpoint.enabled": True,
        },
    )
    try:
        summary = rljax.run(cfg, str(tmp_path), reward_fn=verifier)
    finally:
        verifier.release.set()
    assert summary["steps"] == 2
    lines = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in lines if r["phase"] == "train"]
    assert len(train) == 2
    last = train[-1]
    for kind in FAILURE_KINDS:
        assert f"reward_errors/{kind}" in last
        assert last[f"reward_errors/{kind}"] <= verifier.done[kind]
    assert last["reward_errors"] == sum(last[f"reward_errors/{k}"] for k in FAILURE_KINDS)
    for kind in ("raised", "nan", "inf", "type", "timeout"):
        assert last[f"reward_errors/{kind}"] > 0, kind
    assert last["dropped_reward_failure"] > 0
    assert all(math.isfinite(r["reward"]) for r in train)
    # The checkpoint holds the run config: resuming with a different one is refused by name,
    # before any array is read; a longer run with more workers is a legitimate resume.
    changed = rljax.replace(cfg, **{"learner.learning_rate": 5e-4, "num_steps": 4})
    with pytest.raises(rljax.ConfigError, match=r"learner.learning_rate \(0.001 -> 0.0005\)"):
        rljax.Run(changed, str(tmp_path), reward_fn=verifier)
