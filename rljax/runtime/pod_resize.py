"""Resizing a pod in units of a host: 2+2 hosts -> 1+3 -> 2+2 within one run.

On one host a resize reshards in place (:mod:`rljax.runtime.resizing`). On a pod a host that
changes role must drop one role's objects and build the other's, and every process's
collectives change, so the pod does what a preemption and a relaunch would do, in-process:

1. **Decide** (the leader, at a step boundary): :func:`rljax.runtime.resizing.propose` asks
   ``mesh.resize_schedule`` (a function of the version) or the reallocation policy (the
   leader's PhaseMeter; its granularity whole hosts). The decision is taken once and carried to
   every process as a ``resize`` tick, so every process does the same from then on.
2. **Save**: the leader stops its driver as for SIGTERM; the checkpoint of that boundary holds
   the learner state (written by every process), the buffer, the prompts in flight (to be
   dispatched again) and the prompt stream's position, so nothing in flight is lost.
3. **Rebuild**: every process closes its checkpointer (the save is durable), lets go of its
   role's arrays, recomputes the topology and :func:`~rljax.mesh.roles.roles` for the new
   split, and builds the parts of its (possibly new) role. Engines and learners are kept per
   mesh, so a return to a split used before compiles nothing new.
4. **Restore**: every process restores that checkpoint (the save layout spans every device, so
   it does not depend on the split) onto the new learner mesh; the leader's driver resumes from
   the buffer and pending prompts it saved.

What it costs is logged as a ``resize`` record in metrics.jsonl: ``save_s`` (the leader, from
the decision until the checkpoint is durable), ``rebuild_s``, ``restore_s`` and ``compile_s``
(the slowest process's; compile seconds are what JAX reported while rebuilding and restoring,
and ``first_step_compile_s`` what the first learner step after it compiled).
"""

from __future__ import annotations

import time
from typing import Any

from rljax.config import ConfigError
from rljax.mesh.control import Channel
from rljax.mesh.resize import plan_resize
from rljax.mesh.roles import roles as roles_of
from rljax.mesh.topology import Topology
from rljax.policy.reallocation import Split
from rljax.runtime import resizing
from rljax.runtime.hosted import HostedRun


def check_shape(saved: dict[str, Any] | None, shape: dict[str, Any]) -> None:
    """Refuse to resume a checkpoint saved by another process count (one line, the fix named).

    Another host split with the same process count is fine: the checkpoint spans every device.
    """
    if saved is None or saved["processes"] == shape["processes"]:
        return
    raise ConfigError(
        f"the checkpoint was saved by a pod of {saved['processes']} processes "
        f"({len(saved['sampler'])} sampler + {len(saved['learner'])} learner hosts) but this run "
        f"has {shape['processes']}; relaunch with {saved['processes']} processes (any split of "
        "whole hosts), or use a fresh workdir"
    )


def check_split(run: HostedRun, split: Split, *, what: str) -> Topology:
    """The topology of ``split`` if every process can play a role in it; else a one-line error."""
    try:
        topology = plan_resize(run.cfg.mesh, split, run.devices, batch=run.cfg.learner.batch_size)
        roles_of(topology)
    except ConfigError as e:
        raise ConfigError(f"{what} {split.sampler_chips}/{split.learner_chips}: {e}") from None
    return topology


def check_schedule(run: HostedRun) -> None:
    """Every split of ``mesh.resize_schedule`` is whole hosts, refused at start on every process."""
    for version, sides in run.cfg.mesh.scheduled_splits().items():
        check_split(run, Split(*sides), what=f"config key 'mesh.resize_schedule' at {version}:")


def check_granularity(granularity: int, per_host: int) -> None:
    if granularity % per_host:
        raise ConfigError(
            f"config key 'mesh.reallocate_granularity' = {granularity} moves part of a host; a "
            f"pod moves whole hosts: set it to a multiple of {per_host}, the devices per host"
        )


def split_of(arg: dict[str, Any]) -> Split:
    """The split a ``resize`` tick carries."""
    return Split(*arg["split"])


class PodResizer:
    """The leader's resizer: a resize (the API's, the schedule's or the reallocator's) stops
    the driver at a step boundary as SIGTERM would, and the pod rebuilds through that boundary's
    checkpoint (:func:`rebuild`); the record is logged with the first step after it."""

    def __init__(self, run: HostedRun):
        self.run = run
        self._record: dict[str, Any] | None = None
        self._asked: Split | None = None
        self._decided: tuple[Split, str, float] | None = None  # (split, cause, when)

    def take(self) -> tuple[Split, str, float] | None:
        """The resize decided at the boundary the driver stopped at (split, cause, when), once."""
        decided, self._decided = self._decided, None
        return decided

    def resize(self, split: Split, cause: str) -> None:
        """Ask for ``split`` at the next step boundary; refused with one line when it is not
        whole hosts, or when no driver runs (a pod resizes only mid-run)."""
        run = self.run
        check_split(run, split, what="Run.resize:")
        if run.driver is None or not run.driver.running:
            raise ConfigError(
                "Run.resize on a pod moves hosts through a checkpoint at a step boundary of a "
                "running train(); call it from a step hook or another thread while train() "
                "runs, or set mesh.resize_schedule"
            )
        self._asked = split

    def at_boundary(self) -> None:
        run = self.run
        done = run.learner.version >= run.cfg.num_steps
        if run.stop_requested or done or run.driver is None:
            return
        asked, self._asked = self._asked, None
        proposal = (asked, "api") if asked is not None else resizing.propose(run)
        if proposal is None or proposal[0] == run.topology.split:
            return
        split, cause = proposal
        try:  # the schedule was checked at start; a policy may propose part of a host
            check_split(run, split, what=f"the {cause} proposed")
        except ConfigError as e:
            run.metrics.print(f"{e}; staying")
            return
        self._decided = (split, cause, time.perf_counter())
        run.stop_at_boundary()

    def logged(self, record: dict[str, Any], cause: str) -> None:
        """The leader logs a resize (completed by the first step after it, :meth:`after_step`)."""
        run = self.run
        self._record = {**record, "cause": cause}
        if run.reallocation is not None:  # the next decision weighs the measured cost
            run.reallocation.resized(record["seconds"])
        run.metrics.print(
            f"resized sampler/learner chips {record['from']} -> {record['to']} (hosts "
            f"{record['hosts_from']} -> {record['hosts_to']}) in {record['seconds']:.1f} s: save "
            f"{record['save_s']:.1f}, rebuild {record['rebuild_s']:.1f}, restore "
            f"{record['restore_s']:.1f}, compile {record['compile_s']:.1f}"
        )

    def after_step(self, metrics: dict[str, Any]) -> None:
        record, self._record = self._record, None
        if record is not None:  # the first step after a resize: what it compiled
            record["first_step_compile_s"] = metrics.get("compile_s", 0.0)
            self.run.metrics.write(record["version"], "resize", record)


def pod_costs(channel: Channel, key: str, me: int, mine: dict[str, float]) -> dict[str, float]:
    """Every process's resize costs, the slowest's of each (the leader's ``save_s``: it
    drained and saved the pipeline). Posting and reading them is also the barrier before the
    next collective."""
    channel.post(f"{key}/{me}", mine)
    costs = [channel.get(f"{key}/{p}", waiting_for=key) for p in range(channel.count)]
    record = {k: max(c[k] for c in costs) for k in mine}
    record["save_s"] = costs[0]["save_s"]
    return record
