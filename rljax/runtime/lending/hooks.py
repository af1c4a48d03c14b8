"""Lending's hooks in the driver, whatever the chips: :class:`Lending` (the policy, its meter,
the lent replica's routing and the hooks the driver calls) and :class:`LendingLearner` (the
driver's learner while lending). How a loan is carried out is a subclass's:
:class:`~rljax.runtime.lending.devices.RunLending` on a run's devices,
:class:`~rljax.testing.fake_lending.FakeLending` over the fakes' cost models.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Callable
from typing import Any

from rljax.policy.lending import (
    HELD_THRESHOLD,
    LendDirection,
    LendingConfig,
    LendingDecision,
    lent_units,
)
from rljax.policy.lending_policy import LendingPolicy
from rljax.policy.meter import PhaseMeter
from rljax.policy.reallocation import PhaseStats, Split
from rljax.runtime.lending.replicas import MovableSampler, ReplicaSet
from rljax.runtime.parts import DriverView

NONE = LendingDecision(LendDirection.NONE, 0, 0.0, 0.0, "nothing measured yet")


class LendingLearner:
    """The driver's learner: ``learner()``, whose step lends as decided (Trainer-on-RollPool)
    and whose metrics carry the step's lending record."""

    def __init__(self, lending: Lending, learner: Callable[[], Any]):
        self._lending = lending
        self._learner = learner

    @property
    def version(self) -> int:
        return self._learner().version

    @property
    def params(self) -> Any:
        return self._learner().params

    def step(self, batch: Any) -> dict[str, Any]:
        metrics = self._lending.learn(self._learner(), batch)
        metrics.update(self._lending.metrics())
        return metrics


