"""Lending inside a step: the runtime's mechanisms behind :func:`rljax.policy.lending.decide`.

At every step boundary :class:`Lending` closes a one-step phase of its
:class:`~rljax.policy.meter.PhaseMeter` (the driver reports to it) and asks the pure policy what
to lend during the next step (``lending.*`` keys; ``Lending.force`` pins a decision instead):

- **Rollout-on-TrainPool** (async runs): while the learner waits for its batch, an engine
  replica on the learner's chips serves requests. Its weights are the learner's params, cast to
  ``sampling.dtype`` and ``device_put`` into the engine's layout on the same chips; its KV pool
  takes the memory the learner leaves free (``memory_stats``; on the CPU, which reports none,
  the sampler's own ``sampling.num_pages``); the engine is built once per mesh. The driver's
  sampler is a :class:`~rljax.runtime.lending.replicas.ReplicaSet`: admission counts the lent
  replica's slots and :func:`rljax.policy.routing.route` sends each group to one replica. The
  learner thread steps the lent replica while it waits. When the batch is ready, the replica's
  requests are interrupted and handed to the sampler, which resumes them as partial rollouts:
  their tokens keep the versions that produced them, so the staleness buffer's accounting holds
  (the lent replica's version is the learner's, never older than the sampler's).
- **Trainer-on-RollPool** (any mode): the learner's step computes the gradients of a share of
  its micro-batches on the sampler's chips (:class:`rljax.learner.loan.GradLoan`,
  :meth:`rljax.learner.learner.Learner.lent_grads`) and sums them into its own update; it stays
  the only optimiser and version authority.

Single-process (a pod refuses it: :func:`rljax.runtime.pod_hosting.check_pod`), and not
combined with ``mesh.reallocate`` yet (the config refuses that: :class:`rljax.config.RunConfig`).

Lending's one home, by what each part owns:

- :mod:`rljax.policy.lending` and :mod:`rljax.policy.lending_policy`: the pure policy, the
  cost model of a loan (:class:`~rljax.policy.lending.TrainLoan`) and the rounding of chips to
  whole units (:func:`~rljax.policy.lending.units`), shared by the runtime, the simulator and
  the fakes;
- this package, the runtime's mechanism: :mod:`.hooks` (:class:`Lending`: the policy, its meter
  and the driver's hooks, whatever the chips; :class:`LendingLearner`), :mod:`.devices`
  (:class:`RunLending`: loans carried out on a run's devices) and :mod:`.replicas`
  (:class:`ReplicaSet`: the driver's sampler while a replica is lent);
- the learner's half of a Trainer-on-RollPool loan is the learner's own
  (:meth:`rljax.learner.learner.Learner.lent_grads`); the simulator's and the fakes' mechanisms
  are :mod:`rljax.sim.lend` and :mod:`rljax.testing.fake_lending`.
"""

from rljax.runtime.lending.devices import (
    KV_MEMORY_FRAC,
    RunLending,
    build,
    driver_parts,
    kv_pages,
)
from rljax.runtime.lending.hooks import NONE, Lending, LendingLearner
from rljax.runtime.lending.replicas import MovableSampler, ReplicaSet

__all__ = [
    "KV_MEMORY_FRAC",
    "NONE",
    "Lending",
    "LendingLearner",
    "MovableSampler",
    "ReplicaSet",
    "RunLending",
    "build",
    "driver_parts",
    "kv_pages",
]
