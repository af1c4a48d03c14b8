"""GRPO on GSM8K from Qwen3-8B on a v5p-32 pod slice (16 chips on 4 hosts): ``:v5p32``; with
LoRA on one v5e-8 host: ``:v5e8_lora``.

    scripts/gcp/launch.sh ... -- rljax --config=configs/qwen3_8b_gsm8k.py:v5p32 \
      --workdir=gs://BUCKET/runs/q3_8b_gsm8k \
      --config.init=gs://BUCKET/models/Qwen3-8B \
      --config.data.path=gs://BUCKET/data/gsm8k/train.jsonl
    python scripts/plan_memory.py --config=configs/qwen3_8b_gsm8k.py:v5p32   # fits?

Every host runs the same command; ``rljax.mesh.distributed.maybe_initialize`` joins the four
hosts (TPU_WORKER_HOSTNAMES) into one program. ``init`` is a Hugging Face directory; the
architecture is ``model_config('qwen3-8b')``.

Mesh split (16 chips, disjoint meshes along host boundaries, ``mode=async``, eta = 1):
  * sampler: chips 0-7 (hosts 0-1), axes data=2 x tensor=4: bf16 weights (``sampling.dtype``,
    cast from the learner's f32 master copy at each publish) split 4 ways, each
    data shard owns 128 of the 256 slots and half of the KV page pool, whose 8 kv heads
    'tensor' splits 4 ways;
  * learner: chips 8-15 (hosts 2-3), axes fsdp=8 x tensor=1 (f32 weights, grads and Adam
    moments sharded 8 ways).
Batch: B=32 prompts x G=8 = 256 sequences per step, in 8 micro-batches of 32 rows x 1280
tokens, ``learner.remat='full'``. Asynchronous with eta = 1 and the decoupled PPO loss: hosts 0-1
generate while hosts 2-3 train, as one program (a pod run: process 0 takes every decision and
the others replay it, weights move over ICI in one computation over both meshes;
docs/multihost.md).
Expected memory per chip (``scripts/plan_memory.py``, XLA's memory analysis on a fake 16-device
CPU mesh, re-run for this async recipe with its bf16 sampler; table in docs/benchmarks.md),
GiB of v5p's 95: learner params 3.81 + Adam 7.63 + temp (grads, accumulator, activations)
28.07 = 39.51; sampler weights 3.81 + KV pool 5.63 (bf16, 144 KiB/token x 256 slots x 1280
tokens / 8) + temp 18.50 + a staged weight update 3.81 = 31.76. The sampler's temp is mostly
a CPU artefact (XLA's CPU backend plans f32 copies of the bf16 weights and pool, 7.63 + 11.25;
a TPU computes bf16 natively). Both leave over half the HBM free, room for longer answers or
more slots.

``:v5e8_lora``: the same task, batch and lengths with LoRA adapters (r=16, alpha=32, on all 7
projections; docs/lora.md) on a frozen base, on one v5e-8 host (8 chips of 16 GiB):

    rljax --config=configs/qwen3_8b_gsm8k.py:v5e8_lora --workdir=gs://BUCKET/runs/q3_8b_lora \
      --config.init=gs://BUCKET/models/Qwen3-8B \
      --config.data.path=gs://BUCKET/data/gsm8k/train.jsonl
    python scripts/plan_memory.py --config=configs/qwen3_8b_gsm8k.py:v5e8_lora   # fits
    python scripts/plan_memory.py --config=configs/qwen3_8b_gsm8k.py:v5e8_lora \
      --config.lora.enabled=False   # full fine-tuning: does not fit (exit 1)

  * sampler: chips 0-3, tensor=4: the bf16 base split 4 ways plus the unmerged adapters; a
    weight update stages the adapters alone (44 MiB a chip), not a second base;
  * learner: chips 4-7, fsdp=4: the f32 base (frozen; the adapters and their Adam moments are
    f32 as well, which a bf16 base would make bf16) and 43.6M trainable parameters of 8.23B;
    64 micro-batches of 4 rows x 1280 tokens (one row a chip), ``remat='full'``.
What changed from ``:v5p32`` and why: ``learning_rate`` 1e-5 (adapters want about 10x the full
fine-tuning rate); ``micro_batches`` 64 (32 planned 16.29 GiB on the learner);
``max_concurrent_decodes`` 32 instead of 256 (the CPU plan's f32 upcast copies of the bf16
weights and pool, 7.7 GiB plus twice the pool, leave room for 32 slots of 1280 tokens; a TPU
makes no such copies: 128 slots would be 3.86 + 5.63 GiB of weights and pool, an estimate to
measure before raising it). Planned GiB per chip of 16: learner 7.74 (base + adapters) + Adam
0.23 + temp 4.34 = 12.32 (3.68 free); sampler 3.86 + KV pool 1.41 + temp 9.97 + staged
adapters 0.04 = 15.28 (0.72 free). Full fine-tuning plans 39.78 (learner: 7.63 + Adam 15.26 +
temp 16.90) and 18.92 (sampler, with a staged 3.81 GiB base): f32 weights, Adam moments,
gradients and their accumulator come to 19.1 GiB a chip even spread over all 8 chips.
"""

