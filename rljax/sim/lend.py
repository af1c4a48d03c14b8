"""The simulator's lending mechanisms, driven by :func:`rljax.policy.lending.decide`.

Mode ``lend`` is ``async`` on a static split, plus: every ``phase_steps`` learner steps the
simulator closes a :class:`~rljax.policy.meter.PhaseMeter` phase and asks the lending policy
(:class:`~rljax.policy.lending_policy.LendingPolicy`, as the runtime does) what to lend in each
step of the next phase, with the same ``PhaseStats`` the Reallocator reads. Loans are rounded
to whole replicas of ``tp`` chips as the runtime and the fakes round them
(:func:`~rljax.policy.lending.lent_units`, :func:`~rljax.policy.lending.parked_units`).

* Rollout-on-TrainPool: when the learner finishes publishing and its next batch is not ready,
  ``chips / tp`` extra replicas start on its chips. They decode after ``prepare_s`` (weights
  resharded on the same chips, KV pool allocated; compile cached), with the KV slots the
  learner's state leaves free, and take routed groups like any replica. When the batch is
  ready, each of their requests is interrupted and resumed on a sampler replica from its
  prefix (re-prefilled there; tokens keep their versions, so staleness is unchanged), and the
  learner starts ``release_s`` later. The lent replicas report nothing to the meter (it
  measures the sampler), and the learner's wait is still reported as ``LearnerWait``.
* Trainer-on-RollPool: when a batch is ready, the ``chips / tp`` least-loaded sampler replicas
  are parked for the step (their requests resumed on the other replicas) and compute ``share``
  of the micro-batches; the step takes ``max((1 - share) T, costs + share T L / chips)``, the
  costs being ``train_prepare_s + release_s`` and the gradients (parameter bytes) at
  ``grad_transfer_s_per_gb`` (the policy's :class:`~rljax.policy.lending.TrainLoan`). The parked
  slots are reported as held back (the policies chose not to use them for rollout), so the next
  phase's stats still show the idle capacity the loan used.
"""

from __future__ import annotations

from rljax.policy import lending
from rljax.policy.lending import (
    LendDirection,
    LendingConfig,
    LendingDecision,
    TrainLoan,
    lent_units,
    parked_units,
)
from rljax.policy.lending_policy import LendingPolicy
from rljax.policy.meter import SamplerIdle
from rljax.policy.reallocation import PhaseStats
from rljax.sim.replica import Replica


