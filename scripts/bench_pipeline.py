"""Benchmarks the async pipeline (the real Driver) with fake engines, against baselines.

    python scripts/bench_pipeline.py                  # full run, about 8 minutes on 2 cores
    python scripts/bench_pipeline.py --only-lending   # (d) alone, about 6 minutes
    python scripts/bench_pipeline.py --quick          # tiny workloads, the smoke test's run

The Driver, StalenessBuffer and StalenessController are the real ones; the sampler,
learner and weight sync are rljax.testing.fakes whose device work is a ``time.sleep`` from a
cost model (sleeping releases the GIL, as a blocked device call does). Response lengths are
lognormal with a long tail. Figures, each a ratio taken in this run:
  (a) async learner steps/s vs the ideal min(sampler limit, learner limit), each a limit of
      the cost model measured on its own, not the driver throttled: the sampler's rate with
      every slot busy at every decode step (slots tokens per step, over the tokens a learner
      step consumes: B x G x the mean response length, from 200,000 draws of the length
      distribution), and the learner's step cost at that mean batch plus one publish. The
      driver's own rates with the other side free are printed beside them;
  (b) async vs sync steps/s on the same workload and fakes (sync: the same driver in its
      lock-step schedule: sample a whole batch of groups, then learn, then publish);
  (c) host overhead per trajectory in microseconds: the driver (eta = 4) with every cost set
      to zero, wall time / trajectories consumed, and the process's CPU time / trajectories
      (wall includes the threads' wake-up latency; CPU time is the Python work itself).
  (d) lending inside a step, on vs off (rljax.testing.fake_lending: the runtime's lending
      policy, meter, replica set and driver hooks, each loan's costs slept), on workloads
      of counted chips (a sampler of one-chip replicas, a learner whose step spreads over its
      chips): IDLE_LEARNER, where the learner waits for the sampler (Rollout-on-TrainPool can
      pay), and HELD_SAMPLER, where the staleness window holds a fast sampler back while a slow
      learner trains (Trainer-on-RollPool can pay); and BALANCED, short responses with neither
      side idle, where the policy should decline. Each ratio is lending-on samples/s over
      lending-off, median over --seeds, printed beside the simulator's prediction for the same
      workload and costs (rljax.sim with MeasuredCosts set to the fakes' cost models).
(a) and (b) are swept over eta (max_staleness) in {0, 1, 2, 4}. Rates are steady-state: taken
between the learner steps after a warm-up (the pipeline fill is excluded), the same way for
every run. The last line printed is one JSON object holding every figure.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import os
import statistics
import sys
import time

import numpy as np

from rljax.engine.sampler import Request
from rljax.policy.lending import LendDirection, LendingConfig
from rljax.policy.staleness import StalenessBuffer, StalenessController
from rljax.runtime.driver import Driver
from rljax.testing.fake_lending import LendWorkload
from rljax.testing.fakes import (
    FakeLearner,
    FakeSampler,
    FakeWeightSync,
    fake_make_batch,
    lognormal_lengths,
)

ETAS = (0, 1, 2, 4)


@dataclasses.dataclass(frozen=True)
class Workload:
    """Shapes and cost models of one benchmark run (seconds are per device call)."""

    slots: int  # sampler concurrent sequences
    group_size: int  # G responses per prompt
    batch_groups: int  # B groups per learner step
    prompt_len: int
    median_len: float  # lognormal response lengths
    sigma: float
    max_len: int
    decode_s: float  # decode step: decode_s + decode_per_slot_s * active slots
    decode_per_slot_s: float
    learn_per_token_s: float  # learner step: learn_fixed_s + learn_per_token_s * tokens
    learn_fixed_s: float
    sync_s: float  # weight publish
    steps: int  # learner steps per run
    warmup: int  # steps left out of the steady-state rate
    concurrency: int  # dispatched groups in flight, in units of slots // group_size

    def sampler_cost(self, free: bool):
        if free:
            return lambda active: 0.0
        return lambda active: self.decode_s + self.decode_per_slot_s * active

    def mean_response_len(self, draws: int = 200_000) -> float:
        """The length distribution's mean, by sampling it (the cap makes it no closed form)."""
        draw = lognormal_lengths(self.median_len, self.sigma, self.max_len)
        rng = np.random.default_rng(12345)
        return float(np.mean([draw(rng) for _ in range(draws)]))

    def limits(self) -> tuple[float, float]:
        """(sampler, learner) learner-steps/s, each side's cost model alone at its best.

        The sampler at full slot occupancy; the learner on the mean batch, plus one publish.
        """
        trajectories = self.batch_groups * self.group_size
        mean_len = self.mean_response_len()
        tokens_per_s = self.slots / (self.decode_s + self.decode_per_slot_s * self.slots)
        sampler = tokens_per_s / (trajectories * mean_len)
        batch_tokens = trajectories * (self.prompt_len + mean_len)
        learner = 1.0 / (self.learn_fixed_s + self.learn_per_token_s * batch_tokens + self.sync_s)
        return sampler, learner

    def learner_cost(self, free: bool):
        if free:
            return lambda batch: 0.0
        return lambda batch: self.learn_fixed_s + self.learn_per_token_s * batch.num_tokens


