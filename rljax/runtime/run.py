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

import json
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np

from rljax import io
from rljax.checkpoint import Checkpointer
from rljax.config import ConfigError, RunConfig
from rljax.data.tasks import Answer, check_prompts, encode_prompt, load_task
from rljax.engine.paged import PagedEngine
from rljax.engine.sampler import Request, Trajectory
from rljax.engine.state import SlotSampling
from rljax.envs.base import Env
from rljax.envs.conversation import Conversations
from rljax.learner.advantages import group_advantages, resolve_scale
from rljax.learner.batch import TrainSequence, pack_batch
from rljax.learner.learner import Learner, check_divisible
from rljax.learner.losses import Loss, get_loss
from rljax.mesh.resize import MeshCache, Reallocation
from rljax.mesh.topology import Topology, build_topology
from rljax.mesh.weight_sync import sampler_model
from rljax.metrics import MetricsWriter, Timeline
from rljax.models.loading import check_tokenizer_fits, initial_model_config, load_tokenizer
from rljax.policy import admission
from rljax.policy.reallocation import Split
from rljax.rewards.pool import RewardPool, failure_metrics
from rljax.rewards.registry import check_reward_fn, get_reward
from rljax.runtime import agents, lending, resume, scoring
from rljax.runtime.boundary import install_sigterm, restore_sigterm
from rljax.runtime.driver import Driver
from rljax.runtime.hosting import (
    Hosting,
    PromptSource,
    Resizer,
    ScorerPart,
    hosting_for,
    not_leader,
)
from rljax.runtime.prompts import task_example
from rljax.runtime.rollout import Group, encode_group, train_sequence
from rljax.runtime.warm_start import warm_start

RewardFn = Callable[[str, dict], float]

log = logging.getLogger(__name__)


