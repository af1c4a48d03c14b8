"""Where a run's parts live: one process (or processes sharing both meshes), or a pod.

:class:`~rljax.runtime.run.Run` builds what every process builds alike (config checks, task,
tokenizer, topology, metrics, checkpoints) and runs the phases (warm start, evaluation, the
driver, evaluation). What differs on a pod is chosen once, when the run is built, as a
:class:`Hosting`:

- :class:`LocalHosting`: one process, or several processes that share both meshes (one SPMD
  program; each process reads and scores its own shard of the prompts, all-gathered).
- :class:`~rljax.runtime.pod_hosting.PodHosting`: several processes on split meshes, each
  playing one role; process 0 leads, the others replay its operations (docs/multihost.md).

A hosting builds the run's parts, each behind a Protocol (here, or in
:mod:`rljax.runtime.parts`; :mod:`rljax.testing.conformance` has the type checker hold every
implementation to its Protocol): ``prompts`` (:class:`PromptSource`), ``scorer``
(:class:`ScorerPart`), ``resizer`` (:class:`Resizer`), the sampler, learner and weight sync; and it
writes the checkpoints the run decides to save. Nothing else in the runtime asks which kind of
run it is in.
"""

from __future__ import annotations

import logging
from typing import Any, Protocol, cast

import jax

from rljax.config import ConfigError, RunConfig
from rljax.engine.sampler import Sampler
from rljax.learner.learner import Learner
from rljax.mesh import distributed
from rljax.mesh.weight_sync import WeightSync
from rljax.policy.reallocation import Split
from rljax.runtime import resizing, resume
from rljax.runtime.env_answers import EnvAnswers
from rljax.runtime.exchange import AllGather, Alone, Exchange
from rljax.runtime.hosted import HostedRun
from rljax.runtime.parts import LearnerPart, Parts
from rljax.runtime.prompts import PromptStream, resumed_position
from rljax.runtime.scoring import Scorer

log = logging.getLogger(__name__)


class Hosting(Protocol):
    """What differs between one process and a pod, chosen when the run is built."""

    @property
    def is_leader(self) -> bool:
        """Whether this process runs the phases (and the driver) and writes the metrics."""
        ...

    def check(self, cfg: RunConfig) -> None:
        """Refuse, with a one-line error, what this hosting cannot run (before any work)."""
        ...

    def build(self, run: HostedRun) -> Parts | None:
        """Build the run's parts on this process (learner state restored or new included): the
        leader's, or None on a pod's other processes (their role's objects are the hosting's)."""
        ...

    def train(self, run: HostedRun) -> dict[str, Any]:
        """Run the phases (``run.phases``: :meth:`Run.run_phases` unless replaced), or this
        process's share of them."""
        ...

    def warm_start(self, run: HostedRun) -> None:
        """The supervised warm start (``sft.*``), wherever the learner is."""
        ...

    def check_meta(self, meta: dict[str, Any]) -> None:
        """Refuse a checkpoint this hosting cannot resume (before its arrays are read)."""
        ...

    def checkpoint_extra(self) -> dict[str, Any]:
        """What a checkpoint's meta holds beside the run's state (a pod's shape)."""
        ...

    def write_state(
        self, run: HostedRun, version: int, meta: dict[str, Any], *, wait: bool
    ) -> None:
        """Write the learner state and ``meta`` as ``version`` (the run decided it is due);
        ``wait``: a forced save (the run's last), which a pod's processes see land."""
        ...

    def request_stop(self, run: HostedRun) -> None:
        """SIGTERM: stop at the next step boundary, checkpoint, return."""
        ...

    def fail(self, error: BaseException) -> None:
        """A build or a phase failed on this process: stop the others waiting for it."""
        ...


def hosting_for(cfg: RunConfig) -> Hosting:
    """The hosting of this process: a pod on several processes with split meshes."""
    if jax.process_count() > 1 and cfg.mesh.mode == "split":
        from rljax.runtime.pod_hosting import PodHosting

        return PodHosting()
    return LocalHosting()


def not_leader(what: str) -> ConfigError:
    """The one-line refusal of a leader's operation called on another process of a pod."""
    return ConfigError(
        f"{what} runs on the pod's leader (process {jax.process_index()} is not process 0, "
        "which takes every decision and posts it to the others); call it on process 0"
    )


# -- one process, or processes sharing both meshes ----------------------------------------------


