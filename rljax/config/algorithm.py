"""The algorithm's sections: the RL loss and optimiser, the supervised warm start, the buffer,
and LoRA (which parameters train).

Each field is documented with the paper's symbol where one exists (G, B, eta, epsilon, c, beta,
C, pi_prox), and each section validates itself in ``__post_init__``.
"""

from __future__ import annotations

import dataclasses

from rljax.config.checks import (
    DTYPES,
    LORA_SERVING,
    LORA_TARGETS,
    LOSSES,
    REMAT,
    SFT_TEACHERS,
    _fail,
    _one_of,
    _positive,
    _positive_float,
)
from rljax.learner.loss_names import ADVANTAGE_NAMES


@dataclasses.dataclass(frozen=True)
class LearnerConfig:
    """The RL algorithm and its optimiser (rljax.learner).

    Symbols follow the papers: G (group_size), epsilon_low/epsilon_high (DAPO clip-higher),
    c (clip_ratio_c, verl's dual clip), beta (KL coefficient, k3 estimator), C (truncated
    importance-sampling cap), pi_prox (decoupled PPO's proximal policy, AReaL).

    Attributes:
      loss: the loss, by its name in rljax.LOSSES: grpo, dapo, dr_grpo, gspo, decoupled_ppo,
        or one research code registered.
      advantage: the advantage estimator (docs/algorithms.md). Per response, on the host
        (rljax.learner.advantages): grpo (the group's mean and std), rloo (the mean of the
        group's other responses) or reinforce_plus_plus_baseline (the group's mean, then
        whitened over the batch's tokens). Per token, at learn time
        (rljax.learner.token_advantages): reinforce_plus_plus (discounted returns of the
        reward less kl_reward times the KL to the reference, whitened), gae (a critic's
        values; needs critic.enabled) or opd (the teacher's log-probs minus the student's;
        needs teacher.init).
      gamma: the discount of reinforce_plus_plus's returns and of gae (verl: 1.0).
      lam: lambda, gae's bias-variance trade-off (verl: 1.0).
      kl_reward: reinforce_plus_plus's KL coefficient in the per-token reward (k1 to the
        reference, the initial policy); 0 disables. Unlike beta it is not a loss term.
      group_size: G, responses per prompt (>= 2: GRPO normalises rewards within a group).
      batch_groups: B, groups (prompts) per learner step.
      micro_batches: gradient accumulation steps per learner step.
      ppo_epochs: optimiser updates per batch (PPO reuse; the clip bounds the drift).
      pack_length: the row length of sequence packing; 0 = the model's maximum.
      remat: activation rematerialisation per decoder block: 'none', 'full', or the name of a
        jax.checkpoint_policies policy (dots_saveable, dots_with_no_batch_dims_saveable).
      layer_unroll: decoder layers per iteration of the train step's layer scan; 0 unrolls the
        whole stack. Unrolled, XLA slices each layer's weights and gradients statically
        instead of through the scan's dynamic slices and stacked residuals: faster on the CPU
        (docs/benchmarks.md, Learner), at a compile time that grows with depth. 1 compiles one
        block however deep.
      epsilon_low: the ratio is clipped below at 1 - epsilon_low. loss='gspo' clips one
        length-normalised ratio per sequence, which moves far less than a token's: its paper
        (Zheng et al. 2025) uses 3e-4 and 4e-4, which these defaults do not follow; set both.
      epsilon_high: the ratio is clipped above at 1 + epsilon_high (DAPO clip-higher).
      clip_ratio_c: c, the dual clip (verl; Ye et al. 2020): for A < 0 the loss is at most
        -c * A, so a huge ratio on a bad token cannot dominate; > 1 when on (verl uses 3.0); 0
        disables.
      beta: the KL(pi || pi_ref) coefficient; 0 disables the reference model.
      truncated_is: C, the cap on pi_prox / pi_behaviour; 0 disables.
      proximal: pi_prox: 'recompute' (log-probs of the params before the step, once per batch)
        or 'loglinear' (interpolated by version, no extra forward pass; rljax.learner.losses).
      scale_advantages: divide advantages by the group std. None: the loss decides (False for
        dr_grpo, which exists to remove it; True otherwise; advantages.resolve_scale).
      learning_rate: the AdamW learning rate after the warmup; 0 samples and scores but never
        moves the policy (a control run).
      warmup_steps: updates of linear warmup from 0.
      decay_steps: > 0: cosine decay to 0 over this many updates after the warmup; 0 keeps the
        rate.
      weight_decay: AdamW's decoupled weight decay.
      b1: Adam's first-moment decay.
      b2: Adam's second-moment decay.
      grad_clip: the global gradient-norm clip; 0 disables.
    """

    loss: str = "grpo"
    advantage: str = "grpo"
    group_size: int = 8
    batch_groups: int = 16
    micro_batches: int = 1
    ppo_epochs: int = 1
    pack_length: int = 0
    remat: str = "none"
    layer_unroll: int = 1
    epsilon_low: float = 0.2
    epsilon_high: float = 0.28
    clip_ratio_c: float = 0.0
    beta: float = 0.0
    truncated_is: float = 0.0
    proximal: str = "recompute"
    scale_advantages: bool | None = None
    gamma: float = 1.0
    lam: float = 1.0
    kl_reward: float = 0.0
    learning_rate: float = 1e-4
    warmup_steps: int = 0
    decay_steps: int = 0
    weight_decay: float = 0.0
    b1: float = 0.9
    b2: float = 0.99
    grad_clip: float = 1.0

    def __post_init__(self):
        if not isinstance(self.loss, str) or not self.loss:
            _fail("learner.loss", self.loss, f"a registered loss name such as {', '.join(LOSSES)}")
        if not (isinstance(self.group_size, int) and self.group_size >= 2):
            _fail(
                "learner.group_size",
                self.group_size,
                "an integer >= 2 (GRPO normalises rewards within a group)",
            )
        _positive("learner.batch_groups", self.batch_groups)
        _positive("learner.micro_batches", self.micro_batches)
        _positive("learner.ppo_epochs", self.ppo_epochs)
        _positive("learner.pack_length", self.pack_length, allow_zero=True)
        _one_of("learner.remat", self.remat, REMAT)
        _positive("learner.layer_unroll", self.layer_unroll, allow_zero=True)
        if self.micro_batches > self.batch_groups * self.group_size:
            _fail(
                "learner.micro_batches",
                self.micro_batches,
                f"at most the batch size batch_groups*group_size="
                f"{self.batch_groups * self.group_size} (a micro-batch cannot exceed the batch)",
            )
        _positive_float("learner.epsilon_low", self.epsilon_low)
        _positive_float("learner.epsilon_high", self.epsilon_high)
        if self.epsilon_low >= 1.0:
            _fail("learner.epsilon_low", self.epsilon_low, "a number in (0, 1)")
        _positive_float("learner.clip_ratio_c", self.clip_ratio_c, allow_zero=True)
        if 0.0 < self.clip_ratio_c <= 1.0:
            _fail(
                "learner.clip_ratio_c",
                self.clip_ratio_c,
                "0 (off) or a number > 1 (a bound <= 1 would clip below the PPO clip; verl: 3.0)",
            )
        _positive_float("learner.beta", self.beta, allow_zero=True)
        _positive_float("learner.truncated_is", self.truncated_is, allow_zero=True)
        _one_of("learner.proximal", self.proximal, ("recompute", "loglinear"))
        _one_of("learner.advantage", self.advantage, ADVANTAGE_NAMES)
        if self.scale_advantages is not None and not isinstance(self.scale_advantages, bool):
            _fail("learner.scale_advantages", self.scale_advantages, "True, False or None")
        if self.scale_advantages and self.advantage != "grpo":
            _fail(
                "learner.scale_advantages",
                self.scale_advantages,
                f"None or False with learner.advantage={self.advantage!r} (only grpo divides by "
                "the group's std)",
            )
        for k in ("gamma", "lam"):
            v = getattr(self, k)
            if isinstance(v, bool) or not isinstance(v, int | float) or not 0.0 <= v <= 1.0:
                _fail(f"learner.{k}", v, "a number in [0, 1]")
        _positive_float("learner.kl_reward", self.kl_reward, allow_zero=True)
        if self.kl_reward and self.advantage != "reinforce_plus_plus":
            _fail(
                "learner.kl_reward",
                self.kl_reward,
                f"0 with learner.advantage={self.advantage!r} (only reinforce_plus_plus puts the "
                "KL in the reward; learner.beta is the KL loss term of the others)",
            )
        # 0 is allowed: a control run that samples and scores but never moves the policy.
        _positive_float("learner.learning_rate", self.learning_rate, allow_zero=True)
        _positive("learner.warmup_steps", self.warmup_steps, allow_zero=True)
        _positive("learner.decay_steps", self.decay_steps, allow_zero=True)
        _positive_float("learner.weight_decay", self.weight_decay, allow_zero=True)
        for k in ("b1", "b2"):
            v = getattr(self, k)
            if not (isinstance(v, int | float) and 0.0 <= v < 1.0):
                _fail(f"learner.{k}", v, "a number in [0, 1)")
        _positive_float("learner.grad_clip", self.grad_clip, allow_zero=True)

    @property
    def batch_size(self) -> int:
        """Sequences per learner step."""
        return self.batch_groups * self.group_size

    @property
    def needs_reference(self) -> bool:
        """Whether the step reads the reference policy's log-probs (a KL loss or reward)."""
        return self.beta > 0 or self.kl_reward > 0


