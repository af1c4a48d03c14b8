"""The sections of a run config: one frozen, self-validating dataclass per part of the stack.

Each module receives only its own section (``ModelConfig`` for the model, ``SamplingConfig`` for
the engine, ...), never the whole run config. The algorithm's sections (learner, sft, buffer,
lora) are in ``rljax.config.algorithm``. Each section documents its keys under
``Attributes:``, the text docs/runtime.md's key table is generated from (``rljax.config.keys``).
"""

from __future__ import annotations

import dataclasses

from rljax.config.checks import (
    BUILTIN_TOOL_NAMES,
    DTYPES,
    MESH_MODES,
    SLICE_LAYOUTS,
    SWAP_MODES,
    TASKS,
    WEIGHTS_LAYOUTS,
    _fail,
    _one_of,
    _positive,
    _positive_float,
    check_needs,
    value_in,
)
from rljax.config.model import ModelConfig
from rljax.config.reward import JudgeConfig, RewardConfig, RewardModelConfig
from rljax.data.registry import ANSWER_FORMATS
from rljax.data.registry import TASKS as TASK_REGISTRY
from rljax.envs.tool_calls import FORMATS as TOOL_FORMATS

# Their own modules now (rljax.config.model, rljax.config.reward); kept importable here.
__all__ = ["JudgeConfig", "ModelConfig", "RewardConfig", "RewardModelConfig"]


@dataclasses.dataclass(frozen=True)
class SamplingConfig:
    """Generation settings for the engine on the sampler mesh (rljax.engine).

    The log-prob recorded for each sampled token is that of the distribution actually sampled
    from: ``log_softmax(logits / temperature)`` after top-k/top-p/min-p filtering. The learner
    divides its logits by the same temperature so the importance ratio is exact.

    Attributes:
      temperature: tau; 0 samples greedily.
      top_k: sample from the k most likely tokens; 0 disables.
      top_p: the nucleus mass sampled from, in (0, 1]; 1 disables.
      min_p: drop tokens less likely than min_p times the most likely one, in [0, 1); 0
        disables.
      max_new_tokens: the response budget of a completion, in tokens.
      max_prefill_length: the largest prefill bucket: the longest prompt, in tokens.
      prefill_buckets: the lengths prompts are padded up to; () = powers of two from 8 up to
        max_prefill_length.
      max_concurrent_decodes: decode slots: the sequences decoded at once.
      prefill_batch: prompts prefilled in one device call (rounded up to powers of two); 1 = one
        at a time.
      page_size: tokens per page of the paged KV cache.
      num_pages: KV pages over all shards; 0 = enough for every slot at full length. With
        local (sliding-window) layers, the global layers' pool.
      num_local_pages: the local layers' KV pool over all shards (a model with
        sliding_attention layers only), whose slots hold only their window's pages; 0 = every
        slot's window and decode call plus one slot at full length (rljax.engine.pools).
      swap_mode: what a weight swap does to running sequences: 'inflight' keeps their KV and
        continues, 'recompute' prefills them again under the new weights, 'drain' admits
        nothing new until they finish (rljax.engine.sampler).
      dtype: the sampler's precision: its copy of the weights (cast from the learner's master
        copy at every publish), its activations and its KV pages. Logits, sampling and the
        recorded log-probs stay float32. 'bfloat16' halves the sampler's weight and KV memory
        (and on the CPU decodes faster than float32: docs/benchmarks.md); the learner logs the
        mismatch it brings (mismatch/* metrics, docs/runtime.md).
      weights_layout: how the sampler holds its weights: 'stacked' (the learner's layout,
        layers scanned), 'per_layer' (one array per layer, matrices [out, in]: the layout XLA's
        CPU dots decode from fastest, rebuilt at every swap beside the published copy the
        weight sync keeps, so the sampler side holds the weights twice; rljax.models.serving),
        or 'auto' (per_layer when the sampler's devices are CPUs, stacked on accelerators).
      decode_steps: tokens the sampler decodes per device call, in a loop on the device that
        checks each slot's stop tokens and token budget (rljax.engine.decode); in-flight weight
        swaps, preemption and conversations' turns happen between calls. 0 = the default of
        the sampler's device kind (DEFAULT_DECODE_STEPS there, measured in docs/benchmarks.md).
        1 returns to the host after every token. Tokens and log-probs do not depend on it.
    """

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    max_new_tokens: int = 8
    max_prefill_length: int = 32
    prefill_buckets: tuple[int, ...] = ()
    max_concurrent_decodes: int = 64
    prefill_batch: int = 8
    page_size: int = 16
    num_pages: int = 0
    num_local_pages: int = 0
    swap_mode: str = "inflight"
    dtype: str = "float32"
    weights_layout: str = "auto"
    decode_steps: int = 0

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
        _positive("sampling.num_local_pages", self.num_local_pages, allow_zero=True)
        _positive("sampling.decode_steps", self.decode_steps, allow_zero=True)
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
class MeshConfig:
    """How devices form the sampler and learner meshes (rljax.mesh).

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

    Attributes:
      mode: 'colocated' (both roles on every device) or 'split'.
      sampler_devices: split: the sampler's devices, the first ones.
      learner_devices: split: the learner's devices, the next ones.
      learner_fsdp: the learner mesh's fsdp axis; -1 takes the devices the others leave.
      learner_tensor: the learner mesh's tensor-parallel axis.
      sampler_data: the sampler mesh's data axis; -1 takes the devices the others leave.
      sampler_tensor: the sampler mesh's tensor-parallel axis.
      expert_parallel: the 'expert' axis of both meshes (a mixture-of-experts model): the
        experts are split over it, whole, and batches over it and the data axes; 1: no such
        axis.
      reallocate: let the reallocation policy resize the meshes every reallocate_every steps
        (split mode, async runs; docs/resize.md).
      reallocate_every: learner steps per reallocation phase.
      reallocate_granularity: chips per move (a host's chips on a pod slice).
      resize_schedule: resize at fixed versions: 'version:sampler/learner,...' devices, e.g.
        '3:2/6,5:4/4' (docs/resize.md).
      num_slices: slices joined over DCN (1: one slice, or the CPU).
      slice_layout: 'by_role' (each role takes whole slices) or 'spread' (both meshes over
        every slice).
    """

    mode: str = "colocated"
    sampler_devices: int = 0
    learner_devices: int = 0
    learner_fsdp: int = -1
    learner_tensor: int = 1
    sampler_data: int = -1
    sampler_tensor: int = 1
    expert_parallel: int = 1
    reallocate: bool = False
    reallocate_every: int = 5
    reallocate_granularity: int = 1
    resize_schedule: str = ""
    num_slices: int = 1
    slice_layout: str = "by_role"

    def __post_init__(self):
        _one_of("mesh.mode", self.mode, MESH_MODES)
        _positive("mesh.num_slices", self.num_slices)
        _positive("mesh.expert_parallel", self.expert_parallel)
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
            out[numbers[0]] = (numbers[1], numbers[2])
        return out


