"""GRPO on GSM8K from Gemma-3-12B (text) with LoRA on one v5e-8 host: ``:v5e8_lora``.

    rljax --config=configs/gemma3_12b_gsm8k.py:v5e8_lora --workdir=gs://BUCKET/runs/g3_12b \
      --config.init=gs://BUCKET/models/gemma-3-12b-it-text \
      --config.data.path=gs://BUCKET/data/gsm8k/train.jsonl
    python scripts/plan_memory.py --config=configs/gemma3_12b_gsm8k.py:v5e8_lora \
      --kernel_impl=pallas --no_sampler_hoist --no_learner_hoist   # fits (exit 0)

The architecture is ``model_config('gemma3-12b')`` (rljax.models.presets): 48 layers, 40 local
(sliding window of 1024 keys) and 8 global, five local to one global; 16 query and 8 kv heads
of 256, GeGLU MLPs of 15360, vocab 262208 tied; 11.77B parameters (the text tower; the model
card's 12B counts the vision tower too). ``init`` must be a ``Gemma3ForCausalLM`` directory
(``model_type`` ``gemma3_text``): the Hub's google/gemma-3-12b-it is the multimodal
``Gemma3ForConditionalGeneration``, which rljax does not read, so save its text tower first
(its ``language_model`` weights and ``text_config`` as a Gemma3ForCausalLM with transformers).
``tokenizer='init'`` reads the checkpoint's tokenizer and Gemma's chat template
(``<start_of_turn>user ... <end_of_turn>``; docs/gemma.md), which ``prompt_format='chat'``
applies to each question.

Lengths: prompts up to 256 tokens, answers up to 1792, so a slot is 2048 tokens, twice the
window: the local layers' KV lives in the engine's second page pool (rljax.engine.pools), where a
slot holds only the 66 pages (of 16 tokens) its window and its 8-token decode call reach, not
its 128 (docs/engine.md).

Both roles on all 8 chips (``mesh.mode='colocated'``, sync, eta = 0), tensor=8 on each: the
heads and MLP width split 8 ways, one kv head a chip. LoRA r=16 (alpha 32) on all 7
projections: 65.5M trainable parameters. Batch: 16 prompts x 8 = 128 sequences a step, 128
micro-batches of one row of 2048 tokens, ``remat='full'``; 24 decode slots, bf16.
Why these choices, from the plans (``scripts/plan_memory.py``):
  * bf16 base: an f32 base is 44 GiB, 5.5 a chip, and its learner alone planned 16.90 GiB
    (tensor=8, one row) of the 16; the bf16 base holds 2.79. The adapters stay f32
    (``lora.dtype='float32'``): in the base's bf16 they and their Adam moments would be too
    coarse for updates of 1e-5 (docs/lora.md: A's entries above about 0.004, of a bound of
    0.016, would move by less than half a bf16 step per update, so mostly B would learn); f32
    costs 0.14 GiB a chip against bf16 adapters (15.17 planned with them);
  * colocated: split 4 + 4 (async, tensor=4 each side), each role holds twice its share of
    the base, and the same batch planned 16.30 GiB for the learner and 24.40 for the sampler;
  * tensor=8, not fsdp=8: with fsdp XLA gathers every row of a micro-batch onto every chip
    (f32 [8, 2048, 15360] MLP activations: with the f32 base the learner planned 50.90 GiB of
    temp at 8 rows a micro-batch, the fewest fsdp=8 allows);
  * 24 slots: what the CPU plan shows fitting beside the learner. Of the sampler's 8.02 GiB of
    temp the CPU's f32 copies of the bf16 pools (2 x 1.42) and of each layer's weights are
    artefacts a TPU (bf16 natively) does not make; measure before raising it.

Planned GiB per chip of 16 (Intel Xeon, 2 cores; docs/benchmarks.md, "Gemma 3 memory plans"):
learner params 2.84 (0.10 of f32 adapters) + Adam 0.20 + temp 6.65 = 9.69; sampler weights
2.79 (adapters cast to bf16) + KV pools 1.42 + temp 8.02 + staged adapters 0.05 = 12.28; both
roles 15.31 (0.69 free). The
KV pools are the global layers' 0.38 (3073 pages) and the local layers' 1.05 (1713 pages: 24
slots x 66 + one slot's 128 + the null page); every layer at full length would take 2.25, so
the window saves 0.83 GiB a chip.
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
    to_config_dict,
)
from rljax.models.families import model_config

# Variant -> (chip in rljax.sim.chips, chips); scripts/plan_memory.py plans against these.
TARGETS = {"v5e8_lora": ("tpu-v5e", 8)}
VARIANTS = tuple(TARGETS)  # the first is the default
PRESET = "gemma3-12b"


def recipe(variant: str = "") -> RunConfig:
    """The typed config of a variant ('' is ``v5e8_lora``); ``get_config`` wraps it."""
    if variant not in ("", *VARIANTS):
        raise ValueError(
            f"unknown variant {variant!r} of configs/gemma3_12b_gsm8k.py; "
            f"use one of {VARIANTS} or none"
        )
    return RunConfig(
        # bf16 base (f32 adapters, below): an f32 base (44 GiB) beside the sampler's bf16 copy
        # leaves 16 GiB chips no room for a step (see the docstring).
        model=model_config(PRESET, dtype="bfloat16", param_dtype="bfloat16"),
        init="gs://YOUR_BUCKET/models/gemma-3-12b-it-text",  # override with --config.init
        tokenizer="init",  # Gemma's tokenizer and chat template, from the checkpoint
        lora=LoRAConfig(enabled=True, rank=16, alpha=32.0, dtype="float32"),
        sampling=SamplingConfig(
            temperature=1.0,
            max_new_tokens=1792,  # with the prompt, 2048 tokens: twice the local window
            max_prefill_length=256,
            max_concurrent_decodes=24,
            page_size=16,
            dtype="bfloat16",
        ),
        learner=LearnerConfig(
            loss="grpo",
            group_size=8,
            batch_groups=16,
            micro_batches=128,  # one row of 2048 tokens a micro-batch
            remat="full",
            learning_rate=1e-5,  # adapters want about 10x the full fine-tuning rate
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