@dataclasses.dataclass(frozen=True)
class CriticConfig:
    """The critic of ``learner.advantage='gae'`` (rljax.learner.critic; docs/algorithms.md): a
    decoder of the policy's architecture with a scalar value head, its own parameters and
    AdamW, trained on the learner mesh beside the policy with PPO's clipped value loss.

    Attributes:
      enabled: train a critic (required by, and only allowed with, advantage='gae').
      init: the decoder's initial weights: 'policy' (the policy's at the start of RL, after
        the warm start) or a Hugging Face directory of a model with the policy's
        architecture. The value head starts at zero, so the first values are 0.
      learning_rate: the critic's AdamW rate (constant).
      warmup_steps: the first RL steps train the critic alone; the policy starts moving after
        them (verl's critic_warmup).
      value_clip: the clipped value loss's band around the values the batch was scored with
        (verl's cliprange_value).
      grad_clip: the critic's global gradient-norm clip; 0 disables.
      weight_decay: the critic's AdamW weight decay.
    """

    enabled: bool = False
    init: str = "policy"
    learning_rate: float = 1e-4
    warmup_steps: int = 0
    value_clip: float = 0.5
    grad_clip: float = 1.0
    weight_decay: float = 0.0

    def __post_init__(self):
        if not isinstance(self.enabled, bool):
            _fail("critic.enabled", self.enabled, "True or False")
        if not isinstance(self.init, str) or not self.init:
            _fail("critic.init", self.init, "'policy' or a Hugging Face directory")
        _positive_float("critic.learning_rate", self.learning_rate)
        _positive("critic.warmup_steps", self.warmup_steps, allow_zero=True)
        _positive_float("critic.value_clip", self.value_clip)
        _positive_float("critic.grad_clip", self.grad_clip, allow_zero=True)
        _positive_float("critic.weight_decay", self.weight_decay, allow_zero=True)


