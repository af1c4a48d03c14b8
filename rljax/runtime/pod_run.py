"""``Run`` on a pod: each process builds and runs the parts of its role (``runtime.pod``).

``rljax.Run(cfg, workdir)`` is a :class:`PodRun` when several processes run a split topology
(``mesh.mode='split'``); the launcher and the library need nothing else. The sampler leader
(process 0) runs the phases of :class:`~rljax.runtime.run.Run` (warm start, evaluation, the
driver, checkpoints) through stand-ins that post each operation to the other processes; the
sampler followers and the learner processes replay them.

Checkpoints hold what one host would hold: the learner's params and optimiser state (written
by the learner processes, orbax restricted to them), and the leader's meta (buffer, pending
prompts, prompt-stream state, metrics cursor) plus the pod's shape, so a resume with another
process count is refused (another split of whole hosts is fine). A resize mid-run goes through
such a checkpoint, in-process (:mod:`rljax.runtime.pod_resize`).
"""

from __future__ import annotations

import collections
import time
from typing import Any

import jax
import numpy as np

from rljax import io
from rljax.checkpoint import Checkpointer, save_shardings, use_orbax_distributed_barriers
from rljax.config import ConfigError, RunConfig
from rljax.data.tasks import check_prompts, load_task
from rljax.engine.engine import Engine
from rljax.engine.homes import process_homes
from rljax.engine.sampler import Sampler
from rljax.learner.advantages import resolve_scale
from rljax.learner.learner import Learner
from rljax.learner.losses import get_loss
from rljax.mesh import distributed
from rljax.mesh.control import Channel
from rljax.mesh.resize import MeshCache, Reallocation
from rljax.mesh.topology import build_topology
from rljax.mesh.transfer import transfer
from rljax.mesh.weight_sync import sampler_model
from rljax.metrics import MetricsWriter, Timeline
from rljax.models.loading import (
    abstract_params,
    check_tokenizer_fits,
    initial_model_config,
    load_initial_params,
    load_tokenizer,
)
from rljax.policy.reallocation import Split
from rljax.rewards.pool import RewardPool
from rljax.rewards.registry import check_reward_fn, get_reward
from rljax.runtime import pod, pod_prompts, pod_resize, resizing, resume
from rljax.runtime.clocks import compile_seconds
from rljax.runtime.pod_scoring import PodScorer, ScoreServer
from rljax.runtime.run import Run


def check_pod(cfg: RunConfig) -> None:
    if cfg.lending.enabled:
        raise ConfigError(
            "config key 'lending.enabled' = True is single-process for now (a pod's lent chips "
            "would need their own tick stream); turn it off for a pod run"
        )
    if cfg.mesh.reallocate and cfg.mode != "async":
        raise ConfigError(
            "config key 'mesh.reallocate' = True needs mode='async' (it measures how long "
            "each role idles while the other works); set mode='async' or turn it off"
        )
    resizes = cfg.mesh.reallocate or cfg.mesh.resize_schedule
    if resizes and not cfg.checkpoint.enabled:
        raise ConfigError(
            "a pod resizes through a checkpoint (every process saves, rebuilds for the new "
            "split, restores); set checkpoint.enabled=True, or turn mesh.reallocate and "
            "mesh.resize_schedule off"
        )
    if cfg.mesh.reallocate:
        pod_resize.check_granularity(cfg.mesh.reallocate_granularity, jax.local_device_count())


