"""A run's workdir as a model: the config its checkpoint was saved with, and its weights.

A saved run is named by its workdir (the newest finalised step) or by one step's directory,
``<workdir>/checkpoints/<step>``. Its checkpoint's meta records the run config, so the model,
the tokenizer and, for a LoRA run, the base and the adapters' shape are read from it, not
guessed. A LoRA run's checkpoints hold the adapters alone: its weights are the base its config
names (read from there again) with the adapters folded in (``W + (alpha / r) A B``), or kept
apart for a PEFT export.

``init`` (and so ``teacher.init``, ``critic.init`` and ``rljax eval --checkpoint``) reads a run
through here (:func:`rljax.models.loading.load_saved_run`), and so does ``rljax export``
(:mod:`rljax.models.export`).
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

from rljax import io
from rljax.checkpoint import Checkpointer, CheckpointError
from rljax.config import CheckpointConfig, ConfigError, LoRAConfig, RunConfig, replace
from rljax.config.convert import from_config_dict

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

    @property
    def where(self) -> str:
        """The run as the one-line errors name it."""
        return self.workdir if self.step is None else f"{self.workdir} step {self.step}"


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


def checkpointer(run: SavedRun) -> Checkpointer:
    """A read-only Checkpointer of the run's checkpoints."""
    return Checkpointer(run.checkpoints, _READ_ONLY)


def steps(run: SavedRun) -> list[int]:
    """The run's finalised checkpoint steps, oldest first."""
    return checkpointer(run).all_steps()


def saved_config(run: SavedRun, key: str) -> RunConfig:
    """The run config ``run``'s step was saved with (``key``: the config key or flag that
    named it, for the one-line errors)."""
    try:
        meta = checkpointer(run).read_meta(run.step)
    except CheckpointError as e:
        raise ConfigError(f"{key} = {run.where!r}: {e}") from None
    saved = meta.get("config")
    if not isinstance(saved, dict):
        raise ConfigError(
            f"{key} = {run.where!r}: its checkpoint holds no run config (saved by an older "
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
