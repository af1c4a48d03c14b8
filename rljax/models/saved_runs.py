"""A run's workdir as a model: the config its checkpoint was saved with, and its weights.

A saved run is named by its workdir (the newest finalised step) or by one step's directory,
``<workdir>/checkpoints/<step>``. Its checkpoint's meta records the run config, so the model,
the tokenizer and, for a LoRA run, the base and the adapters' shape are read from it, not
guessed. A LoRA run's checkpoints hold the adapters alone: its weights are the base its config
names (read from there again) with the adapters folded in (``W + (alpha / r) A B``), or kept
apart for a PEFT export.

Teachers (``teacher.init``), ``init``, ``rljax eval --checkpoint`` and ``rljax export`` all read
runs through here.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

from flax import nnx
from jax.sharding import Mesh

from rljax import io
from rljax.checkpoint import Checkpointer, CheckpointError
from rljax.config import CheckpointConfig, ConfigError, LoRAConfig, ModelConfig, RunConfig, replace
from rljax.config.convert import from_config_dict
from rljax.models import lora as lora_lib
from rljax.models.sharding import LEARNER_RULES, ShardingRules

_READ_ONLY = CheckpointConfig(enabled=False)
_STEP_DIR = re.compile(r"^(?P<workdir>.*?)/+checkpoints/+(?P<step>\d+)/*$")


@dataclasses.dataclass(frozen=True)
class SavedRun:
    """One step of a run's workdir: ``step`` None means the newest finalised one."""

    workdir: str
    step: int | None = None

    @property
    def checkpoints(self) -> str:
        return str(io.join(self.workdir, "checkpoints"))


def parse(path: str, step: int | None = None) -> SavedRun | None:
    """The saved run ``path`` names (a workdir, or one step's directory in it), or None when
    it names none (a Hugging Face directory, a GGUF file, 'random'). ``step`` picks a step of
    a workdir; it must agree with a step directory's."""
    path = str(path)
    m = _STEP_DIR.match(path)
    if m and io.is_dir(io.join(m["workdir"], "checkpoints")):
        named = int(m["step"])
        if step is not None and step != named:
            raise ConfigError(
                f"{path!r} is step {named} of run {m['workdir']!r} but step {step} was asked "
                "for; name the workdir with the step, or the step's directory alone"
            )
        return SavedRun(m["workdir"], named)
    if path and io.is_dir(io.join(path, "checkpoints")):
        return SavedRun(path.rstrip("/"), step)
    return None


def is_saved_run(path: str) -> bool:
    """Whether ``path`` names a run's workdir or one step's directory in it."""
    try:
        return parse(path) is not None
    except ConfigError:
        return False


def _checkpointer(run: SavedRun) -> Checkpointer:
    return Checkpointer(run.checkpoints, _READ_ONLY)


def steps(run: SavedRun) -> list[int]:
    """The run's finalised checkpoint steps, oldest first."""
    return _checkpointer(run).all_steps()


def saved_config(run: SavedRun, key: str) -> RunConfig:
    """The run config ``run``'s step was saved with (``key``: the config key or flag that
    named it, for the one-line errors)."""
    where = run.workdir if run.step is None else f"{run.workdir} step {run.step}"
    try:
        meta = _checkpointer(run).read_meta(run.step)
    except CheckpointError as e:
        raise ConfigError(f"{key} = {where!r}: {e}") from None
    saved = meta.get("config")
    if not isinstance(saved, dict):
        raise ConfigError(
            f"{key} = {where!r}: its checkpoint holds no run config (saved by an older "
            "rljax); export the model to a Hugging Face directory with the rljax that wrote it"
        )
    return _unflatten(saved)


def _unflatten(flat: dict[str, Any]) -> RunConfig:
    nested: dict[str, Any] = {}
    for dotted, value in flat.items():
        *path, last = dotted.split(".")
        node = nested
        for part in path:
            node = node.setdefault(part, {})
        node[last] = value
    return from_config_dict(nested)


def base_config(saved: RunConfig) -> RunConfig:
    """The run config of the model a saved run started from (its ``init`` and tokenizer), with
    no adapters: where a LoRA run's frozen base is read from."""
    return replace(saved, lora=LoRAConfig())


