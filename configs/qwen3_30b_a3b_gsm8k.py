"""GRPO on GSM8K from Qwen3-30B-A3B, a mixture of experts: full fine-tuning on a v5p-16
(8 chips) ``:v5p16``; LoRA on a v6e-8 host ``:v6e8_lora``.

    scripts/gcp/launch.sh ... -- rljax --config=configs/qwen3_30b_a3b_gsm8k.py:v5p16 \
      --workdir=gs://BUCKET/runs/q3_30b_a3b_gsm8k \
      --config.init=gs://BUCKET/models/Qwen3-30B-A3B \
      --config.data.path=gs://BUCKET/data/gsm8k/train.jsonl
    python scripts/plan_memory.py --config=configs/qwen3_30b_a3b_gsm8k.py:v5p16 \
      --kernel_impl=pallas --no_sampler_hoist   # fits
    python scripts/plan_memory.py --config=configs/qwen3_30b_a3b_gsm8k.py:v6e8_lora \
      --kernel_impl=pallas --no_sampler_hoist   # fits

The architecture is ``model_config('qwen3-30b-a3b')``: 48 layers, each a mixture of 128
experts of width 768 of which every token takes 8 (``norm_topk_prob``), 32 query and 4 kv
heads of 128, vocab 151936. It holds 30.5B parameters and computes with 3.35B a token
(``rljax.models.presets``): the memory below is the 30.5B's, the FLOPs the 3.35B's.

Both variants are colocated (both roles on all 8 chips, ``mode='sync'``): the model's state
does not fit half the chips of either slice. Routing replay is on (``moe.router_replay=
'rollout'``, docs/moe.md): the learner's forwards use the experts the sampler chose.
``mesh.expert_parallel=4`` x tensor=2 on both meshes puts 32 whole experts on each pair of
chips, their width split over the pair, and splits attention 2 ways over tensor and the
batch 4 ways over the expert axis (expert_parallel=8 would replicate attention and the
embeddings on every sampler chip: docs/benchmarks.md). Batch: 16 prompts x 8 = 128 sequences
a step, 32 micro-batches of 4 rows x 1280 tokens (256 + 1024), ``remat='full'``; 64 decode
slots, the sampler in bf16.

``:v5p16`` (8 v5p chips of 95 GiB): full fine-tuning, f32 weights, Adam moments, gradients and
accumulator. Planned GiB per chip: learner 14.22 + Adam 28.45 + temp 34.57 = 77.24; sampler
weights 8.20 + KV pool 0.94 + temp 2.62 + a staged update 8.20 = 19.95; both on the same
chips 86.38 of 95.

``:v6e8_lora`` (8 v6e chips of 32 GiB): r=16 adapters (alpha 32) on attention only; the routed
experts stay frozen (LoRA never adapts them, and this model has no dense MLP or shared expert
an MLP target could take: docs/lora.md). Planned: learner 14.24 (the f32 base and 0.02 of
adapters) + Adam 0.04 + temp 5.19 = 19.47; sampler 8.22 + 0.94 + 2.62 + staged adapters 0.02 =
11.79; both 28.63 of 32.

``scripts/plan_memory.py`` plans both on the CPU (XLA's memory analysis with the real
shardings; ``--kernel_impl=pallas`` and ``--no_sampler_hoist`` keep two CPU lowerings, the
experts' XLA grouped matmul (per-tile weight copies) and the hoisted bf16 upcast of every
weight, out of the plan); the
table is in docs/benchmarks.md ("Qwen3-30B-A3B memory plans").
"""

import ml_collections

from rljax.config import (
    BufferConfig,
    DataConfig,
    LearnerConfig,
    LoRAConfig,
    MeshConfig,
    MetricsConfig,
    MoEConfig,
    RewardConfig,
    RunConfig,
    SamplingConfig,
    replace,
    to_config_dict,
)
from rljax.models.families import model_config

# Variant -> (chip in rljax.sim.chips, chips); scripts/plan_memory.py plans against these.
TARGETS = {"v5p16": ("tpu-v5p", 8), "v6e8_lora": ("tpu-v6e", 8)}
VARIANTS = tuple(TARGETS)  # the first is the default
PRESET = "qwen3-30b-a3b"


def recipe(variant: str = "") -> RunConfig:
    """The typed config of a variant ('' is ``v5p16``); ``get_config`` wraps it."""
    if variant not in ("", *VARIANTS):
        raise ValueError(
            f"unknown variant {variant!r} of configs/qwen3_30b_a3b_gsm8k.py; "
            f"use one of {VARIANTS} or none"
        )
    variant = variant or VARIANTS[0]
    cfg = RunConfig(
        model=model_config(PRESET, dtype="float32", param_dtype="float32"),
        init="gs://YOUR_BUCKET/models/Qwen3-30B-A3B",  # override with --config.init
        tokenizer="init",
        sampling=SamplingConfig(
            temperature=1.0,
            max_new_tokens=1024,
            max_prefill_length=256,
            max_concurrent_decodes=64,
            page_size=16,
            dtype="bfloat16",  # weights cast at each publish; the learner keeps f32
        ),
        learner=LearnerConfig(
            loss="grpo",
            group_size=8,
            batch_groups=16,
            micro_batches=32,
            remat="full",
            learning_rate=1e-6,
            grad_clip=1.0,
        ),
        buffer=BufferConfig(max_staleness=0),
        mesh=MeshConfig(
            mode="colocated",
            expert_parallel=4,
            learner_fsdp=1,
            learner_tensor=2,
            sampler_data=1,
            sampler_tensor=2,
        ),
        data=DataConfig(
            task="gsm8k",
            path="gs://YOUR_BUCKET/data/gsm8k/train.jsonl",  # override with --config.data.path
            train_size=7_217,  # GSM8K train has 7,473 rows: the rest is held out
            heldout_size=256,
            prompt_format="chat",
            prompt_template="{question}\nPlease reason step by step, and put your final answer "
            "after '####'.",
        ),
        reward=RewardConfig(name="math_answer", num_workers=16),
        metrics=MetricsConfig(progress_bar=True, trace=True),
        mode="sync",
        num_steps=300,
        eval_every=50,
        eval_examples=256,
        moe=MoEConfig(router_replay="rollout"),
    )
    if variant == "v6e8_lora":
        cfg = replace(
            cfg,
            # Attention only: every MLP of this model is routed experts, which stay frozen.
            lora=LoRAConfig(enabled=True, rank=16, alpha=32.0, targets=("q", "k", "v", "o")),
            **{"learner.learning_rate": 1e-5},  # adapters want about 10x the full rate
        )
    return cfg


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    return to_config_dict(recipe(arg or ""))
