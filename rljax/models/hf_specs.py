"""Where each ``Decoder`` parameter lives in a Hugging Face checkpoint (the layout map).

A :class:`TensorSpec` says which Hugging Face tensor holds one rljax parameter, how that
tensor's dimensions split into a *view* (``q_proj.weight`` [N*H, D] is the view [N, H, D]) and
how the view's axes are ordered in rljax (``wq`` [D, N, H] is view axes (2, 0, 1)). A stacked
parameter's leading axes enumerate Hugging Face tensors: ``wq`` [L, D, N, H] holds
``model.layers.{i}.self_attn.q_proj.weight`` for every layer i, and a routed expert's
``we_gate`` [Lm, E, D, Fe] holds ``model.layers.{i}.mlp.experts.{e}.gate_proj.weight`` for every
mixture-of-experts layer i and expert e. The same map drives import, export and the GGUF
loader.

Mixture-of-experts checkpoints (Qwen3-MoE, Qwen2-MoE) are read and written in the layout the
Hub holds and transformers' ``save_pretrained`` writes (its default ``save_original_format``):
one tensor per expert and matrix, as listed in :data:`MOE_TENSOR_SPECS`. transformers 5 fuses
them into ``mlp.experts.gate_up_proj`` [E, 2*Fe, D] and ``mlp.experts.down_proj`` [E, D, Fe]
in memory only (its conversion mapping ``qwen2_moe``, which ``qwen3_moe`` shares); a file saved
fused (``save_original_format=False``) is read through :class:`rljax.models.hf_fused.FusedExperts`.
Dense MLP weights stack over the dense layers only, the expert weights over the
mixture-of-experts layers only (:func:`rljax.models.moe.dense_layers`, ``moe_layers``).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Callable, Iterator, Sequence

from rljax.config import ModelConfig
from rljax.models.moe import dense_layers, moe_layers

# The indices one stacked axis runs over (layers, or experts), from the config.
Indices = Callable[[ModelConfig], Sequence[int]]
# hf_name's placeholders, one per stacked axis, outermost first.
PLACEHOLDERS = ("i", "e")
_LAYER = "model.layers.{i}."
_EXPERT = _LAYER + "mlp.experts.{e}."


def all_layers(cfg: ModelConfig) -> Sequence[int]:
    """Every decoder layer."""
    return range(cfg.num_layers)


def experts(cfg: ModelConfig) -> Sequence[int]:
    """Every routed expert of a mixture-of-experts layer."""
    return range(cfg.num_experts)


@dataclasses.dataclass(frozen=True)
class TensorSpec:
    """Where one Decoder parameter lives in a Hugging Face checkpoint.

    ``hf_name`` has a placeholder (``{i}``, then ``{e}``) per entry of ``stack``: the rljax
    parameter's leading axes, each running over the indices ``stack[a](cfg)`` gives (the layers
    it stacks, then the experts). ``groups(cfg)`` gives, per Hugging Face dimension, the view
    sizes it splits into (outermost first; ``()`` for a dimension of size 1 that rljax drops);
    ``perm`` orders the view axes as the rljax parameter's (per-tensor) axes.
    """

    hf_name: str
    groups: Callable[[ModelConfig], tuple[tuple[int, ...], ...]]
    perm: tuple[int, ...]
    stack: tuple[Indices, ...] = ()

    def hf_shape(self, cfg: ModelConfig) -> tuple[int, ...]:
        """The Hugging Face tensor's shape."""
        return tuple(math.prod(g) for g in self.groups(cfg))

    def stacked(self, cfg: ModelConfig) -> tuple[tuple[int, ...], ...]:
        """The indices each leading (stacked) axis of the rljax parameter runs over."""
        return tuple(tuple(indices(cfg)) for indices in self.stack)

    def name(self, *index: int) -> str:
        """The Hugging Face tensor at ``index`` (a layer, then an expert, as ``stack`` has)."""
        return self.hf_name.format(**dict(zip(PLACEHOLDERS, index)))

    def tensors(self, cfg: ModelConfig) -> Iterator[tuple[tuple[int, ...], str]]:
        """Every ``(index, Hugging Face name)`` the parameter holds, in stacking order."""
        for index in itertools.product(*self.stacked(cfg)):
            yield index, self.name(*index)


def _qkv(heads: Callable[[ModelConfig], int]):
    return lambda c: ((heads(c), c.head_dim), (c.hidden_size,))


def _linear(out: Callable[[ModelConfig], int], in_: Callable[[ModelConfig], int]):
    """A Linear weight W [out, in], held as W.T [in, out] in rljax."""
    return lambda c: ((out(c),), (in_(c),))


