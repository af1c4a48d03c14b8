"""The real :class:`~rljax.runtime.driver.Driver` over the fakes of :mod:`rljax.testing.fakes`.

What the driver tests and the soak share: an endless stream of numbered prompts
(:class:`NumberedPrompts`), a builder that wires the real staleness buffer and controller
around a fake sampler and learner and records what its callbacks saw (:func:`fake_driver`),
and a run that a hang cannot stall (:func:`run_with_watchdog`).
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from rljax.engine.sampler import Request, Trajectory
from rljax.policy.staleness import StalenessBuffer, StalenessController
from rljax.runtime.driver import Driver
from rljax.runtime.rollout import Group
from rljax.testing.fakes import FakeWeightSync, fake_make_batch


class NumberedPrompts:
    """An endless prompt stream of examples ``{"id": n}``, numbered from 0, ``batch`` a chunk.

    ``issued`` lists every id drawn, in order; :meth:`get_state` is what a driver's
    ``prompt_state`` saves.
    """

    def __init__(self, batch: int):
        if batch < 1:
            raise ValueError(f"NumberedPrompts(batch={batch}): a chunk needs at least 1 prompt")
        self.batch = batch
        self.issued: list[int] = []

    def __iter__(self) -> NumberedPrompts:
        return self

    def __next__(self) -> list[dict]:
        chunk = [{"id": self.drawn + i} for i in range(self.batch)]
        self.issued.extend(e["id"] for e in chunk)
        return chunk

    @property
    def drawn(self) -> int:
        return len(self.issued)

    def get_state(self) -> dict[str, int]:
        return {"drawn": self.drawn}


@dataclasses.dataclass
class DriverRecord:
    """What a driver built by :func:`fake_driver` did, as seen from its callbacks."""

    dispatched: dict[int, Any] = dataclasses.field(default_factory=dict)  # rid -> example id
    consumed: list[Any] = dataclasses.field(default_factory=list)  # example ids, in order
    staleness: list[int] = dataclasses.field(default_factory=list)  # per consumed group
    batch_sizes: list[int] = dataclasses.field(default_factory=list)

    def request(self, example: Any, rid: int, prompt: Sequence[int], group_size: int) -> Request:
        """The request of ``example`` (``group_size`` samples of ``prompt``), recorded."""
        self.dispatched[rid] = example["id"]
        return Request(list(prompt), group_size, payload=example, request_id=rid)

    def batch(self, groups: list[Group], learner_version: int) -> Any:
        """The fake batch of ``groups``, consumed at ``learner_version``, recorded."""
        self.batch_sizes.append(len(groups))
        self.staleness.extend(learner_version - g.min_version for g in groups)
        self.consumed.extend(g.example["id"] for g in groups)
        return fake_make_batch(groups)


def fake_driver(
    *,
    sampler: Any,
    learner: Any,
    group_size: int,
    batch_groups: int,
    num_steps: int,
    score: Callable[[list[Trajectory]], np.ndarray],
    eta: int = 0,
    overprovision: int = 0,
    max_concurrent: int | None = None,
    prompt: Sequence[int] = (1, 2, 3),
    prompts: Iterator[list] | None = None,
    weight_sync: Any = None,
    buffer: StalenessBuffer | None = None,
    controller: StalenessController | None = None,
    on_batch: Callable[[list[Group]], None] | None = None,
    record: DriverRecord | None = None,
    **options: Any,
) -> tuple[Driver, DriverRecord]:
    """The real driver over ``sampler`` and ``learner``, with the real buffer and controller.

    Each example ``{"id": ...}`` becomes a request of ``group_size`` samples of ``prompt``.
    ``record`` (a new :class:`DriverRecord` by default) gets every dispatch and consumed group;
    ``on_batch`` sees each batch's groups before the fake batch is made.

    Args:
      sampler, learner: the fakes (or anything with their interface).
      group_size, batch_groups: G and B.
      num_steps: learner steps to run.
      score: rewards for a list of trajectories, in order.
      eta, overprovision: the buffer's and controller's ``max_staleness`` and ``overprovision``.
      max_concurrent: groups in flight; default: a batch plus the overprovision, or as many
        groups as the sampler's slots hold if more.
      prompt: each request's prompt tokens.
      prompts: the prompt stream; default a :class:`NumberedPrompts` of ``batch_groups``.
      weight_sync, buffer, controller: replace the defaults (a free
        :class:`~rljax.testing.fakes.FakeWeightSync`, and the real buffer and controller
        built from ``eta`` and ``overprovision``).
      on_batch: called with each batch's groups, before ``record`` notes them.
      record: where to record; a subclass may carry more.
      **options: the driver's other arguments (``lockstep``, ``on_step``, ``on_boundary``, ...).
    """
    record = DriverRecord() if record is None else record
    if max_concurrent is None:
        max_concurrent = max(batch_groups + overprovision, sampler.num_slots // group_size)

    def make_batch(groups: list[Group]):
        if on_batch is not None:
            on_batch(groups)
        return record.batch(groups, learner.version)

    if buffer is None:
        buffer = StalenessBuffer(
            batch_groups=batch_groups, max_staleness=eta, overprovision=overprovision
        )
    if controller is None:
        controller = StalenessController(
            max_staleness=eta,
            batch_groups=batch_groups,
            max_concurrent=max_concurrent,
            overprovision=overprovision,
        )
    driver = Driver(
        sampler=sampler,
        learner=learner,
        weight_sync=FakeWeightSync() if weight_sync is None else weight_sync,
        buffer=buffer,
        controller=controller,
        prompts=NumberedPrompts(batch_groups) if prompts is None else prompts,
        make_request=lambda example, rid: record.request(example, rid, prompt, group_size),
        score=score,
        make_batch=make_batch,
        group_size=group_size,
        num_steps=num_steps,
        **options,
    )
    return driver, record


def run_with_watchdog(driver: Driver, limit_s: float = 30.0, *, start_step: int = 0) -> None:
    """``driver.run(start_step)``, stopped after ``limit_s`` seconds if still running: a hung
    pipeline then fails its test's checks of how far it got, instead of stalling the suite."""
    watchdog = threading.Timer(limit_s, driver.stop)
    watchdog.start()
    try:
        driver.run(start_step=start_step)
    finally:
        watchdog.cancel()