class Lender:
    """Carries out the lending policy's decisions inside a :class:`Simulator` run."""

    def __init__(self, sim, config: LendingConfig, force: LendingDecision | None = None):
        self.sim = sim
        self.config = config
        self.force = force  # lend this way every phase whatever the policy says (benchmarks)
        self.policy = LendingPolicy(
            config,
            param_bytes=sim.cost.weight_bytes,
            held_threshold=sim.reallocator.config.held_threshold,  # as the runtime's
        )
        self.decision = force or self.policy.running
        self.lent: list[Replica] = []  # Rollout-on-TrainPool replicas now running
        self.parked: list[Replica] = []  # sampler replicas computing gradients
        self._parked_since = 0.0
        self.decisions: list[tuple[float, str, int, float]] = []
        self.lent_steps = {LendDirection.ROLLOUT_ON_TRAIN: 0, LendDirection.TRAIN_ON_ROLL: 0}
        self.migrated = 0
        self.lent_slots = self._lent_slots()

    def _lent_slots(self) -> int:
        """KV slots of a replica on learner chips: the HBM the learner's state leaves free."""
        sim, cost = self.sim, self.sim.cost
        state_per_chip = 16 * cost.n_params / sim.learner_chips
        free = cost.tp * (cost.chip.hbm_bytes - state_per_chip) - cost.weight_bytes
        budget = free * cost.efficiencies.kv_memory_fraction
        tokens = sim.cfg.prompt_tokens + sim.lengths.mean(sim.cfg.steps)
        return max(0, min(sim.cfg.max_slots, int(budget // (cost.kv_token_bytes * tokens))))

    def decide(self, now: float, stats: PhaseStats) -> None:
        """Asks the policy for the next phase's loans."""
        self.decision = self.policy.decide(stats, self.sim._split())
        if self.force is not None:
            self.decision = self.policy.running = self.force
        for d in (self.decision, self.decision.also):
            if d is not None and d.direction is not LendDirection.NONE:
                self.decisions.append((now, d.direction.value, d.chips, d.share))

    # ----- moving requests -------------------------------------------------------------------

    def _evacuate(self, now: float, rep: Replica) -> None:
        """Interrupts every request on ``rep`` and resumes it on a sampler replica."""
        sim = self.sim
        prompt = sim.cfg.prompt_tokens
        targets = [r for r in sim.replicas if r is not rep]
        for rid in sorted(rid for rid, q in sim.running.items() if q.replica is rep):
            req = sim.running[rid]
            samples = rep.extract(now, req, prompt)
            if not samples:
                continue
            # The replica with the most unclaimed slots (then the lowest index) takes it.
            dest = max(targets, key=lambda r: (r.slots - r.n - r.queued, -r.index))
            done = sum(d for _, d in samples)
            req.replica = dest
            again = lending.reprefill_s(prompt + round(done), sim.cost.prefill_s_per_token)
            dest.resume(now, req, samples, prompt, again)
            sim._schedule_replica(dest)
            sim._changes += 1
            self.migrated += 1
        sim._schedule_replica(rep)

    # ----- Rollout-on-TrainPool --------------------------------------------------------------

    def on_learner_free(self, now: float) -> None:
        """The learner finished publishing: lend its chips if the next batch is not ready."""
        sim, d = self.sim, self.decision.loan(LendDirection.ROLLOUT_ON_TRAIN)
        if d is None or self.lent:
            return
        if sim.buffer.ready(sim.buffer.version) or self.lent_slots < sim.cfg.group_size:
            return
        ready = now + self.config.prepare_s
        for _ in range(lent_units(d.chips, sim.cost.tp)):
            rep = Replica(next(sim._replica_ids), sim.cost, self.lent_slots, now, False, None)
            rep.pause_until = ready
            rep.lent = True
            self.lent.append(rep)
            sim._schedule_replica(rep)
        sim._changes += 1
        self.lent_steps[LendDirection.ROLLOUT_ON_TRAIN] += 1

    def release(self, now: float) -> float:
        """The batch is ready: gives the learner's chips back; returns the learner's delay."""
        if not self.lent:
            return 0.0
        sim = self.sim
        lent, self.lent = self.lent, []
        for rep in lent:
            self._evacuate(now, rep)
            rep.epoch = -1  # its pending finish events are now stale
            sim.open.discard(rep)
        return self.config.release_s

    # ----- Trainer-on-RollPool ---------------------------------------------------------------

    def train_s(self, now: float, train_s: float) -> float:
        """The step's training seconds, lending sampler chips to it if the policy says so."""
        sim, d = self.sim, self.decision.loan(LendDirection.TRAIN_ON_ROLL)
        if d is None:
            return train_s
        count = parked_units(d.chips, sim.cost.tp, len(sim.replicas))
        if count < 1:
            return train_s
        cost = lending.train_loan_cost_s(self.config, sim.cost.weight_bytes)
        loan = TrainLoan(train_s, d.share, sim.learner_chips, count * sim.cost.tp, cost)
        if not loan.shortens:
            return train_s  # the loan would not shorten this step: keep the chips sampling
        sim._flush_held(now)
        sim._account_replicas(now)
        # The replicas whose requests are cheapest to move: the fewest KV tokens to re-prefill.
        victims = sorted(sim.replicas, key=lambda r: (r.base + r.n * r.p0, r.queued, r.index))
        victims = victims[:count]
        for rep in victims:
            sim.replicas.remove(rep)
            sim.open.discard(rep)
        for rep in victims:
            self._evacuate(now, rep)
            rep.advance(now)
            rep.epoch += 1
            sim.open.discard(rep)
        self.parked = victims
        self._parked_since = now
        self.lent_steps[LendDirection.TRAIN_ON_ROLL] += 1
        return loan.step_s

    def unpark(self, now: float) -> None:
        """The step is done: the parked replicas rejoin the sampler."""
        if not self.parked:
            return
        sim = self.sim
        sim._flush_held(now)
        sim._account_replicas(now)
        slots = sum(rep.slots for rep in self.parked)
        if sim.meter is not None and now > self._parked_since:
            sim.meter.record(SamplerIdle(self._parked_since, now, slots))
        sim.blocked_slot_s += slots * (now - self._parked_since)
        for rep in self.parked:
            rep.advance(now)
            rep.t0 = now
            sim.replicas.append(rep)
            sim._schedule_replica(rep)
        sim.replicas.sort(key=lambda r: r.index)
        self.parked = []
        sim._changes += 1

    def figures(self) -> dict:
        """The ``SimResult`` fields that describe the loans."""
        return {
            "lends": tuple(self.decisions),
            "lent_steps": tuple((d.value, n) for d, n in self.lent_steps.items()),
            "migrated": self.migrated,
        }
