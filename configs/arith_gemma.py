"""The default recipe on a tiny Gemma-3-shaped model: SFT warm start then GRPO, CPU, minutes.

    rljax --config=configs/arith_gemma.py --workdir=/tmp/rljax/gemma               # full run
    rljax --config=configs/arith_gemma.py:small --workdir=/tmp/rljax/gemma_small   # < 1 minute

configs/arith_tiny.py's task, warm start and GRPO, on a model with Gemma 3's text architecture,
from scratch: local layers attending to a sliding window of 4 tokens (shorter than every
prompt, so they cannot see the whole problem) with their own RoPE base, then a global layer
(Gemma 3 runs five local layers to one global; three layers here keep the run to minutes),
per-head q/k norms, norms after attention and the MLP, RMSNorm's (1 + w) scale, a GeGLU MLP
and the embedding scaled by sqrt(D). Library code builds it with
``rljax.configs.arith_gemma.recipe()``.
"""

import ml_collections
from rljax.configs import arith_tiny

from rljax.config import ModelConfig, RunConfig, replace, to_config_dict

VARIANTS = ("small",)

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


def recipe(variant: str = "") -> RunConfig:
    """The typed config of a variant ('' for the full run); ``get_config`` wraps it."""
    if variant not in ("", *VARIANTS):
        raise ValueError(
            f"unknown variant {variant!r} of configs/arith_gemma.py; use one of {VARIANTS} or none"
        )
    return replace(arith_tiny.recipe(variant), model=MODEL)


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    return to_config_dict(recipe(arg or ""))