@dataclasses.dataclass(frozen=True)
class TeacherConfig:
    """The frozen teacher of ``learner.advantage='opd'`` (on-policy distillation;
    rljax.runtime.teacher): it scores the student's sampled tokens with its log-probs, one
    forward per batch through the fused log-prob kernel (no [T, V] logits), on the learner
    mesh or, with ``devices``, on a mesh of its own.

    Attributes:
      init: the teacher's weights: a run's workdir (its newest checkpoint, with the model and
        tokenizer its config recorded; a LoRA run's adapters folded in) or one step's
        directory in it, a Hugging Face directory, a GGUF file or 'smollm2'; '' (no teacher).
        It must share the policy's tokenizer.
      tokenizer: the teacher's tokenizer when init does not record one: 'init' (the checkpoint's
        own), 'char' or a directory with tokenizer.json. Compared with the policy's before
        anything loads.
      devices: indices into jax.local_devices() of the teacher's own mesh: a copy of its
        weights on each, the batch's rows split over them; each step copies the batch's tokens
        there and the log-probs back to the learner. () (the default): the learner mesh, its
        weights sharded like the policy's. In split mode they must be devices neither the
        sampler nor the learner takes (resizes included); in colocated mode any (the teacher
        shares them with both roles). One process only (not on pods).
    """

    init: str = ""
    tokenizer: str = "init"
    devices: tuple[int, ...] = ()

    def __post_init__(self):
        if not isinstance(self.init, str):
            _fail("teacher.init", self.init, "a workdir, a Hugging Face directory, or ''")
        if not isinstance(self.tokenizer, str) or not self.tokenizer:
            _fail("teacher.tokenizer", self.tokenizer, "'init', 'char' or a tokenizer directory")
        d = self.devices
        ok = isinstance(d, tuple) and len(set(d)) == len(d)
        if not ok or not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in d):
            _fail(
                "teacher.devices",
                d,
                "a tuple of distinct indices into jax.local_devices(), or () for the learner mesh",
            )