@dataclasses.dataclass(frozen=True)
class DataConfig:
    """The prompt source (rljax.data).

    Attributes:
      task: 'arithmetic' (problems generated from the seed), 'arithmetic_lookup' (the same
        problems with the second operand hidden behind a tool: ``rljax.data.arithmetic``,
        for agent runs), 'gsm8k' or 'math' (from path).
      path: the JSONL/parquet file of gsm8k/math.
      num_digits: arithmetic: digits per operand.
      ops: arithmetic: the operators drawn from, a string over '+', '-', '*'.
      train_size: training examples (gsm8k/math: at most this many of the file's rows).
      heldout_size: held-out examples, disjoint from the training ones (gsm8k/math: the file's
        last rows).
      prompt_format: 'raw' or 'chat' (the tokenizer's chat template).
      prompt_template: the user text; {prompt} is the task prompt, {question} the question
        alone (arithmetic: the prompt without its trailing '='; gsm8k/math: the row's question,
        without the step-by-step instruction {prompt} appends).
      prompt_field: gsm8k/math: the row's key of the question ('': 'question' for gsm8k,
        'problem' for math).
      answer_field: gsm8k/math: the row's key of the answer ('': 'answer' for gsm8k; for math
        a short 'answer' when the row has one, else 'solution').
      answer_format: gsm8k/math: how the answer field gives the final answer: 'gsm8k' (the
        number after the last '####'), 'boxed' (the last \\boxed{...}), 'number' (the last
        number in it), 'raw' (the whole text), or 'auto' (gsm8k for gsm8k, boxed for math). A
        row whose answer does not parse, or that lacks a field, is skipped and counted.
    """

    task: str = "arithmetic"
    path: str = ""
    num_digits: int = 2
    ops: str = "+"
    train_size: int = 4096
    heldout_size: int = 256
    prompt_format: str = "raw"
    prompt_template: str = "{prompt}"
    prompt_field: str = ""
    answer_field: str = ""
    answer_format: str = "auto"

    def __post_init__(self):
        _one_of("data.task", self.task, TASKS)
        if TASK_REGISTRY[self.task].reads_file and not self.path:
            _fail("data.path", self.path, f"a JSONL or parquet file for task {self.task!r}")
        _positive("data.num_digits", self.num_digits)
        if not self.ops or set(self.ops) - set("+-*"):
            _fail("data.ops", self.ops, "a non-empty string over '+', '-', '*'")
        # The needs within this section; RunConfig checks them against the other sections.
        needs = TASK_REGISTRY[self.task].needs
        check_needs("data.task", self.task, needs, value_in(self, "data."), DataConfig.task)
        _positive("data.train_size", self.train_size)
        _positive("data.heldout_size", self.heldout_size)
        _one_of("data.prompt_format", self.prompt_format, ("raw", "chat"))
        _one_of("data.answer_format", self.answer_format, ANSWER_FORMATS)
        try:
            self.prompt_template.format(prompt="1+1=", question="1+1")
        except (KeyError, IndexError, ValueError) as e:
            _fail(
                "data.prompt_template", self.prompt_template, f"only {{prompt}}/{{question}} ({e})"
            )


