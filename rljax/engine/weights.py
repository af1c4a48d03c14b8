"""Weights an engine serves: their layout, and what ``load_params()`` reads when given none.

The engine's ``checkpoint`` (what JetStream's server loads) is a Hugging Face safetensors
directory or a GGUF file; it is read straight into the sampler's shardings, and must describe
the engine's own model.
"""

from __future__ import annotations

import dataclasses

from flax import nnx
from jax.sharding import Mesh

from rljax.config import ModelConfig
from rljax.models.sharding import ShardingRules


def resolve_layer_layout(layout: str, mesh: Mesh) -> str:
    """``sampling.layer_layout`` for ``mesh``: 'auto' is 'per_layer' on CPU devices, where XLA
    copies each weight it slices out of a stacked array before the matmul (a decode step on a
    135M model spent a quarter of its time on those copies), and 'stacked' elsewhere, where the
    layer scan keeps one compiled block however deep the model is."""
    if layout != "auto":
        return layout
    return "per_layer" if all(d.platform == "cpu" for d in mesh.devices.flat) else "stacked"


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
