"""Rewards: built-in verifiers, the name registry, and the fault-isolating RewardPool."""

from rljax.rewards.pool import RewardPool, RewardStats
from rljax.rewards.registry import REWARDS, get_reward
from rljax.rewards.verifiers import exact_match, math_answer

__all__ = ["REWARDS", "RewardPool", "RewardStats", "exact_match", "get_reward", "math_answer"]
