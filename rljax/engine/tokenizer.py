"""The engine's tokenizer in JetStream's ``tokenizer_api`` shape.

JetStream's orchestrator asks the engine for tokenizer metadata (``get_tokenizer``) and then
for a tokenizer built from it (``build_tokenizer``); it calls ``encode(text, is_bos=...,
max_prefill_length=..., jax_padding=...)`` to get a padded prompt and its true length, and
``decode([id])`` plus ``stop_tokens`` to stream text. :class:`EngineTokenizer` gives rljax's
:class:`~rljax.models.tokenizer.Tokenizer` that surface, padding to the engine's buckets.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from rljax import io
from rljax.models.tokenizer import TOKENIZER_FILE, Tokenizer

if TYPE_CHECKING:
    import jax


@dataclasses.dataclass(frozen=True)
class TokenizerParameters:
    """What ``Engine.get_tokenizer`` returns: the fields of JetStream's proto of that name.

    ``path`` is a Hugging Face tokenizer directory or a ``.gguf`` file.
    """

    path: str
    extra_ids: int = 0


def load_tokenizer(path: str) -> Tokenizer:
    """rljax's Tokenizer from ``path``; a missing file is one FileNotFoundError naming it."""
    if path.endswith(".gguf"):
        if not io.is_file(path):
            raise FileNotFoundError(
                f"tokenizer file {path} does not exist; give Engine(tokenizer=...) an existing "
                ".gguf file or Hugging Face tokenizer directory"
            )
        return Tokenizer.from_gguf(path)
    if not io.is_file(io.join(path, TOKENIZER_FILE)):
        raise FileNotFoundError(
            f"tokenizer directory {path} has no {TOKENIZER_FILE}; give Engine(tokenizer=...) a "
            "Hugging Face tokenizer directory (tokenizer.json + tokenizer_config.json) or a .gguf"
        )
    return Tokenizer.from_dir(path)


class EngineTokenizer:
    """JetStream's ``tokenizer_api.Tokenizer`` over rljax's Tokenizer.

    ``encode`` pads to the smallest of ``buckets`` that holds the prompt. A tokenizer with no
    BOS token reports ``eos_id`` as ``bos_id`` (GPT-2 style), since JetStream reads it always.
    """

    def __init__(self, tokenizer: Tokenizer, buckets: Sequence[int]):
        self.tokenizer = tokenizer
        self.buckets = tuple(sorted(buckets))

    @property
    def pad_id(self) -> int:
        return self.tokenizer.pad_id

    @property
    def eos_id(self) -> int:
        return self.tokenizer.eos_id

    @property
    def bos_id(self) -> int:
        bos = self.tokenizer.bos_id
        return self.tokenizer.eos_id if bos is None else bos

    @property
    def stop_tokens(self) -> set[int]:
        return {*self.tokenizer.stop_ids, self.pad_id}

    def encode(
        self,
        s: str,
        *,
        is_bos: bool = True,
        prefill_lengths: Sequence[int] | None = None,
        max_prefill_length: int | None = None,
        jax_padding: bool = True,
        **kwargs: Any,
    ) -> tuple[np.ndarray | jax.Array, int]:
        """``(padded ids, true length)``: ``s``'s ids, BOS first when ``is_bos``, padded."""
        del kwargs  # JetStream passes tokenizer-specific options; none apply here
        ids = self.tokenizer.encode(s)
        if is_bos:
            ids = [self.bos_id, *ids]
        buckets = tuple(sorted(prefill_lengths or self.buckets))
        if max_prefill_length is not None:
            buckets = tuple(b for b in buckets if b < max_prefill_length) + (max_prefill_length,)
        fit = [b for b in buckets if b >= len(ids)]
        if not fit:
            raise ValueError(
                f"prompt of {len(ids)} tokens is longer than the largest prefill bucket "
                f"{buckets[-1]}; shorten it or raise sampling.max_prefill_length"
            )
        padded = np.full(fit[0], self.pad_id, np.int32)
        padded[: len(ids)] = ids
        if jax_padding:
            import jax.numpy as jnp

            return jnp.asarray(padded), len(ids)
        return padded, len(ids)

    def decode(self, token_ids: Sequence[int], **kwargs: Any) -> str:
        """The text of ``token_ids`` (special tokens dropped)."""
        del kwargs  # e.g. is_streaming: every id here decodes on its own
        return self.tokenizer.decode([int(t) for t in np.asarray(token_ids).reshape(-1)])
