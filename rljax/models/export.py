"""``rljax export``: one step of a run's workdir written for Hugging Face tools.

``hf`` writes a full fine-tune's weights, ``merged`` a LoRA run's base with its adapters folded
in, ``peft`` a LoRA run's adapters alone; each with the run's tokenizer and chat template beside
the weights, so that ``AutoModelForCausalLM.from_pretrained`` (or peft's ``PeftModel``) and
``AutoTokenizer.from_pretrained`` load the directory as it is.
"""

from __future__ import annotations

from typing import Any

import jax

from rljax import io
from rljax.config import ConfigError
from rljax.models import saved_runs
from rljax.models.hf import save_hf
from rljax.models.loading import load_base_params, load_saved_run, load_tokenizer, resolve_init
from rljax.models.lora_export import save_peft_adapter
from rljax.models.sharding import make_mesh

FORMATS = ("hf", "peft", "merged")
BASE_DIR = "base"  # where a PEFT export writes a base that is no Hugging Face directory


def export(
    run: saved_runs.SavedRun, fmt: str, out: str, key: str = "--checkpoint"
) -> dict[str, Any]:
    """Writes ``run``'s step to ``out`` as ``fmt`` (:data:`FORMATS`), with the tokenizer and its
    chat template beside the weights; what it wrote (format, step, files).

    ``hf``: a full fine-tune's weights; ``merged``: a LoRA run's base with its adapters folded
    in (both load with ``AutoModelForCausalLM.from_pretrained``); ``peft``: a LoRA run's
    adapters alone, for ``peft.PeftModel.from_pretrained`` onto the base its config names (a
    base that is no Hugging Face directory, a GGUF or another run, is written to
    ``<out>/base`` and named instead).
    """
    if fmt not in FORMATS:
        raise ConfigError(f"--format={fmt!r} is not one of {FORMATS}; pick one")
    saved = saved_runs.saved_config(run, key)
    where = run.where
    if fmt == "peft" and not saved.lora.enabled:
        raise ConfigError(
            f"{key} = {where!r} is a full fine-tune (lora.enabled=False): it has no adapter "
            "to export as PEFT; use --format=hf"
        )
    if fmt in ("hf", "merged") and (fmt == "merged") != saved.lora.enabled:
        other = "merged (base with the adapters folded in) or peft" if fmt == "hf" else "hf"
        what = "a LoRA run (its checkpoints hold adapters)" if fmt == "hf" else "no LoRA run"
        raise ConfigError(f"{key} = {where!r} is {what}; use --format={other}")
    step = run.step if run.step is not None else saved_runs.steps(run)[-1]
    run = saved_runs.SavedRun(run.workdir, step)
    tokenizer = load_tokenizer(saved)
    mesh = make_mesh(jax.devices()[:1], {"fsdp": 1, "tensor": 1})
    model_cfg, _, params, _ = load_saved_run(run, mesh, key, merge=fmt != "peft")
    if fmt == "peft":
        base = resolve_init(saved.init)
        if not io.is_file(io.join(base, "config.json")):
            # The base is no Hugging Face directory (a GGUF, another run): written beside the
            # adapter, so that peft has a base to load it onto.
            base = str(io.join(out, BASE_DIR))
            _, _, base_params = load_base_params(saved_runs.base_config(saved), mesh)
            save_hf(base, model_cfg, base_params, tokenizer)
        if io.is_local(base):
            base = str(io.path(base).resolve())
        save_peft_adapter(out, model_cfg, params, saved.lora, base_model_name_or_path=base)
        tokenizer.save(out)
    else:  # hf, or merged: load_params folded the adapters in
        save_hf(out, model_cfg, params, tokenizer)
    return {"format": fmt, "step": step, "out": str(out), "files": sorted(io.listdir(out))}
