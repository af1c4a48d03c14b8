"""Resizing a running :class:`~rljax.runtime.run.Run`: when, and the steps in order.

The mechanisms (reshard the learner, rebuild the engine, detach and attach the sampler) are in
:mod:`rljax.mesh.resize`; the decision is the pure Reallocator's (``rljax.policy``), fed by the
run's PhaseMeter through :class:`~rljax.mesh.resize.Reallocation`. This module sequences them at
the driver's safe point.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any, cast

from rljax.learner.learner import Learner
from rljax.mesh.resize import attach_sampler, detach_sampler, move_learner, plan_resize
from rljax.mesh.weight_sync import WeightSync
from rljax.policy.reallocation import Split
from rljax.runtime.hosted import HostedRun


def resize(run: HostedRun, split: Split, cause: str) -> dict[str, Any] | None:
    """Move ``run`` to ``split`` at a safe point; returns the record logged, or None if no-op.

    In-flight requests are interrupted and resumed as partial rollouts; learner params,
    optimizer state and reference params are resharded onto the new learner mesh; the engine is
    rebuilt on the new sampler mesh (one per mesh, reused on a return) and the weights
    re-published. The buffer is untouched. A split that cannot work raises a one-line error
    before anything moves. From another thread during a run, it waits for the next boundary.
    """
    driver = run.driver
    if driver is not None and driver.running and not driver.on_learner_thread():
        return driver.call_at_boundary(lambda: resize(run, split, cause))
    topology = plan_resize(run.cfg.mesh, split, run.devices, batch=run.cfg.learner.batch_size)
    old = run.topology.split
    if split == old:
        return None
    assert old is not None  # plan_resize refused a colocated run (no split to move from)
    # One process's parts (a pod resizes through rljax.runtime.pod_resize): the hosting built
    # a Learner and a WeightSync, whose arrays move here.
    weight_sync = cast(WeightSync, run.weight_sync)
    start = time.perf_counter()
    # The driver's in-flight requests need interrupting even once its threads have stopped.
    pause: contextlib.AbstractContextManager[list[int]] = (
        driver.safe_point() if driver is not None else contextlib.nullcontext([])
    )
    with pause as interrupted:
        detach_sampler(run.sampler)
        learner = move_learner(cast(Learner, run.learner), topology.learner, run.learners)
        engine = run.engines.get(topology.sampler, lambda: run.build_engine(topology.sampler))
        weight_sync.retarget(engine.param_shardings)
        sync = weight_sync.publish(learner.params, learner.version)
        published = weight_sync.acquire()
        assert published is not None  # the publish above
        attach_sampler(run.sampler, engine, *published)
        run.replace_parts(learner=learner, engine=engine)
        run.move_to(topology)
        if driver is not None:
            driver.use_learner(learner)
    seconds = time.perf_counter() - start
    record = {
        "from": f"{old.sampler_chips}/{old.learner_chips}",
        "to": f"{split.sampler_chips}/{split.learner_chips}",
        "sampler_devices": split.sampler_chips,
        "learner_devices": split.learner_chips,
        "seconds": seconds,
        "cause": cause,
        "interrupted_requests": len(interrupted),
        "sync_bytes": sync.bytes,
        "engines_built": run.engines.builds,
        "learners_built": run.learners.builds,
        "version": run.learner.version,
    }
    run.timeline.add("resize", start, start + seconds, track="learner", **record)
    run.metrics.write(run.learner.version, "resize", record)
    run.metrics.print(
        f"resized sampler/learner chips {record['from']} -> {record['to']} in {seconds:.2f} s"
    )
    if run.reallocation is not None:
        run.reallocation.resized(seconds)
    return record


def maybe_reallocate(run: HostedRun) -> dict[str, Any] | None:
    """At a step boundary: resize if the schedule or the reallocation policy asks for a split."""
    proposal = propose(run)
    return None if proposal is None else resize(run, *proposal)


def propose(run: HostedRun) -> tuple[Split, str] | None:
    """(split, cause) that ``mesh.resize_schedule`` or the reallocation policy asks for at this
    step boundary, validated by :func:`plan_resize`; None to stay. A pod's leader asks too."""
    if run.driver is None:
        return None
    scheduled = run.cfg.mesh.scheduled_splits().get(run.learner.version)
    if scheduled is not None:
        split = Split(*scheduled)
        plan_resize(run.cfg.mesh, split, run.devices, batch=run.cfg.learner.batch_size)
        return (split, "schedule") if split != run.topology.split else None
    r = run.reallocation
    if r is None or not r.due:
        return None
    # Until a resize is measured: moving params and two Adam moments once (>= 3 syncs).
    history = run.weight_sync.history
    current = run.topology.split
    assert current is not None  # reallocation needs split meshes (the config refuses otherwise)
    stats = r.phase(
        split=current,
        slots=run.sampler.num_slots,
        buffer_rows=run.driver.buffer_rows(),
        batch_groups=run.cfg.learner.batch_groups,
        estimated_switch_s=3 * history[-1].seconds if history else 0.0,
    )
    target = r.policy.decide(stats)
    if target is None:
        return None
    try:
        plan_resize(run.cfg.mesh, target, run.devices, batch=run.cfg.learner.batch_size)
    except ValueError as e:  # ConfigError too: the policy proposed a split that can't work
        run.metrics.print(f"reallocator proposed {target}; staying ({e})")
        return None
    return target, "reallocator"
