"""Lending over the fakes: the runtime's policy, meter, replica set and driver hooks, with each
loan carried out on the cost models of :mod:`rljax.testing.fakes` instead of devices.

The chips are counted, not owned: the sampler is a :class:`~rljax.testing.fakes.FakeSampler`
of ``sampler_chips / tp`` replicas of ``tp`` chips each, stepping in lock-step; the learner a
:class:`~rljax.testing.fakes.FakeLearner` whose step of ``T`` seconds is work spread evenly
over its ``learner_chips``. The costs are the policy's own (``LendingConfig``), slept where the
runtime pays them, so the policy's model and the fakes agree on what a loan costs and the
benchmark measures whether its decisions pay:

- **Rollout-on-TrainPool**: ``lent_units(chips, tp)`` replicas (whole ones, at least one; the
  policy's rounding, :func:`rljax.policy.lending.lent_units`) like the sampler's, holding
  the learner's params and version, start after ``prepare_s`` (slept on the learner thread, as
  :class:`~rljax.runtime.lending.RunLending` copies the weights there) and serve routed
  requests while the learner waits; when the batch is ready their requests go back to the
  sampler as partial rollouts, and the learner starts ``release_s`` later; the sampler that
  adopts them prefills their cached tokens again first (``FakeSampler(prefill_s_per_token=...)``,
  as the simulator charges the replica that resumes them).
- **Trainer-on-RollPool**: ``k = parked_units(chips, tp, replicas) * tp`` sampler chips, in whole
  replicas and leaving one sampling (:func:`rljax.policy.lending.parked_units`), are
  parked (their sequences back in the sampler's queue) for ``c + s T L / k`` seconds while the
  learner does its own ``(1 - s) T``, where ``s`` is the lent share of the micro-batches and
  ``c = train_prepare_s + release_s + grad_transfer_s_per_gb * param_bytes / 1e9``; the step
  takes the longer of the two. A loan that would not shorten the step is not taken. The figures
  are the policy's own model (:class:`~rljax.policy.lending.TrainLoan`).

This is the mechanism :mod:`rljax.sim.lend` simulates, on the real driver and threads;
:class:`LendWorkload` describes one workload to both (``scripts/bench_pipeline.py`` runs them).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from rljax.models import presets
from rljax.policy.lending import (
    LendingConfig,
    TrainLoan,
    parked_units,
    train_loan_cost_s,
)
from rljax.policy.reallocation import Split
from rljax.runtime.lending.hooks import Lending
from rljax.sim.config import SimConfig
from rljax.sim.measured import MeasuredCosts
from rljax.sim.simulator import Simulator
from rljax.sim.workload import LengthModel
from rljax.testing.fakes import FakeLearner, FakeSampler, sleep_cost


class FakeLending(Lending):
    """Lending for a driver over the fakes (see the module docstring).

    Args:
      config: the policy's knobs and the loans' costs.
      sampler: the driver's sampler, ``split.sampler_chips // tp`` replicas.
      split: the chips of each role.
      tp: chips per sampler replica (the unit chips are lent in).
      batch_groups: B, groups per learner step.
      micro_batches: the learner step's micro-batches (the unit of a Trainer-on-RollPool share).
      param_bytes: bytes of the parameters (and so of the gradients a loan moves).
      mode: the driver's mode.
    """

    def __init__(
        self,
        config: LendingConfig,
        sampler: FakeSampler,
        *,
        split: Split,
        tp: int,
        batch_groups: int,
        micro_batches: int,
        param_bytes: float,
        mode: str = "async",
    ):
        if split.sampler_chips != sampler.replicas * tp:
            raise ValueError(
                f"the sampler has {sampler.replicas} replicas of tp={tp} chips, not the split's "
                f"{split.sampler_chips} sampler chips; build it with replicas=sampler_chips // tp"
            )
        super().__init__(config, sampler, mode=mode, tp=tp)
        self.sampler = sampler  # replicas.main: its replicas are parked and copied
        self.split = split
        self.batch_groups = batch_groups
        self.micro_batches = micro_batches
        self.param_bytes = param_bytes

    def at_boundary(self, step: int) -> None:
        """Close the step's phase and decide what to lend in the next (the driver's
        ``on_boundary``)."""
        stats = self.meter.stats(
            split=self.split,
            slots=self.sampler.num_slots,
            buffer_rows=self.driver.buffer_rows() if self.driver is not None else [],
            batch_groups=self.batch_groups,
            switch_cost_s=0.0,
            granularity=self.tp,
        )
        self.decide(stats, self.split, self.param_bytes)

    def _open_replica(self, learner: FakeLearner, units: int) -> FakeSampler:
        main = self.sampler
        sleep_cost(self.config.prepare_s)
        return FakeSampler(
            slots=units * (main.num_slots // main.replicas),
            replicas=units,
            step_cost_s=main.step_cost_s,
            length_sampler=main.length_sampler,
            seed=main.seed,
            version=learner.version,
            params=learner.params,
            vocab_size=main.vocab_size,
            prefill_s_per_token=main.prefill_s_per_token,
        )

    def _close_replica(self, replica: FakeSampler) -> None:
        sleep_cost(self.config.release_s)

    def _micro_batches(self, learner) -> int:
        return self.micro_batches

    def _lent_step(
        self, learner: FakeLearner, batch, chips: int, micro_batches: int
    ) -> dict[str, Any]:
        main = self.sampler
        step_s = float(learner.step_cost_s(batch))
        count = parked_units(chips, self.tp, main.replicas)
        share = micro_batches / self.micro_batches
        cost = train_loan_cost_s(self.config, self.param_bytes)
        loan = TrainLoan(step_s, share, self.split.learner_chips, count * self.tp, cost)
        if not loan.shortens:
            self.stats["loans_not_taken"] += 1
            return learner.step(batch)
        parked = main.park(count)
        try:
            sleep_cost(loan.lent_s)
        finally:
            main.unpark(parked)
        sleep_cost(max(0.0, loan.own_s - loan.lent_s))
        return learner.commit(batch, loan.step_s)


@dataclasses.dataclass(frozen=True)
class LendWorkload:
    """A lending workload: chips per role, one replica's slots, and each call's cost."""

    name: str
    sampler_chips: int
    learner_chips: int
    tp: int  # chips per sampler replica: the unit chips are lent in
    slots_per_replica: int
    group_size: int
    batch_groups: int
    prompt_len: int
    median_len: float  # lognormal response lengths
    sigma: float
    max_len: int
    decode_s: float  # one replica's decode step, whatever its load (memory bound)
    learn_per_token_s: float  # the learner's step on all its chips, per trained token
    sync_s: float  # weight publish
    eta: int
    micro_batches: int  # the unit of a Trainer-on-RollPool share
    lending: LendingConfig  # the policy's knobs and each loan's costs
    steps: int
    warmup: int
    # A moved sequence's prefill again, per cached token (rljax.policy.lending.reprefill_s):
    # build the FakeSampler with the same prefill_s_per_token so both charge it.
    prefill_s_per_token: float = 0.0

    @property
    def replicas(self) -> int:
        return self.sampler_chips // self.tp

    def cost_model(self) -> MeasuredCosts:
        """The simulator's costs: the fakes' cost models, call for call (SmolLM2's bytes)."""
        return MeasuredCosts(
            model=presets.PRESETS["smollm2-135m"],
            tp=self.tp,
            decode_s_per_step=self.decode_s,
            train_step_s_per_token=self.learn_per_token_s,
            learner_chips=self.learner_chips,
            publish_s=self.sync_s,
            reprefill_s_per_token=self.prefill_s_per_token,
        )

    def lender(self, sampler: FakeSampler) -> FakeLending:
        """Lending over ``sampler`` (``sampler_chips // tp`` replicas) on this workload's chips."""
        return FakeLending(
            self.lending,
            sampler,
            split=Split(self.sampler_chips, self.learner_chips),
            tp=self.tp,
            batch_groups=self.batch_groups,
            micro_batches=self.micro_batches,
            param_bytes=self.cost_model().weight_bytes,
        )

    def simulate(self, lend: bool, seed: int, steps: int) -> float:
        """The simulator's samples/s on this workload, lending by the policy or off."""
        sim = SimConfig(
            mode="lend" if lend else "async",
            total_chips=self.sampler_chips + self.learner_chips,
            sampler_chips=self.sampler_chips,
            steps=steps,
            batch_groups=self.batch_groups,
            group_size=self.group_size,
            prompt_tokens=self.prompt_len,
            max_staleness=self.eta,
            max_slots=self.slots_per_replica,
            sync_pauses_sampler=False,  # a fake sampler swaps at a step boundary, no pause
            phase_steps=1,  # the runtime decides after every step
            granularity=self.tp,
            lending=self.lending,
            seed=seed,
            timeline=False,
        )
        lengths = LengthModel(
            median=self.median_len, sigma=self.sigma, tail_prob=0.0, max_tokens=self.max_len
        )
        return Simulator(sim, self.cost_model(), lengths).run().samples_per_s
