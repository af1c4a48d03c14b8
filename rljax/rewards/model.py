"""A scalar reward model: a sequence classifier scores prompt + completion.

:class:`RewardModel` holds a Hugging Face ``*ForSequenceClassification`` checkpoint
(:mod:`rljax.models.classifier`) on devices of its own choosing and scores token sequences in
batches: each call pads its sequences to ``batch_size`` rows of a power-of-two length and runs
one jitted forward per ``batch_size`` sequences. A sequence's score is the score head applied to
the final hidden state (after the final norm) at its last token, as transformers does (it takes
the last token that is not ``pad_token_id``: the same one unless a sequence ends in that id).

:class:`ModelReward` is the verifier the reward pool runs (``reward.name='model'``): a batched
``fn(completions, examples) -> list of floats`` that scores the prompt the policy saw
(``rljax.data.tasks.encode_prompt``: the task prompt in ``data.prompt_template``, chat-formatted
when ``data.prompt_format='chat'``) followed by the completion's tokens, both encoded by the
reward model's tokenizer (by default the policy's, ``reward.model.tokenizer``). It runs in the
pool's thread mode only: its weights live on this process's devices.

Cost: one forward pass over prompt + completion per completion (about 2 x params FLOPs per
token, no KV cache, no sampling), on ``reward.model.devices`` (by default a copy on the first
local device, which it shares with whatever role the run put there).
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from rljax import io
from rljax.config import ConfigError, DataConfig, ModelConfig, RewardModelConfig
from rljax.data.tasks import encode_prompt
from rljax.models.classifier import load_classifier, sequence_scores
from rljax.models.sharding import SAMPLER_RULES, make_mesh
from rljax.models.tokenizer import Tokenizer

MIN_LENGTH = 16  # the shortest padded length: shorter buckets would only add compilations


@dataclasses.dataclass(frozen=True)
class RewardContext:
    """What a model-based reward takes from the run.

    Attributes:
      tokenizer: the policy's tokenizer (``reward.*.tokenizer='policy'``).
      data: how the run writes its prompts (``data.prompt_template``, ``data.prompt_format``).
      max_seq_len: the policy's longest prompt + completion (``sampling.max_seq_len``).
      kernel_impl: the attention kernels ('auto', 'pallas', 'xla').
    """

    tokenizer: Tokenizer
    data: DataConfig
    max_seq_len: int
    kernel_impl: str = "auto"


def reward_tokenizer(source: str, key: str, path: str, policy: Tokenizer) -> Tokenizer:
    """The tokenizer a model-based reward reads with: ``'policy'`` (the run's), ``'checkpoint'``
    (the one in ``path``) or a tokenizer directory; one that cannot load is refused naming
    ``key``."""
    if source == "policy":
        return policy
    where = path if source == "checkpoint" else source
    with io.input_error(key, source):
        return Tokenizer.from_dir(where)


def check_vocab(tokenizer: Tokenizer, model_cfg: ModelConfig, key: str, source: str) -> None:
    """Refuses a tokenizer with ids past the model's embedding, naming the config ``key``."""
    if tokenizer.vocab_size > model_cfg.vocab_size:
        raise ConfigError(
            f"config key '{key}' = {source!r} gives a tokenizer of {tokenizer.vocab_size} ids but "
            f"the model has {model_cfg.vocab_size} embedding rows; the model must read that "
            f"tokenizer's ids: set {key} to the tokenizer it was trained with"
        )


def local_mesh(indices: Sequence[int], key: str) -> Mesh:
    """A mesh over ``jax.local_devices()[i]`` for each index, all on the 'data' axis (weights
    replicated, batches split); an index past the devices is refused naming ``key``."""
    devices = jax.local_devices()
    missing = [i for i in indices if i >= len(devices)]
    if missing:
        raise ConfigError(
            f"config key '{key}' = {tuple(indices)!r} names local device {missing[0]}, but this "
            f"process has {len(devices)} ({devices[0].platform}); use indices below "
            f"{len(devices)}"
        )
    return make_mesh([devices[i] for i in indices], {"data": len(indices), "tensor": 1})


def length_buckets(max_length: int) -> tuple[int, ...]:
    """The padded lengths: powers of two from :data:`MIN_LENGTH`, then ``max_length``."""
    out, n = [], MIN_LENGTH
    while n < max_length:
        out.append(n)
        n *= 2
    return (*out, max_length)


class RewardModel:
    """A one-label sequence classifier that scores token sequences in padded batches.

    Args:
      cfg: the decoder's config.
      graphdef, params: the decoder (``nnx.merge(graphdef, params)``), on ``mesh``.
      score_d: the score head's weight [D].
      mesh: its devices (:func:`local_mesh`); the batch is split over its 'data' axis.
      batch_size: rows of one forward pass (rounded up to a multiple of the devices).
      max_length: the longest sequence it scores, in tokens.
      pad_id: the token that pads rows (masked: any id the embedding has).
      impl: the attention kernels ('auto', 'pallas', 'xla').
    """

    def __init__(
        self,
        cfg: ModelConfig,
        graphdef: nnx.GraphDef,
        params: nnx.State,
        score_d: jax.Array,
        *,
        mesh: Mesh,
        batch_size: int,
        max_length: int,
        pad_id: int = 0,
        impl: str = "auto",
    ):
        self.cfg, self.mesh, self.max_length, self.pad_id = cfg, mesh, max_length, pad_id
        self.rows = -(-batch_size // mesh.size) * mesh.size
        self.buckets = length_buckets(max_length)
        self._params, self._score_d = params, score_d
        rows_sharding = NamedSharding(mesh, PartitionSpec("data"))
        self._rows_bt = NamedSharding(mesh, PartitionSpec("data", None))
        self._rows_b = rows_sharding

        def scores(params, score_d, tokens_bt, lengths_b):
            model = nnx.merge(graphdef, params)
            sharding = (mesh, SAMPLER_RULES)
            return sequence_scores(
                model, score_d, tokens_bt, lengths_b, impl=impl, sharding=sharding
            )

        self._scores = jax.jit(scores, out_shardings=rows_sharding)

    def bucket_for(self, length: int) -> int:
        """The padded length of a sequence of ``length`` tokens."""
        for b in self.buckets:
            if length <= b:
                return b
        raise ValueError(
            f"a sequence of {length} tokens is longer than the reward model's max_length="
            f"{self.max_length}; raise reward.model.max_length"
        )

    def warm_up(self) -> None:
        """Compiles the forward of every padded length now, so that no scoring call waits on
        a compilation (the reward pool's ``timeout_s`` bounds each call)."""
        for length in self.buckets:
            self.score_tokens([[self.pad_id] * length])

    def score_tokens(self, sequences: Sequence[Sequence[int]]) -> np.ndarray:
        """The score of each sequence (token ids, each non-empty), float32 [len(sequences)]."""
        for i, seq in enumerate(sequences):
            if not len(seq):
                raise ValueError(f"sequence {i} is empty; a reward model scores its last token")
        out = np.zeros(len(sequences), np.float32)
        for start in range(0, len(sequences), self.rows):
            chunk = sequences[start : start + self.rows]
            t = self.bucket_for(max(len(s) for s in chunk))
            tokens_bt = np.full((self.rows, t), self.pad_id, np.int32)
            lengths_b = np.ones(self.rows, np.int32)  # a padding row: one pad token
            for row, seq in enumerate(chunk):
                tokens_bt[row, : len(seq)] = seq
                lengths_b[row] = len(seq)
            scores_b = self._scores(
                self._params,
                self._score_d,
                jax.device_put(tokens_bt, self._rows_bt),
                jax.device_put(lengths_b, self._rows_b),
            )
            out[start : start + len(chunk)] = np.asarray(scores_b)[: len(chunk)]
        return out


class ModelReward:
    """The batched verifier of a :class:`RewardModel`: ``fn(completions, examples)`` scores
    ``prompt(example) + tokenizer.encode(completion)`` for each pair.

    Args:
      model: the reward model.
      tokenizer: encodes completions (``rljax.models.tokenizer.Tokenizer``).
      prompt: an example's prompt tokens, as the reward model's tokenizer writes them.
    """

    def __init__(self, model: RewardModel, tokenizer: Any, prompt: Callable[[dict], list[int]]):
        self.model, self.tokenizer, self.prompt = model, tokenizer, prompt
        self._lock = threading.Lock()  # one forward at a time on its devices

    def sequence(self, completion: str, example: dict) -> list[int]:
        """The tokens scored for ``completion``; raises when they cannot be written or are
        longer than the model's ``max_length``."""
        tokens = self.prompt(example) + self.tokenizer.encode(completion, add_bos=False)
        self.model.bucket_for(len(tokens))
        return tokens

    def __call__(self, completions: Sequence[str], examples: Sequence[dict]) -> list[Any]:
        """Each completion's score, or (in its place) why it could not be scored: the pool
        counts that completion alone as ``raised``."""
        out: list[Any] = []
        for completion, example in zip(completions, examples, strict=True):
            try:
                out.append(self.sequence(completion, example))
            except (ValueError, KeyError, TypeError) as e:
                out.append(e)
        scored = [i for i, x in enumerate(out) if not isinstance(x, Exception)]
        with self._lock:
            scores = self.model.score_tokens([out[i] for i in scored])
        for i, score in zip(scored, scores.tolist(), strict=True):
            out[i] = score
        return out

    def __reduce__(self):
        raise TypeError(
            "the 'model' reward holds a jitted model on this process's devices and runs in the "
            "reward pool's thread mode only: set reward.mode='thread'"
        )


def build_model_reward(cfg: RewardModelConfig, context: RewardContext) -> ModelReward:
    """The 'model' reward of ``reward.model``, loaded onto its devices and compiled."""
    mesh = local_mesh(cfg.devices, "reward.model.devices")
    with io.input_error("reward.model.path", cfg.path):
        model_cfg, graphdef, params, score_d = load_classifier(
            cfg.path, mesh=mesh, rules=SAMPLER_RULES
        )
    tokenizer = reward_tokenizer(
        cfg.tokenizer, "reward.model.tokenizer", cfg.path, context.tokenizer
    )
    check_vocab(tokenizer, model_cfg, "reward.model.tokenizer", cfg.tokenizer)
    model = RewardModel(
        model_cfg,
        graphdef,
        params,
        score_d,
        mesh=mesh,
        batch_size=cfg.batch_size,
        max_length=cfg.max_length or context.max_seq_len,
        pad_id=tokenizer.pad_id,
        impl=context.kernel_impl,
    )
    model.warm_up()
    data = context.data
    return ModelReward(model, tokenizer, lambda example: encode_prompt(tokenizer, data, example))
