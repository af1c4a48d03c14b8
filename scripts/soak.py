"""Overload and soak: many groups through the real Driver, the sampler 10x faster than the learner.

    python scripts/soak.py                        # 10,000 groups, a few minutes on a 2-core CPU
    python scripts/soak.py --groups 400           # the test's size

The Driver, StalenessBuffer and StalenessController are the real ones; the sampler, learner
and weight sync are rljax.testing.fakes (device work is a sleep). The run first measures the
sampler's own rate (groups/s with a free learner) and then sets the learner's step cost so it
consumes ten times slower: the limit the overload is defined against is measured in the same
run. Figures, per interval of ``--interval`` groups:
  - every host queue's peak (rljax.testing.soak.queue_lengths) against its bound from the config;
  - host memory: tracemalloc's current and peak bytes (Python allocations), the bytes held
    by everything but this script's own audit list ("pipeline"), and the process's RSS and its
    high-water mark (VmRSS, VmHWM from /proc/self/status);
  - live threads.
At the end: no queue past its bound, the thread count back where it started, every group drawn
accounted for (consumed, aborted as surplus, pending or held), and the memory growth from the
first steady interval to the last. The last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import threading
import time
import tracemalloc

import numpy as np

from rljax.engine.sampler import Request
from rljax.metrics import Timeline
from rljax.policy import admission
from rljax.policy.staleness import StalenessBuffer
from rljax.runtime.driver import Driver
from rljax.testing.fakes import (
    FakeLearner,
    FakeSampler,
    FakeWeightSync,
    constant_cost,
    fake_make_batch,
    lognormal_lengths,
)
from rljax.testing.soak import QUEUES, QueueProbe, queue_bounds

SLOTS, GROUP, BATCH, ETA, OVERPROVISION = 32, 4, 8, 2, 1
DECODE_S = 0.0002  # one decode step of the fake sampler
TRACE_EVENTS = 2_000  # the Timeline's cap for this run (the default is larger; see metrics.py)
SLOWDOWN = 10.0  # the learner consumes this many times slower than the sampler produces


class _Prompts:
    def __init__(self):
        self.drawn = 0
        self._ids = itertools.count()

    def __iter__(self):
        return self

    def __next__(self) -> list[dict]:
        self.drawn += BATCH
        return [{"id": next(self._ids)} for _ in range(BATCH)]


class _ProbedSampler(FakeSampler):
    probe: QueueProbe | None = None
    every = 1

    def step(self):
        if self.probe is not None and self.stats["steps"] % self.every == 0:
            self.probe.sample()
        return super().step()


def _rss() -> dict[str, int]:
    """VmRSS and VmHWM in bytes (0 where /proc is missing)."""
    out = {"rss_bytes": 0, "rss_peak_bytes": 0}
    try:
        with open("/proc/self/status") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key in ("VmRSS", "VmHWM"):
                    name = "rss_bytes" if key == "VmRSS" else "rss_peak_bytes"
                    out[name] = int(value.split()[0]) * 1024
    except OSError:
        pass
    return out


def _driver(groups: int, learn_s: float, on_step=None, probe_every: int = 1):
    prompts, consumed = _Prompts(), []

    def make_batch(gs):
        consumed.extend(g.example["id"] for g in gs)
        return fake_make_batch(gs)

    sampler = _ProbedSampler(
        slots=SLOTS,
        step_cost_s=constant_cost(DECODE_S),
        length_sampler=lognormal_lengths(8, 1.0, 64),
    )
    sampler.every = probe_every
    driver = Driver(
        sampler=sampler,
        learner=FakeLearner(constant_cost(learn_s)),
        weight_sync=FakeWeightSync(),
        buffer=StalenessBuffer(batch_groups=BATCH, max_staleness=ETA, overprovision=OVERPROVISION),
        controller=admission.controller(
            slots=SLOTS,
            group_size=GROUP,
            batch_groups=BATCH,
            max_staleness=ETA,
            overprovision=OVERPROVISION,
        ),
        prompts=prompts,
        make_request=lambda ex, rid: Request([1] * 16, GROUP, payload=ex, request_id=rid),
        score=lambda trajs: np.array([float(len(t.response_tokens) % 2) for t in trajs]),
        make_batch=make_batch,
        group_size=GROUP,
        num_steps=max(1, groups // BATCH),
        on_step=on_step,
        timeline=Timeline(max_events=TRACE_EVENTS),
    )
    return driver, prompts, consumed


def sampler_rate(groups: int = 20 * BATCH) -> float:
    """Groups per second the sampler delivers with a free learner (the overload's reference)."""
    driver, _, consumed = _driver(groups, 0.0)
    start = time.perf_counter()
    driver.run()
    return len(consumed) / (time.perf_counter() - start)


def soak(groups: int, *, interval: int, probe_every: int = 1, log=print) -> dict:
    """Runs ``groups`` groups with the learner ``SLOWDOWN`` x slower; returns the figures."""
    rate = sampler_rate()
    learn_s = SLOWDOWN * BATCH / rate
    log(f"sampler alone: {rate:.0f} groups/s; learner step set to {learn_s * 1e3:.1f} ms")
    tracemalloc.start()
    intervals: list[dict] = []
    start = time.perf_counter()
    steps_per_interval = max(1, interval // BATCH)

    def on_step(step, metrics):
        if (step + 1) % steps_per_interval:
            return
        current, peak = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        # What the pipeline holds, without this script's own audit list (one id per group).
        snapshot = tracemalloc.take_snapshot().filter_traces([tracemalloc.Filter(False, __file__)])
        held = sum(stat.size for stat in snapshot.statistics("filename"))
        lengths = probe.sample()
        row = {
            "groups": (step + 1) * BATCH,
            "wall_s": round(time.perf_counter() - start, 2),
            "traced_bytes": current,
            "traced_peak_bytes": peak,
            "pipeline_bytes": held,
            **_rss(),
            **lengths,
        }
        intervals.append(row)
        log(
            f"{row['groups']:>6} groups {row['wall_s']:>7.1f}s traced {current / 1e6:6.2f} MB "
            f"(peak {peak / 1e6:6.2f}, pipeline {held / 1e6:6.3f}) "
            f"rss {row['rss_bytes'] / 1e6:6.1f} MB threads "
            f"{row['threads']} queues "
            + " ".join(f"{k}={lengths[k]}" for k in QUEUES if k not in ("threads",))
        )

    driver, prompts, consumed = _driver(groups, learn_s, on_step, probe_every)
    probe = QueueProbe(driver)
    driver.sampler.probe = probe
    threads_before = threading.active_count()
    bounds = queue_bounds(driver, prompt_chunk=BATCH, threads_before=threads_before)
    driver.run()
    threads_after = threading.active_count()
    tracemalloc.stop()
    state = driver.checkpoint_state()
    held = sum(len(b["groups"]) for b in state["buffer"]["buffers"])
    surplus = driver.counters["surplus_aborted"]
    accounted = len(consumed) + surplus + len(state["pending"]) + held
    # Growth from the first steady interval (the pipeline full, the trace capped) to the last.
    steady = intervals[1:] or intervals
    growth = steady[-1]["pipeline_bytes"] - steady[0]["pipeline_bytes"] if steady else 0
    over = probe.over(bounds)
    return {
        "groups": len(consumed),
        "sampler_groups_per_s": round(rate, 1),
        "learner_step_s": round(learn_s, 4),
        "slowdown": SLOWDOWN,
        "wall_s": round(time.perf_counter() - start, 1),
        "peak": probe.peak,
        "bounds": bounds,
        "over_bound": {k: list(v) for k, v in over.items()},
        "threads_before": threads_before,
        "threads_after": threads_after,
        "drawn": prompts.drawn,
        "accounted": accounted,
        "lost": prompts.drawn - accounted,
        "duplicated": len(consumed) - len(set(consumed)),
        "traced_peak_bytes": max((r["traced_peak_bytes"] for r in intervals), default=0),
        "pipeline_growth_bytes": growth,
        "rss_peak_bytes": _rss()["rss_peak_bytes"],
        "intervals": intervals,
        "ok": not over
        and threads_after <= threads_before
        and prompts.drawn == accounted
        and len(consumed) == len(set(consumed)),
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--groups", type=int, default=10_000, help="groups to consume")
    parser.add_argument("--interval", type=int, default=1_000, help="groups per report line")
    parser.add_argument("--probe-every", type=int, default=4, help="decode steps per probe")
    args = parser.parse_args(argv)
    if args.groups < BATCH or args.interval < BATCH:
        parser.error(f"--groups and --interval must be at least one batch ({BATCH} groups)")
    result = soak(args.groups, interval=args.interval, probe_every=args.probe_every)
    print(
        "peaks vs bounds: "
        + ", ".join(f"{k} {result['peak'][k]}/{result['bounds'][k]}" for k in QUEUES)
    )
    print(
        f"groups lost {result['lost']}, duplicated {result['duplicated']}; threads "
        f"{result['threads_before']} -> {result['threads_after']}; pipeline memory growth "
        f"{result['pipeline_growth_bytes'] / 1e3:+.1f} KB over the steady intervals"
    )
    print(json.dumps(result))
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
