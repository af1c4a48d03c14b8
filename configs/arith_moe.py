"""The default recipe on a tiny mixture of experts: SFT warm start then GRPO, CPU, minutes.

    rljax --config=configs/arith_moe.py --workdir=/tmp/rljax/moe              # sync, replay on
    rljax --config=configs/arith_moe.py:eta2 --workdir=/tmp/rljax/moe_eta2    # async, eta = 2
    rljax --config=configs/arith_moe.py:off --workdir=/tmp/rljax/moe_off      # replay off
    rljax --config=configs/arith_moe.py:small --workdir=/tmp/rljax/moe_small  # < 1 minute

configs/arith_tiny.py's task, warm start and GRPO, on a Qwen3-MoE-style model from scratch:
2 layers, each a mixture of 8 experts of which every token takes 2 (``norm_topk_prob``), with
per-head q/k norms. Each expert is a quarter of the dense recipe's MLP width, so a token's
active MLP is half of it. The sampler records each model token's experts and the learner replays
them (``moe.router_replay='rollout'``, docs/moe.md); the router's load-balancing loss keeps the
experts in use. ``:eta2`` is the async run on configs/arith_async.py's 6/2 split of 8 CPU
devices (JAX_NUM_CPU_DEVICES=8); ``:off`` turns replay off. Library code builds it with
``rljax.configs.arith_moe.recipe()``.
"""

import ml_collections
from rljax.configs import arith_tiny

from rljax.config import ModelConfig, RunConfig, replace, to_config_dict

VARIANTS = ("sync", "eta2", "off", "small")

MODEL = ModelConfig(
    family="qwen3_moe",
    vocab_size=18,  # the char tokenizer
    hidden_size=128,
    intermediate_size=384,  # unused: every layer is a mixture of experts
    num_layers=2,
    num_heads=8,
    num_kv_heads=4,
    head_dim=16,
    qk_norm=True,
    max_position_embeddings=64,
    num_experts=8,
    num_experts_per_tok=2,
    moe_intermediate_size=96,
    norm_topk_prob=True,
    router_aux_loss_coef=0.01,
)


def recipe(variant: str = "") -> RunConfig:
    """The typed config of a variant ('' is ``sync``); ``get_config`` wraps it."""
    if variant not in ("", *VARIANTS):
        raise ValueError(
            f"unknown variant {variant!r} of configs/arith_moe.py; use one of {VARIANTS} or none"
        )
    cfg = replace(
        arith_tiny.recipe("small" if variant == "small" else ""),
        model=MODEL,
        **{"moe.router_replay": "off" if variant == "off" else "rollout"},
    )
    if variant == "eta2":
        cfg = replace(
            cfg,
            **{
                "mesh.mode": "split",
                "mesh.sampler_devices": 6,
                "mesh.learner_devices": 2,
                "mode": "async",
                "buffer.max_staleness": 2,
                "learner.loss": "decoupled_ppo",
            },
        )
    return cfg


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    return to_config_dict(recipe(arg or ""))
