"""Typed, frozen run configuration.

Experiment files under ``configs/`` build a :class:`RunConfig` from these dataclasses and hand
it to the launcher as an ``ml_collections.ConfigDict`` (:func:`to_config_dict`), so that
``--config.learner.learning_rate=1e-5`` style overrides work. The launcher turns the overridden
ConfigDict back into dataclasses (:func:`from_config_dict`), and every dataclass validates itself
in ``__post_init__``. A bad value raises :class:`ConfigError` with a one-line message that names
the key, the bad value and what would be valid.

Each module receives only its own section (``ModelConfig`` for the model, ``SamplingConfig`` for
the engine, ...), never the whole run config.

The package splits along its seams: ``checks`` (ConfigError and the checks), ``sections`` (one
dataclass per part of the stack), ``reward`` (the reward section and its model-based rewards),
``algorithm`` (the learner, warm-start, buffer and LoRA sections), ``run_config`` (RunConfig
and its cross-section rules), ``convert`` (ConfigDict conversion) and ``keys`` (the table of
every key, from the sections' ``Attributes:`` docstrings, that docs/runtime.md holds);
everything public is importable from ``rljax.config``.
"""

from rljax.config.algorithm import (
    BufferConfig,
    CriticConfig,
    LearnerConfig,
    LoRAConfig,
    SFTConfig,
    TeacherConfig,
)
from rljax.config.checks import (
    DTYPES,
    FAMILIES,
    LOSSES,
    MESH_MODES,
    REMAT,
    RUN_MODES,
    SFT_TEACHERS,
    SWAP_MODES,
    TASKS,
    ConfigError,
)
from rljax.config.convert import from_config_dict, replace, to_config_dict
from rljax.config.model import MoEConfig
from rljax.config.reward import JudgeConfig, RewardConfig, RewardModelConfig
from rljax.config.run_config import RunConfig
from rljax.config.sections import (
    CheckpointConfig,
    DataConfig,
    EnvConfig,
    EvalConfig,
    MeshConfig,
    MetricsConfig,
    ModelConfig,
    SamplingConfig,
)

__all__ = [
    "DTYPES",
    "FAMILIES",
    "LOSSES",
    "MESH_MODES",
    "REMAT",
    "RUN_MODES",
    "SFT_TEACHERS",
    "SWAP_MODES",
    "TASKS",
    "BufferConfig",
    "CheckpointConfig",
    "ConfigError",
    "CriticConfig",
    "DataConfig",
    "EnvConfig",
    "EvalConfig",
    "JudgeConfig",
    "LoRAConfig",
    "LearnerConfig",
    "MeshConfig",
    "MetricsConfig",
    "MoEConfig",
    "ModelConfig",
    "RewardConfig",
    "RewardModelConfig",
    "RunConfig",
    "SFTConfig",
    "TeacherConfig",
    "SamplingConfig",
    "from_config_dict",
    "replace",
    "to_config_dict",
]