FULL = Workload(
    slots=64,
    group_size=8,
    batch_groups=8,
    prompt_len=32,
    median_len=64,
    sigma=1.0,
    max_len=512,
    decode_s=0.002,
    decode_per_slot_s=1e-5,
    learn_per_token_s=3e-5,
    learn_fixed_s=0.02,
    sync_s=0.005,
    steps=24,
    warmup=4,
    concurrency=2,
)
QUICK = dataclasses.replace(
    FULL, slots=8, group_size=4, batch_groups=2, median_len=8, max_len=64, steps=6, warmup=2
)


class _Prompts:
    """An endless stream of numbered prompts, one learner batch per chunk."""

    def __init__(self, batch: int):
        self._ids = itertools.count()
        self._batch = batch

    def __iter__(self):
        return self

    def __next__(self) -> list[dict]:
        return [{"id": next(self._ids)} for _ in range(self._batch)]


def _rewards(trajs) -> np.ndarray:
    # Cheap and varied, so no group is without signal; scoring is not what is measured here.
    return np.array([float(len(t.response_tokens) % 2) for t in trajs])


def _steady_rate(times: list[float], warmup: int) -> float:
    """Steps per second between step ``warmup`` and the last one."""
    if len(times) <= warmup + 1:
        raise ValueError(f"{len(times)} steps is too few for warmup={warmup}; raise --steps")
    return (len(times) - 1 - warmup) / (times[-1] - times[warmup])


def _driver(w, sync, *, eta: int, max_concurrent: int, times: list, **kw):
    """The real Driver over the fakes for workload ``w`` (``kw``: its sampler, learner and the
    rest); ``times`` gets each step's end."""
    return Driver(
        weight_sync=sync,
        buffer=StalenessBuffer(batch_groups=w.batch_groups, max_staleness=eta),
        controller=StalenessController(
            max_staleness=eta, batch_groups=w.batch_groups, max_concurrent=max_concurrent
        ),
        prompts=_Prompts(w.batch_groups),
        make_request=lambda ex, rid: Request(
            [1] * w.prompt_len, w.group_size, payload=ex, request_id=rid
        ),
        score=_rewards,
        make_batch=fake_make_batch,
        group_size=w.group_size,
        num_steps=w.steps,
        on_step=lambda step, metrics: times.append(time.perf_counter()),
        **kw,
    )


