"""Weights an engine serves when ``load_params()`` is called with none (JetStream's server does).

The engine's ``checkpoint`` is a Hugging Face safetensors directory or a GGUF file; it is read
straight into the sampler's shardings, and must describe the engine's own model.
"""

from __future__ import annotations

import dataclasses

from flax import nnx
from jax.sharding import Mesh

from rljax.config import ModelConfig
from rljax.models.sharding import ShardingRules


def load_checkpoint(
    path: str, model_cfg: ModelConfig, mesh: Mesh, rules: ShardingRules
) -> nnx.State:
    """The params in ``path``, sharded on ``mesh`` by ``rules``, in ``model_cfg.dtype``.

    Raises one-line errors: FileNotFoundError / ValueError from the loaders (they name the
    file), and ValueError naming the fields where the checkpoint's model differs.
    """
    if path.endswith(".gguf"):
        from rljax.models.gguf import load_gguf

        cfg, _, params = load_gguf(path, mesh=mesh, rules=rules, dtype=model_cfg.dtype)
    else:
        from rljax.models.hf import load_hf

        cfg, _, params = load_hf(path, mesh=mesh, rules=rules, dtype=model_cfg.dtype)
    ours, theirs = dataclasses.asdict(model_cfg), dataclasses.asdict(cfg)
    differ = {k: (theirs[k], ours[k]) for k in ours if theirs.get(k) != ours[k]}
    if differ:
        fields = ", ".join(f"{k}={a!r} (engine: {b!r})" for k, (a, b) in differ.items())
        raise ValueError(
            f"checkpoint {path} is another model: {fields}; build the Engine from its config"
        )
    return params
