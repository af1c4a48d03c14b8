"""The pipeline benchmark's workload: shapes and cost models, and the limits they imply.

``scripts/bench_pipeline.py`` runs the real driver over the fakes on a :class:`Workload` and
compares its rate with limits computed here from the cost model alone, never from the driver:

- :meth:`Workload.limits`: the sampler at full slot occupancy and the learner on the mean batch;
- :meth:`Workload.staleness_bound`: the fraction of that ideal any schedule can reach when every
  consumed group must satisfy the staleness bound eta (its oldest token at most eta versions
  old), even one that knows every response length in advance.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np

from rljax.testing.fake_sampler import FakeSampler, lognormal_lengths


@dataclasses.dataclass(frozen=True)
class Workload:
    """Shapes and cost models of one benchmark run (seconds are per device call)."""

    slots: int  # sampler concurrent sequences
    group_size: int  # G responses per prompt
    batch_groups: int  # B groups per learner step
    prompt_len: int
    median_len: float  # lognormal response lengths
    sigma: float
    max_len: int
    decode_s: float  # decode step: decode_s + decode_per_slot_s * active slots
    decode_per_slot_s: float
    learn_per_token_s: float  # learner step: learn_fixed_s + learn_per_token_s * tokens
    learn_fixed_s: float
    sync_s: float  # weight publish
    steps: int  # learner steps per run
    warmup: int  # steps left out of the steady-state rate
    name: str = "lognormal_s1.0"
    # Multi-turn conversations (0: single-turn): 1 to max_turns turns, each of lognormal
    # length (median_len, sigma, the conversation capped at max_len), each but the last
    # followed by an env step of lognormal seconds (tool_median_s, tool_sigma) that answers
    # with obs_tokens tokens.
    max_turns: int = 0
    tool_median_s: float = 0.0
    tool_sigma: float = 1.0
    obs_tokens: int = 0

    def sampler(self, *, seed: int, params: Any, free: bool = False) -> FakeSampler:
        """The fake sampler of this workload (``free``: its decode steps cost nothing)."""
        lengths = lognormal_lengths(self.median_len, self.sigma, self.max_len)
        turns = None
        if self.max_turns:
            tool_mu, max_turns = math.log(self.tool_median_s), self.max_turns

            def turns(rng: np.random.Generator) -> list[tuple[int, float]]:
                n = int(rng.integers(1, max_turns + 1))
                return [(lengths(rng), rng.lognormal(tool_mu, self.tool_sigma)) for _ in range(n)]

        return FakeSampler(
            slots=self.slots,
            step_cost_s=self.sampler_cost(free),
            length_sampler=lengths,
            seed=seed,
            params=params,
            turns=turns,
            obs_tokens=self.obs_tokens,
        )

    def sampler_cost(self, free: bool):
        if free:
            return lambda active: 0.0
        return lambda active: self.decode_s + self.decode_per_slot_s * active

    def mean_response_len(self, draws: int = 200_000) -> float:
        """The length distribution's mean, by sampling it (the cap makes it no closed form)."""
        draw = lognormal_lengths(self.median_len, self.sigma, self.max_len)
        rng = np.random.default_rng(12345)
        return float(np.mean([draw(rng) for _ in range(draws)]))

    def limits(self) -> tuple[float, float]:
        """(sampler, learner) learner-steps/s, each side's cost model alone at its best.

        The sampler at full slot occupancy; the learner on the mean batch, plus one publish.
        """
        trajectories = self.batch_groups * self.group_size
        mean_len = self.mean_response_len()
        tokens_per_s = self.slots / (self.decode_s + self.decode_per_slot_s * self.slots)
        sampler = tokens_per_s / (trajectories * mean_len)
        batch_tokens = trajectories * (self.prompt_len + mean_len)
        learner = 1.0 / (self.learn_fixed_s + self.learn_per_token_s * batch_tokens + self.sync_s)
        return sampler, learner

    def staleness_bound(self, eta: int, groups: int = 100_000, seed: int = 12345) -> float:
        """The most of the ideal (:meth:`limits`) a schedule reaches under staleness bound eta.

        A group consumed at learner step k has its oldest token from params k - eta or newer,
        which the sampler holds no earlier than step k - eta starts; so its longest response,
        decoded at the fastest a decode step ever runs (one live slot), must fit in the window
        ``a_k - a_{k-eta}`` between those step starts. Every gap between step starts is at
        least the ideal step time T and lies in eta windows, so the run takes at least
        ``(1/eta) * sum_k max(eta * T, D_k)``, ``D_k`` the longest group duration consumed at
        step k. Even a clairvoyant schedule does no better than put the longest groups
        together, B to a step, which this takes over ``groups`` drawn groups. 1.0 at eta = 0
        is not claimed: eta = 0 (sync) serialises the sampler and the learner, a different
        limit; it returns nan there.
        """
        if eta == 0:
            return float("nan")
        draw = lognormal_lengths(self.median_len, self.sigma, self.max_len)
        rng = np.random.default_rng(seed)
        lengths = np.array([[draw(rng) for _ in range(self.group_size)] for _ in range(groups)])
        durations = np.sort(lengths.max(axis=1) * (self.decode_s + self.decode_per_slot_s))[::-1]
        step_s = 1.0 / min(self.limits())
        longest = durations[:: self.batch_groups]  # the longest of each step's B groups
        steps = len(longest)
        total = np.maximum(eta * step_s, longest).sum() / eta
        return float(steps * step_s / total)

    def learner_cost(self, free: bool):
        if free:
            return lambda batch: 0.0
        return lambda batch: self.learn_fixed_s + self.learn_per_token_s * batch.num_tokens