def run_async(
    w: Workload,
    eta: int,
    *,
    free_sampler=False,
    free_learner=False,
    zero_cost=False,
    lockstep=False,
) -> dict:
    """The real Driver over the fakes; returns its rate and counters.

    ``lockstep=True`` (eta = 0) is the synchronous baseline: the same driver in mode='sync'.
    """
    free_sampler |= zero_cost
    free_learner |= zero_cost
    learner = FakeLearner(w.learner_cost(free_learner))
    sampler = FakeSampler(
        slots=w.slots,
        step_cost_s=w.sampler_cost(free_sampler),
        length_sampler=lognormal_lengths(w.median_len, w.sigma, w.max_len),
        seed=0,
        params=learner.params,
    )
    groups_in_slots = max(1, w.slots // w.group_size)
    times: list[float] = []
    driver = _driver(
        w,
        FakeWeightSync(cost_s=0.0 if zero_cost or free_learner else w.sync_s),
        sampler=sampler,
        learner=learner,
        eta=eta,
        max_concurrent=max(w.batch_groups, w.concurrency * groups_in_slots),
        times=times,
        lockstep=lockstep,
    )
    start, cpu = time.perf_counter(), time.process_time()
    driver.run()
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu
    return {
        "steps_per_s": _steady_rate(times, w.warmup),
        "wall_s": wall,
        "cpu_s": cpu,
        "trajectories": w.steps * w.batch_groups * w.group_size,
        "sampler_steps": sampler.stats["steps"],
        "slot_occupancy": sampler.stats["tokens"] / max(1, sampler.stats["steps"] * w.slots),
    }


_COSTS = LendingConfig(
    enabled=True, prepare_s=0.02, release_s=0.01, train_prepare_s=0.02, grad_transfer_s_per_gb=0.1
)
IDLE_LEARNER = LendWorkload(
    name="idle_learner",
    sampler_chips=4,
    learner_chips=4,
    tp=1,
    slots_per_replica=16,
    group_size=8,
    batch_groups=16,
    prompt_len=32,
    median_len=64,
    sigma=0.5,
    max_len=256,
    decode_s=0.006,
    learn_per_token_s=2.25e-5,
    sync_s=0.005,
    eta=4,
    micro_batches=16,
    lending=_COSTS,
    steps=30,
    warmup=6,
)
HELD_SAMPLER = dataclasses.replace(
    IDLE_LEARNER, name="held_sampler", decode_s=0.001, learn_per_token_s=6e-5, eta=1
)
# Short responses, the learner and sampler about equally busy: nothing idles long enough to
# pay for a loan, and the policy should decline.
BALANCED = dataclasses.replace(
    IDLE_LEARNER,
    name="balanced_short",
    median_len=16,
    max_len=64,
    decode_s=0.004,
    learn_per_token_s=2.2e-5,
    eta=1,
)
LENDING = [IDLE_LEARNER, HELD_SAMPLER, BALANCED]
LEND_QUICK = [
    dataclasses.replace(w, batch_groups=4, median_len=8, max_len=64, steps=8, warmup=3)
    for w in LENDING
]


def run_lending(w: LendWorkload, lend: bool, seed: int) -> dict:
    """The real Driver over the fakes on ``w``, lending decided by the policy or off."""
    learner = FakeLearner(lambda batch: w.learn_per_token_s * batch.num_tokens)
    sampler = FakeSampler(
        slots=w.slots_per_replica * w.replicas,
        replicas=w.replicas,
        step_cost_s=lambda active: w.decode_s,
        length_sampler=lognormal_lengths(w.median_len, w.sigma, w.max_len),
        seed=seed,
        params=learner.params,
    )
    lender = w.lender(sampler) if lend else None
    parts = {"sampler": sampler, "learner": learner}
    if lender is not None:  # the lent replicas, the lending learner, its meter
        parts = lender.driver_parts(lambda: learner)
    times: list[float] = []
    driver = _driver(
        w,
        FakeWeightSync(cost_s=w.sync_s),
        eta=w.eta,
        max_concurrent=w.batch_groups * (w.eta + 1),
        times=times,
        on_boundary=lender.at_boundary if lender else None,
        **parts,
    )
    driver.run()
    out = {"samples_per_s": _steady_rate(times, w.warmup) * w.batch_groups * w.group_size}
    if lender is not None:
        d = lender.decisions[w.warmup :]  # the steps the rate is taken over
        out["lent_steps"] = {
            k.value: sum(x.loan(k) is not None for x in d)
            for k in (LendDirection.ROLLOUT_ON_TRAIN, LendDirection.TRAIN_ON_ROLL)
        }
        out["stats"] = dict(lender.stats + lender.replicas.stats)
    return out


def bench_lending(workloads: list[LendWorkload], seeds: list[int]) -> dict:
    """(d): lending on vs off per workload, runtime beside simulator (module docstring)."""
    out = {}
    for w in workloads:
        runs = {False: [], True: []}
        for seed in seeds:
            for lend in (False, True):  # in turn, so drift hits both alike
                runs[lend].append(run_lending(w, lend, seed))
        ratios = [on["samples_per_s"] / off["samples_per_s"] for off, on in zip(*runs.values())]
        sim_off = [w.simulate(False, seed, 200) for seed in seeds]
        sim_on = [w.simulate(True, seed, 200) for seed in seeds]
        sims = [on / off for on, off in zip(sim_on, sim_off)]
        lent = [r["lent_steps"] for r in runs[True]]
        out[w.name] = {
            "off_samples_per_s": statistics.median(r["samples_per_s"] for r in runs[False]),
            "on_samples_per_s": statistics.median(r["samples_per_s"] for r in runs[True]),
            "ratio": statistics.median(ratios),
            "ratio_range": [min(ratios), max(ratios)],
            "simulator_off_samples_per_s": statistics.median(sim_off),
            "simulator_on_samples_per_s": statistics.median(sim_on),
            "simulator_ratio": statistics.median(sims),
            "simulator_range": [min(sims), max(sims)],
            "lent_steps": lent,
        }
        print(
            f"lending {w.name}: on/off {statistics.median(ratios):.3f}x "
            f"[{min(ratios):.3f}, {max(ratios):.3f}] over seeds {seeds}; simulator "
            f"{statistics.median(sims):.3f}x [{min(sims):.3f}, {max(sims):.3f}]; lent steps "
            f"{lent}",
            flush=True,
        )
    return out


def bench_pipeline(w: Workload, quick: bool) -> dict:
    """(a), (b) and (c) (module docstring); returns their figures."""
    print(f"workload: {w}")
    print(f"load average at start: {os.getloadavg()[0]:.1f}")

    sampler_limit, learner_limit = w.limits()
    ideal = min(sampler_limit, learner_limit)
    print(
        f"limits of the cost model: sampler at full slot occupancy {sampler_limit:.2f} steps/s, "
        f"learner {learner_limit:.2f} steps/s -> ideal {ideal:.2f}"
    )
    sampler_alone = run_async(w, max(ETAS), free_learner=True)
    print(
        f"driver, learner free: {sampler_alone['steps_per_s']:.2f} steps/s = "
        f"{sampler_alone['steps_per_s'] / sampler_limit:.3f} of the sampler limit, "
        f"slot occupancy {sampler_alone['slot_occupancy']:.2f}"
    )
    learner_alone = run_async(w, max(ETAS), free_sampler=True)["steps_per_s"]
    print(
        f"driver, sampler free: {learner_alone:.2f} steps/s = "
        f"{learner_alone / learner_limit:.3f} of the learner limit"
    )

    sync = run_async(w, 0, lockstep=True)
    print(f"sync: {sync['steps_per_s']:.2f} steps/s, slot occupancy {sync['slot_occupancy']:.2f}")
    sweep = {}
    for eta in ETAS:
        r = run_async(w, eta)
        sweep[str(eta)] = {
            "steps_per_s": r["steps_per_s"],
            "of_ideal": r["steps_per_s"] / ideal,
            "vs_sync": r["steps_per_s"] / sync["steps_per_s"],
            "slot_occupancy": r["slot_occupancy"],
        }
        print(
            f"async eta={eta}: {r['steps_per_s']:.2f} steps/s = {r['steps_per_s'] / ideal:.3f} "
            f"of ideal, {r['steps_per_s'] / sync['steps_per_s']:.2f}x sync, "
            f"slot occupancy {r['slot_occupancy']:.2f}"
        )

    overhead = run_async(w, max(ETAS), zero_cost=True)
    per_traj_us = overhead["wall_s"] / overhead["trajectories"] * 1e6
    cpu_per_traj_us = overhead["cpu_s"] / overhead["trajectories"] * 1e6
    print(
        f"host overhead: {per_traj_us:.0f} us wall, {cpu_per_traj_us:.0f} us CPU per trajectory "
        f"({overhead['trajectories']} trajectories in {overhead['wall_s']:.2f} s, zero costs)"
    )
    print(f"load average at end: {os.getloadavg()[0]:.1f}")
    return {
        "quick": quick,
        "steps": w.steps,
        "trajectories_per_step": w.batch_groups * w.group_size,
        "sampler_limit_steps_per_s": sampler_limit,
        "learner_limit_steps_per_s": learner_limit,
        "sampler_alone_steps_per_s": sampler_alone["steps_per_s"],
        "sampler_alone_slot_occupancy": sampler_alone["slot_occupancy"],
        "learner_alone_steps_per_s": learner_alone,
        "ideal_steps_per_s": ideal,
        "sync_steps_per_s": sync["steps_per_s"],
        "sync_slot_occupancy": sync["slot_occupancy"],
        "async": sweep,
        "best_of_ideal": max(v["of_ideal"] for v in sweep.values()),
        "host_overhead_us_per_trajectory": per_traj_us,
        "host_cpu_us_per_trajectory": cpu_per_traj_us,
    }


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="tiny workloads (the smoke test)")
    p.add_argument("--steps", type=int, default=None, help="learner steps per run of (a)-(c)")
    p.add_argument("--seeds", default="0,1,2", help="comma-separated seeds of the lending runs")
    p.add_argument("--only-lending", action="store_true", help="run (d) alone")
    args = p.parse_args(argv)
    w = QUICK if args.quick else FULL
    if args.steps is not None:
        if args.steps <= w.warmup + 1:
            p.error(f"--steps={args.steps} must exceed warmup + 1 = {w.warmup + 1}")
        w = dataclasses.replace(w, steps=args.steps)
    figures = {} if args.only_lending else bench_pipeline(w, args.quick)
    seeds = [int(x) for x in args.seeds.split(",")]
    figures["lending"] = bench_lending(LEND_QUICK if args.quick else LENDING, seeds)
    print(json.dumps(figures))
    return figures


if __name__ == "__main__":
    main(sys.argv[1:])
