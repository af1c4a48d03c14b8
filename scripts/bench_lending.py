"""Benchmarks lending inside a step: the same short async run with lending off and forced on.

    python scripts/bench_lending.py            # 8 RL steps per mode, 6/2 split, eta = 1
    python scripts/bench_lending.py --quick    # 3 RL steps per mode: a smoke test
    python scripts/bench_lending.py --slots 16 --steps 12 --repeats 2
    python scripts/bench_lending.py --slots 32 --ppo-epochs 4   # the learner holds the sampler
    python scripts/bench_lending.py > bench.txt          # then the simulator's prediction:
    python scripts/bench_lending.py --simulate bench.txt

Every mode runs the default recipe's small variant (``configs/arith_tiny.py:small``, the tiny
model) in ``mode='async'`` with ``buffer.max_staleness=1`` on 8 fake CPU devices split 6/2,
with ``--slots`` decode slots on the sampler (fewer slots than a batch needs, so the learner
waits for its batch: the idle learner time Rollout-on-TrainPool reclaims). Modes:

- ``off``: no lending (the baseline);
- ``rollout_on_train``: every step, a replica on the learner's 2 chips serves while it waits;
- ``train_on_roll``: every step, half the micro-batches' gradients run on the sampler's chips;
- ``policy``: lending on, decided by ``rljax.policy.lending.decide`` from the measured phase.

Throughput is a batch's trained samples over the median ``step_s`` of the RL steps after the
first (which compiles the lent engine and gradient function); modes run in turn,
``--repeats`` times, and the median per mode is reported with its ratio to ``off``. On the CPU
the fake devices share the host's cores, so a ratio says whether lending's mechanism pays for
itself here, not what it buys on chips that compute in parallel. The last line printed is one
JSON object of every figure, with ``phases``: the lending-off run's median per-step seconds.

``--simulate FILE`` runs no runtime: it reads a previous run's JSON line from FILE and predicts
the lending ratios for the same workload (B, G, eta = 1, the 6/2 split, ``--slots``, the
recipe's responses) in the simulator, with the costs that run measured without lending
(``rljax.sim.measured.MeasuredCosts``: a decode step, a prefill, a learner step, a publish),
and prints each beside the measured ratio. The simulator's chips compute in parallel; the fake
CPU devices do not, so a predicted ratio above the measured one is the cores' contention.
Trainer-on-RollPool is not predicted: the sampler here is one engine on all 6 of its devices,
and the simulator keeps one replica sampling.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import sys
import tempfile

os.environ.setdefault("JAX_NUM_CPU_DEVICES", "8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

from rljax.configs import arith_tiny  # noqa: E402

from rljax.config import replace  # noqa: E402
from rljax.policy.lending import LendDirection, LendingDecision  # noqa: E402
from rljax.runtime import Run  # noqa: E402
from rljax.testing import audit  # noqa: E402

MODES = ("off", "rollout_on_train", "train_on_roll", "policy")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=8, help="RL steps per run (the first untimed)")
    p.add_argument("--slots", type=int, default=8, help="the sampler's decode slots")
    p.add_argument("--micro-batches", type=int, default=2, help="learner.micro_batches")
    p.add_argument(
        "--ppo-epochs",
        type=int,
        default=1,
        help="learner.ppo_epochs: updates per batch (> 1: a learner that holds the sampler back)",
    )
    p.add_argument("--repeats", type=int, default=1, help="runs per mode (median)")
    p.add_argument("--modes", default=",".join(MODES), help=f"comma-separated, of {MODES}")
    p.add_argument("--quick", action="store_true", help="3 steps per run: a smoke test")
    p.add_argument("--simulate", metavar="FILE", help="predict from a previous run's JSON line")
    args = p.parse_args(argv)
    if args.quick:
        args.steps = 3
    args.modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    bad = [m for m in args.modes if m not in MODES]
    if bad:
        p.error(f"--modes names {bad}; use some of {list(MODES)}")
    if args.steps < 2:
        p.error(f"--steps={args.steps}: need >= 2 (the first step is not timed)")
    if args.ppo_epochs < 1:
        p.error(f"--ppo-epochs={args.ppo_epochs}: need >= 1")
    if args.slots < 8:
        p.error(f"--slots={args.slots}: a group of 8 samples needs >= 8 decode slots")
    return args


def config(args, mode: str):
    return replace(
        arith_tiny.recipe("small"),
        **{
            "mode": "async",
            "buffer.max_staleness": 1,
            "mesh.mode": "split",
            "mesh.sampler_devices": 6,
            "mesh.learner_devices": 2,
            "sampling.max_concurrent_decodes": args.slots,
            "learner.micro_batches": args.micro_batches,
            "learner.ppo_epochs": args.ppo_epochs,
            "lending.enabled": mode != "off",
            "num_steps": args.steps,
        },
    )


FORCED = {
    "rollout_on_train": LendingDecision(LendDirection.ROLLOUT_ON_TRAIN, 2, 0.0, 0.0, "forced"),
    "train_on_roll": LendingDecision(LendDirection.TRAIN_ON_ROLL, 6, 0.5, 0.0, "forced"),
}


def run_once(args, mode: str) -> dict:
    """One run of ``mode``: trained samples per second after the first step, and what lent."""
    cfg = config(args, mode)
    workdir = tempfile.mkdtemp(prefix=f"bench_lending_{mode}_")
    run = Run(cfg, workdir)
    try:
        if run.parts.lender is not None:
            run.parts.lender.force = FORCED.get(mode)  # None: the policy decides
        run.train()
    finally:
        run.close()
    train = [r for r in audit.read_metrics(pathlib.Path(workdir)) if r["phase"] == "train"]
    # The median step: a compile in a later step (a new prefill bucket, the policy's first
    # lend) does not swing the figure.
    step_s = statistics.median(r["step_s"] for r in train[1:])
    samples = cfg.learner.batch_groups * cfg.learner.group_size
    lent = {}
    for r in train:
        for k, v in r.items():
            if k.startswith("lending/") and isinstance(v, int | float):
                lent[k] = lent.get(k, 0) + v
    return {
        "samples_per_s": samples / max(step_s, 1e-9),
        "phases": phases(train[1:]),
        "staleness_max": max(r["staleness_max"] for r in train),
        "lent": {k: v for k, v in lent.items() if k not in ("lending/chips", "lending/share")},
    }


def phases(train: list[dict]) -> dict:
    """Median per-step seconds of the recorded steps: what the simulator's costs are fitted to."""

    def median(key: str) -> float:
        return statistics.median(float(r[key] or 0.0) for r in train)

    return {
        k: median(k)
        for k in ("step_s", "sampler_busy_s", "learner_busy_s", "sync_s", "response_length")
    } | {
        "sampler_tokens_per_s": median("sampler_tokens_per_s"),
        "sampler_occupancy": median("sampler_occupancy"),
    }