class PodRun(Run):
    """One experiment on a pod; built and used exactly like :class:`Run`."""

    def _build(self, cfg, workdir, reward_fn, loss, devices) -> None:
        check_pod(cfg)
        self.channel = Channel()
        try:
            self._build_pod(cfg, workdir, reward_fn, loss, devices)
        except BaseException as e:
            self.channel.fail(e)  # the others stop waiting for this process at once
            raise

    def _build_pod(self, cfg, workdir, reward_fn, loss, devices) -> None:
        distributed.check_same_config(cfg)
        self.cfg = cfg
        self.shard_index, self.shard_count = 0, 1  # one stream; each sampler host reads a share
        self.workdir = str(io.ensure_writable_dir(workdir))
        self.loss = get_loss(loss or cfg.learner.loss, cfg.learner)
        self._scale = resolve_scale(cfg.learner, self.loss)
        self.tokenizer = load_tokenizer(cfg)
        self.train_examples, self.heldout_examples = load_task(cfg.data, cfg.seed)
        prompts = self.train_examples + self.heldout_examples[: cfg.eval_examples]
        check_prompts(self.tokenizer, cfg.data, prompts, cfg.sampling.max_prefill_length)
        check_tokenizer_fits(cfg, self.tokenizer, initial_model_config(cfg))
        reward = get_reward(cfg.reward.name) if reward_fn is None else check_reward_fn(reward_fn)
        self.devices = list(jax.devices() if devices is None else devices)
        self.topology = build_topology(cfg.mesh, self.devices)
        self.roles = pod.roles(self.topology)
        pod_resize.check_schedule(self)
        compile_seconds()  # from now on, count the seconds spent compiling
        self.timeline = Timeline()
        self.metrics = MetricsWriter(
            self.workdir, total_steps=cfg.num_steps, progress_bar=cfg.metrics.progress_bar
        )
        self.model_cfg = initial_model_config(cfg)
        self.step_hooks, self.lending = [], None
        # Only the leader's is used: it decides for the pod, from its own PhaseMeter.
        self.reallocation = Reallocation(cfg.mesh, cfg.reallocator) if cfg.mesh.reallocate else None
        self.reward_failures: dict[str, int] = {}
        self._stop_requested = self._preempted = False
        self._resize_to: tuple | None = None  # (split, cause, when decided): the leader's
        self.resizes, self._resize_record = 0, None
        self.last_metrics: dict[str, Any] = {}
        self.driver = None
        self.initial_accuracy = float("nan")
        self._last_saved = -1
        self._reward, self.rewards, self._ticks = reward, None, None
        self.scored_by_host: dict[int, int] = {}  # trajectories each sampler host scored
        self.read_by_host: dict[int, int] = {}  # prompts each sampler host read
        self.engines, self.learners = MeshCache(), MeshCache()  # per mesh, across resizes
        self.tick = 0  # the next tick this process reads (a follower)
        self.build_split()

    def build_split(self) -> float:
        """The parts that depend on the split (at start, and after each resize); returns the
        seconds spent restoring a checkpoint."""
        graphdef, abstract = abstract_params(self.model_cfg, self.topology.learner)
        self.weights = pod.PodWeights(
            abstract, self.topology.sampler, self.cfg.sampling.dtype, self.topology.slices
        )
        self.sampler_model = sampler_model(self.model_cfg, graphdef, self.cfg.sampling.dtype)
        restore_s = self._build_state()
        self._build_role(self._reward)
        if not self.resizes:  # a resize's cost exchange is its barrier (pod_resize.rebuild)
            self.channel.barrier("built")
        return restore_s

    def release_role(self) -> None:
        """Let go of this process's role objects before a resize (their meshes are cached)."""
        if self.roles.role == "learner":
            self.learner.params = self.learner.opt_state = None
        self.learner = self.sampler = self.real_sampler = self.engine = self.driver = None
        self.scorer = self.score_server = self.prompts = None

    def _build_role(self, reward) -> None:
        cfg = self.cfg
        if self.roles.role == "learner":
            return
        version = self.learner_version
        model_cfg, graph = self.sampler_model
        self.engine = self.engines.get(
            self.topology.sampler,
            lambda: Engine(
                model_cfg, cfg.sampling, self.topology.sampler, graph, impl=cfg.kernel_impl
            ),
        )
        stop_ids = sorted(self.tokenizer.stop_ids)
        # each host's prompts take its own slots (None: slots replicated over the hosts)
        self.slot_homes = homes = process_homes(self.engine, self.roles.sampler)
        # No weights until the first swap.
        sampler = Sampler(self.engine, None, version=version, stop_ids=stop_ids, slot_homes=homes)
        self.prompts = pod_prompts.open_stream(self, cfg.learner.batch_groups, self.read_by_host)
        if self.rewards is None:  # every sampler host scores a share of the groups
            self.rewards = RewardPool.from_config(reward, cfg.reward)
        if not self.roles.is_leader:
            self.real_sampler = sampler
            self.score_server = ScoreServer(
                self.channel, self.roles.me, self.resizes, self.rewards, self.tokenizer
            )
            return
        self.scorer = PodScorer(
            self.channel,
            self.roles.sampler,
            self.resizes,
            self.rewards,
            self.tokenizer,
            scored=self.scored_by_host,
        )
        self.weight_sync = pod.PodWeightSync()
        self._ticks = self._ticks or pod.Ticks(self.channel)  # one tick count across resizes
        self.sampler = pod.PodSampler(sampler, self._ticks, self.weights, self.weight_sync)
        self.learner = pod.RemoteLearner(self.sampler, self.channel, version)
        if self.resumed_meta is not None:
            self.initial_accuracy = self.resumed_meta["initial_accuracy"]
            self.metrics.rewind(self.resumed_meta.get("metrics_offset"))
        elif cfg.checkpoint.enabled:
            self.metrics.rewind(0)

    def _build_state(self) -> float:
        """The learner state: restored by every process from the newest checkpoint, or new;
        returns the seconds the restore took.

        A checkpoint holds the state laid out over every device of the pod (the save layout,
        :func:`save_shardings`), so every process takes part in orbax's save and restore as on
        any multi-host job; the learner processes then take it onto the learner mesh.
        """
        cfg = self.cfg
        use_orbax_distributed_barriers()
        self.ckpt = (
            Checkpointer(io.join(self.workdir, "checkpoints"), cfg.checkpoint)
            if cfg.checkpoint.enabled
            else None
        )
        learner_mesh = self.topology.learner
        graphdef, abstract = abstract_params(self.model_cfg, learner_mesh)
        self.abstract = Learner.abstract(
            cfg.learner,
            graphdef,
            abstract,
            learner_mesh,
            loss=self.loss,
            kernel_impl=cfg.kernel_impl,
        )
        learner_state = (self.abstract.params, self.abstract.opt_state)
        self.save_layout = save_shardings(learner_state, self.devices)
        self.resumed_meta, restored = None, None
        start = time.perf_counter()
        if resume.can_resume(self.ckpt):
            where, newest = str(self.ckpt.directory), self.ckpt.read_meta()
            resume.check_resume_config(newest, cfg, where=where)
            pod_resize.check_shape(newest.get("pod"), self._shape())  # before reading arrays
            saved = jax.tree.map(
                lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                learner_state,
                self.save_layout,
            )
            params, opt_state, self.resumed_meta = self.ckpt.restore(
                abstract_params=saved[0], abstract_opt_state=saved[1], fallback=True
            )
            pod_resize.check_shape(self.resumed_meta.get("pod"), self._shape())
            targets = jax.tree.map(lambda x: x.sharding, learner_state)
            restored = transfer((params, opt_state), targets)
        restore_s = time.perf_counter() - start
        meta = self.resumed_meta
        self.learner_version = 0 if meta is None else int(meta["version"])
        if self.roles.role != "learner":
            return restore_s
        cached = self.learners.peek(learner_mesh)
        if restored is None:
            self.model_cfg, self.learner = resume.new_learner(cfg, learner_mesh, self.loss)
        elif cached is not None:  # a mesh this process learned on before: compiled already
            cached.params, cached.opt_state = restored
            cached.version = self.learner_version
            self.learner = cached
        else:
            ref = load_initial_params(cfg, learner_mesh)[2] if cfg.learner.beta > 0 else None
            self.learner = resume.make_learner(
                cfg,
                graphdef,
                restored[0],
                learner_mesh,
                self.loss,
                ref_params=ref,
                opt_state=restored[1],
                version=self.learner_version,
            )
        self.learners.put(learner_mesh, self.learner)
        return restore_s

    def _shape(self) -> dict[str, Any]:
        r = self.roles
        return {
            "processes": jax.process_count(),
            "sampler": list(r.sampler),
            "learner": list(r.learner),
        }

    # -- the leader's seams -------------------------------------------------------------------

    def next_prompts(self) -> list[dict]:
        return next(self.prompts)

    def make_request(self, example: dict, request_id: int, *, greedy: bool = False):
        request = super().make_request(example, request_id, greedy=greedy)
        request.home = pod_prompts.home(example, len(self.roles.sampler))
        return request

    def score(self, trajs) -> np.ndarray:
        """Rewards for ``trajs``, scored across the sampler hosts (runtime.pod_scoring)."""
        rewards, self.reward_failures = self.scorer.score(trajs)
        return rewards

    def make_batch(self, groups):
        if self.roles.role == "learner":
            return super().make_batch(groups)
        return pod.make_pod_batch(groups)

    def publish(self) -> None:
        self.sampler.set_params(None, self.learner.version)

    def _warm_start(self) -> None:
        if self.cfg.sft.steps:
            self.sampler.ticks.flush("sft")
            self.channel.get("done/sft", waiting_for="the warm start")
        self.publish()

    def save(self, *, force: bool = False) -> None:
        """The leader decides and sends the meta; every process then saves (:meth:`save_state`)."""
        version = self.learner.version
        ck = self.cfg.checkpoint
        if not ck.enabled or version == self._last_saved:
            return
        if not (force or version % ck.every_steps == 0):
            return
        with self.timeline.span("checkpoint"):
            driver = self.driver.checkpoint_state() if self.driver is not None else {}
            data = driver.pop("data", None) or self.prompts.get_state()
            meta = resume.checkpoint_meta(
                version=version,
                data_state=data,
                initial_accuracy=self.initial_accuracy,
                metrics_offset=self.metrics.offset(),
                extra={"pod": self._shape(), **({"driver": driver} if driver else {})},
                config=self.cfg,
                gather=False,
            )
            with self.sampler.ticks.lock:  # every process saves at this tick
                self.sampler.ticks.flush("save", {"version": version, "meta": meta, "wait": force})
                self.save_state(version, meta, wait=force)
        self._last_saved = version

    def save_state(self, version: int, meta: dict[str, Any], *, wait: bool = False) -> None:
        """Every process: the learner state onto the save layout, then one orbax save."""
        if self.learner_role:
            state = (self.learner.params, self.learner.opt_state)
        else:
            state = (self.abstract.params, self.abstract.opt_state)
        params, opt_state = transfer(state, self.save_layout)
        self.ckpt.save(version, params=params, opt_state=opt_state, meta=meta, force=True)
        if wait:
            self.ckpt.wait()

    @property
    def learner_role(self) -> bool:
        return self.roles.role == "learner"

    def request_stop(self, *_: Any) -> None:
        """SIGTERM: the leader stops at the next step boundary; others tell the leader."""
        self._stop_requested = self._preempted = True
        if self.roles.is_leader:
            if self.driver is not None:
                self.driver.stop()
        else:
            self.channel.post(f"stop/{self.roles.me}", {}, overwrite=True)  # a second SIGTERM too

    def _poll_stop(self) -> None:
        if not self._stop_requested and self.channel.keys("stop"):
            self.request_stop()

    def _at_boundary(self, step: int) -> None:
        """The leader's safe point: a resize decided here stops the driver as SIGTERM would
        (the boundary's checkpoint then holds everything in flight) and runs after it."""
        for hook in list(self.step_hooks):
            hook(self, step)
        done = self.learner.version >= self.cfg.num_steps
        if self._stop_requested or done or self.driver is None:
            return
        proposal = resizing.propose(self)
        if proposal is not None:
            split, cause = proposal
            try:  # the schedule was checked at start; a policy may propose part of a host
                pod_resize.check_split(self, split, what=f"the {cause} proposed")
            except ConfigError as e:
                self.metrics.print(f"{e}; staying")
                return
            self._resize_to = (split, cause, time.perf_counter())
            self._stop_requested = True
            self.driver.stop()

    def _log_step(self, step: int, metrics: dict[str, Any]) -> None:
        super()._log_step(step, metrics)
        record, self._resize_record = self._resize_record, None
        if record is not None:  # the first step after a resize: what it compiled
            record["first_step_compile_s"] = metrics.get("compile_s", 0.0)
            self.metrics.write(record["version"], "resize", record)

    # -- phases ---------------------------------------------------------------------------------

    def _train(self) -> dict[str, Any]:
        try:
            return self._train_role()
        except BaseException as e:
            self.channel.fail(e)
            raise

    def _train_role(self) -> dict[str, Any]:
        start = time.perf_counter()
        while True:
            summary, resize = self._train_split()
            if resize is None:
                break
            split, cause, decided = resize
            record = pod_resize.rebuild(self, split, decided)
            self.metrics_resize(record, cause)
        if self.roles.role == "learner":
            self.channel.post(f"replicas/{self.roles.me}", pod.shard_digests(self.learner.params))
        if self.roles.is_leader:
            summary["pod"] = {**self._shape(), "resizes": self.resizes}
            summary["pod"]["wall_s"] = time.perf_counter() - start
            for what, counts in (("scored", self.scored_by_host), ("read", self.read_by_host)):
                summary["pod"][f"{what}_by_host"] = {str(h): n for h, n in counts.items()}
            slots = collections.Counter(self.slot_homes or [])
            summary["pod"]["slots_by_host"] = {str(h): n for h, n in sorted(slots.items())}
            digests = [
                self.channel.get(f"replicas/{p}", waiting_for=f"learner process {p}'s digests")
                for p in self.roles.learner
            ]
            check = pod.compare_replicas(digests)
            self.metrics.write(self.learner.version, "replicas", check)
            summary["pod"]["learner_replicas"] = check
        return summary

    def _train_split(self) -> tuple[dict[str, Any], tuple | None]:
        """Run until the end or a resize: (summary, (split, cause, when decided) or None)."""
        if self.roles.role == "learner":
            self.tick, op, arg = pod.follow_learner(
                self, self.channel, self.weights, self.roles, self.tick
            )
            summary = {"role": "learner", "steps": self.learner.version}
        elif not self.roles.is_leader:
            self.tick, op, arg = pod.follow_sampler(
                self, self.channel, self.real_sampler, self.weights, self.tick
            )
            self.score_server.join()  # the leader stopped both before this tick
            if self.prompts is not None:
                self.prompts.join()
            summary = {"role": "sampler"}
        else:
            summary, op, arg = self._lead()
        if op == "end":
            return summary, None
        decided = arg.get("decided", time.perf_counter())  # a follower: when the tick came
        return summary, (Split(*arg["split"]), arg["cause"], decided)

    def _lead(self) -> tuple[dict[str, Any], str, Any]:
        self.sampler.on_tick = self._poll_stop
        if self.resumed_meta is not None:
            self.publish()  # the restored version, before anything samples
        summary = super()._train()
        resize, self._resize_to = self._resize_to, None
        self.scorer.stop()  # before 'end' or 'resize': the followers' servers stop first
        self.prompts.stop()
        if resize is not None and not self._preempted:
            split, cause, decided = resize
            arg = {"split": [split.sampler_chips, split.learner_chips], "cause": cause}
            self.sampler.ticks.flush("resize", arg)
            self._stop_requested = False
            return summary, "resize", {**arg, "decided": decided}
        # Only on success: after an error the others learn of it from Channel.fail and exit
        # non-zero instead of ending cleanly.
        self.sampler.ticks.flush("end")
        return summary, "end", None

    def metrics_resize(self, record: dict[str, Any], cause: str) -> None:
        """The leader logs a resize (completed by the first step after it, :meth:`_log_step`)."""
        if not self.roles.is_leader:
            return
        self._resize_record = {**record, "cause": cause}
        if self.reallocation is not None:  # the next decision weighs the measured cost
            self.reallocation.switch_cost_s = record["seconds"]
        self.metrics.print(
            f"resized sampler/learner chips {record['from']} -> {record['to']} (hosts "
            f"{record['hosts_from']} -> {record['hosts_to']}) in {record['seconds']:.1f} s: save "
            f"{record['save_s']:.1f}, rebuild {record['rebuild_s']:.1f}, restore "
            f"{record['restore_s']:.1f}, compile {record['compile_s']:.1f}"
        )


Run.pod_class = PodRun  # Run(cfg, ...) on a pod is a PodRun
