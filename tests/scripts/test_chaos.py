"""scripts/chaos.py: its audits on hand-made records, its plan, and the quick run for real.

The quick run launches, kills (SIGKILL at seeded random moments) and resumes real runs of the
small sync and async configs, then audits them; its assertions hold wherever the kills land.
"""

import collections
import contextlib
import importlib.util
import io
import json
import pathlib
import random
import signal
import sys

import pytest

from rljax.testing import audit

REPO = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def chaos():
    path = REPO / "scripts/chaos.py"
    spec = importlib.util.spec_from_file_location("chaos", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up in sys.modules
    spec.loader.exec_module(module)
    return module


def _train(step, prompts, staleness=0):
    return {
        "phase": "train",
        "step": step,
        "version": step + 1,
        "prompt_ids": prompts,
        "staleness_max": staleness,
        "staleness_hist": {str(staleness): len(prompts)},
    }


def _run(*train):
    return [{"phase": "eval_initial"}, *train, {"phase": "eval_final"}, {"phase": "summary"}]


def test_audit_steps_catches_a_step_logged_twice():
    assert audit.audit_steps(_run(_train(0, [1]), _train(1, [2])), 2) == []
    # A killed run's step 1, not rewound, then the resumed run's step 1 again.
    twice = _run(_train(0, [1]), _train(1, [2]), _train(1, [2]))
    assert "twice: [1]" in audit.audit_steps(twice, 2)[0]
    # A fresh restart (killed before its first checkpoint) that appended to the old metrics.
    restarted = [{"phase": "eval_initial"}, *_run(_train(0, [1]))]
    assert audit.audit_steps(restarted, 1) == [
        "2 'eval_initial' records in metrics.jsonl, expected 1"
    ]
    wrong_version = _run({**_train(0, [1]), "version": 0})
    assert "version != step + 1: [(0, 0)]" in audit.audit_steps(wrong_version, 1)[0]


def test_audit_staleness_reads_max_and_histogram():
    assert audit.audit_staleness(_run(_train(0, [1], staleness=1)), 1) == []
    assert audit.audit_staleness(_run(_train(0, [1], staleness=2)), 1) == [
        "step 0 consumed a group of staleness 2 > eta 1"
    ]
    hidden = {**_train(0, [1]), "staleness_hist": {"0": 1, "3": 1}}
    assert audit.audit_staleness([hidden], 1)


def test_audit_prompts_catches_lost_and_twice():
    records = _run(_train(0, [5, 3]), _train(1, [9, 1]))
    assert audit.audit_prompts(records, leftover=[7], drawn=[5, 3, 9, 1, 7]) == []
    lost = audit.audit_prompts(records, leftover=[], drawn=[5, 3, 9, 1, 7])
    assert lost == ["prompts drawn but never consumed nor held: [7]; extra: []"]
    again = audit.audit_prompts(_run(_train(0, [5, 3]), _train(1, [3, 1])), [], [5, 3, 1])
    assert again[0] == "prompts consumed more than once: [3]"
    # A stream that repeats (a second epoch) may hand out the same id twice, and that counts.
    assert audit.audit_prompts(records, leftover=[5], drawn=[5, 3, 9, 1, 5]) == []


def test_leftover_prompts_reads_buffer_and_pending():
    group = {"group": {"example": {"id": 4}}}
    meta = {"driver": {"buffer": {"buffers": [{"groups": [group]}]}, "pending": [{"id": 8}]}}
    assert audit.leftover_prompts(meta) == [4, 8]
    assert audit.leftover_prompts({"version": 3}) == []


def test_audit_same_metrics_ignores_wall_clock_only():
    a = _train(0, [1]) | {"loss": 0.5, "step_s": 1.0, "sampler_tokens_per_s": 9.0, "time": 1}
    b = a | {"step_s": 2.0, "sampler_tokens_per_s": 3.0, "time": 2}
    assert audit.audit_same_metrics([a], [b]) == []
    c = b | {"loss": 0.25, "dispatched": 4}
    assert audit.audit_same_metrics([a], [c]) == [
        "step 0: metrics ['dispatched', 'loss'] differ from the uninterrupted run"
    ]
    d = b | {"sampler_occupancy": 0.1}  # a scenario's volatile key is left out, no other
    assert audit.audit_same_metrics([a], [d], ("sampler_occupancy",)) == []
    assert audit.audit_same_metrics([a], [d | {"loss": 0.1}], ("sampler_occupancy",)) == [
        "step 0: metrics ['loss'] differ from the uninterrupted run"
    ]


def test_audit_same_state_compares_bits(tmp_path):
    import jax.numpy as jnp

    from rljax.checkpoint import Checkpointer
    from rljax.config import CheckpointConfig

    def save(workdir, w):
        with Checkpointer(workdir / "checkpoints", CheckpointConfig(enabled=True)) as ckpt:
            ckpt.save(3, params={"w": w}, opt_state={"mu": w * 0}, meta={"version": 3}, force=True)

    w = jnp.arange(4, dtype=jnp.float32) / 3
    save(tmp_path / "a", w)
    save(tmp_path / "b", w)
    save(tmp_path / "c", w.at[2].add(1e-7))  # one ulp-sized change
    assert audit.audit_same_state(tmp_path / "a", tmp_path / "b", 3) == []
    assert audit.audit_same_state(tmp_path / "a", tmp_path / "c", 3) == [
        "params: leaves [0] differ from the uninterrupted run's"
    ]
    assert audit.read_meta(tmp_path / "a", 3) == {"version": 3}


def test_audit_sigterms():
    def term(**kw):
        return {"signal": "SIGTERM", "fired": True, "checkpoint_at_signal": 2, "trained": True} | kw

    assert audit.audit_sigterms([term(rc=0, stopped_at=4)]) == []
    assert audit.audit_sigterms([term(rc=-signal.SIGTERM, stopped_at=None, trained=False)]) == []
    late = audit.audit_sigterms([term(rc=0, stopped_at=9)])
    assert late == [
        "launch 0: SIGTERM at checkpoint 2 gave exit 0, stopped at 9 (expected exit 0 by step 4)"
    ]
    assert audit.audit_sigterms([term(rc=-signal.SIGTERM, stopped_at=None)])
    # Landed in the final evaluation: the run finished, exit 0; not when it did not finish.
    assert audit.audit_sigterms([term(rc=0, stopped_at=None, finished=True)]) == []
    assert audit.audit_sigterms([term(rc=0, stopped_at=None, finished=False)])
    assert audit.audit_sigterms([{"signal": "SIGKILL", "fired": True, "rc": -9}]) == []


def _held(pid, routes, tokens=3):
    """A checkpoint's buffered group (encode_group's JSON) of one trajectory."""
    traj = {"response_tokens": list(range(tokens)), "routes": routes}
    return {"group": {"example": {"id": pid}, "trajectories": [traj]}}


def _meta(version, *groups):
    return {"version": version, "driver": {"buffer": {"buffers": [{"groups": list(groups)}]}}}


def test_audit_routes_catches_lost_altered_and_shifted_routes():
    from rljax.runtime.rollout import routes_digest

    routes = [[0, 3], [7, 1], []]  # two fed tokens of width Lm*k = 2, the last never fed
    meta = _meta(1, _held(5, routes))
    digest = routes_digest([routes])
    records = _run(
        _train(0, [4]) | {"routes_digest": ["d4"]}, _train(1, [5]) | {"routes_digest": [digest]}
    )

    def check(records=records, meta=meta, leftover=()):
        return audit.audit_routes(records, [meta], list(leftover), width=2, num_experts=8)

    assert check() == []
    # The checkpoint's routes, mutated (one expert id), dropped, shifted by one, out of range.
    altered = _meta(1, _held(5, [[0, 3], [7, 2], []]))
    assert check(meta=altered) == [
        f"prompt 5 trained with routes digest {digest}, its checkpoint at version 1 held "
        + routes_digest([[[0, 3], [7, 2], []]])
    ]
    dropped = check(meta=_meta(1, _held(5, None)))
    assert dropped[0] == "version 1: prompt 5 sample 0: None routes for 3 response tokens"
    shifted = check(meta=_meta(1, _held(5, [[], [0, 3], [7, 1]])))
    assert (
        shifted[0] == "version 1: prompt 5 sample 0: malformed routes at response positions [0, 2]"
    )
    assert check(meta=_meta(1, _held(5, [[0, 8], [7, 1], []])))[0].endswith("positions [0]")
    # The learner trained it on other routes (a resume that lost them), or on none.
    other = _run(
        _train(0, [4]) | {"routes_digest": ["d4"]}, _train(1, [5]) | {"routes_digest": ["x"]}
    )
    assert "trained with routes digest x" in check(records=other)[0]
    assert check(records=_run(_train(0, [4]), _train(1, [5]) | {"routes_digest": [digest]}))
    # Trained before the checkpoint's version does not count; still held at the end does.
    early = _run(
        _train(0, [5]) | {"routes_digest": [digest]}, _train(1, [4]) | {"routes_digest": ["d"]}
    )
    assert check(records=early) == ["prompt 5 held at version 1 was never trained"]
    assert check(records=early, leftover=[5]) == []
    # An env token (loss_mask 0) has no routes; one that has them is malformed.
    conv = _held(5, [[0, 3], [], [7, 1], []], tokens=4)
    conv["group"]["trajectories"][0]["loss_mask"] = [1, 0, 1, 1]
    assert audit.route_failures(conv["group"], 2, 8) == []
    conv["group"]["trajectories"][0]["routes"][1] = [1, 1]
    assert audit.route_failures(conv["group"], 2, 8)


def test_audit_routes_fails_when_decode_group_drops_routes(monkeypatch):
    """A resume that loses the checkpoint's routes (decode_group without them) trains on other
    routes than those recorded: the digest the learner logs then differs from the checkpoint's."""
    import numpy as np

    from rljax.engine.sampler import Trajectory
    from rljax.runtime import clocks, rollout

    traj = Trajectory(
        [1, 2], [3, 4, 5], [-0.1] * 3, [0] * 3, "stop", 9, 0, routes=[[0, 1], [2, 3], []]
    )
    group = rollout.make_group({"id": 5}, [traj], [1.0])
    encoded = json.loads(json.dumps(rollout.encode_group(group)))
    meta = _meta(1, {"group": encoded})
    stats = {"wall_s": 1.0, "sampler_busy_s": 0.5, "learner_busy_s": 0.5, "reward_s": 0.0}
    stats |= {"sampler_idle_s": 0.5, "learner_idle_s": 0.5, "sampler_tokens": 3}
    stats |= {"learner_tokens": 3, "occupancy": None}

    def trained(decode):
        step = clocks.step_metrics([decode(encoded)], collections.Counter([0]), stats, None)
        records = _run(_train(0, [4]) | {"routes_digest": ["d"]}, _train(1, [5]) | step)
        return audit.audit_routes(records, [meta], [], width=2, num_experts=4)

    assert trained(rollout.decode_group) == []

    def dropping(d):  # routes lost: the step has none to digest
        g = rollout.decode_group(d)
        for t in g.trajectories:
            t.routes = None
        return g

    def shifting(d):  # routes one token off
        g = rollout.decode_group(d)
        for t in g.trajectories:
            t.routes = [[], *t.routes[:-1]]
        return g

    assert trained(dropping)[0] == "step 1: routes_digest None for [5]"
    assert "trained with routes digest" in trained(shifting)[0]
    assert np.asarray(encoded["trajectories"][0]["routes"][:2]).shape == (2, 2)


@pytest.mark.parametrize("seed", range(20))
def test_moments_leave_room_for_the_interruptions_to_come(chaos, seed):
    rng, num_steps, planned = random.Random(seed), 8, 5
    resumed, startup = None, None  # a fresh run; no launch measured yet
    for i in range(planned):
        left = planned - i
        m = chaos.pick_moment(rng, resumed, num_steps, left, startup, 0.5)
        if m.after == 0:  # after the initial evaluation: only a fresh run has one to come
            assert resumed is None and 0 <= m.delay_s <= 0.5
        elif m.after is None:  # a delay after the launch
            assert resumed is not None and 0 <= m.delay_s <= (startup or 0.5)
        else:
            assert (resumed or 0) < m.after <= num_steps - left and 0 <= m.delay_s <= 0.5
            resumed = m.after + rng.randint(0, 1)  # the kill may land a checkpoint later
        startup = 3.0


def test_command_and_environment(chaos, tmp_path, monkeypatch):
    sc = chaos.SCENARIOS["async_resize"]
    cmd = chaos.command(sc, tmp_path / "w", 7)
    assert cmd[1:3] == ["-m", "rljax.launch"]
    assert f"--config={REPO / 'configs/arith_async.py'}:small" in cmd
    for flag in ("num_steps=7", "checkpoint.every_steps=1", "mesh.reallocate=True"):
        assert f"--config.{flag}" in cmd
    monkeypatch.setenv("XLA_FLAGS", "--xla_force_host_platform_device_count=8 --xla_foo=1")
    env = chaos.environment(2, tmp_path / "cache")
    assert env["JAX_NUM_CPU_DEVICES"] == "2" and env["XLA_FLAGS"] == "--xla_foo=1"
    assert env["JAX_COMPILATION_CACHE_DIR"] == str(tmp_path / "cache")
    # The typed config the audit reads is the one the command line builds.
    cfg = chaos.run_config(sc, 7)
    assert cfg.num_steps == 7 and cfg.mesh.reallocate and cfg.buffer.max_staleness == 1


def test_too_few_steps_for_the_interruptions(chaos, tmp_path):
    with pytest.raises(ValueError, match="pass --num_steps=4 or more"):
        chaos.run_scenario(
            chaos.SCENARIOS["sync"],
            tmp_path,
            seed=0,
            kills=2,
            terms=1,
            num_steps=3,
            cache_dir=None,
            baseline=False,
        )


@pytest.mark.slow
def test_quick_chaos_run(chaos, tmp_path):
    """A SIGTERM and a SIGKILL of the small sync run, each resumed; every audit passes,
    bitwise against an uninterrupted run included. (``--quick`` adds the async scenario, which
    CI leaves to tests/runtime/test_run_async.py and the pod's kill and resume in
    tests/runtime/test_pod.py, for time.)"""
    out = io.StringIO()
    argv = ["--scenarios=sync", "--kills=1", "--terms=1", "--no_baseline", "--num_steps=5"]
    with contextlib.redirect_stdout(out):
        figures = chaos.main([*argv, f"--workdir={tmp_path}", "--seed=1"])
    assert json.loads(out.getvalue().strip().splitlines()[-1]) == json.loads(
        json.dumps(figures, default=str)
    )
    assert list(figures["scenarios"]) == ["sync"]
    for name in ("sync",):
        r = figures["scenarios"][name]
        assert r["failures"] == [], r
        assert r["sigkills"] + r["sigterms"] + r["not_sent"] == 2, r
        assert r["sigkills"] + r["sigterms"] >= 1, r
        assert 2 <= r["launches"] <= 3  # a signal not sent because the run had finished ends it
    assert figures["scenarios"]["sync"]["audits_passed"] == [
        "bitwise",
        "prompts",
        "sigterm",
        "staleness",
        "steps",
    ]
    assert figures["audits_failed"] == 0


@pytest.mark.slow
def test_moe_async_chaos_run(chaos, tmp_path):
    """A SIGKILL of the small MoE run made async (eta 2, 6/2 split) with routing replay, resumed;
    every audit passes, the routes audit included: the groups its checkpoints buffered carry
    their routes and are trained on them after the resume."""
    argv = ["--scenarios=moe_async", "--kills=1", "--terms=0", "--no_baseline", "--num_steps=4"]
    with contextlib.redirect_stdout(io.StringIO()):
        figures = chaos.main([*argv, f"--workdir={tmp_path}", "--seed=1"])
    r = figures["scenarios"]["moe_async"]
    assert r["failures"] == [], r
    assert r["audits_passed"] == ["prompts", "routes", "sigterm", "staleness", "steps"]
    metas = [
        audit.read_meta(tmp_path / "moe_async", s)
        for s in chaos.checkpoints(tmp_path / "moe_async")
    ]
    assert any(audit.held_groups(m) for m in metas)  # the routes audit had groups to check


# -- regressions the chaos audits found (in-process, deterministic: no signal, no timing) ------


def _small_run_config(num_steps):
    from rljax.configs import arith_tiny

    from rljax.config import replace

    return replace(
        arith_tiny.recipe("small"),
        **{
            "checkpoint.enabled": True,
            "checkpoint.every_steps": 1,
            "checkpoint.async_save": False,
            "num_steps": num_steps,
        },
    )


def _train_in_process(cfg, workdir, before_train=None):
    from rljax.runtime import Run

    run = Run(cfg, str(workdir))
    try:
        if before_train is not None:
            before_train(run)
        return run.train()
    finally:
        run.close()


def test_one_run_preempted_killed_and_resumed_in_process(tmp_path):
    """Three bugs the chaos audits found, in the life of one run (no signal, no timing):

    1. a run killed between its warm start and its first checkpoint starts afresh, and its
       relaunch appended a second warm start and initial evaluation to the old metrics;
    2. a SIGTERM that landed before the driver existed (warm start, first evaluation) was
       ignored until every step had run;
    3. the driver's running counts (``dispatched``, ...) restarted at 0 on each resume;
    4. a SIGTERM during the final evaluation killed the process (the default handler was back).
    """
    killed = [{"step": 0, "phase": "sft", "loss": 1.0}, {"step": 0, "phase": "eval_initial"}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in killed))

    def preempt_during_warm_start(run):
        warm_start = run.warm_start_learner

        def preempted(learner):
            warm_start(learner)
            run.request_stop()  # what the SIGTERM handler does

        run.warm_start_learner = preempted

    summary = _train_in_process(_small_run_config(3), tmp_path, preempt_during_warm_start)
    assert summary == {"stopped": True, "steps": 0}  # 2.
    records = audit.read_metrics(tmp_path)
    assert [r["phase"] for r in records].count("eval_initial") == 1  # 1.
    assert all("time" in r for r in records)  # the killed run's records are gone

    def preempt_after_step_1(run):
        run.step_hooks.append(lambda r, step: r.request_stop() if step == 1 else None)

    summary = _train_in_process(_small_run_config(3), tmp_path, preempt_after_step_1)
    assert summary == {"stopped": True, "steps": 2}
    handlers = []

    def watch_the_final_evaluation(run):
        evaluate = run.evaluate

        def evaluate_and_look(step, phase="eval"):
            handlers.append((phase, signal.getsignal(signal.SIGTERM)))
            return evaluate(step, phase)

        run.evaluate = evaluate_and_look
        handlers.append(("run", run.request_stop))

    assert (
        _train_in_process(_small_run_config(3), tmp_path, watch_the_final_evaluation)["steps"] == 3
    )
    # 4. SIGTERM during the final evaluation still stops gracefully (it killed the process).
    assert handlers == [("run", handlers[0][1]), ("eval_final", handlers[0][1])]
    records = audit.read_metrics(tmp_path)
    assert audit.audit_steps(records, 3) == []
    train = [r for r in records if r["phase"] == "train"]
    assert [r["dispatched"] for r in train] == [4, 8, 12]  # 3. (4 groups a step)
