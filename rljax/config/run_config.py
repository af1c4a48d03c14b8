"""RunConfig: every section of a run, and the rules that span sections."""

from __future__ import annotations

import dataclasses

from rljax.config.algorithm import (
    BufferConfig,
    CriticConfig,
    LearnerConfig,
    LoRAConfig,
    SFTConfig,
    TeacherConfig,
)
from rljax.config.checks import (
    RUN_MODES,
    ConfigError,
    _fail,
    _one_of,
    _positive,
    check_needs,
    value_in,
)
from rljax.config.model import ModelConfig, MoEConfig, check_lora_targets, check_moe
from rljax.config.reward import RewardConfig
from rljax.config.sections import (
    CheckpointConfig,
    DataConfig,
    EnvConfig,
    EvalConfig,
    MeshConfig,
    MetricsConfig,
    SamplingConfig,
)
from rljax.data.registry import TASKS
from rljax.data.teachers import TEACHERS
from rljax.learner.loss_names import LOSS_NEEDS
from rljax.needs import NOTHING
from rljax.policy.lending import LendingConfig
from rljax.policy.reallocation import ReallocatorConfig


@dataclasses.dataclass(frozen=True)
class RunConfig:
    """One experiment: every section plus the run-level knobs.

    ``__post_init__`` checks the rules that span sections, once, whoever builds the config.

    Attributes:
      model: the decoder (ModelConfig).
      moe: mixture-of-experts training: routing replay, expert parallelism (MoEConfig).
      tokenizer: 'char', a directory with tokenizer.json, or 'init' (the checkpoint's).
      init: the initial weights: 'random' (from model), a Hugging Face directory, a GGUF file,
        'smollm2', or a run's workdir or one step's directory in it (a LoRA run's adapters
        folded in). A loaded checkpoint's own config.json / GGUF metadata / run config replaces
        model (its dtype is kept).
      sampling: generation (SamplingConfig).
      learner: the RL algorithm and its optimiser (LearnerConfig).
      critic: the value model of learner.advantage='gae' (CriticConfig).
      teacher: the frozen teacher of learner.advantage='opd' (TeacherConfig).
      sft: the supervised warm start (SFTConfig).
      buffer: the staleness-aware buffer (BufferConfig).
      mesh: the devices of the two roles (MeshConfig).
      reallocator: the reallocation policy's settings; the simulator's SimConfig.reallocator
        is this section.
      lending: lending idle chips of one role to the other inside a step
        (rljax.runtime.lending); the policy's settings, shared with the simulator's
        SimConfig.lending. Off by default.
      data: the prompt source (DataConfig).
      reward: the verifier (RewardConfig).
      env: multi-turn conversations with an environment (EnvConfig).
      lora: low-rank adapters trained on a frozen base (LoRAConfig).
      checkpoint: checkpointing (CheckpointConfig).
      metrics: where metrics go (MetricsConfig).
      eval: how the held-out split is evaluated: greedy, or k samples per problem (EvalConfig).
      mode: 'sync' (one lock-step schedule, on-policy) or 'async' (sampler and learner
        overlap, off-policy up to buffer.max_staleness).
      seed: seeds the data, the initial weights and the sampling.
      num_steps: learner (RL) steps.
      eval_every: evaluate the held-out accuracy every this many steps; 0: only after the warm
        start and at the end.
      eval_examples: held-out examples per evaluation.
      kernel_impl: the Pallas kernels: 'auto' (on TPU), 'pallas' (interpreted off TPU), or 'xla'.
    """

    model: ModelConfig = ModelConfig()
    moe: MoEConfig = MoEConfig()
    tokenizer: str = "char"
    init: str = "random"
    sampling: SamplingConfig = SamplingConfig()
    learner: LearnerConfig = LearnerConfig()
    critic: CriticConfig = CriticConfig()
    teacher: TeacherConfig = TeacherConfig()
    sft: SFTConfig = SFTConfig()
    buffer: BufferConfig = BufferConfig()
    mesh: MeshConfig = MeshConfig()
    reallocator: ReallocatorConfig = ReallocatorConfig()
    lending: LendingConfig = LendingConfig()
    data: DataConfig = DataConfig()
    reward: RewardConfig = RewardConfig()
    env: EnvConfig = EnvConfig()
    lora: LoRAConfig = LoRAConfig()
    checkpoint: CheckpointConfig = CheckpointConfig()
    metrics: MetricsConfig = MetricsConfig()
    eval: EvalConfig = EvalConfig()
    mode: str = "sync"
    seed: int = 0
    num_steps: int = 100
    eval_every: int = 0
    eval_examples: int = 256
    kernel_impl: str = "auto"

    def __post_init__(self):
        _one_of("mode", self.mode, RUN_MODES)
        _positive("seed", self.seed, allow_zero=True)
        _positive("num_steps", self.num_steps, allow_zero=True)
        _positive("eval_every", self.eval_every, allow_zero=True)
        _positive("eval_examples", self.eval_examples)
        _one_of("kernel_impl", self.kernel_impl, ("auto", "pallas", "xla"))
        if self.mode == "sync" and self.buffer.max_staleness != 0:
            _fail(
                "buffer.max_staleness",
                self.buffer.max_staleness,
                "0 in sync mode (set mode='async' to train off-policy)",
            )
        self._check_needs()
        self._check_roles()
        check_moe(self.model, self.moe, self.mesh.expert_parallel)
        if self.lora.enabled:
            check_lora_targets(self.model, self.lora.targets)
        lr = self.learner
        updates = self.num_steps * lr.ppo_epochs
        if lr.decay_steps and lr.warmup_steps + lr.decay_steps < updates:
            _fail(
                "learner.decay_steps",
                lr.decay_steps,
                f"at least {updates - lr.warmup_steps} (num_steps * learner.ppo_epochs - "
                f"learner.warmup_steps): the rate is 0 once the decay ends, so the last "
                f"{updates - lr.warmup_steps - lr.decay_steps} updates would not train",
            )
        if self.lending.enabled and self.mesh.mode != "split":
            _fail(
                "lending.enabled",
                self.lending.enabled,
                "False unless mesh.mode='split' (lending runs work on the other mesh's chips)",
            )
        if self.lending.enabled and self.mesh.reallocate:
            raise ConfigError(
                "config keys 'lending.enabled' and 'mesh.reallocate' are both True; the runtime "
                "lends or reallocates, not both yet: turn one off"
            )
        if self.mesh.reallocate and self.mode != "async":
            raise ConfigError(
                "config key 'mesh.reallocate' = True needs mode='async' (it measures how long "
                "each role idles while the other works); set mode='async' or turn it off"
            )
        if self.env.max_tokens > self.sampling.max_new_tokens:
            _fail(
                "env.max_tokens",
                self.env.max_tokens,
                f"at most sampling.max_new_tokens={self.sampling.max_new_tokens} (the engine's "
                "budget per sample; raise it too)",
            )
        if self.env.name and self.reward.model_rewards:
            raise ConfigError(
                f"config key 'reward.name' = {self.reward.name!r} scores single-turn completions "
                f"with the {self.reward.model_rewards[0]!r} reward, but env.name="
                f"{self.env.name!r} makes the env's steps give the reward; set env.name='' or "
                "reward.name to a verifier"
            )
        if self.tokenizer == "init" and self.init == "random":
            raise ConfigError(
                "config key 'tokenizer' = 'init' needs a checkpoint in 'init' (it is 'random'); "
                "set tokenizer='char' or a tokenizer directory, or init to a model"
            )
        if self.sampling.max_concurrent_decodes < self.learner.group_size:
            _fail(
                "sampling.max_concurrent_decodes",
                self.sampling.max_concurrent_decodes,
                f"at least learner.group_size={self.learner.group_size} (a group shares a prefill)",
            )

    def _check_roles(self) -> None:
        """The critic and the teacher exist exactly when the estimator uses them."""
        advantage = self.learner.advantage
        if advantage == "gae" and not self.critic.enabled:
            raise ConfigError(
                "config key 'learner.advantage' = 'gae' needs a critic; set critic.enabled=True "
                "(critic.init='policy' starts it from the policy) or pick another estimator"
            )
        if self.critic.enabled and advantage != "gae":
            _fail(
                "critic.enabled",
                True,
                f"False with learner.advantage={advantage!r} (only gae reads a critic's values)",
            )
        if advantage == "opd" and not self.teacher.init:
            raise ConfigError(
                "config key 'learner.advantage' = 'opd' needs a teacher; set teacher.init to a "
                "run's workdir or a Hugging Face directory"
            )
        if self.teacher.init and advantage != "opd":
            _fail(
                "teacher.init",
                self.teacher.init,
                f"'' with learner.advantage={advantage!r} (only opd reads a teacher)",
            )
        if self.teacher.devices and not self.teacher.init:
            _fail("teacher.devices", self.teacher.devices, "() without teacher.init (no teacher)")

    def _check_needs(self) -> None:
        """What the chosen task, teacher and loss need of the other sections (``rljax.needs``),
        declared by their registries and checked by one rule."""
        value_of = value_in(self)
        task, teacher, loss = self.data.task, self.sft.teacher, self.learner.loss
        check_needs("data.task", task, TASKS[task].needs, value_of, DataConfig.task)
        check_needs("sft.teacher", teacher, TEACHERS[teacher].needs, value_of, SFTConfig.teacher)
        # A loss registered at run time (rljax.LOSSES) declares nothing here.
        needs = LOSS_NEEDS.get(loss, NOTHING)
        check_needs("learner.loss", loss, needs, value_of, LearnerConfig.loss)
