"""The reward section: the verifier, how the pool runs it, and the model-based rewards.

A reward is a verifier by name (``rljax.rewards.REWARDS``), a reward model (``'model'``, the
``reward.model`` sub-section: a Hugging Face ``*ForSequenceClassification`` checkpoint), a
generative judge (``'judge'``, the ``reward.judge`` sub-section), or ``'weighted'``: the sum of
several of those, each times its weight in ``reward.weights`` (docs/algorithms.md, "Model-based
rewards").
"""

from __future__ import annotations

import dataclasses
import math
import string
from collections.abc import Mapping
from typing import Any

from rljax.config.checks import (
    MODEL_REWARDS,
    WEIGHTED_REWARD,
    ConfigError,
    _fail,
    _one_of,
    _positive,
    _positive_float,
)

# Where a model-based reward's tokenizer comes from, besides a tokenizer directory.
TOKENIZER_SOURCES = ("policy", "checkpoint")
# The slots a judge template may fill; 'response' is required.
JUDGE_SLOTS = ("prompt", "response", "answer")
DEFAULT_JUDGE_TEMPLATE = (
    "Rate how well the response solves the task, from 0 (wrong) to 10 (right).\n"
    "Task: {prompt}\nResponse: {response}\n"
    "End your answer with a line 'Score: <number>'."
)


def _devices(key: str, devices: Any) -> None:
    ok = isinstance(devices, tuple) and bool(devices)
    ok = ok and all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in devices)
    if not ok or len(set(devices)) != len(devices):
        _fail(key, devices, "a non-empty tuple of distinct indices into jax.local_devices()")


def _tokenizer(key: str, value: Any) -> None:
    if not isinstance(value, str) or not value:
        _fail(key, value, f"one of {', '.join(TOKENIZER_SOURCES)}, or a tokenizer directory")


@dataclasses.dataclass(frozen=True)
class RewardModelConfig:
    """A scalar reward model (rljax.rewards.model): the score head of a Hugging Face
    ``*ForSequenceClassification`` checkpoint at the last token of prompt + completion.

    Attributes:
      path: the checkpoint directory (config.json and safetensors of a Llama, Qwen2 or Qwen3
        ``*ForSequenceClassification`` with num_labels=1); read when reward.name='model' or
        reward.weights names 'model'.
      tokenizer: 'policy' (the run's tokenizer: the reward model shares the policy's
        vocabulary and scores the very prompt the policy saw), 'checkpoint' (path's own
        tokenizer.json) or a tokenizer directory; the prompt is rendered with it as data.*
        says.
      devices: indices into jax.local_devices() it runs on: a copy of its weights on each,
        every batch split over them.
      batch_size: sequences per forward pass (rounded up to a multiple of the devices); a
        larger call runs in several.
      max_length: the longest prompt + completion it scores, in tokens (padded up to powers of
        two); 0: the policy's sampling.max_seq_len. A longer one fails as 'raised'.
    """

    path: str = ""
    tokenizer: str = "policy"
    devices: tuple[int, ...] = (0,)
    batch_size: int = 32
    max_length: int = 0

    def __post_init__(self):
        if not isinstance(self.path, str):
            _fail("reward.model.path", self.path, "a checkpoint directory")
        _tokenizer("reward.model.tokenizer", self.tokenizer)
        _devices("reward.model.devices", self.devices)
        _positive("reward.model.batch_size", self.batch_size)
        _positive("reward.model.max_length", self.max_length, allow_zero=True)


@dataclasses.dataclass(frozen=True)
class JudgeConfig:
    """A generative judge (rljax.rewards.judge): a causal LM of its own, served by an engine
    of its own, answers a prompt made from ``template`` greedily; the reward is the number in
    its verdict's last 'Score: <number>', divided by max_score.

    Attributes:
      path: the judge's Hugging Face ``*ForCausalLM`` directory (Llama, Qwen2, Qwen3); read
        when reward.name='judge' or reward.weights names 'judge'.
      tokenizer: 'checkpoint' (path's own tokenizer.json), 'policy' (the run's) or a
        tokenizer directory.
      template: the judge's prompt; {response} (required) is the completion, {prompt} the task
        prompt and {answer} the reference answer. Write literal braces as {{ and }}.
      prompt_format: 'chat' (the template is a user turn of the judge tokenizer's chat
        template) or 'raw'.
      max_score: the top of the verdict's scale: a score must be in [0, max_score]; the reward
        is score / max_score, in [0, 1].
      max_new_tokens: the verdict's budget, in tokens.
      max_prompt_length: the longest judge prompt, in tokens; a longer one fails as 'raised'.
      batch_size: verdicts decoded at once (the judge engine's decode slots).
      devices: indices into jax.local_devices() its engine runs on.
    """

    path: str = ""
    tokenizer: str = "checkpoint"
    template: str = DEFAULT_JUDGE_TEMPLATE
    prompt_format: str = "chat"
    max_score: float = 10.0
    max_new_tokens: int = 32
    max_prompt_length: int = 512
    batch_size: int = 16
    devices: tuple[int, ...] = (0,)

    def __post_init__(self):
        if not isinstance(self.path, str):
            _fail("reward.judge.path", self.path, "a checkpoint directory")
        _tokenizer("reward.judge.tokenizer", self.tokenizer)
        check_judge_template(self.template)
        _one_of("reward.judge.prompt_format", self.prompt_format, ("chat", "raw"))
        _positive_float("reward.judge.max_score", self.max_score)
        _positive("reward.judge.max_new_tokens", self.max_new_tokens)
        _positive("reward.judge.max_prompt_length", self.max_prompt_length)
        _positive("reward.judge.batch_size", self.batch_size)
        _devices("reward.judge.devices", self.devices)


