"""GRPO on GSM8K from Qwen2.5-1.5B-Instruct, one TPU host: ``:v5e8`` (default) or ``:v6e8``;
two v5e-8 slices (multislice): ``:v5e8x2``.

    rljax --config=configs/qwen2_5_1_5b_gsm8k.py:v5e8 --workdir=gs://BUCKET/runs/q15_gsm8k \
      --config.init=gs://BUCKET/models/Qwen2.5-1.5B-Instruct \
      --config.data.path=gs://BUCKET/data/gsm8k/train.jsonl
    python scripts/plan_memory.py --config=configs/qwen2_5_1_5b_gsm8k.py:v5e8   # fits?
    python scripts/plan_memory.py --config=configs/qwen2_5_1_5b_gsm8k.py:v5e8x2

``init`` must be a Hugging Face directory (config.json, safetensors, tokenizer.json); the
architecture below is ``model_config('qwen2.5-1.5b')`` and the checkpoint's config.json must
agree with it. ``data.path`` is a GSM8K JSONL or parquet file (local or gs://).

Mesh split (8 chips, one host, disjoint meshes, ``mode=async``):
  * sampler: chips 0-3, axes data=2 x tensor=2 (``:v6e8``: data=4 x tensor=1). Each data shard
    owns 128 of the 256 decode slots and their own half of the KV page pool; 'tensor' splits
    the weights, the 2 kv heads and so the pool again. The sampler runs in bf16
    (``sampling.dtype``: weights cast from the learner's f32 master copy at each publish, KV
    pages and activations bf16); an in-flight update holds a second copy of its weights while
    it is staged;
  * learner: chips 4-7, axes fsdp=4 x tensor=1 (f32 master weights and Adam moments sharded).
Batch: B=32 prompts x G=8 responses = 256 sequences per step, in 16 micro-batches of 16 rows x
768 tokens (``:v6e8``: 8 of 32 x 1280), ``learner.remat='full'``; eta = 1 (decoupled PPO
corrects the one-step staleness).
Expected memory per chip (``scripts/plan_memory.py``: XLA's memory analysis of the learner
step and the engine's generate, compiled on a fake CPU mesh; the table is in
docs/benchmarks.md), GiB; the plan was made with an f32 sampler, so its sampler weights, KV
pool and staged weights are half of these in bf16:
  * ``:v5e8`` (16 GiB): learner params 1.44 + Adam 2.88 + temp (grads, accumulator,
    activations) 6.91 = 11.23; sampler weights 2.88 + KV pool 2.63 (f32, 56 KiB/token x 256
    slots x 768 tokens / 4) + temp 2.75 + staged weights 2.88 = 11.13.
  * ``:v6e8`` (32 GiB): learner params 1.44 + Adam 2.88 + temp 17.24 = 21.56; sampler
    weights 5.75 + KV pool 4.38 (56 KiB/token x 256 slots x 1280 tokens / 4) + temp 0.32 +
    staged weights 5.75 = 16.20.
``:v5e8x2`` (two v5e-8 slices joined over DCN, ``mesh.num_slices=2``, ``slice_layout=
'by_role'``; launch in docs/tpu.md, "Multislice"): ``:v5e8`` doubled at the same load per
chip. Slice 0 samples (data=4 x tensor=2, 512 slots, 128 per replica), slice 1 learns
(fsdp=8; B=64 x G=8 = 512 sequences in 16 micro-batches of 32 rows x 768 tokens), eta = 1.
Each publish sends one bf16 copy across DCN to one sampler replica and fans it out over ICI
(``rljax.mesh.fan_out``) in a one-process run; a two-process pod run moves it with the pod's
union transfer instead (docs/multihost.md). Planned GiB per chip (bf16 sampler): learner
0.72 + Adam 1.44 + temp 8.92 = 11.08; sampler weights 1.44 + KV pool 1.31 + temp 6.19 +
staged weights 1.44 = 10.38, of 16.
The plan is a CPU proxy, not a TPU measurement: the same shardings and buffers, but another
fusion, and the XLA attention (with [T, T] scores) where the TPU runs the Pallas kernel.
"""

import ml_collections

from rljax.config import (
    BufferConfig,
    DataConfig,
    LearnerConfig,
    MeshConfig,
    MetricsConfig,
    RewardConfig,
    RunConfig,
    SamplingConfig,
    replace,
    to_config_dict,
)
from rljax.models.families import model_config

# Variant -> (chip in rljax.sim.chips, chips); scripts/plan_memory.py plans against these.
TARGETS = {"v5e8": ("tpu-v5e", 8), "v6e8": ("tpu-v6e", 8), "v5e8x2": ("tpu-v5e", 16)}
VARIANTS = tuple(TARGETS)  # the first is the default
PRESET = "qwen2.5-1.5b"


def recipe(variant: str = "") -> RunConfig:
    """The typed config of a variant ('' is ``v5e8``); ``get_config`` wraps it."""
    if variant not in ("", *VARIANTS):
        raise ValueError(
            f"unknown variant {variant!r} of configs/qwen2_5_1_5b_gsm8k.py; "
            f"use one of {VARIANTS} or none"
        )
    variant = variant or VARIANTS[0]
    cfg = RunConfig(
        model=model_config(PRESET, dtype="float32", param_dtype="float32"),
        init="gs://YOUR_BUCKET/models/Qwen2.5-1.5B-Instruct",  # override with --config.init
        tokenizer="init",
        sampling=SamplingConfig(
            temperature=1.0,
            max_new_tokens=512,
            max_prefill_length=256,
            max_concurrent_decodes=256,
            page_size=16,
            dtype="bfloat16",  # weights cast at each publish; the learner keeps f32
        ),
        learner=LearnerConfig(
            loss="decoupled_ppo",
            group_size=8,
            batch_groups=32,
            micro_batches=16,  # v6e8: 8
            remat="full",
            learning_rate=1e-6,
            grad_clip=1.0,
        ),
        buffer=BufferConfig(max_staleness=1),
        mesh=MeshConfig(
            mode="split",
            sampler_devices=4,
            learner_devices=4,
            sampler_data=2,  # v6e8: 4
            sampler_tensor=2,  # v6e8: 1
            learner_fsdp=4,
            learner_tensor=1,
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
        reward=RewardConfig(name="math_answer", num_workers=8),
        metrics=MetricsConfig(progress_bar=True, trace=True),
        mode="async",
        num_steps=500,
        eval_every=50,
        eval_examples=256,
    )
    if variant == "v5e8x2":
        # Two v5e-8 slices: v5e8 doubled at the same load per chip, one role per slice.
        cfg = replace(
            cfg,
            **{
                "learner.batch_groups": 64,
                "sampling.max_concurrent_decodes": 512,
                "mesh.num_slices": 2,
                "mesh.slice_layout": "by_role",
                "mesh.sampler_devices": 8,
                "mesh.learner_devices": 8,
                "mesh.sampler_data": 4,
                "mesh.learner_fsdp": 8,
                "reward.num_workers": 16,
            },
        )
    if variant == "v6e8":
        cfg = replace(
            cfg,
            **{
                "sampling.max_new_tokens": 1024,
                "learner.micro_batches": 8,
                "mesh.sampler_data": 4,
                "mesh.sampler_tensor": 1,
            },
        )
    return cfg


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    return to_config_dict(recipe(arg or ""))