def simulate(args) -> int:
    """The simulator's lending ratios for this workload, from a run's measured costs."""
    from rljax.sim import measured
    from rljax.sim.config import SimConfig
    from rljax.sim.simulator import Simulator
    from rljax.sim.workload import LengthModel

    lines = pathlib.Path(args.simulate).read_text().splitlines()
    bench = json.loads([line for line in lines if line.startswith("{")][-1])
    cfg = config(args, "policy")
    ph = bench["phases"]
    batch, group = cfg.learner.batch_groups, cfg.learner.group_size
    prompt = cfg.sampling.max_prefill_length  # the arithmetic prompts fit one prefill bucket
    response = max(1.0, ph["response_length"])
    # Live sequences per decode step over tokens per second: seconds per decode step.
    decode_s = ph["sampler_occupancy"] * args.slots / max(ph["sampler_tokens_per_s"], 1e-9)
    train_s = max(0.0, ph["learner_busy_s"] - ph["sync_s"])
    cost = measured.MeasuredCosts(
        model=measured.tiny_preset(cfg.model),
        tp=cfg.mesh.sampler_devices,  # one engine on the sampler's devices
        decode_s_per_step=decode_s,
        prefill_s_per_group=decode_s,  # one engine call; not timed apart
        train_step_s_per_token=train_s / (batch * group * (prompt + response)),
        learner_chips=cfg.mesh.learner_devices,
        publish_s=ph["sync_s"],
    )
    lengths = LengthModel(
        median=response, sigma=0.0, tail_prob=0.0, max_tokens=cfg.sampling.max_new_tokens
    )
    chips = cfg.mesh.sampler_devices + cfg.mesh.learner_devices

    def rate(mode: str, force=None) -> float:
        sim = SimConfig(
            mode="async" if mode == "off" else "lend",
            total_chips=chips,
            sampler_chips=cfg.mesh.sampler_devices,
            steps=max(50, args.steps),
            batch_groups=batch,
            group_size=group,
            prompt_tokens=prompt,
            max_staleness=cfg.buffer.max_staleness,
            max_slots=args.slots,
            phase_steps=1,  # the runtime decides after every step
            granularity=1,
            lending=cfg.lending,
            timeline=False,
        )
        return Simulator(sim, cost, lengths, force_lending=force).run().samples_per_s

    base = rate("off")
    predicted = {
        "off": 1.0,
        "rollout_on_train": rate("rollout_on_train", FORCED["rollout_on_train"]),
    }
    predicted = {k: v / base if k != "off" else v for k, v in predicted.items()}
    predicted["policy"] = rate("policy") / base
    measured_ratio = bench.get("ratio_vs_off", {})
    print(
        f"costs from the lending-off run: decode step {decode_s * 1e3:.2f} ms, learner step "
        f"{train_s:.3f} s, publish {ph['sync_s']:.3f} s, {response:.1f}-token responses"
    )
    for mode in MODES:
        pred = predicted.get(mode)
        meas = measured_ratio.get(mode)
        pred_s = f"{pred:.3f}x" if pred is not None else "not predicted"
        meas_s = f"{meas:.3f}x" if meas is not None else "not measured"
        print(f"{mode:>17}: simulator {pred_s}, runtime {meas_s} of lending off")
    print(
        json.dumps({"predicted_ratio_vs_off": predicted, "measured_ratio_vs_off": measured_ratio})
    )
    return 0


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.simulate:
        return simulate(args)
    results: dict[str, list[dict]] = {m: [] for m in args.modes}
    for _ in range(args.repeats):
        for mode in args.modes:  # in turn, so load on a shared machine hits every mode alike
            results[mode].append(run_once(args, mode))
            r = results[mode][-1]
            print(f"{mode:>17}: {r['samples_per_s']:8.1f} samples/s  lent {r['lent']}", flush=True)
    figures = {
        "steps": args.steps,
        "slots": args.slots,
        "repeats": args.repeats,
        "samples_per_s": {
            m: statistics.median(r["samples_per_s"] for r in rs) for m, rs in results.items()
        },
        "staleness_max": {m: max(r["staleness_max"] for r in rs) for m, rs in results.items()},
        "lent": {m: rs[-1]["lent"] for m, rs in results.items()},
    }
    if "off" in results:
        figures["phases"] = results["off"][-1]["phases"]
    base = figures["samples_per_s"].get("off")
    if base:
        figures["ratio_vs_off"] = {m: v / base for m, v in figures["samples_per_s"].items()}
        for m, ratio in figures["ratio_vs_off"].items():
            print(f"{m:>17}: {ratio:.3f}x the samples/s of lending off")
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