@dataclasses.dataclass(frozen=True)
class SFTConfig:
    """The warm start before RL (rljax.runtime.warm_start): cross-entropy on a teacher's answers.

    ``teacher='reference'`` imitates the task's reference answers. ``teacher='drops_carries'``
    (addition only) imitates a careless teacher that forgets each carry with probability
    ``teacher_slip``, fresh on every visit: the student learns to carry but rarely does it
    greedily, the regime where a verifier reward has a lot to fix. With ``exact_steps`` the first
    steps imitate the reference answers instead: exact labels teach digit sums and when a carry
    is due much faster than noisy ones, and the careless steps that follow only make the
    student skip the carry it knows.

    Attributes:
      steps: warm-start steps; 0 skips the warm start.
      batch_size: examples per warm-start step.
      learning_rate: the warm start's learning rate after its warmup.
      num_examples: train on the first n training examples; 0 = all.
      teacher: whose answers are imitated: 'reference' (the task's), 'drops_carries'
        (addition only: a teacher that forgets each carry with probability teacher_slip) or
        'looks_up_sometimes' (data.task='arithmetic_lookup': with probability teacher_slip it
        answers the visible operand without calling the tool, else it looks the hidden one up
        and adds; the reference always looks it up) or 'calls_calculator_sometimes'
        (env.name='tools' on products: with probability teacher_slip it guesses a wrong
        product ('The answer is ...'), else it asks the calculator and repeats the result) or
        'worked' (data.task='gsm8k': each training row's worked answer, its steps and
        '#### N' as the file writes them, where 'reference' is N alone).
      teacher_slip: the probability that drops_carries forgets a carry, or that
        looks_up_sometimes or calls_calculator_sometimes does not call the tool.
      schedule: 'constant', or 'cosine': decay the rate to 0 over the warm start.
      warmup_steps: linear warmup from 0 over the first steps of the warm start.
      exact_steps: the first steps imitate the reference answers (no slips).
    """

    steps: int = 0
    batch_size: int = 64
    learning_rate: float = 1e-3
    num_examples: int = 0
    teacher: str = "reference"
    teacher_slip: float = 0.0
    schedule: str = "constant"
    warmup_steps: int = 0
    exact_steps: int = 0

    def __post_init__(self):
        _positive("sft.steps", self.steps, allow_zero=True)
        _positive("sft.batch_size", self.batch_size)
        _positive_float("sft.learning_rate", self.learning_rate)
        _positive("sft.num_examples", self.num_examples, allow_zero=True)
        _one_of("sft.teacher", self.teacher, SFT_TEACHERS)
        _one_of("sft.schedule", self.schedule, ("constant", "cosine"))
        _positive("sft.warmup_steps", self.warmup_steps, allow_zero=True)
        if self.steps and self.warmup_steps >= self.steps:
            _fail("sft.warmup_steps", self.warmup_steps, f"fewer than sft.steps={self.steps}")
        slip = self.teacher_slip
        if isinstance(slip, bool) or not isinstance(slip, int | float) or not 0.0 <= slip < 1.0:
            _fail("sft.teacher_slip", self.teacher_slip, "a probability in [0, 1)")
        if self.teacher == "reference" and self.teacher_slip:
            _fail("sft.teacher_slip", self.teacher_slip, "0 with sft.teacher='reference'")
        _positive("sft.exact_steps", self.exact_steps, allow_zero=True)
        if self.exact_steps and self.teacher == "reference":
            _fail("sft.exact_steps", self.exact_steps, "0 with sft.teacher='reference'")
        if self.steps and self.exact_steps >= self.steps:
            _fail("sft.exact_steps", self.exact_steps, f"fewer than sft.steps={self.steps}")


