"""The default recipe on a tiny Gemma-3-shaped model: SFT warm start then GRPO, CPU, minutes.

    rljax --config=configs/arith_gemma.py --workdir=/tmp/rljax/gemma               # full run
    rljax --config=configs/arith_gemma.py:small --workdir=/tmp/rljax/gemma_small   # < 1 minute
    rljax --config=configs/arith_gemma.py:gemma4_moe --workdir=/tmp/rljax/gemma4_moe

configs/arith_tiny.py's task, warm start and GRPO, on a model with Gemma 3's text architecture,
from scratch: local layers attending to a sliding window of 4 tokens (shorter than every
prompt, so they cannot see the whole problem) with their own RoPE base, then a global layer
(Gemma 3 runs five local layers to one global; three layers here keep the run to minutes),
per-head q/k norms, norms after attention and the MLP, RMSNorm's (1 + w) scale, a GeGLU MLP
and the embedding scaled by sqrt(D). Library code builds it with
``rljax.configs.arith_gemma.recipe()``.

``:gemma4_moe`` is the same run on a Gemma-4-shaped mixture of experts (:data:`GEMMA4_MOE`):
Gemma 4's attention (value norm, a scale of 1, a quarter of each global head rotated, layer
scalars, norms scaled by w) and its mixture-of-experts block on every layer, 8 experts of which
each token takes 2 beside a dense MLP half the width of the one above, with rollout routing
replay (``moe.router_replay='rollout'``, docs/moe.md) and the load-balancing loss of
configs/arith_moe.py.
"""

import ml_collections
from rljax.configs import arith_tiny

from rljax.config import ModelConfig, RunConfig, replace, to_config_dict

VARIANTS = ("small", "gemma4_moe")

MODEL = ModelConfig(
    family="gemma3",
    vocab_size=18,  # the char tokenizer
    hidden_size=128,
    intermediate_size=384,
    num_layers=3,
    num_heads=8,
    num_kv_heads=4,
    head_dim=16,
    max_position_embeddings=64,
    layer_types=("sliding_attention", "sliding_attention", "full_attention"),
    sliding_window=4,
    rope_theta=1_000_000.0,
    rope_local_base_freq=10_000.0,
    query_pre_attn_scalar=16,
    qk_norm=True,
    hidden_act="gelu_pytorch_tanh",
    post_norms=True,
    norm_unit_offset=True,
    scale_embeddings=True,
    tie_embeddings=True,
)


GEMMA4_MOE = replace(
    MODEL,
    family="gemma4",
    intermediate_size=192,
    norm_unit_offset=False,
    v_norm=True,
    layer_scalar=True,
    query_pre_attn_scalar=1.0,
    partial_rotary_factor=0.25,
    enable_moe_block=True,
    num_experts=8,
    num_experts_per_tok=2,
    moe_intermediate_size=96,
    norm_topk_prob=True,
    router_aux_loss_coef=0.01,
)


def recipe(variant: str = "") -> RunConfig:
    """The typed config of a variant ('' for the full run); ``get_config`` wraps it."""
    if variant not in ("", *VARIANTS):
        raise ValueError(
            f"unknown variant {variant!r} of configs/arith_gemma.py; use one of {VARIANTS} or none"
        )
    if variant == "gemma4_moe":
        cfg = replace(arith_tiny.recipe(), model=GEMMA4_MOE)
        return replace(cfg, **{"moe.router_replay": "rollout"})
    return replace(arith_tiny.recipe(variant), model=MODEL)


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    return to_config_dict(recipe(arg or ""))
