"""A pod's operations and the seams one Run shares with a pod, in one process.

The followers replay a typed stream of operations (an unknown one fails the pod, naming it);
the pod leader saves through the same ``Run.save`` (``Checkpointer.should_save``, preemption
included) as one process; ``Run.resize`` on a pod goes through the step boundary, and the
leader's operations are refused on the other processes with one line.
"""

from __future__ import annotations

import types

import jax
import jax.numpy as jnp
import pytest
from rljax.configs import arith_async

from rljax.checkpoint import Checkpointer
from rljax.config import ConfigError, replace
from rljax.mesh.roles import Roles
from rljax.metrics import Timeline
from rljax.policy.reallocation import Split
from rljax.runtime import pod, pod_replay
from rljax.runtime.hosting import LocalHosting
from rljax.runtime.pod import Op, PodProtocolError
from rljax.runtime.pod_hosting import PodHosting
from rljax.runtime.pod_resize import PodResizer
from rljax.runtime.run import Run
from rljax.testing.pod import MemoryChannel


def test_an_unknown_operation_fails_the_follower_naming_it():
    channel = MemoryChannel(blocking=False)
    channel.post("tick/0", [["submit", []], ["sumbit", []], ["step", None]])
    seen = []
    with pytest.raises(PodProtocolError, match=r"unknown pod operation 'sumbit' in the leader's"):
        pod_replay.replay(channel, 0, {Op.SUBMIT: seen.append, Op.STEP: seen.append})
    assert seen == [[]]  # the operations before it ran, the one after did not


def test_each_role_replays_its_operations_in_order_until_the_build_ends():
    channel = MemoryChannel(blocking=False)
    channel.post("tick/0", [["submit", [1]], ["learn", {"version": 0}], ["step", None]])
    channel.post("tick/1", [["swap", 1], ["resize", {"split": [2, 6], "cause": "api"}]])
    seen = []
    handlers = {op: (lambda arg, op=op: seen.append((op, arg))) for op in (Op.SUBMIT, Op.STEP)}
    k, op, arg = pod_replay.replay(channel, 0, handlers)
    # learn and swap are not a sampler's: skipped; resize ends the build and says where to go
    assert seen == [(Op.SUBMIT, [1]), (Op.STEP, None)]
    assert (k, op, arg) == (2, Op.RESIZE, {"split": [2, 6], "cause": "api"})


def test_the_leader_posts_operations_by_their_wire_names():
    channel = MemoryChannel(blocking=False)
    ticks = pod.Ticks(channel)
    ticks.queue(Op.SUBMIT, [])
    ticks.flush(Op.SWAP, 3)
    assert channel.store["tick/0"] == [["submit", []], ["swap", 3]]
    assert pod.parse_op("swap", 0) is Op.SWAP


# -- one save decision for one process and a pod --------------------------------------------


class Preempted(Checkpointer):
    """A checkpointer that received a preemption notice at ``at`` (orbax's policy would say
    so on a TPU VM): due there, though ``every_steps`` is not."""

    at = 3

    def should_save(self, step, *, force=False):
        return step == self.at or super().should_save(step, force=force)


def _leader_run(hosting, tmp_path, version: int) -> Run:
    """The part of a Run that ``save`` reads, around ``hosting``."""
    cfg = arith_async.recipe("small")
    cfg = replace(cfg, **{"checkpoint.enabled": True, "checkpoint.every_steps": 5})
    run = Run.__new__(Run)  # the seams alone: no model, engine or learner is built
    state = {"w": jnp.arange(4.0)}
    run.cfg, run.hosting, run.driver = cfg, hosting, None
    run.ckpt = Preempted(tmp_path / "ckpt", cfg.checkpoint)
    learner = types.SimpleNamespace(
        version=version, params=state, saved_params=state, opt_state=state
    )
    prompts = types.SimpleNamespace(get_state=lambda: {"position": 7})
    run.parts = types.SimpleNamespace(learner=learner, prompts=prompts)
    run.metrics = types.SimpleNamespace(offset=lambda: None)
    run.timeline, run.initial_accuracy = Timeline(), 0.5
    return run


@pytest.mark.parametrize("version, due", [(3, True), (4, False), (5, True)])
def test_one_process_saves_when_the_checkpointer_says_so(tmp_path, version, due):
    run = _leader_run(LocalHosting(), tmp_path, version)
    run.save()
    run.ckpt.wait()
    assert run.ckpt.latest_step() == (version if due else None)
    run.ckpt.close()


