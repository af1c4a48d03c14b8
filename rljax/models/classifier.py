"""Hugging Face ``*ForSequenceClassification`` checkpoints: the decoder plus a score head.

transformers' sequence classifiers (``LlamaForSequenceClassification``,
``Qwen2ForSequenceClassification``, ...) hold the causal LM's decoder under ``model.`` and a
bias-free ``score`` Linear [num_labels, hidden] in place of the LM head. Their logits are the
score head applied to the final hidden states (after the final norm); the sequence's logit is
the one at its last non-pad token. A reward model is such a classifier with ``num_labels = 1``.

The decoder is read by the causal LM's loader (:func:`rljax.models.hf.load_params`, the same
layout map); ``score.weight`` is read here. The decoder is built with tied embeddings, so it
holds no LM head (a classifier has none; its output projection is never used).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from rljax import io
from rljax.config import ModelConfig
from rljax.models import hf
from rljax.models.call_paths import Sharding
from rljax.models.families import ARCHITECTURES, config_from_hf, config_to_hf
from rljax.models.sharding import ShardingRules
from rljax.models.transformer import Decoder

SCORE = "score.weight"
_SUFFIX = "ForSequenceClassification"
# sequence-classifier architecture -> the causal LM whose decoder it holds
CLASSIFIERS: dict[str, str] = {
    arch.removesuffix("ForCausalLM") + _SUFFIX: arch for arch in ARCHITECTURES
}
_CAUSAL = {causal: cls for cls, causal in CLASSIFIERS.items()}


def num_labels(config_json: Mapping[str, Any]) -> int:
    """The classifier's outputs as transformers counts them: ``num_labels``, else the size of
    ``id2label``, else transformers' default, 2."""
    if "num_labels" in config_json:
        return int(config_json["num_labels"])
    return len(config_json.get("id2label") or {0: "LABEL_0", 1: "LABEL_1"})


def classifier_config(config_json: Mapping[str, Any], *, source: str, dtype: str | None = None):
    """The decoder's :class:`ModelConfig` of a one-label sequence classifier's ``config.json``;
    raises a one-line ValueError for any other checkpoint."""
    archs = config_json.get("architectures") or []
    arch = archs[0] if archs else None
    if arch not in CLASSIFIERS:
        raise ValueError(
            f"{source}: architecture {arch} is not a sequence classifier; a reward model is a "
            f"Hugging Face *{_SUFFIX} checkpoint with num_labels=1 (one of "
            f"{', '.join(CLASSIFIERS)}): train or convert one (scripts/train_rm.py writes one)"
        )
    labels = num_labels(config_json)
    if labels != 1:
        raise ValueError(
            f"{source}: {arch} has num_labels={labels}; a reward model gives one score per "
            "sequence: use a checkpoint trained with num_labels=1"
        )
    causal = {**config_json, "architectures": [CLASSIFIERS[arch]]}
    overrides: dict[str, Any] = {"tie_embeddings": True}
    if dtype is not None:
        overrides.update(dtype=dtype, param_dtype=dtype)
    return config_from_hf(causal, source=source, **overrides)


def sequence_scores(
    model: Decoder,
    score_d: jax.Array,
    tokens_bt: jax.Array,
    lengths_b: jax.Array,
    *,
    impl: str = "auto",
    sharding: Sharding | None = None,
) -> jax.Array:
    """The classifier's score [B] (float32) of each row's first ``lengths_b`` tokens (right
    padding after them is masked): the score head ``score_d`` [D] applied to the final hidden
    state at the row's last token. A row of length 0 is scored at its first token."""
    t = tokens_bt.shape[1]
    positions_bt = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), tokens_bt.shape)
    segment_ids_bt = (positions_bt < lengths_b[:, None]).astype(jnp.int32)
    hidden_btd = model(tokens_bt, positions_bt, segment_ids_bt, impl=impl, sharding=sharding)
    last_b = jnp.maximum(lengths_b - 1, 0)
    last_bd = jnp.take_along_axis(hidden_btd, last_b[:, None, None], axis=1)[:, 0]
    return jnp.einsum("BD,D->B", last_bd.astype(jnp.float32), score_d.astype(jnp.float32))


def load_classifier(
    path: str | os.PathLike, *, mesh: Mesh, rules: ShardingRules, dtype: str | None = None
) -> tuple[ModelConfig, nnx.GraphDef, nnx.State, jax.Array]:
    """Loads a one-label ``*ForSequenceClassification`` directory onto ``mesh``.

    Returns ``(cfg, graphdef, params, score_d)``: the decoder as :func:`rljax.models.hf.load_hf`
    gives it (``nnx.merge(graphdef, params)``; no LM head) and the score head's weight [D],
    replicated on ``mesh``, in float32.
    """
    source = str(io.join(path, hf.CONFIG_FILE))
    cfg = classifier_config(hf.read_config(path), source=source, dtype=dtype)
    reader = hf.SafetensorsReader(path)
    hf.check_tensors(reader, cfg, source)
    shape = reader.shape(SCORE)
    if shape != (1, cfg.hidden_size):
        found = "is missing" if shape is None else f"has shape {list(shape)}"
        raise ValueError(
            f"{reader.where(SCORE)}: tensor {SCORE} {found} (expected [1, {cfg.hidden_size}] "
            f"from {source}); the checkpoint does not match its config: re-download or re-save it"
        )
    graphdef, params = hf.load_params(reader, cfg, mesh=mesh, rules=rules)
    score = reader.read(SCORE, (slice(0, 1), slice(0, cfg.hidden_size)))[0]
    replicated = NamedSharding(mesh, PartitionSpec())
    return cfg, graphdef, params, jax.device_put(score.astype(np.float32), replicated)


def save_classifier(
    path: str | os.PathLike,
    cfg: ModelConfig,
    params: nnx.State | Mapping[str, Any],
    score_d: Any,
    *,
    pad_token_id: int,
) -> None:
    """Writes a directory ``transformers.AutoModelForSequenceClassification`` loads (and
    :func:`load_classifier`): the decoder of ``params`` (its LM head, if any, left out) and
    ``score_d`` [D] as ``score.weight`` [1, D], with ``num_labels = 1``."""
    tensors = {
        name: np.ascontiguousarray(array)
        for name, array in hf.hf_tensors(cfg, params)
        if name != "lm_head.weight"
    }
    tensors[SCORE] = np.asarray(jax.device_get(score_d), tensors["model.norm.weight"].dtype)[None]
    io.makedirs(path)
    hf.save_safetensors(tensors, io.join(path, hf.WEIGHTS_FILE), {"format": "pt"})
    config = config_to_hf(cfg)
    config.update(
        architectures=[_CAUSAL[config["architectures"][0]]],
        id2label={"0": "LABEL_0"},
        label2id={"LABEL_0": 0},
        pad_token_id=pad_token_id,
        tie_word_embeddings=False,
    )
    io.write_text(io.join(path, hf.CONFIG_FILE), json.dumps(config, indent=2))