import ml_collections

from rljax.config import (
    BufferConfig,
    DataConfig,
    LearnerConfig,
    LoRAConfig,
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
TARGETS = {"v5p32": ("tpu-v5p", 16), "v5e8_lora": ("tpu-v5e", 8)}
VARIANTS = tuple(TARGETS)  # the first is the default
PRESET = "qwen3-8b"


def recipe(variant: str = "") -> RunConfig:
    """The typed config of a variant ('' is ``v5p32``); ``get_config`` wraps it."""
    if variant not in ("", *VARIANTS):
        raise ValueError(
            f"unknown variant {variant!r} of configs/qwen3_8b_gsm8k.py; "
            f"use one of {VARIANTS} or none"
        )
    variant = variant or VARIANTS[0]
    cfg = RunConfig(
        model=model_config(PRESET, dtype="float32", param_dtype="float32"),
        init="gs://YOUR_BUCKET/models/Qwen3-8B",  # override with --config.init
        tokenizer="init",
        sampling=SamplingConfig(
            temperature=1.0,
            max_new_tokens=1024,
            max_prefill_length=256,
            max_concurrent_decodes=256,
            page_size=16,
            dtype="bfloat16",  # weights cast at each publish; the learner keeps f32
        ),
        learner=LearnerConfig(
            loss="decoupled_ppo",  # corrects for the sampler's one version of lead
            group_size=8,
            batch_groups=32,
            micro_batches=8,
            remat="full",
            learning_rate=1e-6,
            grad_clip=1.0,
        ),
        buffer=BufferConfig(max_staleness=1),
        mesh=MeshConfig(
            mode="split",
            sampler_devices=8,
            learner_devices=8,
            sampler_data=2,
            sampler_tensor=4,
            learner_fsdp=8,
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
        reward=RewardConfig(name="math_answer", num_workers=16),
        metrics=MetricsConfig(progress_bar=True, trace=True),
        mode="async",
        num_steps=300,
        eval_every=50,
        eval_examples=256,
    )
    if variant == "v5e8_lora":
        cfg = replace(
            cfg,
            lora=LoRAConfig(enabled=True, rank=16, alpha=32.0),
            **{
                # Adapters want a larger step than full weights (about 10x is the usual rule).
                "learner.learning_rate": 1e-5,
                "learner.micro_batches": 64,  # 1 row per chip: 32 rows planned 16.29 GiB
                "sampling.max_concurrent_decodes": 32,  # what the CPU plan can show fitting
                "mesh.sampler_devices": 4,
                "mesh.learner_devices": 4,
                "mesh.sampler_data": 1,
                "mesh.sampler_tensor": 4,
                "mesh.learner_fsdp": 4,
            },
        )
    return cfg


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    return to_config_dict(recipe(arg or ""))