def load_params(
    run: SavedRun,
    mesh: Mesh,
    key: str,
    rules: ShardingRules = LEARNER_RULES,
    *,
    merge: bool = True,
    dtype: str | None = None,
) -> tuple[ModelConfig, nnx.GraphDef, nnx.State, RunConfig]:
    """(model config, graphdef, params, saved run config) of ``run``'s step on ``mesh``.

    A LoRA run's base is read from the ``init`` its config names; its adapters are restored
    from the checkpoint and, with ``merge``, folded into the weights they adapt (a plain
    Decoder's state), else joined to the base (a LoRA-adapted Decoder's state). ``dtype``:
    the weights' dtype, when it is not the saved run's.
    """
    from rljax.models.loading import abstract_params, initial_model_config, load_base_params

    saved = saved_config(run, key)
    if dtype is not None and dtype != saved.model.dtype:
        model = dataclasses.replace(saved.model, dtype=dtype, param_dtype=dtype)
        saved = replace(saved, model=model)
    model_cfg = initial_model_config(saved)
    ckpt = _checkpointer(run)
    where = run.workdir if run.step is None else f"{run.workdir} step {run.step}"
    if not saved.lora.enabled:
        graphdef, abstract = abstract_params(model_cfg, mesh, rules)
        return model_cfg, graphdef, _restore(ckpt, abstract, run.step, key, where), saved
    lora_graphdef, abstract = abstract_params(model_cfg, mesh, rules, lora=saved.lora)
    adapters_abstract, _ = lora_lib.split_adapters(abstract)
    adapters = _restore(ckpt, adapters_abstract, run.step, key, where)
    with io.input_error(key, where):
        base = load_base_params(base_config(saved), mesh, rules)[2]
    joined = lora_lib.join(base, adapters)
    if not merge:
        return model_cfg, lora_graphdef, joined, saved
    graphdef, plain = abstract_params(model_cfg, mesh, rules)
    merged = lora_lib.merged_layers(nnx.to_pure_dict(joined), saved.lora.scale)
    nnx.replace_by_pure_dict(plain, merged)
    return model_cfg, graphdef, plain, saved


def _restore(ckpt: Checkpointer, abstract: Any, step: int | None, key: str, where: str) -> Any:
    try:
        return ckpt.restore_params(abstract, step)
    except CheckpointError as e:
        raise ConfigError(f"{key} = {where!r}: {e}") from None


FORMATS = ("hf", "peft", "merged")
BASE_DIR = "base"  # where a PEFT export writes a base that is no Hugging Face directory


def export(run: SavedRun, fmt: str, out: str, key: str = "--checkpoint") -> dict[str, Any]:
    """Writes ``run``'s step to ``out`` as ``fmt`` (:data:`FORMATS`), with the tokenizer and its
    chat template beside the weights; what it wrote (format, step, files).

    ``hf``: a full fine-tune's weights; ``merged``: a LoRA run's base with its adapters folded
    in (both load with ``AutoModelForCausalLM.from_pretrained``); ``peft``: a LoRA run's
    adapters alone, for ``peft.PeftModel.from_pretrained`` onto the base its config names (a
    base that is no Hugging Face directory, a GGUF or another run, is written to
    ``<out>/base`` and named instead).
    """
    import jax

    from rljax.models.hf import save_hf
    from rljax.models.loading import load_base_params, load_tokenizer, resolve_init
    from rljax.models.lora_export import save_peft_adapter
    from rljax.models.sharding import make_mesh

    if fmt not in FORMATS:
        raise ConfigError(f"--format={fmt!r} is not one of {FORMATS}; pick one")
    saved = saved_config(run, key)
    where = run.workdir if run.step is None else f"{run.workdir} step {run.step}"
    if fmt == "peft" and not saved.lora.enabled:
        raise ConfigError(
            f"{key} = {where!r} is a full fine-tune (lora.enabled=False): it has no adapter "
            "to export as PEFT; use --format=hf"
        )
    if fmt in ("hf", "merged") and (fmt == "merged") != saved.lora.enabled:
        other = "merged (base with the adapters folded in) or peft" if fmt == "hf" else "hf"
        what = "a LoRA run (its checkpoints hold adapters)" if fmt == "hf" else "no LoRA run"
        raise ConfigError(f"{key} = {where!r} is {what}; use --format={other}")
    step = run.step if run.step is not None else steps(run)[-1]
    run = SavedRun(run.workdir, step)
    tokenizer = load_tokenizer(saved)
    mesh = make_mesh(jax.devices()[:1], {"fsdp": 1, "tensor": 1})
    model_cfg, _, params, _ = load_params(run, mesh, key, merge=fmt != "peft")
    if fmt == "peft":
        base = resolve_init(saved.init)
        if not io.is_file(io.join(base, "config.json")):
            # The base is no Hugging Face directory (a GGUF, another run): written beside the
            # adapter, so that peft has a base to load it onto.
            base = str(io.join(out, BASE_DIR))
            _, _, base_params = load_base_params(base_config(saved), mesh)
            save_hf(base, model_cfg, base_params, tokenizer)
        if io.is_local(base):
            base = str(io.path(base).resolve())
        save_peft_adapter(out, model_cfg, params, saved.lora, base_model_name_or_path=base)
        tokenizer.save(out)
    else:  # hf, or merged: load_params folded the adapters in
        save_hf(out, model_cfg, params, tokenizer)
    return {"format": fmt, "step": step, "out": str(out), "files": sorted(io.listdir(out))}