def check_judge_template(template: Any) -> None:
    """Refuses a judge template without a {response} slot, or with a slot it cannot fill."""
    key = "reward.judge.template"
    if not isinstance(template, str):
        _fail(key, template, "a string with a {response} slot")
    try:
        slots = {name for _, name, _, _ in string.Formatter().parse(template) if name is not None}
    except ValueError as e:
        _fail(key, template, f"a format string with a {{response}} slot ({e}; write {{{{ }}}})")
    unknown = sorted(s for s in slots if s not in JUDGE_SLOTS)
    if unknown:
        slots_text = "only the slots {prompt}, {response}, {answer}"
        _fail(key, template, f"{slots_text} ({unknown[0]!r})")
    if "response" not in slots:
        _fail(key, template, "a template with a {response} slot, where the completion goes")


@dataclasses.dataclass(frozen=True)
class RewardConfig:
    """The verifier and how it runs (isolated, with a timeout; see rljax.rewards.pool).

    A completion whose verifier raises, overruns ``timeout_s``, or returns NaN, inf, a
    non-number or (batched) the wrong count is counted in ``reward_errors/<kind>`` and scored
    as ``on_failure`` says: ``'zero'`` scores it 0.0 and its group trains; ``'drop'`` drops
    its whole group (counted in ``dropped_reward_failure``; the driver admits another).

    Attributes:
      name: the verifier, by its name in rljax.rewards.REWARDS; 'model' (a reward model,
        reward.model), 'judge' (a generative judge, reward.judge) or 'weighted' (the sum of
        reward.weights' rewards, each times its weight).
      weights: with name='weighted', {reward name: weight}: the reward is the sum of each
        named reward (a verifier, 'model' or 'judge') times its weight; a completion one of
        them fails on fails. Empty otherwise.
      timeout_s: seconds per call (per completion, or per batch when batched; 'model',
        'judge' and 'weighted' are batched, and their first call compiles).
      num_workers: the verifier's workers.
      mode: 'thread', or 'process' for untrusted or hang-prone verifiers ('model' and 'judge'
        run in threads only).
      on_failure: a failed completion scores 0.0 and its group trains ('zero'), or its group
        is dropped ('drop').
      batched: the verifier is fn(completions, examples) -> list of floats, one call per group.
        'model', 'judge' and 'weighted' always are.
      model: the reward model of 'model' (RewardModelConfig).
      judge: the judge of 'judge' (JudgeConfig).
      heldout: the verifier (a name in rljax.rewards.REWARDS) that scores the held-out
        accuracy; '' scores it with the training reward. A run trained on a learned reward
        sets it to be judged on the task itself (rljax.runtime.evaluation).
    """

    name: str = "exact_match"
    weights: Mapping[str, float] = dataclasses.field(default_factory=dict, hash=False)
    timeout_s: float = 5.0
    num_workers: int = 2
    mode: str = "thread"
    on_failure: str = "zero"
    batched: bool = False
    model: RewardModelConfig = RewardModelConfig()
    judge: JudgeConfig = JudgeConfig()
    heldout: str = ""

    def __post_init__(self):
        if not isinstance(self.heldout, str):
            _fail("reward.heldout", self.heldout, "'' or a verifier from rljax.rewards.REWARDS")
        if not self.name:
            _fail("reward.name", self.name, "a reward name from rljax.rewards.REWARDS")
        _positive_float("reward.timeout_s", self.timeout_s)
        _positive("reward.num_workers", self.num_workers)
        _one_of("reward.mode", self.mode, ("thread", "process"))
        _one_of("reward.on_failure", self.on_failure, ("zero", "drop"))
        if not isinstance(self.batched, bool):
            _fail("reward.batched", self.batched, "True or False")
        self._check_weights()
        for name in self.model_rewards:
            path = getattr(self, name).path
            if not path:
                _fail(f"reward.{name}.path", path, f"a checkpoint directory (reward uses {name!r})")
        if self.model_rewards and self.mode == "process":
            raise ConfigError(
                f"config key 'reward.mode' = 'process' cannot run the {self.model_rewards[0]!r} "
                "reward: its model lives on devices this process holds; set reward.mode='thread'"
            )

    def _check_weights(self) -> None:
        weights = self.weights
        if not isinstance(weights, Mapping):
            _fail("reward.weights", weights, "a mapping {reward name: weight}")
        if (self.name == WEIGHTED_REWARD) != bool(weights):
            raise ConfigError(
                f"config key 'reward.weights' = {dict(weights)!r} goes with reward.name="
                f"'{WEIGHTED_REWARD}' (it is {self.name!r}): set both, e.g. reward.name="
                f"'{WEIGHTED_REWARD}' and reward.weights={{'exact_match': 0.5, 'model': 0.5}}, "
                "or neither"
            )
        for name, weight in weights.items():
            if not isinstance(name, str) or name == WEIGHTED_REWARD:
                _fail("reward.weights", dict(weights), "reward names other than 'weighted'")
            finite = isinstance(weight, int | float) and not isinstance(weight, bool)
            if not (finite and math.isfinite(weight)):
                _fail(f"reward.weights.{name}", weight, "a finite number")
        if weights and not any(weights.values()):
            _fail("reward.weights", dict(weights), "at least one weight that is not 0")

    @property
    def names(self) -> tuple[str, ...]:
        """The rewards this config combines: ``weights``' names, or ``name`` alone."""
        return tuple(self.weights) if self.name == WEIGHTED_REWARD else (self.name,)

    @property
    def model_rewards(self) -> tuple[str, ...]:
        """The model-based rewards ('model', 'judge') among :attr:`names`."""
        return tuple(n for n in self.names if n in MODEL_REWARDS)