@dataclasses.dataclass(frozen=True)
class EnvConfig:
    """Multi-turn conversations with an environment (rljax.envs; docs/agents.md).

    Attributes:
      name: '' (single-turn: the reward scores the completion), or a registered env
        (rljax.envs.ENVS: 'lookup', 'lookup_blind', 'tools'); ``rljax.run(..., env=factory)``
        overrides it. The trajectory's reward is the sum of its steps' rewards.
      max_turns: model turns per conversation; the last one's step still scores it.
      max_tokens: response tokens per conversation, model and env tokens together (0: the
        engine's sampling.max_new_tokens).
      step_timeout_s: seconds one Env.step may run before its conversation fails ('timeout').
      num_workers: env steps that run at once (threads, off the sampler's).
      on_failure: a conversation whose env raised, hung or answered badly ends with what it
        has ('end', its reward the steps' so far) or its group is dropped ('drop').
      tool_format: the tool-call syntax the 'tools' env parses: 'hermes' (Qwen), 'smollm2' or
        'gemma' (a Python call in a tool_code block; results come back in tool_output blocks).
      tools: the built-in tools the 'tools' env offers: 'calculator', 'python' or both.
      tool_prompt: how the 'tools' env's system message lists them: 'card' (the model
        family's own wording) or 'brief' (a line per tool and one example call).
    """

    name: str = ""
    max_turns: int = 4
    max_tokens: int = 0
    step_timeout_s: float = 10.0
    num_workers: int = 4
    on_failure: str = "end"
    tool_format: str = "hermes"
    tools: tuple[str, ...] = BUILTIN_TOOL_NAMES
    tool_prompt: str = "card"

    def __post_init__(self):
        if not isinstance(self.name, str):
            _fail("env.name", self.name, "'' or the name of a registered env")
        _positive("env.max_turns", self.max_turns)
        _positive("env.max_tokens", self.max_tokens, allow_zero=True)
        _positive_float("env.step_timeout_s", self.step_timeout_s)
        _positive("env.num_workers", self.num_workers)
        _one_of("env.on_failure", self.on_failure, ("end", "drop"))
        _one_of("env.tool_format", self.tool_format, TOOL_FORMATS)
        _one_of("env.tool_prompt", self.tool_prompt, ("card", "brief"))
        tools = self.tools
        if isinstance(tools, str) or not tools or any(t not in BUILTIN_TOOL_NAMES for t in tools):
            _fail(
                "env.tools",
                tools,
                f"a non-empty tuple of built-in tools from {BUILTIN_TOOL_NAMES} (register an env "
                "for others: rljax.envs.register_env)",
            )


@dataclasses.dataclass(frozen=True)
class CheckpointConfig:
    """Orbax checkpointing of the full training state (rljax.checkpoint).

    Attributes:
      enabled: checkpoint, and resume from the workdir's checkpoint after a kill.
      every_steps: save every this many learner steps.
      keep: the newest checkpoints kept.
      async_save: write in a background thread once the arrays are copied off the devices.
    """

    enabled: bool = False
    every_steps: int = 50
    keep: int = 3
    async_save: bool = True

    def __post_init__(self):
        _positive("checkpoint.every_steps", self.every_steps)
        _positive("checkpoint.keep", self.keep)


@dataclasses.dataclass(frozen=True)
class EvalConfig:
    """How a run evaluates its held-out split (``eval_every``, ``eval_examples``): greedy, one
    answer per problem (the default), or ``k`` samples per problem at ``temperature``, logged
    with the figures of ``rljax eval`` (avg@k, pass@j for powers of two j up to k, maj@k, the
    mean length and the fraction cut; rljax.eval).

    Attributes:
      k: samples per held-out problem; 1 with temperature 0 is greedy.
      temperature: the evaluation's sampling temperature (0: greedy, which needs k = 1).
    """

    k: int = 1
    temperature: float = 0.0

    def __post_init__(self):
        _positive("eval.k", self.k)
        if not isinstance(self.temperature, int | float) or self.temperature < 0:
            _fail("eval.temperature", self.temperature, "a number >= 0 (0: greedy)")
        if self.temperature == 0 and self.k > 1:
            _fail(
                "eval.k",
                self.k,
                "1 with eval.temperature=0 (greedy draws the same answer k times); or set "
                "eval.temperature above 0",
            )


@dataclasses.dataclass(frozen=True)
class MetricsConfig:
    """Where metrics go (rljax.metrics): JSONL in the workdir, a progress bar, an optional timeline.

    Attributes:
      progress_bar: a progress bar of the learner steps on the terminal.
      trace: write a Perfetto / Chrome trace JSON of the run's phases.
    """

    progress_bar: bool = True
    trace: bool = False