@pytest.mark.parametrize("version, due", [(3, True), (4, False), (5, True)])
def test_a_pod_leader_saves_when_the_checkpointer_says_so(tmp_path, version, due):
    """The pod's save decision is the one process's: a preemption notice at step 3 saves, on
    every process (the SAVE tick), with the pod's shape in the meta."""
    hosting = PodHosting(MemoryChannel(blocking=False))
    hosting.roles = Roles(sampler=(0,), learner=(1,), me=0)
    hosting.ticks = pod.Ticks(hosting.channel)
    written = []
    hosting.save_state = lambda run, v, meta, *, wait: written.append((v, meta, wait))
    run = _leader_run(hosting, tmp_path, version)
    run.save()
    posted = hosting.channel.store.get("tick/0")
    if not due:
        assert posted is None and written == []
        return
    ((op, arg),) = posted
    assert Op(op) is Op.SAVE and arg["version"] == version and not arg["wait"]
    ((v, meta, wait),) = written
    assert (v, wait) == (version, False) and meta == arg["meta"]
    assert meta["data"] == {"position": 7} and meta["pod"]["sampler"] == [0]
    run.ckpt.close()


# -- resize and the leader's operations on a pod ---------------------------------------------


def _pod_leader_for_resize(monkeypatch, running: bool):
    monkeypatch.setattr(jax, "local_device_count", lambda: 2)  # hosts of 2 devices, as a pod's
    cfg = arith_async.recipe("small")
    sides = {"mesh.sampler_devices": 4, "mesh.learner_devices": 4, "learner.group_size": 6}
    cfg = replace(cfg, **sides)  # 24 sequences a step: a learner of 4 or 6 splits them
    stops = []
    driver = types.SimpleNamespace(running=running)
    run = types.SimpleNamespace(
        cfg=cfg,
        devices=jax.devices(),
        driver=driver if running else None,
        topology=types.SimpleNamespace(split=Split(4, 4)),
        learner=types.SimpleNamespace(version=1),
        stop_requested=False,
        stop_at_boundary=lambda: stops.append(True),
    )
    return PodResizer(run), run, stops


def test_run_resize_on_a_pod_goes_through_the_next_step_boundary(monkeypatch):
    resizer, run, stops = _pod_leader_for_resize(monkeypatch, running=True)
    assert resizer.resize(Split(2, 6), "api") is None  # logged when the pod has moved
    assert not stops  # nothing moves mid-step
    resizer.at_boundary()
    split, cause, _ = resizer.take()
    assert (split, cause) == (Split(2, 6), "api") and resizer.take() is None
    assert stops == [True]  # the driver stops at the boundary; the pod rebuilds


def test_run_resize_on_a_pod_that_is_not_training_is_refused_in_one_line(monkeypatch):
    resizer, *_ = _pod_leader_for_resize(monkeypatch, running=False)
    with pytest.raises(ConfigError, match=r"^Run.resize on a pod moves hosts through a check"):
        resizer.resize(Split(2, 6), "api")


def test_run_resize_on_a_pod_to_a_split_that_cannot_work_is_refused_at_once(monkeypatch):
    resizer, _, stops = _pod_leader_for_resize(monkeypatch, running=True)
    with pytest.raises(ConfigError, match=r"^Run.resize: 5/3: .*is not whole hosts"):
        resizer.resize(Split(5, 3), "api")
    assert resizer.take() is None and not stops


@pytest.mark.parametrize(
    "call, what",
    [
        (lambda run: run.resize(Split(2, 6)), "Run.resize"),
        (lambda run: run.evaluate(0), "Run.evaluate"),
        (lambda run: run.save(), "Run.save"),
        (lambda run: run.publish(), "Run.publish"),
        (lambda run: run.next_prompts(), "Run.next_prompts"),
        (lambda run: run.score([]), "Run.score"),
        (lambda run: run.make_request({}, 0), "Run.make_request"),
        (lambda run: run.run_phases(), "Run.run_phases"),
    ],
)
def test_the_leaders_operations_are_refused_on_the_other_processes(call, what):
    hosting = PodHosting(MemoryChannel(blocking=False))
    hosting.roles = Roles(sampler=(0,), learner=(1,), me=1)  # a learner process
    run = Run.__new__(Run)
    run.hosting = hosting
    with pytest.raises(ConfigError, match=rf"^{what} runs on the pod's leader .*process 0$"):
        call(run)


def test_an_error_in_a_pod_process_fails_the_pod_at_once():
    """Run.train on a process whose replay meets an unknown operation: the error reaches the
    others through the channel (they stop waiting), and this process raises it."""
    channel = MemoryChannel(blocking=False)
    channel.post("tick/0", [["sumbit", []]])
    hosting = PodHosting(channel)
    hosting.roles = Roles(sampler=(0, 1), learner=(2,), me=1)  # a sampler follower
    hosting.weights = None
    hosting.real_sampler = types.SimpleNamespace(interrupt=None, resume=None, abort=None)
    hosting.servers = []
    hosting.answers = types.SimpleNamespace(stop=lambda: None, conversations=None)
    run = Run.__new__(Run)
    run.hosting = hosting
    with pytest.raises(PodProtocolError, match="unknown pod operation 'sumbit'"):
        run.train()
    assert isinstance(channel.failed, PodProtocolError)
