"""GRPO on GSM8K from Gemma-3-27B (text), full fine-tuning on a v5p-16 (8 chips): ``:v5p16``.

    scripts/gcp/launch.sh ... -- rljax --config=configs/gemma3_27b_gsm8k.py:v5p16 \
      --workdir=gs://BUCKET/runs/g3_27b_gsm8k \
      --config.init=gs://BUCKET/models/gemma-3-27b-it-text \
      --config.data.path=gs://BUCKET/data/gsm8k/train.jsonl
    python scripts/plan_memory.py --config=configs/gemma3_27b_gsm8k.py:v5p16 \
      --kernel_impl=pallas --no_sampler_hoist   # fits (exit 0)

The architecture is ``model_config('gemma3-27b')`` (rljax.models.presets): 62 layers, 52 local
(sliding window of 1024 keys) and 10 global, five local to one global and two local at the end;
32 query and 16 kv heads of 128 (``query_pre_attn_scalar`` 168), GeGLU MLPs of 21504, vocab
262208 tied; 27.01B parameters (the text tower). ``init`` must be a ``Gemma3ForCausalLM``
directory: the Hub's google/gemma-3-27b-it is the multimodal ``Gemma3ForConditionalGeneration``,
which rljax does not read, so save its text tower first (configs/gemma3_12b_gsm8k.py says how).
``tokenizer='init'``: the checkpoint's tokenizer and Gemma's chat template (docs/gemma.md).
Every host runs the same command (two hosts of four chips: one program, docs/multihost.md).

Lengths: prompts up to 256 tokens, answers up to 1792: slots of 2048 tokens, twice the window,
so the local layers' KV lives in the engine's second page pool, 66 pages of 16 tokens a slot
instead of 128 (rljax.engine.pools; docs/engine.md).

Full fine-tuning, both roles on all 8 chips (``mesh.mode='colocated'``, sync, eta = 0), tensor=8
on each (4 query and 2 kv heads a chip, the MLP width split 8 ways). Why:
  * full fine-tuning fits: its f32 state (weights, two Adam moments, gradients and their
    accumulator, 16 bytes a parameter: 403 GiB) is 50 GiB a chip over 8 chips of 95, which
    leaves room for a step's activations and the sampler beside it, and it trains every weight
    (LoRA would spare memory this slice does not need);
  * colocated: split by role, 4 chips would hold 101 GiB of the learner's state each;
  * tensor=8, not fsdp=8: with fsdp XLA gathers every row of a micro-batch onto every chip
    (configs/gemma3_12b_gsm8k.py);
  * 32 slots: 64 planned 94.3 GiB of 95 for both roles.
Batch: 16 prompts x 8 = 128 sequences a step, 128 micro-batches of one row of 2048 tokens,
``remat='full'``; the sampler in bf16 (cast at each publish).

Planned GiB per chip of 95 (Intel Xeon, 2 cores; docs/benchmarks.md, "Gemma 3 memory plans"):
learner params 12.58 + Adam 25.16 + temp 45.60 = 83.35; sampler weights 6.29 + KV pools 2.40 +
temp 16.71 + a staged update 6.29 = 31.69; both roles on the same chips 92.05 (2.95 free). The
learner's temp is its gradients and their accumulator (2 x 12.58) and one row's activations, and
about 16 GiB of copies of the local runs' MLP weights and their gradients (58 buffers of f32
[5, 5376, 2688] in XLA's buffer assignment: rljax.models.layer_runs runs each run of local
layers over its slice of the stacked weights). The KV pools are the global layers' 0.63 (4097
pages) and the local layers' 1.78 (2241 pages: 32 slots x 66 + one slot's 128 + the null page);
every layer at full length would take 3.88, so the window saves 1.47 GiB a chip.
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
    to_config_dict,
)
from rljax.models.families import model_config

# Variant -> (chip in rljax.sim.chips, chips); scripts/plan_memory.py plans against these.
TARGETS = {"v5p16": ("tpu-v5p", 8)}
VARIANTS = tuple(TARGETS)  # the first is the default
PRESET = "gemma3-27b"


def recipe(variant: str = "") -> RunConfig:
    """The typed config of a variant ('' is ``v5p16``); ``get_config`` wraps it."""
    if variant not in ("", *VARIANTS):
        raise ValueError(
            f"unknown variant {variant!r} of configs/gemma3_27b_gsm8k.py; "
            f"use one of {VARIANTS} or none"
        )
    return RunConfig(
        model=model_config(PRESET, dtype="float32", param_dtype="float32"),
        init="gs://YOUR_BUCKET/models/gemma-3-27b-it-text",  # override with --config.init
        tokenizer="init",  # Gemma's tokenizer and chat template, from the checkpoint
        sampling=SamplingConfig(
            temperature=1.0,
            max_new_tokens=1792,  # with the prompt, 2048 tokens: twice the local window
            max_prefill_length=256,
            max_concurrent_decodes=32,
            page_size=16,
            dtype="bfloat16",  # weights cast at each publish; the learner keeps f32
        ),
        learner=LearnerConfig(
            loss="grpo",
            group_size=8,
            batch_groups=16,
            micro_batches=128,  # one row of 2048 tokens a micro-batch
            remat="full",
            learning_rate=1e-6,
            grad_clip=1.0,
        ),
        buffer=BufferConfig(max_staleness=0),
        mesh=MeshConfig(
            mode="colocated",
            learner_fsdp=1,
            learner_tensor=8,
            sampler_data=1,
            sampler_tensor=8,
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
    )


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    return to_config_dict(recipe(arg or ""))
