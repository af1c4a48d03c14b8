"""rljax: JAX-native asynchronous RL post-training for LLMs.

The names below are the public API that research code may import; everything else may change.

    import rljax
    from rljax.configs import arith_tiny
    cfg = arith_tiny.recipe("small")
    summary = rljax.run(cfg, "/tmp/run", reward_fn=my_reward, loss=my_loss)

Each name is resolved on first use (PEP 562 module ``__getattr__``), so ``import rljax.policy``
or ``import rljax.sim`` does not load jax or flax.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

# Public name -> the module that defines it.
_EXPORTS = {
    "BufferConfig": "rljax.config",
    "CheckpointConfig": "rljax.config",
    "ConfigError": "rljax.config",
    "DataConfig": "rljax.config",
    "EnvConfig": "rljax.config",
    "LearnerConfig": "rljax.config",
    "MeshConfig": "rljax.config",
    "MetricsConfig": "rljax.config",
    "ModelConfig": "rljax.config",
    "ReallocatorConfig": "rljax.policy.reallocation",
    "RewardConfig": "rljax.config",
    "RunConfig": "rljax.config",
    "SamplingConfig": "rljax.config",
    "SFTConfig": "rljax.config",
    "from_config_dict": "rljax.config",
    "replace": "rljax.config",
    "to_config_dict": "rljax.config",
    "PhaseMeter": "rljax.policy.meter",
    "StalenessBuffer": "rljax.policy.staleness",
    "StalenessController": "rljax.policy.staleness",
    "Engine": "rljax.engine.engine",
    "PagedEngine": "rljax.engine.paged",
    "ResultTokens": "rljax.engine.engine",
    "SlotSampling": "rljax.engine.engine",
    "Request": "rljax.engine.samples",
    "Sampler": "rljax.engine.sampler",
    "Trajectory": "rljax.engine.samples",
    "group_advantages": "rljax.learner.advantages",
    "TrainSequence": "rljax.learner.batch",
    "pack_batch": "rljax.learner.batch",
    "Learner": "rljax.learner.learner",
    "LOSSES": "rljax.learner.losses",
    "Loss": "rljax.learner.losses",
    "LossInputs": "rljax.learner.losses",
    "get_loss": "rljax.learner.losses",
    "LEARNER_RULES": "rljax.models.sharding",
    "SAMPLER_RULES": "rljax.models.sharding",
    "init_sharded": "rljax.models.transformer",
    "make_mesh": "rljax.models.sharding",
    "Tokenizer": "rljax.models.tokenizer",
    "Decoder": "rljax.models.transformer",
    "Env": "rljax.envs",
    "ENVS": "rljax.envs",
    "Step": "rljax.envs",
    "register_env": "rljax.envs",
    "RewardPool": "rljax.rewards.pool",
    "REWARDS": "rljax.rewards.registry",
    "get_reward": "rljax.rewards.registry",
    "Run": "rljax.runtime",
    "run": "rljax.runtime",
}
_SUBMODULES = ("envs", "testing")

__all__ = sorted([*_EXPORTS, *_SUBMODULES])


def __getattr__(name: str) -> Any:
    if name in _SUBMODULES:
        value = importlib.import_module(f"{__name__}.{name}")
    elif name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name]), name)
    else:
        raise AttributeError(f"module 'rljax' has no attribute {name!r}")
    globals()[name] = value  # resolve once
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
