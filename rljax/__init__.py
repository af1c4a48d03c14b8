"""rljax: JAX-native asynchronous RL post-training for LLMs.

The names below are the public API that research code may import; everything else may change.

    import rljax
    cfg = rljax.testing.arith_tiny()
    summary = rljax.run(cfg, "/tmp/run", reward_fn=my_reward, loss=my_loss)
"""

from rljax import testing
from rljax.policy.staleness import StalenessBuffer, StalenessController
from rljax.config import (
    BufferConfig,
    CheckpointConfig,
    ConfigError,
    DataConfig,
    LearnerConfig,
    MeshConfig,
    MetricsConfig,
    ModelConfig,
    RewardConfig,
    RunConfig,
    SamplingConfig,
    SFTConfig,
    from_config_dict,
    replace,
    to_config_dict,
)
from rljax.engine.engine import Engine, ResultTokens, SlotSampling
from rljax.engine.sampler import Request, Sampler, Trajectory
from rljax.learner.advantages import group_advantages
from rljax.learner.batch import TrainSequence, pack_batch
from rljax.learner.learner import Learner
from rljax.learner.losses import LOSSES, Loss, LossInputs, get_loss
from rljax.models.sharding import LEARNER_RULES, SAMPLER_RULES, init_sharded, make_mesh
from rljax.models.tokenizer import Tokenizer
from rljax.models.transformer import Decoder
from rljax.rewards.pool import RewardPool
from rljax.rewards.registry import REWARDS, get_reward
from rljax.runtime import Run, run

__version__ = "0.1.0"

__all__ = [
    "LEARNER_RULES",
    "LOSSES",
    "REWARDS",
    "SAMPLER_RULES",
    "BufferConfig",
    "CheckpointConfig",
    "ConfigError",
    "DataConfig",
    "Decoder",
    "Engine",
    "Learner",
    "LearnerConfig",
    "Loss",
    "LossInputs",
    "MeshConfig",
    "MetricsConfig",
    "ModelConfig",
    "Request",
    "ResultTokens",
    "RewardConfig",
    "RewardPool",
    "Run",
    "RunConfig",
    "SFTConfig",
    "Sampler",
    "SamplingConfig",
    "SlotSampling",
    "StalenessBuffer",
    "StalenessController",
    "Tokenizer",
    "TrainSequence",
    "Trajectory",
    "from_config_dict",
    "get_loss",
    "get_reward",
    "group_advantages",
    "init_sharded",
    "make_mesh",
    "pack_batch",
    "replace",
    "run",
    "testing",
    "to_config_dict",
]
