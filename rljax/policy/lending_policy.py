"""The lending policy across phases: a running loan is judged by what it measured.

:func:`rljax.policy.lending.decide` predicts a loan's saving from one phase;
:class:`LendingPolicy` owns what one phase cannot tell: the unlent baseline, whether the running
loan ever paid, and the loans that failed. The runtime (:mod:`rljax.runtime.lending`) and the
simulator (:mod:`rljax.sim.lend`) both decide through it.
"""

from __future__ import annotations

import dataclasses

from rljax.policy.lending import (
    HELD_THRESHOLD,
    LendDirection,
    LendingConfig,
    LendingDecision,
    decide,
    no_loan,
    phase_s,
)
from rljax.policy.reallocation import PhaseStats, Split


class LendingPolicy:
    """:func:`decide` across phases: a running loan is judged by what it measured.

    The model in :func:`decide` predicts a loan's saving from a phase run *without* it. A phase
    run *with* a loan looks different (the borrowed replicas took part of the sampler's work,
    the learner waited less), and read as if unlent it predicts that lending would save
    nothing: the loan was returned every other phase, and ran half the time. So, per call:

    * the first phase: it holds the pipeline fill (and, in the runtime, the first compiles), so
      it is neither a baseline nor a basis for a loan: nothing is lent;
    * the phase ran without a loan: its per-step time is the baseline, and :func:`decide`
      answers; a loan that failed before (see below) is proposed again only when the model
      predicts at least its failed prediction plus the ``min_gain_frac`` floor;
    * the phase ran with a loan and a baseline on the same split is known: the measured saving
      is baseline minus this phase's per-step time. At least the floor keeps the loan as it
      is; less returns it, and if that loan never paid, its direction is marked failed at the
      saving the model had predicted for it.

    Every host of a pod that feeds equal stats in the same order decides the same.
    """

    def __init__(
        self,
        config: LendingConfig,
        *,
        param_bytes: float = 0.0,
        held_threshold: float = HELD_THRESHOLD,
    ):
        self.config = config
        self.param_bytes = param_bytes
        self.held_threshold = held_threshold  # reallocator.held_threshold (see decide)
        self.running = no_loan("no phase measured yet")
        self._baseline: tuple[Split, float] | None = None  # (split, per-step s), unlent
        self._paid = False  # the running loan measured a saving at least once
        self._failed: dict[LendDirection, float] = {}  # predicted gain of a loan that never paid
        self._phases = 0

    def decide(self, stats: PhaseStats, split: Split) -> LendingDecision:
        """What to lend in each step of the next phase, given the phase just measured."""
        self._phases += 1
        if self._phases == 1:
            self.running = no_loan("first phase: it holds the pipeline fill; measuring a baseline")
            return self.running
        step = phase_s(stats) / max(1, stats.steps)
        running, floor = self.running, self.config.min_gain_frac * step
        if self._baseline is not None and self._baseline[0] != split:
            self._baseline, self._failed = None, {}  # measured on another split
        lent = running.direction is not LendDirection.NONE
        if self.config.enabled and step > 0 and lent and self._baseline is not None:
            base = self._baseline[1]
            saved = base - step
            if saved >= self.config.min_gain_frac * base:
                self._paid = True
                decision = dataclasses.replace(
                    running,
                    expected_gain_s=saved,
                    reason=f"{running.direction.value}: keeps {running.chips} chips, measured "
                    f"{saved:.2f} s saved of a {base:.2f} s unlent step",
                )
            else:
                if not self._paid:
                    self._failed[running.direction] = running.expected_gain_s
                decision = no_loan(
                    f"returns the loan: {running.direction.value} saved {saved:+.2f} s of a "
                    f"{base:.2f} s unlent step, below {self.config.min_gain_frac * base:.2f} s"
                )
        else:
            if not lent and step > 0:
                self._baseline = (split, step)
            decision = decide(
                stats,
                split,
                self.config,
                param_bytes=self.param_bytes,
                held_threshold=self.held_threshold,
            )
            failed = self._failed.get(decision.direction)
            if failed is not None and decision.expected_gain_s < failed + floor:
                decision = no_loan(
                    f"{decision.direction.value} predicted {decision.expected_gain_s:.2f} s, but a "
                    f"loan predicted {failed:.2f} s saved nothing; waits for {failed + floor:.2f} s"
                )
        if decision.direction is not running.direction:
            self._paid = False
        self.running = decision
        return decision