_N = lambda c: c.num_heads  # noqa: E731
_K = lambda c: c.num_kv_heads  # noqa: E731
_D = lambda c: c.hidden_size  # noqa: E731
_F = lambda c: c.intermediate_size  # noqa: E731
_FE = lambda c: c.moe_intermediate_size  # noqa: E731
_FS = lambda c: c.shared_expert_intermediate_size  # noqa: E731
_E = lambda c: c.num_experts  # noqa: E731
_NORM = lambda c: ((c.hidden_size,),)  # noqa: E731
_LAYERS = (all_layers,)
_DENSE = (dense_layers,)
_MOE = (moe_layers,)
_MOE_EXPERTS = (moe_layers, experts)

DENSE_TENSOR_SPECS: dict[str, TensorSpec] = {
    "embed": TensorSpec("model.embed_tokens.weight", _linear(lambda c: c.vocab_size, _D), (0, 1)),
    "lm_head": TensorSpec("lm_head.weight", _linear(lambda c: c.vocab_size, _D), (1, 0)),
    "final_norm": TensorSpec("model.norm.weight", _NORM, (0,)),
    "attn_norm": TensorSpec(_LAYER + "input_layernorm.weight", _NORM, (0,), _LAYERS),
    "mlp_norm": TensorSpec(_LAYER + "post_attention_layernorm.weight", _NORM, (0,), _LAYERS),
    "wq": TensorSpec(_LAYER + "self_attn.q_proj.weight", _qkv(_N), (2, 0, 1), _LAYERS),
    "wk": TensorSpec(_LAYER + "self_attn.k_proj.weight", _qkv(_K), (2, 0, 1), _LAYERS),
    "wv": TensorSpec(_LAYER + "self_attn.v_proj.weight", _qkv(_K), (2, 0, 1), _LAYERS),
    "wo": TensorSpec(
        _LAYER + "self_attn.o_proj.weight",
        lambda c: ((c.hidden_size,), (c.num_heads, c.head_dim)),
        (1, 2, 0),
        _LAYERS,
    ),
    "bq": TensorSpec(
        _LAYER + "self_attn.q_proj.bias",
        lambda c: ((c.num_heads, c.head_dim),),
        (0, 1),
        _LAYERS,
    ),
    "bk": TensorSpec(
        _LAYER + "self_attn.k_proj.bias",
        lambda c: ((c.num_kv_heads, c.head_dim),),
        (0, 1),
        _LAYERS,
    ),
    "bv": TensorSpec(
        _LAYER + "self_attn.v_proj.bias",
        lambda c: ((c.num_kv_heads, c.head_dim),),
        (0, 1),
        _LAYERS,
    ),
    "q_norm": TensorSpec(
        _LAYER + "self_attn.q_norm.weight", lambda c: ((c.head_dim,),), (0,), _LAYERS
    ),
    "k_norm": TensorSpec(
        _LAYER + "self_attn.k_norm.weight", lambda c: ((c.head_dim,),), (0,), _LAYERS
    ),
    # Gemma 4's per-layer output scalar: a [1] buffer in transformers, one entry per layer here.
    "layer_scalar": TensorSpec(_LAYER + "layer_scalar", lambda c: ((),), (), _LAYERS),
    # A mixture-of-experts model keeps these on its dense layers only.
    "w_gate": TensorSpec(_LAYER + "mlp.gate_proj.weight", _linear(_F, _D), (1, 0), _DENSE),
    "w_up": TensorSpec(_LAYER + "mlp.up_proj.weight", _linear(_F, _D), (1, 0), _DENSE),
    "w_down": TensorSpec(_LAYER + "mlp.down_proj.weight", _linear(_D, _F), (1, 0), _DENSE),
}