@dataclasses.dataclass(frozen=True)
class BufferConfig:
    """The staleness-aware replay buffer between sampler and learner (rljax.policy.staleness).

    Attributes:
      max_staleness: eta, the most versions a consumed group's oldest token may lag the
        learner; 0 is synchronous on-policy training.
      overprovision: redundant rollout: launch B + k groups per batch, abort the surplus.
      dynamic_sampling: drop groups whose rewards all match (no signal).
    """

    max_staleness: int = 0
    overprovision: int = 0
    dynamic_sampling: bool = False

    def __post_init__(self):
        if not (isinstance(self.max_staleness, int) and self.max_staleness >= 0):
            _fail("buffer.max_staleness", self.max_staleness, "an integer eta >= 0")
        _positive("buffer.overprovision", self.overprovision, allow_zero=True)


@dataclasses.dataclass(frozen=True)
class LoRAConfig:
    """Low-rank adapters trained in place of the full weights (rljax.models.lora; docs/lora.md).

    Attributes:
      enabled: train adapters on a frozen base instead of every weight.
      rank: r, the adapters' rank (>= 1).
      alpha: the adapters' output is scaled by alpha / rank (PEFT's lora_alpha).
      targets: the projections adapted, any of q, k, v, o, gate, up, down.
      dropout: dropout on an adapter's input while training (PEFT's lora_dropout); 0 = off.
      serving: how the sampler applies the adapters: 'merged' (folded into the weights at each
        swap), 'unmerged' (the base plus the low-rank product at every step) or 'auto'
        (merged on CPU devices, unmerged on accelerators).
      dtype: the learner's adapters' dtype, and so their gradients' and Adam moments':
        'float32' or 'bfloat16'; None: the base's (model.param_dtype). 'float32' on a bf16 base
        keeps updates of 1e-5 that bf16 would round away. The sampler holds them in its own
        dtype (sampling.dtype), as it holds the base.
    """

    enabled: bool = False
    rank: int = 16
    alpha: float = 32.0
    targets: tuple[str, ...] = LORA_TARGETS
    dropout: float = 0.0
    serving: str = "auto"
    dtype: str | None = None

    def __post_init__(self):
        if not isinstance(self.enabled, bool):
            _fail("lora.enabled", self.enabled, "True or False")
        _positive("lora.rank", self.rank)
        _positive_float("lora.alpha", self.alpha)
        if isinstance(self.targets, str) or not self.targets:
            _fail("lora.targets", self.targets, f"a non-empty tuple of {', '.join(LORA_TARGETS)}")
        for t in self.targets:
            _one_of("lora.targets", t, LORA_TARGETS)
        if len(set(self.targets)) != len(self.targets):
            _fail("lora.targets", self.targets, "each projection named once")
        _positive_float("lora.dropout", self.dropout, allow_zero=True)
        if self.dropout >= 1:
            _fail("lora.dropout", self.dropout, "a probability in [0, 1)")
        _one_of("lora.serving", self.serving, LORA_SERVING)
        if self.dtype is not None:
            _one_of("lora.dtype", self.dtype, DTYPES)

    @property
    def scale(self) -> float:
        """alpha / rank: what the adapters' product is multiplied by."""
        return self.alpha / self.rank
