"""Wires a run together: data, model, engine, rewards, learner and metrics.

Synchronous mode (eta = 0, the baseline) loops: sample G responses for each of B prompts,
score them, compute group advantages, take one learner step, publish the new weights to the
sampler, repeat. An optional supervised warm start runs first, and held-out accuracy (greedy)
is measured after it and at the end.
"""

from __future__ import annotations

import itertools
import os
import tempfile
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np

from rljax.config import ConfigError, RunConfig
from rljax.data.arithmetic import ArithmeticTask
from rljax.data.pipeline import prompt_iterator
from rljax.engine.engine import Engine, SlotSampling
from rljax.engine.sampler import FINISH_STOP, Request, Sampler, Trajectory
from rljax.learner.advantages import group_advantages
from rljax.learner.batch import TrainSequence, pack_batch
from rljax.learner.learner import Learner, check_divisible
from rljax.learner.losses import Loss, get_loss
from rljax.mesh.topology import Topology, build_topology
from rljax.metrics import MetricsWriter, Timeline
from rljax.models.sharding import LEARNER_RULES, init_sharded
from rljax.models.tokenizer import Tokenizer
from rljax.rewards.pool import RewardPool
from rljax.rewards.registry import get_reward

RewardFn = Callable[[str, dict], float]


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


