"""The weights an engine serves: the layout it holds them in, and the checkpoint it reads.

An engine serves its weights in one layout (``sampling.weights_layout``), chosen once when it
is built (:func:`serving_layout`) and kept for its life: a :class:`ServingLayout` turns a
params state (the learner's layout, on the sampler mesh) into the weights the engine serves,
and those into the decoder its jitted steps run. The engine's code is the same for both.

- ``stacked``: the learner's params state as it is (:data:`rljax.models.layouts.STACKED`);
  what accelerators serve.
- ``per_layer``: a :class:`rljax.models.serving.ServingDecoder`, converted from the state on
  every weight swap (:data:`rljax.models.layouts.PER_LAYER`); what CPU devices decode from
  fastest.

With LoRA adapters in the params (:mod:`rljax.models.lora`), a layout serves them merged
(folded into the weights they adapt when the weights swap; the engine then decodes a plain
model) or unmerged (the base as it is plus the low-rank product at every step), per
``lora.serving`` (:func:`lora_merged`).

When ``load_params()`` is called with no params (JetStream's server does), the engine reads its
``checkpoint``, a Hugging Face safetensors directory or a GGUF file, straight into the
sampler's shardings; it must describe the engine's own model.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, Protocol

import jax
from flax import nnx
from jax.sharding import Mesh

from rljax.config import LoRAConfig, ModelConfig
from rljax.models import lora
from rljax.models.call_paths import CallPaths
from rljax.models.serving import ServingDecoder, serving_converter
from rljax.models.sharding import ShardingRules, state_shardings, with_shardings
from rljax.models.transformer import abstract_decoder


class ServingLayout(Protocol):
    """How an engine holds the weights it serves; one implementation per weights layout."""

    name: str  # its sampling.weights_layout

    def serve(self, params: nnx.State) -> Any:
        """A params state on the sampler mesh, as the weights this layout serves."""
        ...

    def model(self, served: Any) -> CallPaths:
        """The decoder over served weights; traced inside the engine's jitted steps."""
        ...

    def abstract(self, params: nnx.State) -> Any:
        """What :meth:`serve` makes of ``params`` (arrays or abstract), as placed
        ``jax.ShapeDtypeStruct``s: nothing is computed or allocated."""
        ...


def _wrong_weights(layout: str, want: str, served: Any) -> TypeError:
    return TypeError(
        f"this engine serves weights_layout={layout!r} ({want}), got a "
        f"{type(served).__name__}; pass the params through engine.load_params(params) or "
        "engine.serving_params(params) first"
    )


class StackedServing:
    """Serves the params state as it is: the learner's stacked layout. Merged LoRA adapters
    are folded into the base weights by one compiled function at each swap."""

    name = "stacked"

    def __init__(
        self,
        model_cfg: ModelConfig,
        graphdef: nnx.GraphDef,
        mesh: Mesh,
        rules: ShardingRules,
        *,
        lora_cfg: LoRAConfig | None = None,
        merge_adapters: bool = False,
    ):
        del lora_cfg  # the graphdef holds the adapters
        self._graphdef, self._mesh, self._rules = graphdef, mesh, rules
        self._merge = None
        if merge_adapters:
            base = nnx.split(abstract_decoder(model_cfg))
            self._graphdef = base[0]
            shardings = state_shardings(base[1], mesh, rules)

            def merge(params: nnx.State) -> nnx.State:
                model = nnx.merge(graphdef, params)
                merged = lora.merged_layers(model._layers(), model.lora_scale)
                state = lora.split_adapters(params)[1]
                for name, w in merged.items():
                    state[name] = nnx.Param(w)  # replaced leaf, same path and metadata
                return state

            self._merge = jax.jit(merge, out_shardings=shardings)

    def serve(self, params: nnx.State) -> nnx.State:
        if self._merge is None or not lora.has_adapters(params):
            return params  # served already (merged states hold no adapters)
        return self._merge(params)

    def model(self, served: nnx.State) -> CallPaths:
        if not isinstance(served, nnx.State):
            raise _wrong_weights(self.name, "a params state", served)
        return nnx.merge(self._graphdef, served)

    def abstract(self, params: nnx.State) -> nnx.State:
        if self._merge is not None:
            return jax.eval_shape(self._merge, params)
        return with_shardings(params, state_shardings(params, self._mesh, self._rules))


