"""The driver's parts: the sampler, learner, weight sync and lender it is built with.

:class:`~rljax.runtime.driver.Driver` runs the same step loop whatever stands behind each part;
the members below are all it (with its safe point) uses. Who implements each:

- :class:`SamplerPart`: :class:`rljax.engine.sampler.Sampler` (an engine on the sampler mesh),
  :class:`rljax.runtime.pod.PodSampler` (a pod leader's sampler, each operation also posted to
  the other processes), :class:`rljax.runtime.replica_set.ReplicaSet` (the sampler while the
  learner lends a replica) and :class:`rljax.testing.fakes.FakeSampler` (a cost model).
- :class:`LearnerPart`: :class:`rljax.learner.learner.Learner`,
  :class:`rljax.runtime.pod.RemoteLearner` (a step posted to the learner processes),
  :class:`rljax.runtime.lending.LendingLearner` (a step that lends as decided) and
  :class:`rljax.testing.fakes.FakeLearner`.
- :class:`WeightSyncPart`: :class:`rljax.mesh.weight_sync.WeightSync`,
  :class:`rljax.runtime.pod.PodWeightSync` (a publish announces a version; the bytes move when
  the sampler swaps) and :class:`rljax.testing.fakes.FakeWeightSync`.
- :class:`LenderPart`: :class:`rljax.runtime.lending.Lending`, with its subclasses
  :class:`~rljax.runtime.lending.RunLending` (a run's devices) and
  :class:`rljax.testing.fake_lending.FakeLending` (the fakes' cost models).

The static type check (mypy, in ``.ci/run``) holds every implementation to its part
(:mod:`rljax.testing.conformance`): one that loses a member the driver uses, or changes its
signature, fails the check.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import numpy as np

    from rljax.engine.paged import PagedEngine
    from rljax.engine.sampler import Request, Trajectory
    from rljax.mesh.weight_sync import SyncStats
    from rljax.policy.reallocation import Split
    from rljax.policy.staleness import StalenessBuffer
    from rljax.runtime.env_answers import EnvAnswers
    from rljax.runtime.rollout import Group


class SamplerPart(Protocol):
    """Generates a group of samples per request, in slots; weights swap at a step boundary."""

    @property
    def version(self) -> int:
        """The params version new tokens are sampled with."""
        ...

    @property
    def num_slots(self) -> int:
        """Sequences decoded at once."""
        ...

    @property
    def busy_slots(self) -> int:
        """Slots holding a sequence now."""
        ...

    @property
    def free_slots(self) -> int:
        """Slots admission may fill now (a replica lent by the learner's included)."""
        ...

    @property
    def queued_samples(self) -> int:
        """Samples submitted that wait for a slot."""
        ...

    @property
    def kv_tokens(self) -> int:
        """Tokens the busy slots hold in the KV cache (what a decode step reads)."""
        ...

    def submit(self, requests: Sequence[Request]) -> list[int]:
        """Queue ``requests``; returns their ids."""
        ...

    def step(self) -> list[Trajectory]:
        """One generate call; returns the samples it finished."""
        ...

    def has_work(self) -> bool:
        """Whether a sample is running or waiting."""
        ...

    def set_params(self, params: Any, version: int) -> None:
        """Stage ``params`` of ``version``; they apply at the next generate boundary."""
        ...

    def abort(self, request_id: int) -> None:
        """Drop every sample of a request."""
        ...

    def interrupt(self, request_id: int) -> int:
        """Hold a request's samples with their tokens so far; returns how many."""
        ...

    def resume(self, request_id: int) -> None:
        """Queue a held request's samples again (they continue from their prefixes)."""
        ...


class RunSamplerPart(SamplerPart, Protocol):
    """The sampler a run holds: the driver's part, plus what the run's own phases use."""

    def run(self, requests: Sequence[Request]) -> list[Trajectory]:
        """Generate ``requests`` to the end (held-out evaluation); their samples."""
        ...

    def clear(self) -> int:
        """Drop every running and waiting sample (the driver is done); how many."""
        ...


class LearnerPart(Protocol):
    """Trains on a batch; each step advances the version by one."""

    @property
    def version(self) -> int:
        """Steps taken: the version of ``params``."""
        ...

    @property
    def params(self) -> Any:
        """The weights a publish sends (None where they live on other processes)."""
        ...

    def step(self, batch: Any) -> dict[str, Any]:
        """One learner step on ``batch``; returns its metrics."""
        ...


class WeightSyncPart(Protocol):
    """Hands the learner's weights to the sampler, versioned."""

    @property
    def history(self) -> Sequence[SyncStats]:
        """The newest publishes, oldest first."""
        ...

    def due(self, version: int) -> bool:
        """Whether ``version`` should be published."""
        ...

    def publish(self, params: Any, version: int) -> SyncStats:
        """Make ``params`` the newest version the sampler can take."""
        ...

    def acquire(self) -> tuple[Any, int] | None:
        """The newest ``(params, version)``, or None before the first publish."""
        ...


class DriverView(Protocol):
    """What a lender reads of the driver it serves."""

    @property
    def buffer(self) -> StalenessBuffer: ...

    def wake(self) -> None: ...

    def buffer_rows(self) -> list[dict[str, int]]: ...


class LenderPart(Protocol):
    """Lends the learner's chips to rollout while it waits for its batch."""

    def bind(self, driver: DriverView) -> None:
        """Called once by ``Driver(lender=...)``: the driver this lender serves."""
        ...

    def waiting(self, learner: LearnerPart) -> None:
        """The learner starts waiting for a batch."""
        ...

    def serve(self) -> bool:
        """One generate on a lent replica; False when there is none or it has nothing to do."""
        ...

    def ready(self) -> None:
        """The batch is ready: take the lent chips back before the learner trains."""
        ...


class PromptSource(Protocol):
    """The training prompt stream the run's driver reads, a batch at a time."""

    def __next__(self) -> list[dict]:
        """The next global batch of examples (every process gets the same list)."""
        ...

    def get_state(self) -> dict[str, Any]:
        """This process's position, as a checkpoint holds it."""
        ...

    def home(self, example: dict) -> int | None:
        """The sampler host whose slots ``example``'s samples take (None: any slot)."""
        ...

    def stop(self) -> None:
        """The end of a build: let go of whatever reads ahead."""
        ...


class ScorerPart(Protocol):
    """Rewards for trajectories, wherever the reward functions run."""

    def score(self, trajs: list[Trajectory]) -> tuple[np.ndarray, dict[str, int]]:
        """(rewards of ``trajs`` in order, failures by kind over every scoring process); each
        trajectory's ``reward`` is set too."""
        ...

    def stop(self) -> None: ...


class Resizer(Protocol):
    """Moves chips between the meshes: asked by the API or at the driver's step boundary."""

    def resize(self, split: Split, cause: str) -> dict[str, Any] | None:
        """Move to ``split``; the record logged, or None when nothing moved (yet)."""
        ...

    def at_boundary(self) -> None:
        """The safe point after a learner step: resize if the schedule or the policy asks."""
        ...

    def after_step(self, metrics: dict[str, Any]) -> None:
        """A train step was logged with ``metrics`` (a resize's record may wait for it)."""
        ...


@dataclasses.dataclass(frozen=True)
class Parts:
    """The leader's parts of a run: what :meth:`Hosting.build <rljax.runtime.hosting.Hosting.
    build>` returns and the :class:`~rljax.runtime.run.Run` holds as one field.

    Frozen: a resize or a loan that changes a part makes new parts
    (:meth:`~rljax.runtime.run.Run.replace_parts`); nothing writes into them.
    """

    sampler: RunSamplerPart
    learner: LearnerPart
    weight_sync: WeightSyncPart
    prompts: PromptSource
    scorer: ScorerPart
    resizer: Resizer
    answers: EnvAnswers  # each conversation's Turns, and its env's answers where they run
    # What the driver's learner steps on, from groups; None: the run packs its own batches (its
    # learner is in this process), a pod's leader posts the groups themselves.
    batches: Callable[[list[Group]], Any] | None = None
    engine: PagedEngine | None = None  # this process's engine, where it has one
    lender: Any = None  # lending.enabled: a rljax.runtime.lending RunLending
