"""Chaos: kill a real run at random moments, resume it each time, and audit what it did.

    python scripts/chaos.py                # the full suite: 10 SIGKILLs + 3 SIGTERMs per scenario
    python scripts/chaos.py --quick        # the CI test's version (tests/scripts/test_chaos.py)
    python scripts/chaos.py --scenarios=async --kills=3 --terms=0 --seed=7   # replay one

Each scenario launches ``python -m rljax.launch`` on a fresh workdir with a checkpoint every
step, interrupts it at random moments (SIGKILL to its whole process group, or SIGTERM to the
process: a preemption notice), and relaunches the same command each time; the runtime resumes
by itself. A moment is a random delay after the launch, after a fresh run's initial evaluation
(before its first checkpoint), or after the process finalises a randomly chosen checkpoint. The
plan is drawn from ``--seed``, so a failing seed replays the same kinds of moments (the exact
instants still depend on the machine). The audits are in ``rljax/testing/audit.py``.

Audits once the run has finished (each one a list of failures, empty when it passes):
  - steps: metrics.jsonl holds train steps 0..num_steps-1 once each, in order, with version =
    step + 1, one initial evaluation, one final evaluation and one summary (the metrics a
    killed run logged past its checkpoint are rewound on resume);
  - staleness: no step consumed a group with staleness above eta;
  - prompts: every prompt drawn from the data stream is consumed exactly once, or is still
    buffered or pending in the last checkpoint (nothing lost, nothing twice);
  - sigterm: each SIGTERM exits 0 within the step after the one in flight, with a checkpoint;
  - bitwise (synchronous scenarios): every step's metrics and the final params and optimiser
    state equal, bit for bit, those of an uninterrupted run of the same config;
  - resizes (async_resize): the reallocator moved chips at least once during the run;
  - routes (a mixture of experts, moe and moe_async): the groups buffered in every checkpoint
    (those resumed from, those left) carry routes for each model token they fed, and each is
    trained after the resume on the routes its checkpoint held (a digest per group).
Scenarios: sync and async arithmetic (configs/arith_tiny.py, configs/arith_async.py), async with
the reallocator resizing, conversations with the lookup tool (configs/arith_tools.py) and a
mixture of experts with routing replay (configs/arith_moe.py), each in sync and async, and PPO
with a critic (configs/arith_ppo.py), in sync and async with the reallocator resizing. No
scenario lends chips (lending is single-process and off by default).
Figures are wall times of this run: the interrupted run against an uninterrupted baseline of
the same config measured here. The last line printed is one JSON object of figures.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib
import json
import os
import pathlib
import random
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

from rljax.testing import audit, pod

REPO = pathlib.Path(__file__).resolve().parents[1]
POLL_S = 0.02  # how often the supervisor looks for a new checkpoint
STARTUP_SHARE = 0.25  # share of moments drawn as a delay after the launch
LAUNCH_TIMEOUT_S = 900.0

# A reallocator that moves whenever one role idles more than the other (the runtime's only way
# to resize from the config); chips move two at a time so the learner keeps the batch divisible.
RESIZE = (
    ("mesh.reallocate", True),
    ("mesh.reallocate_every", 1),
    ("mesh.reallocate_granularity", 2),
    ("reallocator.patience", 1),
    ("reallocator.cooldown", 0),
    ("reallocator.reversal_block", 0),
    ("reallocator.idle_threshold", 0.0),
    ("reallocator.min_gain", 0.0),
    ("reallocator.margin", 1e-6),
    ("reallocator.horizon", 1000),
)


# A small variant (arith_tools.py's, arith_moe.py's) made asynchronous on split meshes, as
# configs/arith_async.py does.
ASYNC_SPLIT = (
    ("mode", "async"),
    ("buffer.max_staleness", 2),
    ("learner.loss", "decoupled_ppo"),
    ("mesh.mode", "split"),
    ("mesh.sampler_devices", 6),
    ("mesh.learner_devices", 2),
)


@dataclasses.dataclass(frozen=True)
class Scenario:
    """One config to interrupt: ``config`` is ``configs/<file>.py:<variant>``."""

    name: str
    config: str
    devices: int  # JAX_NUM_CPU_DEVICES of the launched process
    overrides: tuple[tuple[str, Any], ...] = ()
    bitwise: bool = False  # compare with an uninterrupted run, bit for bit
    min_resizes: int = 0
    volatile: tuple[str, ...] = ()  # metrics the bitwise audit leaves out (see audit)


SCENARIOS = {
    "sync": Scenario("sync", "configs/arith_tiny.py:small", 2, bitwise=True),
    "async": Scenario("async", "configs/arith_async.py:small", 8),
    "async_resize": Scenario("async_resize", "configs/arith_async.py:small", 8, RESIZE, False, 1),
    # Conversations with an env (the lookup tool): in flight at a kill, they restart from their
    # prompt on resume (the prompt audit sees each consumed once), deterministic enough in sync
    # to be compared bit for bit.
    # How many decode steps run while conversations wait for their env threads depends on
    # those threads' timing, so slot occupancy does; the tokens, metrics and state do not.
    "agents": Scenario(
        "agents", "configs/arith_tools.py:small", 2, bitwise=True, volatile=("sampler_occupancy",)
    ),
    "agents_async": Scenario("agents_async", "configs/arith_tools.py:small", 8, ASYNC_SPLIT),
    # A mixture of experts with rollout routing replay (the recipe's default): the routes audit.
    "moe": Scenario("moe", "configs/arith_moe.py:small", 2, bitwise=True),
    "moe_async": Scenario("moe_async", "configs/arith_moe.py:small", 8, ASYNC_SPLIT),
    # PPO with a critic (gae): the critic's params and optimiser state ride in the learner's
    # optimiser state, so the bitwise audit compares them; async, they move with a resize.
    "ppo": Scenario("ppo", "configs/arith_ppo.py:small", 2, bitwise=True),
    "ppo_async_resize": Scenario(
        "ppo_async_resize", "configs/arith_ppo.py:small", 8, ASYNC_SPLIT + RESIZE, False, 1
    ),
}


# -- launching ----------------------------------------------------------------------------


def command(sc: Scenario, workdir: pathlib.Path, num_steps: int) -> list[str]:
    """The launch command of ``sc``: the same for the first launch and every relaunch."""
    path, _, variant = sc.config.partition(":")
    config = f"{REPO / path}:{variant}" if variant else str(REPO / path)
    overrides = [("num_steps", num_steps), ("checkpoint.enabled", True)]
    overrides += [("checkpoint.every_steps", 1), *sc.overrides]
    flags = [f"--config.{k}={v}" for k, v in overrides]
    return [
        sys.executable,
        "-m",
        "rljax.launch",
        f"--config={config}",
        f"--workdir={workdir}",
        *flags,
    ]


def environment(devices: int, cache_dir: pathlib.Path | None) -> dict[str, str]:
    """The launched process's environment: ``devices`` fake CPU devices, a shared compile cache."""
    env = pod.cpu_env(devices)
    if cache_dir is not None:
        env["JAX_COMPILATION_CACHE_DIR"] = str(cache_dir)
        env["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"
        env["JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES"] = "0"
    return env


class Launch:
    """One process of a run, in a process group of its own, its output in ``log_path``."""

    def __init__(self, cmd: list[str], env: dict[str, str], log_path: pathlib.Path):
        self.log_path = log_path
        self.started = time.monotonic()
        with open(log_path, "w") as log:
            self.proc = subprocess.Popen(
                cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=REPO, start_new_session=True
            )

    def alive(self) -> bool:
        return self.proc.poll() is None

    def signal(self, sig: int) -> None:
        """SIGKILL takes the whole group (a VM dies); SIGTERM goes to the process (a notice)."""
        if sig == signal.SIGKILL:
            os.killpg(self.proc.pid, sig)
        else:
            self.proc.send_signal(sig)

    def wait(self, timeout: float = LAUNCH_TIMEOUT_S) -> int:
        try:
            rc = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
            raise RuntimeError(f"{self.log_path}: no exit after {timeout:.0f} s (a hang)") from None
        with contextlib.suppress(ProcessLookupError):  # helpers it left behind go with it
            os.killpg(self.proc.pid, signal.SIGKILL)
        return rc

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


def checkpoints(workdir: pathlib.Path) -> list[int]:
    """Finalised checkpoint steps (orbax writes into a temporary name, then renames)."""
    root = workdir / "checkpoints"
    return sorted(int(p.name) for p in root.iterdir() if p.name.isdigit()) if root.exists() else []


def latest(workdir: pathlib.Path) -> int | None:
    """The newest finalised checkpoint, None before the first."""
    steps = checkpoints(workdir)
    return steps[-1] if steps else None


def initial_eval_since(workdir: pathlib.Path, since: float) -> bool:
    """Whether metrics.jsonl holds an initial evaluation written at ``since`` (wall) or later."""
    path = workdir / "metrics.jsonl"
    if not path.exists():
        return False
    for line in path.read_text(errors="replace").splitlines():
        if '"eval_initial"' in line:
            with contextlib.suppress(ValueError):  # a line still being written
                record = json.loads(line)
                if record["phase"] == "eval_initial" and record["time"] >= since:
                    return True
    return False


def run_to_end(cmd, env, workdir: pathlib.Path, name: str) -> tuple[float, str]:
    """Launch and wait for a clean exit; returns (wall seconds, log)."""
    launch = Launch(cmd, env, workdir.parent / f"{workdir.name}-{name}.log")
    rc = launch.wait()
    wall = time.monotonic() - launch.started
    if rc != 0:
        raise RuntimeError(f"{launch.log_path}: exit {rc}:\n{launch.log()[-3000:]}")
    return wall, launch.log()


# -- interrupting -------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Moment:
    """When to interrupt: ``delay_s`` after an event of the launch.

    The event is checkpoint ``after`` appearing; with ``after=0``, the run's initial
    evaluation (a fresh run, before its first checkpoint); with None, the launch itself.
    """

    after: int | None
    delay_s: float


def pick_moment(
    rng: random.Random,
    resumed: int | None,
    num_steps: int,
    left: int,
    startup_s: float | None,
    step_s: float,
) -> Moment:
    """A random moment of a launch that resumes from checkpoint ``resumed`` (None: a fresh
    run), leaving room for the ``left - 1`` interruptions still to come."""
    start = resumed or 0
    last = num_steps - left  # the last checkpoint this interruption may wait for
    if rng.random() < STARTUP_SHARE or start + 1 > last:
        if resumed is None:  # between the warm start and the first checkpoint
            return Moment(0, rng.uniform(0.0, step_s))
        if startup_s is not None or start + 1 > last:
            return Moment(None, rng.uniform(0.0, startup_s or step_s))
    return Moment(rng.randint(start + 1, last), rng.uniform(0.0, step_s))


def interrupt(launch: Launch, workdir: pathlib.Path, moment: Moment, sig: int) -> dict[str, Any]:
    """Wait for ``moment``, send ``sig``, wait for the exit; the record of what happened."""
    resumed = latest(workdir)
    since = time.time()  # metrics records carry wall time
    deadline = launch.started + LAUNCH_TIMEOUT_S
    seen: dict[int, float] = {}  # new checkpoint -> when it appeared (startup and step figures)
    start = launch.started
    while launch.alive() and time.monotonic() < deadline:
        now = time.monotonic()
        for s in checkpoints(workdir):
            if resumed is None or s > resumed:
                seen.setdefault(s, now)
        if moment.after is None:
            break
        if moment.after in seen or (moment.after == 0 and initial_eval_since(workdir, since)):
            start = seen.get(moment.after, now)
            break
        time.sleep(POLL_S)
    while launch.alive() and time.monotonic() < start + moment.delay_s:
        time.sleep(POLL_S)
    record = {"signal": signal.Signals(sig).name, "resumed_from": resumed, "moment": moment}
    fired = launch.alive()
    if fired:
        record["checkpoint_at_signal"] = latest(workdir)
        sent = time.monotonic()
        launch.signal(sig)
    rc = launch.wait()
    record.update(fired=fired, rc=rc, wall_s=time.monotonic() - launch.started)
    if fired:
        record["exit_s"] = time.monotonic() - sent
    if seen:
        times = sorted(seen.values())
        if resumed is not None:  # a fresh launch's first checkpoint waits for its warm start
            record["startup_s"] = times[0] - launch.started
        record["step_s"] = [b - a for a, b in zip(times, times[1:], strict=False)]
    log = launch.log()
    stopped = re.findall(r"stopped at step (\d+); checkpoint saved", log)
    record["stopped_at"] = int(stopped[-1]) if stopped else None
    # A SIGTERM that lands once the last step is done (in the final evaluation) lets the run
    # finish: its final summary line.
    record["finished"] = re.search(r"after \d+ RL steps \(", log) is not None
    # Whether the SIGTERM handler was in place: training (warm start included) had begun.
    record["trained"] = (
        any(m in log for m in ("resumed from checkpoint", "held-out accuracy after warm start"))
        or latest(workdir) != resumed
    )
    return record


def interrupted_run(
    sc: Scenario,
    workdir: pathlib.Path,
    rng: random.Random,
    kills: int,
    terms: int,
    num_steps: int,
    env: dict[str, str],
) -> tuple[list[dict[str, Any]], list[str]]:
    """Interrupt ``sc`` ``kills + terms`` times in a seeded order, then run it to the end."""
    cmd = command(sc, workdir, num_steps)
    plan = [signal.SIGKILL] * kills + [signal.SIGTERM] * terms
    rng.shuffle(plan)
    records, logs = [], []
    startup_s, step_s = None, 1.0
    for i, sig in enumerate(plan):
        launch = Launch(cmd, env, workdir.parent / f"{workdir.name}-{i}.log")
        moment = pick_moment(rng, latest(workdir), num_steps, len(plan) - i, startup_s, step_s)
        record = interrupt(launch, workdir, moment, sig)
        records.append(record)
        logs.append(launch.log())
        resumed = latest(workdir)  # what the next launch resumes from (the routes audit)
        if resumed is not None:
            record["resume_meta"] = audit.read_meta(workdir, resumed)
        if "startup_s" in record:
            startup_s = (
                record["startup_s"] if startup_s is None else min(startup_s, record["startup_s"])
            )
        if record.get("step_s"):
            step_s = statistics.median(record["step_s"])
        print(f"  {sc.name} #{i}: {_describe(record)}", flush=True)
        if not record["fired"] and record["rc"] != 0:
            raise RuntimeError(f"{launch.log_path}: exit {record['rc']}:\n{logs[-1][-3000:]}")
        if not record["fired"]:
            break  # the run finished before the moment came
    wall, log = run_to_end(cmd, env, workdir, "final")
    records.append({"signal": None, "fired": False, "rc": 0, "wall_s": wall})
    logs.append(log)
    return records, logs


def _describe(r: dict[str, Any]) -> str:
    m = r["moment"]
    when = {None: "launch", 0: "initial eval"}.get(m.after, f"checkpoint {m.after}")
    fired = f"sent at checkpoint {r.get('checkpoint_at_signal')}" if r["fired"] else "not sent"
    stop = f", stopped at {r['stopped_at']}" if r["stopped_at"] is not None else ""
    wall = f"{r['wall_s']:.1f} s"
    return f"{r['signal']} {m.delay_s:.2f} s after {when}: {fired}, exit {r['rc']}{stop} ({wall})"


def run_config(sc: Scenario, num_steps: int):
    """The typed RunConfig the launched processes build from ``sc``'s command line."""
    from rljax.config import replace

    path, _, variant = sc.config.partition(":")
    module = importlib.import_module(f"rljax.configs.{pathlib.Path(path).stem}")
    return replace(module.recipe(variant), **{"num_steps": num_steps, **dict(sc.overrides)})


# -- scenarios ----------------------------------------------------------------------------


def run_scenario(
    sc: Scenario,
    root: pathlib.Path,
    *,
    seed: int,
    kills: int,
    terms: int,
    num_steps: int,
    cache_dir: pathlib.Path | None,
    baseline: bool,
) -> dict[str, Any]:
    """The uninterrupted baseline (if wanted), the interrupted run, the audits; its figures."""
    if num_steps < kills + terms + 1:
        raise ValueError(
            f"num_steps={num_steps} leaves no room for {kills + terms} interruptions (each waits "
            f"for a later checkpoint); pass --num_steps={kills + terms + 1} or more"
        )
    env = environment(sc.devices, cache_dir)
    clean, workdir = root / f"{sc.name}-clean", root / sc.name
    rng = random.Random(f"{seed}/{sc.name}")
    records, logs = interrupted_run(sc, workdir, rng, kills, terms, num_steps, env)
    # The baseline runs second: with a compile cache it is then as warm as the relaunches, and
    # only the interrupted run's first launch compiled (the ratio overstates the overhead).
    baseline_s = None
    if baseline or sc.bitwise:
        baseline_s, _ = run_to_end(command(sc, clean, num_steps), env, clean, "run")
    metrics = audit.read_metrics(workdir)
    cfg = run_config(sc, num_steps)
    meta = audit.read_meta(workdir, num_steps)
    audits = {
        "steps": audit.audit_steps(metrics, num_steps),
        "staleness": audit.audit_staleness(metrics, cfg.buffer.max_staleness),
        "prompts": audit.audit_prompts(
            metrics, audit.leftover_prompts(meta), audit.drawn_prompts(cfg, meta["data"])
        ),
        "sigterm": audit.audit_sigterms(records[:-1]),
    }
    if sc.bitwise:
        clean_metrics = audit.read_metrics(clean)
        audits["bitwise"] = audit.audit_same_metrics(clean_metrics, metrics, sc.volatile)
        audits["bitwise"] += audit.audit_same_state(clean, workdir, num_steps)
    if cfg.model.num_experts:  # a mixture of experts: the sampler records routes
        from rljax.models.moe import moe_layers

        metas = [r["resume_meta"] for r in records if "resume_meta" in r]
        metas += [audit.read_meta(workdir, s) for s in checkpoints(workdir)]
        audits["routes"] = audit.audit_routes(
            metrics,
            metas,
            audit.leftover_prompts(meta),
            width=len(moe_layers(cfg.model)) * cfg.model.num_experts_per_tok,
            num_experts=cfg.model.num_experts,
        )
    resizes = sum(log.count("resized sampler/learner chips") for log in logs)
    if sc.min_resizes:
        short = resizes < sc.min_resizes
        audits["resizes"] = [f"{resizes} resizes, expected >= {sc.min_resizes}"] if short else []
    sent = [r for r in records if r["fired"]]
    wall = sum(r["wall_s"] for r in records)
    exits = sorted(r["exit_s"] for r in sent if r["signal"] == "SIGTERM" and r["rc"] == 0)
    startups = sorted(r["startup_s"] for r in records if "startup_s" in r)
    return {
        "sigkills": sum(r["signal"] == "SIGKILL" for r in sent),
        "sigterms": sum(r["signal"] == "SIGTERM" for r in sent),
        "sigterms_before_training": sum(
            r["signal"] == "SIGTERM" and not r["trained"] for r in sent
        ),
        "not_sent": sum(1 for r in records[:-1] if not r["fired"]),
        "launches": len(records),
        "resizes": resizes,
        "audits_passed": sorted(k for k, v in audits.items() if not v),
        "audits_failed": sorted(k for k, v in audits.items() if v),
        "failures": [f"{k}: {f}" for k, v in audits.items() for f in v],
        "wall_s": round(wall, 2),
        "baseline_s": None if baseline_s is None else round(baseline_s, 2),
        "wall_over_baseline": None if baseline_s is None else round(wall / baseline_s, 3),
        # Wall seconds each interruption cost: the work redone plus a relaunch.
        "s_per_interruption": None
        if baseline_s is None or not sent
        else round((wall - baseline_s) / len(sent), 2),
        # [min, median, max]: a relaunch until its first new checkpoint; a SIGTERM until exit.
        "resume_to_checkpoint_s": _spread(startups),
        "sigterm_exit_s": _spread(exits),
        "workdir": str(workdir),
    }


def _spread(values: list[float]) -> list[float] | None:
    if not values:
        return None
    return [round(x, 2) for x in (min(values), statistics.median(values), max(values))]


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--scenarios",
        default="sync,async,async_resize,agents,agents_async,moe,moe_async",
        help=f"of {list(SCENARIOS)}",
    )
    p.add_argument("--kills", type=int, default=10, help="SIGKILLs per scenario")
    p.add_argument("--terms", type=int, default=3, help="SIGTERMs per scenario")
    p.add_argument("--num_steps", type=int, default=0, help="RL steps (0: 2 (kills + terms + 1))")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--workdir", default="", help="where the runs go (default: a temporary dir)")
    p.add_argument("--no_baseline", action="store_true", help="skip async baselines (no figure)")
    p.add_argument("--no_compile_cache", action="store_true", help="every launch compiles")
    p.add_argument("--quick", action="store_true", help="sync, async: 1 SIGKILL, 1 SIGTERM")
    args = p.parse_args(argv)
    if args.quick:
        args.scenarios, args.kills, args.terms, args.no_baseline = "sync,async", 1, 1, True
        args.num_steps = args.num_steps or 5
    names = [n for n in args.scenarios.split(",") if n]
    unknown = [n for n in names if n not in SCENARIOS]
    if unknown:
        p.error(f"unknown scenarios {unknown}; choose from {list(SCENARIOS)}")
    # Room to spare: a SIGTERM stops after the step in flight, and a kill may land a checkpoint
    # past its moment; a run that reaches its end before the plan does leaves kills unsent.
    num_steps = args.num_steps or 2 * (args.kills + args.terms + 1)
    root = pathlib.Path(args.workdir or tempfile.mkdtemp(prefix="rljax-chaos-"))
    root.mkdir(parents=True, exist_ok=True)
    cache = None if args.no_compile_cache else root / "jax-cache"
    start = time.monotonic()
    results = {}
    for name in names:
        print(
            f"{name}: {args.kills} SIGKILL + {args.terms} SIGTERM, {num_steps} steps, "
            f"seed {args.seed}",
            flush=True,
        )
        try:
            results[name] = r = run_scenario(
                SCENARIOS[name],
                root,
                seed=args.seed,
                kills=args.kills,
                terms=args.terms,
                num_steps=num_steps,
                cache_dir=cache,
                baseline=not args.no_baseline,
            )
        except RuntimeError as e:  # a launch crashed or hung: a finding, with its log's tail
            results[name] = r = {"sigkills": 0, "sigterms": 0, "resizes": 0, "wall_s": 0.0}
            r.update(audits_passed=[], audits_failed=["run"], failures=[f"run: {e}"])
            r["baseline_s"] = None
        print(
            f"{name}: passed {r['audits_passed']}, failed {r['audits_failed']}; "
            f"{r['sigkills']} SIGKILL, {r['sigterms']} SIGTERM, {r['resizes']} resizes; "
            f"{r['wall_s']:.1f} s (uninterrupted {r['baseline_s']} s)",
            flush=True,
        )
        for failure in r["failures"]:
            print(f"  FAIL {failure}", flush=True)
    figures = {
        "seed": args.seed,
        "num_steps": num_steps,
        "sigkills": sum(r["sigkills"] for r in results.values()),
        "sigterms": sum(r["sigterms"] for r in results.values()),
        "audits_passed": sum(len(r["audits_passed"]) for r in results.values()),
        "audits_failed": sum(len(r["audits_failed"]) for r in results.values()),
        "wall_s": round(time.monotonic() - start, 1),
        "scenarios": results,
    }
    print(json.dumps(figures, default=str), flush=True)
    return figures


if __name__ == "__main__":
    sys.exit(1 if main()["audits_failed"] else 0)