class PerLayerServing:
    """Serves a ServingDecoder, converted from the params state by one compiled function."""

    name = "per_layer"

    def __init__(
        self,
        model_cfg: ModelConfig,
        graphdef: nnx.GraphDef,
        mesh: Mesh,
        rules: ShardingRules,
        *,
        lora_cfg: LoRAConfig | None = None,
        merge_adapters: bool = False,
    ):
        self._convert = serving_converter(
            model_cfg, graphdef, mesh, rules, lora_cfg=lora_cfg, merge_adapters=merge_adapters
        )

    def serve(self, params: nnx.State) -> ServingDecoder:
        return self._convert(params)

    def model(self, served: ServingDecoder) -> CallPaths:
        if not isinstance(served, ServingDecoder):
            raise _wrong_weights(self.name, "a ServingDecoder", served)
        return served

    def abstract(self, params: nnx.State) -> ServingDecoder:
        return jax.eval_shape(self._convert, params)


# sampling.weights_layout -> its ServingLayout ('auto' is resolved by serving_layout).
SERVING_LAYOUTS: dict[str, Callable[..., ServingLayout]] = {
    StackedServing.name: StackedServing,
    PerLayerServing.name: PerLayerServing,
}


def on_cpu(mesh: Mesh) -> bool:
    """Whether every device of ``mesh`` is a CPU."""
    return all(d.platform == "cpu" for d in mesh.devices.flat)


def lora_merged(lora_cfg: LoRAConfig | None, mesh: Mesh) -> bool:
    """Whether an engine on ``mesh`` serves ``lora_cfg``'s adapters merged.

    'auto' merges on CPU devices, where the per-layer layout rewrites every weight at each
    swap anyway (merging adds the rank-r products to that copy) and a decode step's time is
    its op count, which unmerged adapters raise by two small products per projection. On an
    accelerator the stacked layout serves the params as they are: merging would hold a second
    copy of every adapted weight beside the base, while the unmerged products read only the
    adapters' bytes (docs/lora.md has the measurements).
    """
    if lora_cfg is None or not lora_cfg.enabled:
        return False
    if lora_cfg.serving == "auto":
        return on_cpu(mesh)
    return lora_cfg.serving == "merged"


def serving_layout(
    name: str,
    model_cfg: ModelConfig,
    graphdef: nnx.GraphDef,
    mesh: Mesh,
    rules: ShardingRules,
    *,
    lora_cfg: LoRAConfig | None = None,
) -> ServingLayout:
    """The layout ``name`` (a ``sampling.weights_layout``) for an engine on ``mesh``.

    'auto' is 'per_layer' when every device of the mesh is a CPU, else 'stacked'; a
    mixture-of-experts model is served stacked (its layers differ by kind). The name is
    one of ``rljax.config.checks.WEIGHTS_LAYOUTS``, which SamplingConfig checks. ``lora_cfg``:
    the adapters ``graphdef`` holds (None or disabled: none), served as :func:`lora_merged`
    says.
    """
    if name == "auto":
        per_layer = on_cpu(mesh) and not model_cfg.num_experts
        name = PerLayerServing.name if per_layer else StackedServing.name
    if name == PerLayerServing.name and model_cfg.num_experts:
        raise ValueError(
            "sampling.weights_layout='per_layer' serves dense models only; use 'stacked' or "
            "'auto' for a mixture-of-experts model"
        )
    merge = lora_merged(lora_cfg, mesh)
    return SERVING_LAYOUTS[name](
        model_cfg, graphdef, mesh, rules, lora_cfg=lora_cfg, merge_adapters=merge
    )


def check_learner_params(params: Any) -> nnx.State:
    """``params`` if it is what ``PagedEngine.load_params`` copies, a params state in the
    learner's layout; raises for None or weights an engine already serves."""
    if params is None:
        raise ValueError(
            "load_params() needs the params to serve: pass a params state, e.g. "
            "load_params(learner.params)"
        )
    if not isinstance(params, nnx.State):
        raise ValueError(
            "load_params() takes a params state (the learner's layout), not params this "
            "engine already serves; pass those to prefill/generate as they are"
        )
    return params


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