class Lending:
    """Lending inside a step, whatever the chips: the policy, its meter and the loans' hooks.

    The driver reports its events to ``meter``, uses ``replicas`` as its sampler and calls the
    hooks :meth:`waiting`, :meth:`serve`, :meth:`ready`, :meth:`learn` and :meth:`metrics`
    (build it with :meth:`driver_parts`; the driver then binds itself, :meth:`bind`); the owner
    calls :meth:`decide` after every step. How a loan is carried out is a subclass's:
    :class:`~rljax.runtime.lending.devices.RunLending` on a run's devices,
    ``rljax.testing.fake_lending.FakeLending`` over the fakes' cost models. Set ``force`` to a
    LendingDecision to lend that way every step whatever the policy says (tests, benchmarks).

    Args:
      config: the policy's knobs (``RunConfig.lending``).
      sampler: the sampler the driver would use; ``replicas`` wraps it.
      mode: the run's mode; Rollout-on-TrainPool needs ``'async'``.
      max_new_tokens: the token budget of a routed request that names none.
      held_threshold: ``reallocator.held_threshold``, which the policy reads too.
      tp: chips per unit a loan is lent in (a replica of the fakes' sampler; 1 on a run's
        devices); loans are rounded to whole units by :func:`rljax.policy.lending.lent_units`.

    The hooks' ``learner`` is typed ``Any``: each subclass lends from its own kind (a
    :class:`~rljax.learner.learner.Learner`, a ``FakeLearner``) and overrides the hooks with it.
    """

    def __init__(
        self,
        config: LendingConfig,
        sampler: MovableSampler,
        *,
        mode: str = "async",
        max_new_tokens: int | None = None,
        held_threshold: float = HELD_THRESHOLD,
        tp: int = 1,
    ):
        self.config = config
        self.mode = mode
        self.tp = tp
        self.meter = PhaseMeter()
        self.policy = LendingPolicy(config, held_threshold=held_threshold)
        self.replicas = ReplicaSet(
            sampler, max_new_tokens=max_new_tokens, on_routed=self._wake_driver
        )
        # The driver lending through this; it binds itself when built.
        self.driver: DriverView | None = None
        self.force: LendingDecision | None = None
        self.decision = NONE
        self.decisions: list[LendingDecision] = []
        self.last_stats: PhaseStats | None = None  # what the last decision read
        self.stats: collections.Counter = collections.Counter()
        self._reported: collections.Counter = collections.Counter()

    # -- the driver -------------------------------------------------------------------------

    def driver_parts(self, learner: Callable[[], Any]) -> dict[str, Any]:
        """``Driver(...)``'s ``sampler``, ``learner``, ``meter`` and ``lender`` that make it lend
        through this: ``replicas``, a :class:`LendingLearner` over ``learner()`` (read at each
        step: a resize replaces it), ``meter`` and this lending itself."""
        lent = LendingLearner(self, learner)
        return {"sampler": self.replicas, "learner": lent, "meter": self.meter, "lender": self}

    def bind(self, driver: DriverView) -> None:
        """Called by ``Driver(lender=self)``: the driver whose buffer a loan reads and whose
        learner thread a group routed to the lent replica wakes."""
        self.driver = driver

    def _wake_driver(self) -> None:
        if self.driver is not None:
            self.driver.wake()

    # -- the policy -------------------------------------------------------------------------

    def decide(self, stats: PhaseStats, split: Split, param_bytes: float) -> LendingDecision:
        """Decide what to lend in the next step from the step just measured (``stats``)."""
        self.policy.param_bytes = param_bytes
        self.last_stats = stats
        decided = self.policy.decide(stats, split)
        if decided.loan(LendDirection.ROLLOUT_ON_TRAIN) and self.mode != "async":
            why = "Rollout-on-TrainPool needs mode='async' (a lock-step learner has no wait)"
            if decided.direction is LendDirection.ROLLOUT_ON_TRAIN:
                decided = decided.also or LendingDecision(LendDirection.NONE, 0, 0.0, 0.0, why)
            else:
                decided = dataclasses.replace(decided, also=None)
        self.decision = self.force or decided
        self.policy.running = self.decision  # the policy judges the loan the next step runs
        self.decisions.append(self.decision)
        return self.decision

    @property
    def _current(self) -> LendingDecision:
        return self.force or self.decision

    # -- Rollout-on-TrainPool ---------------------------------------------------------------

    def waiting(self, learner: Any) -> None:
        """The learner starts waiting for a batch: lend its chips to rollout if so decided."""
        d = self._current.loan(LendDirection.ROLLOUT_ON_TRAIN)
        if d is None or self.replicas.lent is not None or self._batch_ready(learner):
            return  # no loan, one running, or no wait to fill
        self.replicas.lend(self._open_replica(learner, lent_units(d.chips, self.tp)))
        self.stats["rollout_lends"] += 1

    def serve(self) -> bool:
        """One generate on the lent replica (the learner thread, while it waits)."""
        return self.replicas.serve()

    def ready(self) -> None:
        """The batch is ready: give the learner's chips back before it trains."""
        lent = self.replicas.release()
        if lent is not None:
            self._close_replica(lent)

    # -- Trainer-on-RollPool ----------------------------------------------------------------

    def learn(self, learner: Any, batch: Any) -> dict[str, Any]:
        """The learner's step, with a share of its micro-batches on the sampler's chips if so
        decided."""
        d = self._current.loan(LendDirection.TRAIN_ON_ROLL)
        if d is None:
            return learner.step(batch)
        micro = self._micro_batches(learner)
        lent = int(min(micro, max(1, round(d.share * micro))))
        self.stats["lent_micro_batches"] += lent
        self.stats["train_lends"] += 1
        return self._lent_step(learner, batch, d.chips, lent)

    # -- how a loan is carried out (subclasses) -----------------------------------------------

    def _batch_ready(self, learner: Any) -> bool:
        """Whether the learner's batch is ready already (then there is no wait to lend)."""
        return self.driver is not None and self.driver.buffer.ready(learner.version)

    def _open_replica(self, learner: Any, units: int) -> MovableSampler:
        """A sampler on ``units`` units of the learner's chips, holding its weights and
        version."""
        raise NotImplementedError

    def _close_replica(self, replica: Any) -> None:
        """Free what a released replica holds (its requests have been handed back)."""

    def _micro_batches(self, learner: Any) -> int:
        """How many micro-batches the learner's step is cut into (the unit a loan takes)."""
        return learner.cfg.micro_batches

    def _lent_step(
        self, learner: Any, batch: Any, chips: int, micro_batches: int
    ) -> dict[str, Any]:
        """The learner's step with its last ``micro_batches`` on the sampler's chips, ``chips``
        as decided (the subclass rounds them to the units it lends)."""
        raise NotImplementedError

    # -- metrics ----------------------------------------------------------------------------

    def metrics(self) -> dict[str, Any]:
        """This step's lending record: the decision in force and what lending did since the
        last call."""
        now = self.stats + self.replicas.stats
        delta = {k: now[k] - self._reported[k] for k in now}
        self._reported = collections.Counter(now)
        d = self._current
        return {
            "lending/direction": d.direction.value
            + (f"+{d.also.direction.value}" if d.also else ""),
            "lending/chips": d.chips,
            "lending/share": d.share,
            **{f"lending/{k}": int(v) for k, v in sorted(delta.items())},
        }
