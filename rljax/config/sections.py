"""The sections of a run config: one frozen, self-validating dataclass per part of the stack.

Each module receives only its own section (``ModelConfig`` for the model, ``SamplingConfig`` for
the engine, ...), never the whole run config.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from rljax.config.checks import (
    DTYPES,
    FAMILIES,
    LOSSES,
    MESH_MODES,
    REMAT,
    SFT_TEACHERS,
    SLICE_LAYOUTS,
    SWAP_MODES,
    TASKS,
    WEIGHTS_LAYOUTS,
    _fail,
    _one_of,
    _positive,
    _positive_float,
)


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """A decoder-only transformer (Llama / Qwen2 / Qwen3 / SmolLM2 family).

    Field names follow Hugging Face ``config.json`` where one exists.
    """

    family: str = "llama"
    vocab_size: int = 32
    hidden_size: int = 128
    intermediate_size: int = 384
    num_layers: int = 2
    num_heads: int = 4
    num_kv_heads: int = 2
    head_dim: int = 32
    rope_theta: float = 10000.0
    # None, or a mapping with rope_type='llama3', factor, low_freq_factor, high_freq_factor,
    # original_max_position_embeddings (Llama 3.1+ long-context scaling).
    rope_scaling: Mapping[str, Any] | None = None
    norm_eps: float = 1e-6
    tie_embeddings: bool = False
    qk_norm: bool = False  # Qwen3: RMSNorm on each head's q and k before RoPE.
    qkv_bias: bool = False  # Qwen2: bias on the q/k/v projections.
    max_position_embeddings: int = 2048
    dtype: str = "float32"  # activation / compute dtype
    param_dtype: str = "float32"

    def __post_init__(self):
        _one_of("model.family", self.family, FAMILIES)
        for name in (
            "vocab_size",
            "hidden_size",
            "intermediate_size",
            "num_layers",
            "num_heads",
            "num_kv_heads",
            "head_dim",
            "max_position_embeddings",
        ):
            _positive(f"model.{name}", getattr(self, name))
        if self.num_heads % self.num_kv_heads:
            _fail(
                "model.num_kv_heads",
                self.num_kv_heads,
                f"a divisor of model.num_heads={self.num_heads} (grouped-query attention)",
            )
        if self.head_dim % 2:
            _fail("model.head_dim", self.head_dim, "an even number (RoPE rotates pairs)")
        _positive_float("model.rope_theta", self.rope_theta)
        _positive_float("model.norm_eps", self.norm_eps)
        _one_of("model.dtype", self.dtype, DTYPES)
        _one_of("model.param_dtype", self.param_dtype, DTYPES)
        if self.rope_scaling is not None:
            scaling = dict(self.rope_scaling)
            if scaling.get("rope_type") != "llama3":
                _fail("model.rope_scaling.rope_type", scaling.get("rope_type"), "'llama3' or None")
            for k in ("factor", "low_freq_factor", "high_freq_factor"):
                _positive_float(f"model.rope_scaling.{k}", scaling.get(k))
            _positive(
                "model.rope_scaling.original_max_position_embeddings",
                scaling.get("original_max_position_embeddings"),
            )


@dataclasses.dataclass(frozen=True)
class SamplingConfig:
    """Generation settings for the engine on the sampler mesh.

    The log-prob recorded for each sampled token is that of the distribution actually sampled
    from: ``log_softmax(logits / temperature)`` after top-k/top-p/min-p filtering. The learner
    divides its logits by the same temperature so the importance ratio is exact.
    """

    temperature: float = 1.0  # tau; 0 means greedy
    top_k: int = 0  # 0 disables
    top_p: float = 1.0  # nucleus mass in (0, 1]
    min_p: float = 0.0  # in [0, 1)
    max_new_tokens: int = 8
    max_prefill_length: int = 32  # the largest prefill bucket
    prefill_buckets: tuple[int, ...] = ()  # () = powers of two up to max_prefill_length
    max_concurrent_decodes: int = 64  # decode slots
    # Prompts prefilled in one device call (rounded up to powers of two); 1 = one at a time.
    prefill_batch: int = 8
    page_size: int = 16
    num_pages: int = 0  # 0 = enough for every slot at full length
    swap_mode: str = "inflight"
    # The sampler's precision: its copy of the weights (cast from the learner's master copy at
    # every publish), its activations and its KV pages. Logits, sampling and the recorded
    # log-probs stay float32. 'bfloat16' halves the sampler's weight and KV memory; the
    # learner logs the mismatch it brings (mismatch/* metrics, docs/runtime.md).
    dtype: str = "float32"
    # How the sampler holds its weights: 'stacked' (the learner's layout, layers scanned),
    # 'per_layer' (one array per layer, matrices [out, in]: the layout XLA's CPU dots decode
    # from fastest, rebuilt at every swap beside the published copy the weight sync keeps, so
    # the sampler side holds the weights twice; rljax.models.serving), or 'auto' (per_layer
    # when the sampler's devices are CPUs, stacked on accelerators).
    weights_layout: str = "auto"

    def __post_init__(self):
        _positive_float("sampling.temperature", self.temperature, allow_zero=True)
        _one_of("sampling.dtype", self.dtype, DTYPES)
        _positive("sampling.top_k", self.top_k, allow_zero=True)
        if not (isinstance(self.top_p, int | float) and 0.0 < self.top_p <= 1.0):
            _fail("sampling.top_p", self.top_p, "a number in (0, 1]")
        if not (isinstance(self.min_p, int | float) and 0.0 <= self.min_p < 1.0):
            _fail("sampling.min_p", self.min_p, "a number in [0, 1)")
        _positive("sampling.max_new_tokens", self.max_new_tokens)
        _positive("sampling.max_prefill_length", self.max_prefill_length)
        _positive("sampling.max_concurrent_decodes", self.max_concurrent_decodes)
        _positive("sampling.prefill_batch", self.prefill_batch)
        _positive("sampling.page_size", self.page_size)
        _positive("sampling.num_pages", self.num_pages, allow_zero=True)
        _one_of("sampling.swap_mode", self.swap_mode, SWAP_MODES)
        _one_of("sampling.weights_layout", self.weights_layout, WEIGHTS_LAYOUTS)
        for b in self.prefill_buckets:
            _positive("sampling.prefill_buckets[]", b)
        if self.prefill_buckets and max(self.prefill_buckets) != self.max_prefill_length:
            _fail(
                "sampling.prefill_buckets",
                self.prefill_buckets,
                "buckets whose largest equals sampling.max_prefill_length="
                f"{self.max_prefill_length}",
            )

    @property
    def max_seq_len(self) -> int:
        """Tokens a slot holds at most: the longest prompt plus the response budget."""
        return self.max_prefill_length + self.max_new_tokens

    @property
    def buckets(self) -> tuple[int, ...]:
        """Prefill lengths, ascending; prompts are padded up to the next one."""
        if self.prefill_buckets:
            return tuple(sorted(set(self.prefill_buckets)))
        out, b = [], 8
        while b < self.max_prefill_length:
            out.append(b)
            b *= 2
        return (*out, self.max_prefill_length)


@dataclasses.dataclass(frozen=True)
class LearnerConfig:
    """The RL algorithm and its optimiser.

    Symbols follow the papers: G (group_size), epsilon_low/epsilon_high (DAPO clip-higher),
    c (clip_ratio_c, verl's dual clip), beta (KL coefficient, k3 estimator), C (truncated
    importance-sampling cap), pi_prox (decoupled PPO's proximal policy, AReaL).
    """

    loss: str = "grpo"
    group_size: int = 8  # G: responses per prompt
    batch_groups: int = 16  # B: groups (prompts) per learner step
    micro_batches: int = 1  # gradient accumulation steps per learner step
    ppo_epochs: int = 1  # optimiser updates per batch (PPO reuse; the clip bounds the drift)
    pack_length: int = 0  # row length for sequence packing; 0 = model max
    remat: str = "none"  # activation rematerialisation per decoder block: one of REMAT
    # Decoder layers per iteration of the train step's layer scan; 0 unrolls the whole stack.
    # Unrolled, XLA slices each layer's weights and gradients statically instead of through the
    # scan's dynamic slices and stacked residuals: faster on the CPU (docs/benchmarks.md,
    # Learner), at a compile time that grows with depth. 1 compiles one block however deep.
    layer_unroll: int = 1
    epsilon_low: float = 0.2
    epsilon_high: float = 0.28
    # c: dual clip (verl; Ye et al. 2020): for A < 0 the loss is at most -c * A, so a huge ratio
    # on a bad token cannot dominate; > 1 when on (verl uses 3.0); 0 disables
    clip_ratio_c: float = 0.0
    beta: float = 0.0  # KL(pi || pi_ref) coefficient; 0 disables the reference model
    truncated_is: float = 0.0  # C: cap on pi_prox / pi_behaviour; 0 disables
    # pi_prox: 'recompute' (log-probs of the params before the step, once per batch) or
    # 'loglinear' (interpolated by version, no extra forward pass; see rljax.learner.losses)
    proximal: str = "recompute"
    # Divide advantages by the group std. None: the loss decides (False for dr_grpo, which
    # exists to remove it; True otherwise); see advantages.resolve_scale
    scale_advantages: bool | None = None
    learning_rate: float = 1e-4
    warmup_steps: int = 0
    decay_steps: int = 0  # > 0: cosine decay to 0 over this many updates after the warmup
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
        if self.scale_advantages is not None and not isinstance(self.scale_advantages, bool):
            _fail("learner.scale_advantages", self.scale_advantages, "True, False or None")
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


@dataclasses.dataclass(frozen=True)
class SFTConfig:
    """Supervised warm start before RL: cross-entropy on a teacher's answers.

    ``teacher='reference'`` imitates the task's reference answers. ``teacher='drops_carries'``
    (addition only) imitates a careless teacher that forgets each carry with probability
    ``teacher_slip``, fresh on every visit: the student learns to carry but rarely does it
    greedily, the regime where a verifier reward has a lot to fix. With ``exact_steps`` the first
    steps imitate the reference answers instead: exact labels teach digit sums and when a carry
    is due much faster than noisy ones, and the careless steps that follow only make the
    student skip the carry it knows.
    """

    steps: int = 0  # 0 skips the warm start
    batch_size: int = 64
    learning_rate: float = 1e-3
    num_examples: int = 0  # train on the first n training examples; 0 = all
    teacher: str = "reference"
    teacher_slip: float = 0.0
    schedule: str = "constant"  # or 'cosine': decay the rate to 0 over the warm start
    warmup_steps: int = 0  # linear warmup from 0 over the first steps of the warm start
    exact_steps: int = 0  # the first steps imitate the reference answers (no slips)

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
    """The staleness-aware replay buffer between sampler and learner."""

    max_staleness: int = 0  # eta: 0 is synchronous on-policy training
    overprovision: int = 0  # redundant rollout: launch B + k groups per batch, abort surplus
    dynamic_sampling: bool = False  # drop groups whose rewards all match (no signal)

    def __post_init__(self):
        if not (isinstance(self.max_staleness, int) and self.max_staleness >= 0):
            _fail("buffer.max_staleness", self.max_staleness, "an integer eta >= 0")
        _positive("buffer.overprovision", self.overprovision, allow_zero=True)


@dataclasses.dataclass(frozen=True)
class MeshConfig:
    """How devices form the sampler and learner meshes.

    ``colocated`` puts every device in one mesh shared by both roles. ``split`` gives the first
    ``sampler_devices`` devices to the sampler and the next ``learner_devices`` to the learner.
    Axis sizes of -1 absorb the remaining devices.

    With ``reallocate`` on (split mode, async runs), every ``reallocate_every`` learner steps
    the runtime hands the measured phase (busy/idle seconds per role, buffer fill, switch cost)
    to :class:`rljax.policy.reallocation.Reallocator` and resizes the two meshes when it answers
    with a new split (``Run.resize``); chips move ``reallocate_granularity`` at a time. The
    policy's own settings (the least chips per side, thresholds, hysteresis) are the
    ``reallocator`` section, shared with the simulator.

    ``resize_schedule`` resizes at fixed versions instead: ``'3:2/6,5:4/4'`` moves to 2 sampler
    and 6 learner devices at the step boundary where the learner reaches version 3, and back to
    4/4 at version 5. A relaunch starts from ``sampler_devices``/``learner_devices`` again. On a
    pod each side must stay whole hosts.

    ``num_slices`` > 1: a multislice job (``rljax.mesh.slices``); ``slice_layout='by_role'``
    gives each role whole slices, ``'spread'`` spreads both meshes over every slice.
    """

    mode: str = "colocated"
    sampler_devices: int = 0
    learner_devices: int = 0
    learner_fsdp: int = -1
    learner_tensor: int = 1
    sampler_data: int = -1
    sampler_tensor: int = 1
    reallocate: bool = False
    reallocate_every: int = 5  # learner steps per reallocation phase
    reallocate_granularity: int = 1  # chips per move (a host's chips on a pod slice)
    resize_schedule: str = ""  # 'version:sampler/learner,...' devices, e.g. '3:2/6,5:4/4'
    num_slices: int = 1  # slices joined over DCN (1: one slice, or the CPU)
    slice_layout: str = "by_role"  # by_role | spread (see above)

    def __post_init__(self):
        _one_of("mesh.mode", self.mode, MESH_MODES)
        _positive("mesh.num_slices", self.num_slices)
        _one_of("mesh.slice_layout", self.slice_layout, SLICE_LAYOUTS)
        if self.num_slices > 1 and self.reallocate:
            _fail("mesh.reallocate", True, "False with mesh.num_slices > 1 (chips move in slices)")
        if self.mode == "split":
            for k in ("sampler_devices", "learner_devices"):
                v = getattr(self, k)
                if not (isinstance(v, int) and v > 0):
                    _fail(f"mesh.{k}", v, "an integer > 0 in split mode (each side needs a device)")
        for k in ("learner_fsdp", "learner_tensor", "sampler_data", "sampler_tensor"):
            v = getattr(self, k)
            if not (isinstance(v, int) and (v == -1 or v > 0)):
                _fail(f"mesh.{k}", v, "a positive integer, or -1 to use the remaining devices")
        if not isinstance(self.reallocate, bool):
            _fail("mesh.reallocate", self.reallocate, "True or False")
        if self.reallocate and self.mode != "split":
            _fail(
                "mesh.reallocate",
                self.reallocate,
                "False in colocated mode (reallocation moves chips between the two meshes of "
                "mesh.mode='split')",
            )
        for k in ("reallocate_every", "reallocate_granularity"):
            _positive(f"mesh.{k}", getattr(self, k))
        if self.resize_schedule and (self.mode != "split" or self.reallocate):
            _fail(
                "mesh.resize_schedule",
                self.resize_schedule,
                "'' unless mesh.mode='split' and mesh.reallocate is off (one of the two decides)",
            )
        self.scheduled_splits()  # refuses a schedule that does not parse

    def scheduled_splits(self) -> dict[int, tuple[int, int]]:
        """``resize_schedule`` as {version: (sampler devices, learner devices)}."""
        out: dict[int, tuple[int, int]] = {}
        want = "'version:sampler/learner,...' with integers > 0 and rising versions, e.g. '3:2/6'"
        if not isinstance(self.resize_schedule, str):
            _fail("mesh.resize_schedule", self.resize_schedule, want)
        for entry in filter(None, self.resize_schedule.replace(" ", "").split(",")):
            try:
                version, sides = entry.split(":")
                numbers = (int(version), *map(int, sides.split("/")))
            except ValueError:
                numbers = ()
            if len(numbers) != 3 or min(numbers) < 1 or numbers[0] <= max(out, default=0):
                _fail("mesh.resize_schedule", self.resize_schedule, want)
            out[numbers[0]] = numbers[1:]
        return out


@dataclasses.dataclass(frozen=True)
class DataConfig:
    """The prompt source."""

    task: str = "arithmetic"
    path: str = ""  # JSONL/parquet for gsm8k/math
    num_digits: int = 2
    ops: str = "+"
    train_size: int = 4096
    heldout_size: int = 256
    prompt_format: str = "raw"  # 'raw' or 'chat' (the tokenizer's chat template)
    # The user text; {prompt} is the task prompt, {question} the same without a trailing '='.
    prompt_template: str = "{prompt}"

    def __post_init__(self):
        _one_of("data.task", self.task, TASKS)
        if self.task != "arithmetic" and not self.path:
            _fail("data.path", self.path, f"a JSONL or parquet file for task {self.task!r}")
        _positive("data.num_digits", self.num_digits)
        if not self.ops or set(self.ops) - set("+-*"):
            _fail("data.ops", self.ops, "a non-empty string over '+', '-', '*'")
        _positive("data.train_size", self.train_size)
        _positive("data.heldout_size", self.heldout_size)
        _one_of("data.prompt_format", self.prompt_format, ("raw", "chat"))
        try:
            self.prompt_template.format(prompt="1+1=", question="1+1")
        except (KeyError, IndexError, ValueError) as e:
            _fail(
                "data.prompt_template", self.prompt_template, f"only {{prompt}}/{{question}} ({e})"
            )


@dataclasses.dataclass(frozen=True)
class RewardConfig:
    """The verifier and how it runs (isolated, with a timeout; see rljax.rewards.pool).

    A completion whose verifier raises, overruns ``timeout_s``, or returns NaN, inf, a
    non-number or (batched) the wrong count is counted in ``reward_errors/<kind>`` and scored
    as ``on_failure`` says: ``'zero'`` scores it 0.0 and its group trains; ``'drop'`` drops
    its whole group (counted in ``dropped_reward_failure``; the driver admits another).
    """

    name: str = "exact_match"
    timeout_s: float = 5.0  # per call (per completion, or per batch when batched)
    num_workers: int = 2
    mode: str = "thread"  # or 'process' for untrusted or hang-prone verifiers
    on_failure: str = "zero"  # or 'drop' the group of a failed completion
    batched: bool = False  # fn(completions, examples) -> list of floats, one call per group

    def __post_init__(self):
        if not self.name:
            _fail("reward.name", self.name, "a reward name from rljax.rewards.REWARDS")
        _positive_float("reward.timeout_s", self.timeout_s)
        _positive("reward.num_workers", self.num_workers)
        _one_of("reward.mode", self.mode, ("thread", "process"))
        _one_of("reward.on_failure", self.on_failure, ("zero", "drop"))
        if not isinstance(self.batched, bool):
            _fail("reward.batched", self.batched, "True or False")


@dataclasses.dataclass(frozen=True)
class CheckpointConfig:
    """Orbax checkpointing of the full training state."""

    enabled: bool = False
    every_steps: int = 50
    keep: int = 3
    async_save: bool = True

    def __post_init__(self):
        _positive("checkpoint.every_steps", self.every_steps)
        _positive("checkpoint.keep", self.keep)


@dataclasses.dataclass(frozen=True)
class MetricsConfig:
    """Where metrics go: JSONL in the workdir, a progress bar, an optional timeline."""

    progress_bar: bool = True
    trace: bool = False  # Perfetto / Chrome trace JSON of the run's phases
