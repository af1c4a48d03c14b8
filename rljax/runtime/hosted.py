"""What a hosting sees of the run it builds parts for: :class:`HostedRun`.

The hostings (:mod:`rljax.runtime.hosting`, :mod:`rljax.runtime.pod_hosting`) and the pod's
resizer read the run through this Protocol, not through :class:`~rljax.runtime.run.Run`
itself, which builds them: so the run's module imports the hostings and no hosting imports the
run's (no import circle), and the static type check holds :class:`Run` to every member listed
here (:mod:`rljax.testing.conformance`). A hosting changes the run only through its methods.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from rljax.checkpoint import Checkpointer
from rljax.config import RunConfig
from rljax.engine.paged import PagedEngine
from rljax.envs.conversation import Conversations
from rljax.learner.learner import Learner
from rljax.learner.losses import Loss
from rljax.mesh.resize import MeshCache, Reallocation
from rljax.mesh.topology import Topology
from rljax.metrics import MetricsWriter, Timeline
from rljax.rewards.pool import RewardPool
from rljax.runtime.batches import Encoding
from rljax.runtime.driver import Driver
from rljax.runtime.parts import LearnerPart, Parts, PromptSource, RunSamplerPart, WeightSyncPart


class HostedRun(Protocol):
    """The run, as its hosting builds and drives it."""

    # What every process builds alike before its hosting builds the parts.
    @property
    def cfg(self) -> RunConfig: ...

    @property
    def topology(self) -> Topology: ...

    @property
    def devices(self) -> list[Any]: ...

    @property
    def loss(self) -> Loss: ...

    @property
    def tokenizer(self) -> Any: ...

    @property
    def train_examples(self) -> list[dict]: ...

    @property
    def conversations(self) -> Conversations | None: ...

    @property
    def encoding(self) -> Encoding: ...

    @property
    def ckpt(self) -> Checkpointer | None: ...

    @property
    def metrics(self) -> MetricsWriter: ...

    @property
    def timeline(self) -> Timeline: ...

    @property
    def engines(self) -> MeshCache: ...

    @property
    def learners(self) -> MeshCache: ...

    @property
    def reallocation(self) -> Reallocation | None: ...

    @property
    def resumed_meta(self) -> dict[str, Any] | None: ...

    @property
    def sampler_model(self) -> tuple[Any, Any]: ...

    @property
    def step_hooks(self) -> list[Callable[[Any, int], None]]: ...

    @property
    def stop_requested(self) -> bool: ...

    @property
    def driver(self) -> Driver | None: ...

    # The leader's parts (None on a pod's other processes) and their members.
    @property
    def parts(self) -> Parts | None: ...

    @property
    def sampler(self) -> RunSamplerPart: ...

    @property
    def learner(self) -> LearnerPart: ...

    @property
    def weight_sync(self) -> WeightSyncPart: ...

    @property
    def prompts(self) -> PromptSource: ...

    # Building.
    def adopt_learner(
        self, learner: Learner | None, resumed_meta: dict[str, Any] | None, graphdef: Any
    ) -> None: ...

    def build_engine(self, mesh: Any) -> PagedEngine: ...

    def reward_pool(self) -> RewardPool: ...

    # Changing the run, each through its own method.
    def replace_parts(self, **changes: Any) -> Parts: ...

    def adopt_parts(self, parts: Parts | None) -> None: ...

    def move_to(self, topology: Topology) -> None: ...

    def open_checkpointer(self) -> None: ...

    def stop_at_boundary(self) -> None: ...

    def clear_stop(self) -> None: ...

    def request_stop(self, *_: Any) -> None: ...

    # The phases: ``phases`` is what the leader runs (``run_phases`` unless replaced).
    phases: Callable[[], dict[str, Any]]

    def run_phases(self) -> dict[str, Any]: ...

    def publish(self) -> None: ...

    def warm_start_learner(self, learner: Learner) -> None: ...

    def make_batch(self, groups: list[Any]) -> Any: ...