MOE_TENSOR_SPECS: dict[str, TensorSpec] = {
    # The router: Qwen*MoeTopKRouter.weight [E, D].
    "router": TensorSpec(_LAYER + "mlp.gate.weight", _linear(_E, _D), (1, 0), _MOE),
    "we_gate": TensorSpec(_EXPERT + "gate_proj.weight", _linear(_FE, _D), (1, 0), _MOE_EXPERTS),
    "we_up": TensorSpec(_EXPERT + "up_proj.weight", _linear(_FE, _D), (1, 0), _MOE_EXPERTS),
    "we_down": TensorSpec(_EXPERT + "down_proj.weight", _linear(_D, _FE), (1, 0), _MOE_EXPERTS),
    # Qwen2-MoE's shared expert, and its sigmoid gate: a Linear(D, 1), weight [1, D].
    "ws_gate": TensorSpec(
        _LAYER + "mlp.shared_expert.gate_proj.weight", _linear(_FS, _D), (1, 0), _MOE
    ),
    "ws_up": TensorSpec(
        _LAYER + "mlp.shared_expert.up_proj.weight", _linear(_FS, _D), (1, 0), _MOE
    ),
    "ws_down": TensorSpec(
        _LAYER + "mlp.shared_expert.down_proj.weight", _linear(_D, _FS), (1, 0), _MOE
    ),
    "ws_router": TensorSpec(
        _LAYER + "mlp.shared_expert_gate.weight", lambda c: ((), (c.hidden_size,)), (0,), _MOE
    ),
}

TENSOR_SPECS: dict[str, TensorSpec] = {**DENSE_TENSOR_SPECS, **MOE_TENSOR_SPECS}

# Gemma's sandwich norms (``post_norms``): its ``post_attention_layernorm`` follows attention,
# and the MLP's input norm is ``pre_feedforward_layernorm``.
POST_NORM_TENSOR_SPECS: dict[str, TensorSpec] = {
    "mlp_norm": TensorSpec(_LAYER + "pre_feedforward_layernorm.weight", _NORM, (0,), _LAYERS),
    "attn_post_norm": TensorSpec(_LAYER + "post_attention_layernorm.weight", _NORM, (0,), _LAYERS),
    "mlp_post_norm": TensorSpec(_LAYER + "post_feedforward_layernorm.weight", _NORM, (0,), _LAYERS),
}


_GEMMA4_EXPERT = _LAYER + "experts.{e}."

# Gemma 4's mixture-of-experts block (``enable_moe_block``), on every layer beside the dense MLP:
# its router (``router.proj``, ``router.scale``, ``router.per_expert_scale``), the three norms it
# adds, and the experts, which transformers holds fused (``experts.gate_up_proj`` [E, 2*Fe, D],
# ``experts.down_proj`` [E, D, Fe]); read through rljax.models.hf_fused.FusedExperts under these
# per-expert names and written fused (hf_fused.fused_tensors).
GEMMA4_MOE_TENSOR_SPECS: dict[str, TensorSpec] = {
    "router": TensorSpec(_LAYER + "router.proj.weight", _linear(_E, _D), (1, 0), _MOE),
    "router_scale": TensorSpec(_LAYER + "router.scale", _NORM, (0,), _MOE),
    "expert_scale": TensorSpec(
        _LAYER + "router.per_expert_scale", lambda c: ((c.num_experts,),), (0,), _MOE
    ),
    "we_gate": TensorSpec(
        _GEMMA4_EXPERT + "gate_proj.weight", _linear(_FE, _D), (1, 0), _MOE_EXPERTS
    ),
    "we_up": TensorSpec(_GEMMA4_EXPERT + "up_proj.weight", _linear(_FE, _D), (1, 0), _MOE_EXPERTS),
    "we_down": TensorSpec(
        _GEMMA4_EXPERT + "down_proj.weight", _linear(_D, _FE), (1, 0), _MOE_EXPERTS
    ),
    "dense_post_norm": TensorSpec(
        _LAYER + "post_feedforward_layernorm_1.weight", _NORM, (0,), _MOE
    ),
    "moe_norm": TensorSpec(_LAYER + "pre_feedforward_layernorm_2.weight", _NORM, (0,), _MOE),
    "moe_post_norm": TensorSpec(_LAYER + "post_feedforward_layernorm_2.weight", _NORM, (0,), _MOE),
}


def tensor_specs(cfg: ModelConfig) -> dict[str, TensorSpec]:
    """The layout map of ``cfg``'s architecture: :data:`TENSOR_SPECS`, with Gemma's norm names
    under ``post_norms`` and Gemma 4's block's tensors under ``enable_moe_block``."""
    specs = {**TENSOR_SPECS, **POST_NORM_TENSOR_SPECS} if cfg.post_norms else TENSOR_SPECS
    return {**specs, **GEMMA4_MOE_TENSOR_SPECS} if cfg.enable_moe_block else specs


def describe(spec: TensorSpec, index: tuple[int, ...], cfg: ModelConfig) -> str:
    """What the tensor at ``index`` is, for error messages: '' for a non-expert tensor,
    ' (expert 3 of 8 in layer 1)' for a routed expert's."""
    if len(index) < 2:
        return ""
    return f" (expert {index[1]} of {cfg.num_experts} in layer {index[0]})"
