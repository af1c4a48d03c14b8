"""One experiment: build the parts from a :class:`RunConfig`, then sequence the phases.

Phases: an optional supervised warm start (``runtime.warm_start``), held-out accuracy (greedy),
``num_steps`` RL steps through the one driver (``runtime.driver``: lock-step for mode='sync',
threaded for mode='async'), held-out accuracy again. With checkpointing on, a workdir that
holds a checkpoint resumes from it (``runtime.resume``), and SIGTERM checkpoints at the next
step boundary and returns.

One ``Run`` serves one process and a pod. What differs (where prompts are read and scored,
how weights cross the meshes, how a resize moves chips, how the state is written, which
phases this process runs) is the run's :class:`~rljax.runtime.hosting.Hosting`, chosen once
when the run is built; everything here is the same on every kind of run.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import time
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh

from rljax import io
from rljax.checkpoint import Checkpointer
from rljax.config import RunConfig
from rljax.data.tasks import check_prompts, load_task
from rljax.engine.paged import PagedEngine
from rljax.engine.sampler import Request, Trajectory
from rljax.envs.base import Env
from rljax.envs.conversation import Conversations
from rljax.learner.batch import TrainBatch
from rljax.learner.learner import Learner
from rljax.learner.losses import Loss, get_loss
from rljax.mesh.resize import MeshCache, Reallocation
from rljax.mesh.topology import Topology, build_topology
from rljax.mesh.weight_sync import sampler_model
from rljax.metrics import MetricsWriter, Timeline
from rljax.models.loading import check_tokenizer_fits, initial_model_config, load_tokenizer
from rljax.policy import admission
from rljax.policy.reallocation import Split
from rljax.rewards.model import RewardContext
from rljax.rewards.pool import RewardPool, failure_metrics
from rljax.rewards.registry import RewardFn, reward_for
from rljax.runtime import agents, evaluation, lending, resume
from rljax.runtime.batches import Encoding
from rljax.runtime.boundary import install_sigterm, restore_sigterm
from rljax.runtime.driver import Driver
from rljax.runtime.hosting import Hosting, hosting_for, not_leader
from rljax.runtime.parts import LearnerPart, Parts, PromptSource, RunSamplerPart, WeightSyncPart
from rljax.runtime.rollout import Group, encode_group
from rljax.runtime.teacher import check_teacher
from rljax.runtime.warm_start import warm_start

log = logging.getLogger(__name__)


class Run:
    """One experiment, built from a :class:`RunConfig`. ``Run(cfg, workdir).train()``.

    The same on one process and on every process of a pod (docs/multihost.md): ``hosting``
    (:func:`~rljax.runtime.hosting.hosting_for`) builds this process's parts.
    """

    metrics: MetricsWriter
    ckpt: Checkpointer | None
    rewards: RewardPool | None  # None on a process that scores nothing (a pod's learner)
    parts: Parts | None  # the leader's (Hosting.build); None before, and on a pod's others

    def __init__(
        self,
        cfg: RunConfig,
        workdir: str,
        *,
        reward_fn: RewardFn | None = None,
        loss: str | Loss | None = None,
        devices: Sequence[jax.Device] | None = None,
        hosting: Hosting | None = None,
        env: Callable[[], Env] | None = None,
        phases: Callable[[Run], dict[str, Any]] | None = None,
    ):
        self.ckpt = self.rewards = self.parts = None
        self.conversations: Conversations | None = None
        # What the leader runs in train(): run_phases, or ``phases`` (``rljax eval``'s).
        self.phases = self.run_phases if phases is None else functools.partial(phases, self)
        self.hosting: Hosting = hosting_for(cfg) if hosting is None else hosting
        try:
            self._build(cfg, workdir, reward_fn, loss, devices, env)
        except BaseException as e:
            self.hosting.fail(e)  # a pod's other processes stop waiting for this one at once
            self.close()  # a refused start leaves no checkpoint manager or worker running
            raise

    def _build(
        self,
        cfg: RunConfig,
        workdir: str,
        reward_fn: RewardFn | None,
        loss: str | Loss | None,
        devices: Sequence[jax.Device] | None,
        env: Callable[[], Env] | None,
    ) -> None:
        self.hosting.check(cfg)
        self.cfg = cfg
        self.workdir = str(io.ensure_writable_dir(workdir))
        self.loss = get_loss(loss or cfg.learner.loss, cfg.learner)
        self.tokenizer = load_tokenizer(cfg)
        skipped: Counter = Counter()  # a task file's unusable rows, by reason: counted, not fatal
        self.train_examples, self.heldout_examples = load_task(cfg.data, cfg.seed, skipped)
        prompts = self.train_examples + self.heldout_examples[: cfg.eval_examples]
        check_prompts(self.tokenizer, cfg.data, prompts, cfg.sampling.max_prefill_length)
        self.model_cfg = initial_model_config(cfg)
        check_tokenizer_fits(cfg, self.tokenizer, self.model_cfg)
        check_teacher(cfg, self.tokenizer, devices)  # opd's: loads, reads the policy's ids
        # reward.name's ('model' and 'judge' load their checkpoints here) or reward_fn
        ctx = RewardContext(self.tokenizer, cfg.data, cfg.sampling.max_seq_len, cfg.kernel_impl)
        self.reward, self.reward_batched = reward_for(cfg.reward, ctx, reward_fn)
        # Conversations (env.name or env=): the env's steps give the reward (docs/agents.md).
        self.conversations = agents.build(cfg, self.tokenizer, self.reward, env)
        self.encoding = Encoding(cfg, self.tokenizer, self.loss, self.conversations)
        self.env_metrics = agents.EnvMetrics()
        self.devices = list(jax.devices() if devices is None else devices)
        self.topology: Topology = build_topology(cfg.mesh, self.devices)
        self.timeline = Timeline()
        self.metrics = MetricsWriter(
            self.workdir, total_steps=cfg.num_steps, progress_bar=cfg.metrics.progress_bar
        )
        if skipped:
            self.metrics.write(0, "data", {f"skipped_rows/{why}": n for why, n in skipped.items()})
        self.open_checkpointer()
        self.engines, self.learners = MeshCache(), MeshCache()  # per mesh: resizes reuse them
        self.step_hooks: list[Callable[[Run, int], None]] = []  # hook(run, step) at boundaries
        self.reallocation = (
            Reallocation(cfg.mesh, cfg.reallocator, max_staleness=cfg.buffer.max_staleness)
            if cfg.mesh.reallocate
            else None
        )
        self.reward_failures: dict[str, int] = {}  # summed over the scoring processes
        self.stop_requested = False
        self.last_metrics: dict[str, Any] = {}
        self.driver: Driver | None = None
        self.initial_accuracy = float("nan")
        self.resumed_meta: dict[str, Any] | None = None  # restored onto abstract state
        self.parts = self.hosting.build(self)
        if cfg.lending.enabled:  # chips lent inside a step (one process: a pod refuses it)
            self.replace_parts(lender=lending.build(self))

    # -- the parts ------------------------------------------------------------------------

    def _parts(self, what: str) -> Parts:
        if self.parts is None:
            raise not_leader(f"Run.{what}")
        return self.parts

    @property
    def sampler(self) -> RunSamplerPart:
        return self._parts("sampler").sampler

    @property
    def learner(self) -> LearnerPart:
        return self._parts("learner").learner

    @property
    def weight_sync(self) -> WeightSyncPart:
        return self._parts("weight_sync").weight_sync

    @property
    def prompts(self) -> PromptSource:
        return self._parts("prompts").prompts

    def replace_parts(self, **changes: Any) -> Parts:
        """New parts with ``changes`` (a resize's new learner and engine, say); returns them."""
        self.parts = dataclasses.replace(self._parts("replace_parts"), **changes)
        return self.parts

    def adopt_parts(self, parts: Parts | None) -> None:
        """The parts a pod's hosting rebuilt after a resize (None off the leader, and while it
        rebuilds); the driver of the old parts goes with them."""
        self.parts, self.driver = parts, None

    def move_to(self, topology: Topology) -> None:
        """The topology after a resize (its parts are rebuilt or replaced alongside)."""
        self.topology = topology

    def reward_pool(self) -> RewardPool:
        """This process's reward pool, opened on first use (a pod's learner never opens one)."""
        if self.rewards is None:
            self.rewards = RewardPool.from_config(self.reward, self.cfg.reward, self.reward_batched)
        return self.rewards

    def open_checkpointer(self) -> None:
        """Open the run's checkpoints (None with ``checkpoint.enabled`` off); an open
        checkpointer is closed first (its pending save made durable: a pod's resize)."""
        if self.ckpt is not None:
            self.ckpt.close()
        enabled = self.cfg.checkpoint.enabled
        path = io.join(self.workdir, "checkpoints")
        self.ckpt = Checkpointer(path, self.cfg.checkpoint) if enabled else None

    def adopt_learner(
        self, learner: Learner | None, resumed_meta: dict[str, Any] | None, graphdef: Any
    ) -> None:
        """Take what a hosting built: this process's learner (None on a process without one:
        checked here, held by the hosting's parts), the meta it was restored from (None for a
        fresh run: the version, metrics and accuracy resume there) and the model's graphdef
        (the engine's comes from it)."""
        cfg = self.cfg
        self.resumed_meta = resumed_meta
        self.sampler_model = sampler_model(self.model_cfg, graphdef, cfg.sampling.dtype, cfg.lora)
        if learner is not None:
            self.encoding.use_dp(learner.dp)
        if resumed_meta is not None:
            self.initial_accuracy = resumed_meta["initial_accuracy"]
            self.metrics.rewind(resumed_meta.get("metrics_offset"))
        elif self.ckpt is not None:
            # A run killed before its first checkpoint starts afresh, and so do its metrics.
            self.metrics.rewind(0)

    def build_engine(self, mesh: Mesh) -> PagedEngine:
        """The engine of this run's sampler on ``mesh``."""
        cfg = self.cfg
        model_cfg, graphdef = self.sampler_model
        return PagedEngine(
            model_cfg, cfg.sampling, mesh, graphdef, impl=cfg.kernel_impl, lora=cfg.lora
        )

    # -- pieces -----------------------------------------------------------------------------

    def publish(self) -> None:
        """Hand the learner's newest weights to the sampler (across meshes, and hosts)."""
        self._lead("Run.publish")
        with self.timeline.span("weight_sync"):
            self.weight_sync.publish(self.learner.params, self.learner.version)
            self._swap_to_latest(newer=False)

    def _swap_to_latest(self, *, newer: bool = True) -> None:
        """Stage the newest published weights on the sampler (``newer``: only if it has older
        ones; a publish stages its own weights whatever the sampler's version says)."""
        latest = self.weight_sync.acquire()
        if latest is not None and (not newer or latest[1] > self.sampler.version):
            self.sampler.set_params(*latest)

    def make_request(self, example: dict, request_id: int, **how: Any) -> Request:
        """A request for ``example`` (``how``: greedy, samples, sampling; Encoding.request)."""
        self._lead("Run.make_request")
        home = self.prompts.home(example)
        request = self.encoding.request(example, request_id, home=home, **how)
        return self._parts("make_request").answers.bind(request)

    def next_prompts(self) -> list[dict]:
        """The next global batch of prompts (the same list on every process that reads it)."""
        self._lead("Run.next_prompts")
        return next(self.prompts)

    def score(self, trajs: list[Trajectory]) -> np.ndarray:
        """Rewards for ``trajs`` (in order), wherever the hosting scores them."""
        self._lead("Run.score")
        rewards, self.reward_failures = self._parts("score").scorer.score(trajs)
        self.env_metrics.add(trajs)
        return rewards

    def evaluate(self, step: int, phase: str = "eval") -> float:
        """Greedy accuracy on the held-out split (rljax.runtime.evaluation). The record also
        holds each problem's score (``heldout_rewards``, in held-out order), so two evaluations
        can be compared pairwise."""
        self._lead("Run.evaluate")
        return evaluation.evaluate(self, step, phase)

    def make_batch(self, groups: list[Group]) -> TrainBatch:
        """Group-normalised advantages, then a packed batch for the configured loss."""
        return self.encoding.batch(groups)

    # -- checkpoints ------------------------------------------------------------------------

    def save(self, *, force: bool = False) -> None:
        """Checkpoint the full training state at this step boundary if due (or forced).

        Due is :meth:`Checkpointer.should_save`'s answer: every ``checkpoint.every_steps``, or a
        preemption notice. The driver's state (buffer, pending prompts) and the prompt
        stream's are read under one lock, so no prompt drawn in between is skipped or repeated
        on resume; the hosting then writes it (on a pod, every process at the same tick).
        """
        self._lead("Run.save")
        version = self.learner.version
        if self.ckpt is None or not self.ckpt.should_save(version, force=force):
            return
        with self.timeline.span("checkpoint"):
            driver = self.driver.checkpoint_state() if self.driver is not None else {}
            data = driver.pop("data", None) or self.prompts.get_state()
            meta = resume.checkpoint_meta(
                version=version,
                data_state=data,
                initial_accuracy=self.initial_accuracy,
                metrics_offset=self.metrics.offset(),
                extra={**self.hosting.checkpoint_extra(), **({"driver": driver} if driver else {})},
                config=self.cfg,
            )
            self.hosting.write_state(self, version, meta, wait=force)

    def stop_at_boundary(self) -> None:
        """Stop the driver at the next step boundary (a pod's resize: no preemption notice)."""
        self.stop_requested = True
        if self.driver is not None:
            self.driver.stop()

    def clear_stop(self) -> None:
        """The stop was for a resize, now done: the rebuilt run goes on."""
        self.stop_requested = False

    def request_stop(self, *_: Any) -> None:
        """Finish the current step, checkpoint, and return (SIGTERM lands here)."""
        self.stop_requested = True
        self.hosting.request_stop(self)

    def _lead(self, what: str) -> None:
        if not self.hosting.is_leader:
            raise not_leader(what)

    # -- resizing ---------------------------------------------------------------------------

    def resize(self, split: Split) -> dict[str, Any] | None:
        """Move to ``split`` (sampler chips, learner chips) at a safe point.

        Call it between steps: from a ``step_hooks`` hook (a run calls them after the learner
        step, before its weights go out), before or after ``train``, or from another thread
        during an async run (it then waits for the next step boundary). See
        :func:`rljax.runtime.resizing.resize` for what moves; returns the record logged to
        metrics.jsonl (phase 'resize'), or None when ``split`` is the current split. On a
        pod, the run resizes through a checkpoint at the next step boundary, as
        ``mesh.resize_schedule`` would (:mod:`rljax.runtime.pod_resize`): the record is
        logged then, and this returns None.
        """
        self._lead("Run.resize")
        return self._parts("resize").resizer.resize(split, "api")

    def _at_boundary(self, step: int) -> None:
        """The safe point after each learner step: step hooks, then the resizer."""
        for hook in list(self.step_hooks):
            hook(self, step)
        self._parts("at_boundary").resizer.at_boundary()

    # -- phases -----------------------------------------------------------------------------

    def warm_start_learner(self, learner: Learner) -> None:
        """The ``sft.*`` warm start of ``learner``, this process's (not yet published)."""
        warm_start(
            self.cfg,
            learner,
            self.train_examples,
            encode=self.encoding.teacher_sequence,
            pack=self.encoding.pack,
            metrics=self.metrics,
            timeline=self.timeline,
        )

    def _log_step(self, step: int, metrics: dict[str, Any]) -> None:
        metrics.update(failure_metrics(self.reward_failures))
        if self.conversations is not None:
            metrics.update(self.env_metrics.metrics(getattr(self.sampler, "stats", None)))
        self.last_metrics = metrics
        self.metrics.write(step, "train", metrics)
        self.metrics.progress(reward=metrics["reward"], len=metrics["response_length"])
        self._parts("after_step").resizer.after_step(metrics)
        if self.stop_requested:
            return
        cfg = self.cfg
        # Evaluating mid-run needs the sampler to itself: only the lock-step schedule allows it.
        done = step + 1
        due = cfg.eval_every and done % cfg.eval_every == 0 and done < cfg.num_steps
        if cfg.mode == "sync" and due:
            acc = self.evaluate(done)
            self.metrics.print(f"step {done}: held-out accuracy {acc:.3f}")

    def _make_driver(self) -> Driver:
        cfg = self.cfg
        b, eta, k = cfg.learner.batch_groups, cfg.buffer.max_staleness, cfg.buffer.overprovision
        buffer, requeue, next_id = resume.driver_state(
            self.resumed_meta, cfg, version=self.learner.version
        )
        return Driver(
            **lending.driver_parts(self),  # lending.enabled: its sampler, learner, meter
            weight_sync=self.weight_sync,
            buffer=buffer,
            controller=admission.controller(
                slots=self.sampler.num_slots,
                group_size=cfg.learner.group_size,
                batch_groups=b,
                max_staleness=eta,
                overprovision=k,
            ),
            prompts=iter(self.next_prompts, None),
            make_request=self.make_request,
            score=self.score,
            make_batch=self._parts("driver").batches or self.make_batch,
            group_size=cfg.learner.group_size,
            num_steps=cfg.num_steps,
            lockstep=cfg.mode == "sync",
            dynamic_sampling=cfg.buffer.dynamic_sampling,
            on_step=self._log_step,
            on_checkpoint=lambda driver: self.save(),
            on_boundary=self._at_boundary,
            timeline=self.timeline,
            prompt_state=self.prompts.get_state,
            requeue=requeue,
            next_request_id=next_id,
            counters=resume.driver_counters(self.resumed_meta),
            encode_group=encode_group,
        )

    def train(self) -> dict[str, Any]:
        """Warm start, evaluate, run ``num_steps`` RL steps, evaluate again.

        On a pod every process calls it: process 0 runs the phases, the others their share.
        """
        # SIGTERM stops the run gracefully until train returns: one during the final
        # evaluation lets it finish (it used to kill the process there).
        previous = install_sigterm(self.request_stop)
        try:
            return self.hosting.train(self)
        except BaseException as e:
            self.hosting.fail(e)
            raise
        finally:
            restore_sigterm(previous)

    def run_phases(self) -> dict[str, Any]:
        """The leader's phases (:meth:`train` without the SIGTERM handling); the summary."""
        self._lead("Run.run_phases")
        cfg = self.cfg
        start = time.perf_counter()
        if self.resumed_meta is None:
            self.hosting.warm_start(self)
            self.publish()
            self.initial_accuracy = self.evaluate(0, "eval_initial")
            self.metrics.print(f"held-out accuracy after warm start: {self.initial_accuracy:.3f}")
        else:
            self.metrics.print(f"resumed from checkpoint at step {self.learner.version}")
        self.driver = self._make_driver()
        if self.stop_requested:  # a SIGTERM before the driver existed (warm start, eval)
            self.driver.stop()
        self.driver.run(start_step=self.learner.version)
        # Rollouts still in flight belong to versions nobody will train; evaluation needs
        # the newest weights and empty slots.
        self.sampler.clear()
        self._swap_to_latest(newer=False)
        if self.stop_requested:
            self.save(force=True)
            if self.ckpt is not None:
                self.ckpt.wait()
            self.metrics.print(f"stopped at step {self.learner.version}; checkpoint saved")
            return {"stopped": True, "steps": self.learner.version}
        initial = self.initial_accuracy
        final = self.evaluate(cfg.num_steps, "eval_final")
        wall = time.perf_counter() - start
        self.metrics.print(
            f"held-out accuracy: {initial:.3f} after warm start -> {final:.3f} after "
            f"{cfg.num_steps} RL steps ({wall:.0f} s)"
        )
        summary = {
            "initial_accuracy": initial,
            "final_accuracy": final,
            "wall_s": wall,
            "steps": self.learner.version,
            "last": self.last_metrics,
            "phase_s": self.timeline.totals(),
        }
        self.metrics.write(cfg.num_steps, "summary", summary)
        if cfg.metrics.trace:
            self.timeline.write(io.join(self.workdir, "trace.json"))
        self.save(force=True)
        return summary

    def close(self) -> None:
        for part in (self.ckpt, self.rewards, self.conversations, getattr(self, "metrics", None)):
            if part is not None:
                part.close()


def run(cfg: RunConfig, workdir: str, **kwargs: Any) -> dict[str, Any]:
    """Build and train a run; returns its summary (accuracies, wall time, last metrics)."""
    r = Run(cfg, workdir, **kwargs)
    # Outside train (which routes it to a stop at the next boundary) a SIGTERM is ignored: the
    # run is already stopping, and close may still be committing its last checkpoint.
    previous = install_sigterm(_stopping_already)
    try:
        return r.train()
    finally:
        try:
            r.close()
        finally:
            restore_sigterm(previous)


def _stopping_already(*_: Any) -> None:
    """SIGTERM outside :meth:`Run.train`: nothing to do, the process exits once closed."""