class InPlaceResizer:
    """Resizes within the process: reshard the learner, rebuild the engine, re-publish
    (:mod:`rljax.runtime.resizing`)."""

    def __init__(self, run: HostedRun):
        self.run = run

    def resize(self, split: Split, cause: str) -> dict[str, Any] | None:
        return resizing.resize(self.run, split, cause)

    def at_boundary(self) -> None:
        resizing.maybe_reallocate(self.run)

    def after_step(self, metrics: dict[str, Any]) -> None:
        pass  # an in-place resize logs its record at once


class LocalHosting:
    """One process, or several processes that share both meshes (one SPMD program)."""

    is_leader = True

    def __init__(self) -> None:
        self.shard_index, self.shard_count = distributed.data_shard()

    def check(self, cfg: RunConfig) -> None:
        # Several processes here share both meshes (mesh.mode is not 'split'), which the config
        # already refuses to reallocate or lend on; what is left depends on the process count.
        n = self.shard_count
        if cfg.learner.batch_groups % n:
            raise ConfigError(
                f"config key 'learner.batch_groups' = {cfg.learner.batch_groups} does not divide "
                f"by the process count {n} (each process reads an equal share of the prompts); "
                f"set it to a multiple of {n}"
            )
        if cfg.mode == "async" and n > 1:
            raise ConfigError(
                f"config key 'mode' = 'async' on {n} processes needs split meshes (a pod run: "
                f"mesh.mode='split', sampler and learner on whole hosts); set mesh.mode="
                f"'split', or mode='sync' and buffer.max_staleness=0"
            )
        if n > 1:
            distributed.check_same_config(cfg)

    def build(self, run: HostedRun) -> Parts:
        cfg = run.cfg
        learner_mesh = run.topology.learner
        abstract = resume.abstract_learner(cfg, learner_mesh, run.loss)
        restored = resume.restore(run.ckpt, cfg, abstract, check_meta=self.check_meta)
        learner = resume.learner_for(cfg, learner_mesh, run.loss, restored, run.learners)
        run.adopt_learner(learner, None if restored is None else restored.meta, learner.graphdef)
        sampler_mesh = run.topology.sampler
        engine = run.build_engine(sampler_mesh)
        run.engines.put(sampler_mesh, engine)  # builds counts the resizes' cache misses
        weight_sync = WeightSync(
            engine.param_shardings,
            dtype=cfg.sampling.dtype,
            slices=run.topology.slices,
            adapters_only=cfg.lora.enabled,
        )
        sampler = Sampler(
            engine,
            weight_sync.copy(learner.params),
            version=learner.version,
            stop_ids=sorted(run.tokenizer.stop_ids),
        )
        exchange: Exchange = Alone() if self.shard_count == 1 else AllGather()
        prompts = PromptStream(
            run.train_examples,
            seed=cfg.seed,
            batch_size=cfg.learner.batch_groups,
            exchange=exchange,
            start=resumed_position(run.resumed_meta),
        )
        return Parts(
            sampler=sampler,
            learner=learner,
            weight_sync=weight_sync,
            prompts=prompts,
            scorer=Scorer(exchange, run.reward_pool(), run.tokenizer),
            resizer=InPlaceResizer(run),
            answers=EnvAnswers(run.conversations, exchange),
            engine=engine,
        )

    def train(self, run: HostedRun) -> dict[str, Any]:
        return run.phases()

    def warm_start(self, run: HostedRun) -> None:
        run.warm_start_learner(_local(run.learner))

    def check_meta(self, meta: dict[str, Any]) -> None:
        pass

    def checkpoint_extra(self) -> dict[str, Any]:
        return {}

    def write_state(
        self, run: HostedRun, version: int, meta: dict[str, Any], *, wait: bool
    ) -> None:
        assert run.ckpt is not None
        learner = _local(run.learner)
        params, opt_state = learner.saved_params, learner.opt_state
        run.ckpt.write(version, params=params, opt_state=opt_state, meta=meta)

    def request_stop(self, run: HostedRun) -> None:
        if run.driver is not None:
            run.driver.stop()

    def fail(self, error: BaseException) -> None:
        pass


def _local(learner: LearnerPart) -> Learner:
    """The run's learner, which one process builds and holds itself (a pod's leader holds a
    stand-in, and writes through its own hosting)."""
    return cast(Learner, learner)