def load_tokenizer(cfg: RunConfig) -> Tokenizer:
    if cfg.tokenizer == "char":
        return Tokenizer.char_level()
    return Tokenizer.from_dir(cfg.tokenizer)


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
        self.cfg = cfg
        self.workdir = check_workdir(workdir)
        self.loss = get_loss(loss or cfg.learner.loss)
        self.tokenizer = load_tokenizer(cfg)
        self.tokenizer.check_fits(cfg.model.vocab_size)
        self.train_examples, self.heldout_examples = load_task(cfg)
        self.topology: Topology = build_topology(cfg.mesh, devices)
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
        self.graphdef, params = init_sharded(
            cfg.model, self.topology.learner, LEARNER_RULES, cfg.seed
        )
        self.engine = Engine(cfg.model, cfg.sampling, self.topology.sampler, self.graphdef)
        self.learner = self._make_learner(params, self.loss)
        check_divisible(
            "learner.batch_groups * learner.group_size", cfg.learner.batch_size, self.learner.dp
        )
        if cfg.sft.steps:
            check_divisible("sft.batch_size", cfg.sft.batch_size, self.learner.dp)
        self.sampler = Sampler(
            self.engine,
            self.engine.load_params(self.learner.params),
            version=0,
            stop_ids=sorted(self.tokenizer.stop_ids),
        )
        self.prompts = prompt_iterator(
            self.train_examples, batch_size=cfg.learner.batch_groups, seed=cfg.seed
        )
        self._seeds = itertools.count(cfg.seed * 1_000_000)

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
        )

    # -- pieces -----------------------------------------------------------------------------

    def encode_prompt(self, example: dict) -> list[int]:
        if self.cfg.data.prompt_format == "chat":
            text = self.tokenizer.apply_chat_template(
                [{"role": "user", "content": example["prompt"]}], add_generation_prompt=True
            )
            return self.tokenizer.encode(text, add_bos=False)
        return self.tokenizer.encode(example["prompt"], add_bos=True)

    def completion_text(self, t: Trajectory) -> str:
        tokens = t.response_tokens
        if t.finish_reason == FINISH_STOP and tokens:
            tokens = tokens[:-1]
        # A checkpoint's embedding may be padded past the tokenizer; such ids decode to nothing.
        return self.tokenizer.decode([i for i in tokens if i < self.tokenizer.vocab_size])

    def publish(self) -> None:
        """Hand the learner's newest weights to the sampler (a device_put across meshes)."""
        with self.timeline.span("weight_sync"):
            params = self.engine.load_params(self.learner.params)
            self.sampler.set_params(params, self.learner.version)

    def sample(self, examples: list[dict], *, greedy: bool = False) -> list[Trajectory]:
        n = 1 if greedy else self.cfg.learner.group_size
        sampling = SlotSampling(temperature=0.0) if greedy else None
        requests = [
            Request(
                self.encode_prompt(ex), n, seed=next(self._seeds), sampling=sampling, payload=ex
            )
            for ex in examples
        ]
        return self.sampler.run(requests)

    def score(self, trajs: list[Trajectory]) -> np.ndarray:
        texts = [self.completion_text(t) for t in trajs]
        rewards = self.rewards.score(texts, [t.payload for t in trajs])
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

    # -- phases -----------------------------------------------------------------------------

    def warm_start(self) -> dict[str, float]:
        """Supervised cross-entropy on reference answers before RL (``cfg.sft``)."""
        s = self.cfg.sft
        if s.steps == 0:
            return {}
        examples = self.train_examples[: s.num_examples or None]
        data = prompt_iterator(examples, batch_size=s.batch_size, seed=self.cfg.seed + 1)
        learner = Learner(
            self.cfg.learner,
            self.graphdef,
            self.learner.params,
            self.topology.learner,
            loss="sft",
            learning_rate=s.learning_rate,
        )
        eos = self.tokenizer.eos_id
        metrics: dict[str, float] = {}
        for step in range(s.steps):
            batch = next(data)
            seqs = []
            for ex in batch:
                prompt = self.encode_prompt(ex)
                answer = self.tokenizer.encode(ex["answer"], add_bos=False) + [eos]
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

    def to_sequences(self, trajs: list[Trajectory], advantages: dict) -> list[TrainSequence]:
        return [
            TrainSequence(
                list(t.prompt_tokens) + t.response_tokens,
                len(t.prompt_tokens),
                t.logprobs,
                advantages[(t.group_id, t.sample_index)],
                t.versions,
            )
            for t in trajs
        ]

    def rl_step(self, step: int) -> dict[str, Any]:
        """One synchronous GRPO step: sample, score, advantages, learn, publish."""
        cfg = self.cfg
        examples = next(self.prompts)
        t0 = time.perf_counter()
        with self.timeline.span("sample"):
            trajs = self.sample(examples)
        t1 = time.perf_counter()
        with self.timeline.span("reward"):
            self.score(trajs)
        groups: dict[int, list[Trajectory]] = {}
        for t in trajs:
            groups.setdefault(t.group_id, []).append(t)
        ordered = [sorted(g, key=lambda t: t.sample_index) for g in groups.values()]
        rewards = np.array([[t.reward for t in g] for g in ordered], np.float32)
        adv = group_advantages(rewards, scale=cfg.learner.scale_advantages)
        adv_map = {
            (t.group_id, t.sample_index): float(a)
            for g, row in zip(ordered, adv, strict=True)
            for t, a in zip(g, row, strict=True)
        }
        t2 = time.perf_counter()
        with self.timeline.span("learn"):
            batch = self._pack(self.to_sequences(trajs, adv_map), self.loss.aggregation)
            metrics = self.learner.step(batch)
        t3 = time.perf_counter()
        self.publish()
        lengths = [len(t.response_tokens) for t in trajs]
        metrics.update(
            reward=float(rewards.mean()),
            response_length=float(np.mean(lengths)),
            sample_s=t1 - t0,
            reward_s=t2 - t1,
            learn_s=t3 - t2,
            sample_tokens_per_s=sum(lengths) / max(t1 - t0, 1e-9),
            learn_tokens_per_s=batch.num_tokens / max(t3 - t2, 1e-9),
            reward_errors=self.rewards.stats.failures,
            version=self.learner.version,
        )
        return metrics

    def train(self) -> dict[str, Any]:
        """Warm start, evaluate, run ``num_steps`` RL steps, evaluate again."""
        cfg = self.cfg
        start = time.perf_counter()
        self.warm_start()
        initial = self.evaluate(0, "eval_initial")
        self.metrics.print(f"held-out accuracy after warm start: {initial:.3f}")
        metrics: dict[str, Any] = {}
        for step in range(cfg.num_steps):
            metrics = self.rl_step(step)
            self.metrics.write(step, "train", metrics)
            self.metrics.progress(reward=metrics["reward"], len=metrics["response_length"])
            if cfg.eval_every and (step + 1) % cfg.eval_every == 0 and step + 1 < cfg.num_steps:
                acc = self.evaluate(step + 1)
                self.metrics.print(f"step {step + 1}: held-out accuracy {acc:.3f}")
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
            "steps": cfg.num_steps,
            "last": metrics,
            "phase_s": self.timeline.totals(),
        }
        self.metrics.write(cfg.num_steps, "summary", summary)
        if cfg.metrics.trace:
            self.timeline.write(os.path.join(self.workdir, "trace.json"))
        return summary

    def close(self) -> None:
        self.rewards.close()
        self.metrics.close()


def run(cfg: RunConfig, workdir: str, **kwargs: Any) -> dict[str, Any]:
    """Build and train a run; returns its summary (accuracies, wall time, last metrics)."""
    r = Run(cfg, workdir, **kwargs)
    try:
        return r.train()
    finally:
        r.close()
