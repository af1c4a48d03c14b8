"""Benchmarks the async pipeline (the real Driver) with fake engines, against baselines.

    python scripts/bench_pipeline.py --no-lending     # (a)-(c): 3 workloads x 5 seeds
    python scripts/bench_pipeline.py --only-lending   # (d) alone
    python scripts/bench_pipeline.py --quick          # tiny workloads, the smoke test's run

The Driver, StalenessBuffer and admission (``rljax.policy.admission``, the runtime's rule) are
the real ones; the sampler, learner and weight sync are rljax.testing.fakes whose device work is
a ``time.sleep`` from a cost model (sleeping releases the GIL, as a blocked device call does).
Response lengths are lognormal with a long tail. Figures, each a ratio taken in this run:
  (a) async learner steps/s vs the ideal min(sampler limit, learner limit), each a limit of
      the cost model measured on its own, not the driver throttled: the sampler's rate with
      every slot busy at every decode step (slots tokens per step, over the tokens a learner
      step consumes: B x G x the mean response length, from 200,000 draws of the length
      distribution), and the learner's step cost at that mean batch plus one publish. Beside
      it, per eta, the staleness bound: a ceiling on the most of that ideal any schedule, even
      one knowing every length, reaches when each group's oldest token is at most eta versions
      old (rljax.testing.pipeline_workload.Workload.staleness_bound), and what one constructed
      schedule of the same relaxation reaches (staleness_reachable), and the relaxation's
      floor with the groups taken in the order drawn (in_order=True: no sort). Per eta also: slot
      occupancy, the staleness histogram of consumed groups, the fraction of trajectories
      whose tokens span several params versions (partial rollout across versions: in-flight
      swaps) and the tokens prefilled again. Three workloads (median 64,
      sigma 1.0; sigma 1.5; a learner-bound one), each over --seeds, as median and range;
  (b) async vs sync steps/s on the first workload (sync: the same driver in its lock-step
      schedule: sample a whole batch of groups, then learn, then publish);
  (c) host overhead per trajectory in microseconds: the driver (eta = 4) with every cost set
      to zero, wall time / trajectories consumed, and the process's CPU time / trajectories.
  (d) lending inside a step, on vs off (rljax.testing.fake_lending: the runtime's lending
      policy, meter, replica set and driver hooks, each loan's costs slept), on workloads
      of counted chips: IDLE_LEARNER (Rollout-on-TrainPool can pay), HELD_SAMPLER
      (Trainer-on-RollPool can pay) and BALANCED (the policy should decline). Each ratio is
      lending-on samples/s over lending-off, median over --seeds, printed beside the
      simulator's prediction for the same workload and costs.
  (e) conversations that wait for tools (rljax.testing.fake_sampler's multi-turn samples: a
      waiting conversation holds its slot, its env answers after a lognormal tool latency
      about as long as a turn's decode): conversations/s, async at eta 2 over sync, median
      and range over --seeds (--only-agents runs it alone).
Rates are steady-state: taken between the learner steps after a warm-up (the pipeline fill is
excluded), the same way for every run. The last line printed is one JSON object holding every
figure.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import itertools
import json
import os
import statistics
import sys
import time

import numpy as np

from rljax.engine.sampler import Request
from rljax.policy import admission
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
from rljax.testing.pipeline_workload import Workload

ETAS = (0, 1, 2, 4)


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
    steps=16,
    warmup=3,
)
# The three workloads of (a): the one above, a longer tail, and one the learner bounds.
WORKLOADS = [
    FULL,
    dataclasses.replace(FULL, name="lognormal_s1.5", sigma=1.5),
    dataclasses.replace(FULL, name="learner_bound", learn_per_token_s=6e-5),
]
# (e) conversations: up to 4 turns of lognormal length (median 32), each but the last followed by
# a tool call whose latency (lognormal, median 85 ms) equals a median turn's decode at full
# occupancy (32 x 2.64 ms); the tool's reply is 16 tokens.
AGENTS = dataclasses.replace(
    FULL,
    name="agents",
    median_len=32,
    max_turns=4,
    tool_median_s=0.0845,
    obs_tokens=16,
    steps=12,
    warmup=2,
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


def _driver(
    w, sync, *, eta: int, controller, times: list, on_step=None, make_batch=fake_make_batch, **kw
):
    """The real Driver over the fakes for workload ``w`` (``kw``: its sampler, learner and the
    rest); ``times`` gets each step's end, ``on_step`` each step's metrics."""

    def step_done(step, metrics):
        times.append(time.perf_counter())
        if on_step is not None:
            on_step(metrics)

    return Driver(
        weight_sync=sync,
        buffer=StalenessBuffer(batch_groups=w.batch_groups, max_staleness=eta),
        controller=controller,
        prompts=_Prompts(w.batch_groups),
        make_request=lambda ex, rid: Request(
            [1] * w.prompt_len, w.group_size, payload=ex, request_id=rid
        ),
        score=_rewards,
        make_batch=make_batch,
        group_size=w.group_size,
        num_steps=w.steps,
        on_step=step_done,
        **kw,
    )


def run_async(
    w: Workload,
    eta: int,
    *,
    seed: int = 0,
    free_sampler=False,
    free_learner=False,
    zero_cost=False,
    lockstep=False,
) -> dict:
    """The real Driver over the fakes; returns its rate, counters and what its batches held.

    ``lockstep=True`` (eta = 0) is the synchronous baseline: the same driver in mode='sync'.
    Admission is the runtime's own rule (``rljax.policy.admission.controller``: groups in flight
    derived from the slots and the staleness window), not a constant of this script.
    """
    free_sampler |= zero_cost
    free_learner |= zero_cost
    learner = FakeLearner(w.learner_cost(free_learner))
    sampler = w.sampler(seed=seed, params=learner.params, free=free_sampler)
    times: list[float] = []
    staleness: collections.Counter = collections.Counter()
    spans = [0, 0]  # trajectories consumed after the warm-up: spanning several versions, all

    # Steps warmup + 1 onwards are the ones the rate is taken over (on_step runs after the
    # step's time is appended, make_batch before).
    def on_step(metrics):
        if len(times) > w.warmup + 1:
            staleness.update({int(k): v for k, v in metrics["staleness_hist"].items()})

    def make_batch(groups):
        if len(times) > w.warmup:
            trajs = [t for g in groups for t in g.trajectories]
            spans[0] += sum(len(set(t.versions)) > 1 for t in trajs)
            spans[1] += len(trajs)
        return fake_make_batch(groups)

    controller = admission.controller(
        slots=w.slots, group_size=w.group_size, batch_groups=w.batch_groups, max_staleness=eta
    )
    driver = _driver(
        w,
        FakeWeightSync(cost_s=0.0 if zero_cost or free_learner else w.sync_s),
        sampler=sampler,
        learner=learner,
        eta=eta,
        controller=controller,
        times=times,
        on_step=on_step,
        make_batch=make_batch,
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
        "staleness_hist": {str(k): staleness[k] for k in sorted(staleness)},
        "multi_version_fraction": spans[0] / max(1, spans[1]),
        # The fakes' in-flight swap keeps every sequence's KV: nothing is prefilled again.
        "reprefilled_tokens": sampler.stats["reprefilled_tokens"],
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
QUICK_AGENTS = dataclasses.replace(
    QUICK, name="agents", max_turns=3, tool_median_s=0.01, obs_tokens=4
)
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
        controller=StalenessController(
            max_staleness=w.eta,
            batch_groups=w.batch_groups,
            max_concurrent=w.batch_groups * (w.eta + 1),
        ),
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


def _spread(values: list[float]) -> dict:
    return {"median": statistics.median(values), "range": [min(values), max(values)]}


def bench_workload(w: Workload, seeds: list[int], etas: tuple[int, ...], sync: bool) -> dict:
    """(a) and (b) on one workload: per eta, the median and range over ``seeds`` of the fraction
    of the ideal, slot occupancy and (with ``sync``) the ratio to sync; the staleness histogram,
    the trajectories that span several versions and the tokens prefilled again, summed."""
    sampler_limit, learner_limit = w.limits()
    ideal = min(sampler_limit, learner_limit)
    print(
        f"[{w.name}] limits of the cost model: sampler at full slot occupancy "
        f"{sampler_limit:.2f} steps/s, learner {learner_limit:.2f} steps/s -> ideal {ideal:.2f}",
        flush=True,
    )
    alone = [run_async(w, max(etas), seed=seed, free_learner=True) for seed in seeds]
    out: dict = {
        "sampler_limit_steps_per_s": sampler_limit,
        "learner_limit_steps_per_s": learner_limit,
        "ideal_steps_per_s": ideal,
        "learner_free_of_sampler_limit": _spread([r["steps_per_s"] / sampler_limit for r in alone]),
        "learner_free_slot_occupancy": _spread([r["slot_occupancy"] for r in alone]),
    }
    print(
        f"[{w.name}] driver, learner free: {out['learner_free_of_sampler_limit']} of the "
        f"sampler limit, slot occupancy {out['learner_free_slot_occupancy']}",
        flush=True,
    )
    syncs = [run_async(w, 0, seed=seed, lockstep=True) for seed in seeds] if sync else []
    if syncs:
        out["sync_steps_per_s"] = _spread([r["steps_per_s"] for r in syncs])
        out["sync_slot_occupancy"] = _spread([r["slot_occupancy"] for r in syncs])
        print(f"[{w.name}] sync: {out['sync_steps_per_s']} steps/s", flush=True)
    out["async"] = {}
    for eta in etas:
        runs = [run_async(w, eta, seed=seed) for seed in seeds]
        hist: collections.Counter = collections.Counter()
        for r in runs:
            hist.update({int(k): v for k, v in r["staleness_hist"].items()})
        bound, reachable = w.staleness_bound(eta), w.staleness_reachable(eta)
        in_order = w.staleness_bound(eta, in_order=True)
        row = {
            "steps_per_s": _spread([r["steps_per_s"] for r in runs]),
            "of_ideal": _spread([r["steps_per_s"] / ideal for r in runs]),
            "staleness_bound_of_ideal": bound,
            "staleness_reachable_of_ideal": reachable,
            "staleness_bound_in_order_of_ideal": in_order,
            "of_bound": _spread([r["steps_per_s"] / ideal / bound for r in runs]),
            "slot_occupancy": _spread([r["slot_occupancy"] for r in runs]),
            "staleness_hist": {str(k): hist[k] for k in sorted(hist)},
            "multi_version_fraction": _spread([r["multi_version_fraction"] for r in runs]),
            "reprefilled_tokens": sum(r["reprefilled_tokens"] for r in runs),
        }
        if syncs:
            row["vs_sync"] = _spread(
                [r["steps_per_s"] / s["steps_per_s"] for r, s in zip(runs, syncs)]
            )
        out["async"][str(eta)] = row
        print(
            f"[{w.name}] async eta={eta}: of ideal {row['of_ideal']} (staleness bound "
            f"{bound:.3f}, a schedule reaches {reachable:.3f}, groups in drawn order "
            f"{in_order:.3f}; of the bound {row['of_bound']}), "
            "slot occupancy "
            f"{row['slot_occupancy']}, vs sync {row.get('vs_sync')}, staleness "
            f"{row['staleness_hist']}, spanning versions {row['multi_version_fraction']}",
            flush=True,
        )
    return out


def bench_agents(w: Workload, seeds: list[int]) -> dict:
    """(e): conversations per second, async (eta = 2) over sync, per seed on workload ``w``."""
    runs = {
        mode: [run_async(w, eta, seed=seed, lockstep=eta == 0) for seed in seeds]
        for mode, eta in (("sync", 0), ("async_eta2", 2))
    }
    per_step = w.batch_groups * w.group_size
    rates = {m: [r["steps_per_s"] * per_step for r in rs] for m, rs in runs.items()}
    ratios = [a / s for a, s in zip(rates["async_eta2"], rates["sync"])]
    out = {m: _spread(r) for m, r in rates.items()} | {"async_vs_sync": _spread(ratios)}
    print(f"[{w.name}] conversations/s: {out}", flush=True)
    return out


def bench_pipeline(workloads: list[Workload], seeds: list[int], quick: bool) -> dict:
    """(a), (b) and (c) (module docstring); returns their figures."""
    print(f"load average at start: {os.getloadavg()[0]:.1f}")
    figures: dict = {"quick": quick, "seeds": seeds, "workloads": {}}
    for i, w in enumerate(workloads):
        print(f"workload: {w}")
        # Sync and eta = 0 on the first workload only (eta = 0 is sync's schedule, and slow).
        etas = ETAS if i == 0 else tuple(eta for eta in ETAS if eta > 0)
        figures["workloads"][w.name] = bench_workload(w, seeds, etas, sync=i == 0)
    w = workloads[0]
    figures["steps"] = w.steps
    figures["trajectories_per_step"] = w.batch_groups * w.group_size
    learner_alone = run_async(w, max(ETAS), free_sampler=True)["steps_per_s"]
    figures["learner_alone_of_learner_limit"] = learner_alone / w.limits()[1]
    print(f"driver, sampler free: {figures['learner_alone_of_learner_limit']:.3f} of the limit")
    overhead = run_async(w, max(ETAS), zero_cost=True)
    figures["host_overhead_us_per_trajectory"] = overhead["wall_s"] / overhead["trajectories"] * 1e6
    figures["host_cpu_us_per_trajectory"] = overhead["cpu_s"] / overhead["trajectories"] * 1e6
    print(
        f"host overhead: {figures['host_overhead_us_per_trajectory']:.0f} us wall, "
        f"{figures['host_cpu_us_per_trajectory']:.0f} us CPU per trajectory (zero costs)"
    )
    print(f"load average at end: {os.getloadavg()[0]:.1f}")
    return figures


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="tiny workloads (the smoke test)")
    p.add_argument("--steps", type=int, default=None, help="learner steps per run of (a)-(c)")
    p.add_argument("--seeds", default="0,1,2,3,4", help="comma-separated seeds of every run")
    p.add_argument("--only-lending", action="store_true", help="run (d) alone")
    p.add_argument("--no-lending", action="store_true", help="leave (d) out")
    p.add_argument("--only-agents", action="store_true", help="run (e) alone")
    args = p.parse_args(argv)
    workloads = [QUICK] if args.quick else WORKLOADS
    if args.steps is not None:
        if args.steps <= workloads[0].warmup + 1:
            p.error(f"--steps={args.steps} must exceed warmup + 1 = {workloads[0].warmup + 1}")
        workloads = [dataclasses.replace(w, steps=args.steps) for w in workloads]
    seeds = [int(x) for x in args.seeds.split(",")]
    if args.only_agents:
        agents = QUICK_AGENTS if args.quick else AGENTS
        figures = {"agents": bench_agents(agents, seeds)}
        print(json.dumps(figures))
        return figures
    figures = {} if args.only_lending else bench_pipeline(workloads, seeds, args.quick)
    if not args.only_lending:
        figures["agents"] = bench_agents(QUICK_AGENTS if args.quick else AGENTS, seeds)
    if not args.no_lending:
        figures["lending"] = bench_lending(LEND_QUICK if args.quick else LENDING, seeds)
    print(json.dumps(figures))
    return figures


if __name__ == "__main__":
    main(sys.argv[1:])