class Run:
    """One experiment, built from a :class:`RunConfig`. ``Run(cfg, workdir).train()``.

    The same on one process and on every process of a pod (docs/multihost.md): ``hosting``
    (:func:`~rljax.runtime.hosting.hosting_for`) builds this process's parts.
    """

    metrics: MetricsWriter
    ckpt: Checkpointer | None
    rewards: RewardPool | None  # None on a process that scores nothing (a pod's learner)
    # The parts the hosting builds (on a pod, those of this process's role).
    prompts: PromptSource
    scorer: ScorerPart
    resizer: Resizer
    batches: Callable[[list[Group]], Any]  # what the driver's learner steps on, from groups
    engine: PagedEngine | None
    sampler: Any  # a SamplerPart (rljax.runtime.parts)
    learner: Any  # a LearnerPart
    weight_sync: Any  # a WeightSyncPart
    lending: lending.RunLending | None  # lending.enabled: chips lent inside a step

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
    ):
        self.ckpt = self.rewards = None
        self.conversations: Conversations | None = None
        self.hosting: Hosting = hosting_for(cfg) if hosting is None else hosting
        try:
            self._build(cfg, workdir, reward_fn, loss, devices, env)
        except BaseException as e:
            self.hosting.fail(e)  # a pod's other processes stop waiting for this one at once
            self.close()  # a refused start leaves no checkpoint manager or worker running
            raise

    def _build(self, cfg, workdir, reward_fn, loss, devices, env) -> None:
        self.hosting.check(cfg)
        self.cfg = cfg
        self.workdir = str(io.ensure_writable_dir(workdir))
        self.loss = get_loss(loss or cfg.learner.loss, cfg.learner)
        self.tokenizer = load_tokenizer(cfg)
        self.train_examples, self.heldout_examples = load_task(cfg.data, cfg.seed)
        prompts = self.train_examples + self.heldout_examples[: cfg.eval_examples]
        check_prompts(self.tokenizer, cfg.data, prompts, cfg.sampling.max_prefill_length)
        self.model_cfg = initial_model_config(cfg)
        check_tokenizer_fits(cfg, self.tokenizer, self.model_cfg)
        self.reward = (
            get_reward(cfg.reward.name) if reward_fn is None else check_reward_fn(reward_fn)
        )
        # Conversations (env.name or env=): the env's steps give the reward (docs/agents.md).
        self.conversations = agents.build(cfg, self.tokenizer, self.reward, env)
        self.env_metrics = agents.EnvMetrics()
        self.devices = list(jax.devices() if devices is None else devices)
        self.topology: Topology = build_topology(cfg.mesh, self.devices)
        self.timeline = Timeline()
        self.metrics = MetricsWriter(
            self.workdir, total_steps=cfg.num_steps, progress_bar=cfg.metrics.progress_bar
        )
        self.ckpt = self.open_checkpointer()
        # Per-mesh engines and learners, so a resize back to a mesh recompiles nothing.
        self.engines, self.learners = MeshCache(), MeshCache()
        # Called as hook(run, step) on the learner thread at each step boundary (see resize).
        self.step_hooks: list[Callable[[Run, int], None]] = []
        self.reallocation = (
            Reallocation(cfg.mesh, cfg.reallocator, max_staleness=cfg.buffer.max_staleness)
            if cfg.mesh.reallocate
            else None
        )
        # Reward failures summed over the scoring processes, for metrics.
        self.reward_failures: dict[str, int] = {}
        self.stop_requested = False
        self.last_metrics: dict[str, Any] = {}
        self.driver: Driver | None = None
        self.lending = None
        self.initial_accuracy = float("nan")
        # A resumed run restores onto abstract state: the model is not loaded to be overwritten.
        self.resumed_meta: dict[str, Any] | None = None
        self.hosting.build(self)

    def open_checkpointer(self) -> Checkpointer | None:
        """The run's checkpoints (None with ``checkpoint.enabled`` off)."""
        if not self.cfg.checkpoint.enabled:
            return None
        return Checkpointer(io.join(self.workdir, "checkpoints"), self.cfg.checkpoint)

    def adopt_learner(
        self, learner: Learner | None, resumed_meta: dict[str, Any] | None, graphdef: Any
    ) -> None:
        """Take what a hosting built: this process's learner (None on a process without one),
        the meta it was restored from (None for a fresh run: the version, metrics and accuracy
        resume there) and the model's graphdef (the engine's comes from it)."""
        cfg = self.cfg
        self.resumed_meta = resumed_meta
        self.learner = learner
        self.sampler_model = sampler_model(self.model_cfg, graphdef, cfg.sampling.dtype, cfg.lora)
        if learner is not None:
            check_divisible(
                "learner.batch_groups * learner.group_size", cfg.learner.batch_size, learner.dp
            )
            if cfg.sft.steps:
                check_divisible("sft.batch_size", cfg.sft.batch_size, learner.dp)
        if resumed_meta is not None:
            self.initial_accuracy = resumed_meta["initial_accuracy"]
            self.metrics.rewind(resumed_meta.get("metrics_offset"))
        elif self.ckpt is not None:
            # A run killed before its first checkpoint starts afresh, and so do its metrics.
            self.metrics.rewind(0)

    def build_engine(self, mesh) -> PagedEngine:
        """The engine of this run's sampler on ``mesh``."""
        cfg = self.cfg
        model_cfg, graphdef = self.sampler_model
        return PagedEngine(
            model_cfg, cfg.sampling, mesh, graphdef, impl=cfg.kernel_impl, lora=cfg.lora
        )

    # -- pieces -----------------------------------------------------------------------------

    def encode_prompt(self, example: dict) -> list[int]:
        return encode_prompt(self.tokenizer, self.cfg.data, example)

    def completion_text(self, t: Trajectory) -> str:
        return scoring.completion_text(self.tokenizer, t)

    def publish(self) -> None:
        """Hand the learner's newest weights to the sampler (across meshes, and hosts)."""
        self._lead("Run.publish")
        with self.timeline.span("weight_sync"):
            self.weight_sync.publish(self.learner.params, self.learner.version)
            self.sampler.set_params(*self.weight_sync.acquire())

    def make_request(self, example: dict, request_id: int, *, greedy: bool = False) -> Request:
        """A request for ``example``; its sampling seed depends only on the run seed and id."""
        self._lead("Run.make_request")
        prompt, turns, budget = self.encode_prompt(example), None, None
        if self.conversations is not None:  # a fresh env per sample, reset on the example
            prompt = self.conversations.prompt(task_example(example))
            turns = self.conversations.turns(task_example(example), prompt)
            budget = self.cfg.env.max_tokens or None
        return Request(
            prompt,
            1 if greedy else self.cfg.learner.group_size,
            seed=(self.cfg.seed * 1_000_003 + request_id) % (2**31 - 1),
            sampling=SlotSampling(temperature=0.0) if greedy else None,
            payload=example,
            request_id=request_id,
            home=self.prompts.home(example),
            turns=turns,
            max_new_tokens=budget,
        )

    def next_prompts(self) -> list[dict]:
        """The next global batch of prompts (the same list on every process that reads it)."""
        self._lead("Run.next_prompts")
        return next(self.prompts)

    def score(self, trajs: list[Trajectory]) -> np.ndarray:
        """Rewards for ``trajs`` (in order), wherever the hosting scores them."""
        self._lead("Run.score")
        rewards, self.reward_failures = self.scorer.score(trajs)
        self.env_metrics.add(trajs)
        return rewards

    def evaluate(self, step: int, phase: str = "eval") -> float:
        """Greedy accuracy on the held-out split. The record also holds each problem's reward
        (``heldout_rewards``, in held-out order), so two evaluations can be compared pairwise."""
        self._lead("Run.evaluate")
        examples = self.heldout_examples[: self.cfg.eval_examples]
        latest = self.weight_sync.acquire()  # the driver's sampler swaps only when it generates
        if latest is not None and latest[1] > self.sampler.version:
            self.sampler.set_params(*latest)
        with self.timeline.span("eval"):
            requests = [self.make_request(ex, i, greedy=True) for i, ex in enumerate(examples)]
            trajs = self.sampler.run(requests)  # in the order they finished
            rewards = np.nan_to_num(self.score(trajs), nan=0.0)  # a failed reward is wrong
        self.env_metrics.skip(getattr(self.sampler, "stats", None))  # train steps' alone
        by_problem = np.zeros(len(examples))
        by_problem[[t.group_id for t in trajs]] = rewards  # group_id: the request's index
        acc = float(np.mean(rewards))
        record = {"heldout_accuracy": acc, "examples": len(examples)}
        self.metrics.write(step, phase, record | {"heldout_rewards": by_problem.tolist()})
        return acc

    def _pack(self, seqs: list[TrainSequence], aggregation: str):
        cfg = self.cfg
        return pack_batch(
            seqs,
            row_len=cfg.learner.pack_length or cfg.sampling.max_seq_len,
            micro_batches=cfg.learner.micro_batches,
            row_multiple=self.learner.dp,
            aggregation=aggregation,
            max_new_tokens=cfg.sampling.max_new_tokens,
        )

    def make_batch(self, groups: list[Group]):
        """Group-normalised advantages, then a packed batch for the configured loss."""
        _debug("learner", prompts=[g.example["prompt"] for g in groups])
        adv = group_advantages(
            np.stack([g.rewards for g in groups]),
            scale=resolve_scale(self.cfg.learner, self.learner.loss),
        )
        seqs = [
            train_sequence(t, float(a))
            for g, row in zip(groups, adv, strict=True)
            for t, a in zip(g.trajectories, row, strict=True)
        ]
        return self._pack(seqs, self.loss.aggregation)

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
            self.hosting.write_state(self, version, meta, force=force)

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
        return self.resizer.resize(split, "api")

    def _at_boundary(self, step: int) -> None:
        """The safe point after each learner step: step hooks, then the resizer."""
        for hook in list(self.step_hooks):
            hook(self, step)
        self.resizer.at_boundary()

    # -- phases -----------------------------------------------------------------------------

    def warm_start_learner(self) -> None:
        """The ``sft.*`` warm start of this process's learner (not yet published)."""
        if getattr(self.learner, "params", None) is None:
            raise ConfigError(
                "Run.warm_start_learner trains this process's learner, and this process holds "
                "none (on a pod, process 0 posts the warm start to the learner processes): "
                "call Run.train, which runs it where the learner is"
            )
        warm_start(
            self.cfg,
            self.learner,
            self.train_examples,
            encode=self.teacher_sequence,
            pack=self._pack,
            metrics=self.metrics,
            timeline=self.timeline,
        )

    def teacher_sequence(self, example: dict, answer: Answer) -> TrainSequence:
        """What the warm start trains for a teacher's ``answer`` to ``example``: the prompt, then
        the answer and its stop token, or a transcript's turns as a conversation holds them."""
        if isinstance(answer, str):
            c = self.conversations
            prompt = self.encode_prompt(example) if c is None else c.prompt(example)
            tokens = prompt + self.tokenizer.encode(answer, add_bos=False)
            return TrainSequence(tokens + [self.tokenizer.eos_id], len(prompt))
        return agents.transcript_sequence(
            self.conversations, example, answer, self.tokenizer, self.cfg.env.tool_format
        )

    def _log_step(self, step: int, metrics: dict[str, Any]) -> None:
        metrics.update(failure_metrics(self.reward_failures))
        if self.conversations is not None:
            metrics.update(self.env_metrics.metrics(getattr(self.sampler, "stats", None)))
        self.last_metrics = metrics
        self.metrics.write(step, "train", metrics)
        self.metrics.progress(reward=metrics["reward"], len=metrics["response_length"])
        self.resizer.after_step(metrics)
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
            make_batch=self.batches,
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
        latest = self.weight_sync.acquire()
        if latest is not None:
            self.sampler.set_params(*latest)
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
    try:
        return r.train()
    finally:
        r.close()


def _debug(event: str, **fields: Any) -> None:
    """One JSON line per data event, for --logger_levels=rljax.runtime:DEBUG."""
    if log.isEnabledFor(logging.DEBUG):
        log.debug("data %s %s", event, json.dumps(fields))
