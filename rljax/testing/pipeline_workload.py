"""The pipeline benchmark's workload: shapes and cost models, and the limits they imply.

``scripts/bench_pipeline.py`` runs the real driver over the fakes on a :class:`Workload` and
compares its rate with limits computed here from the cost model alone, never from the driver:

- :meth:`Workload.limits`: the sampler at full slot occupancy and the learner on the mean batch;
- :meth:`Workload.staleness_bound`: a ceiling on the fraction of that ideal any schedule can
  reach when every consumed group must satisfy the staleness bound eta (its oldest token at
  most eta versions old), even one that knows every response length in advance;
- :meth:`Workload.staleness_reachable`: what one constructed schedule of that same clairvoyant
  relaxation reaches. The best schedule lies between the two (at eta <= 1 they meet).

``staleness_bound(eta, in_order=True)`` is the same floor with the groups put together in the
order they were drawn instead of longest first: where that relaxation leaves a schedule that
cannot tell one group's lengths from another's. It is a reference, not a ceiling on such
schedules: one that lets a step take the groups that finished first still sorts some.
"""

from __future__ import annotations

import dataclasses
import functools
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
        return _mean_length(self.median_len, self.sigma, self.max_len, draws)

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

    def _sorted_steps(
        self, groups: int, seed: int, in_order: bool = False
    ) -> tuple[np.ndarray, np.ndarray]:
        """(D, L) per learner step of ``groups`` drawn groups put together longest first (with
        ``in_order``, B at a time in the order drawn).

        D is a step's longest group at the fastest a decode step ever runs (one live slot), L
        the learner's cost on that step's batch. Taking the groups B at a time in order of
        their longest response gives the least sum of D over any split into steps.
        """
        lengths = _group_lengths(
            self.median_len, self.sigma, self.max_len, self.group_size, groups, seed
        )
        durations = lengths.max(axis=1) * (self.decode_s + self.decode_per_slot_s)
        tokens = (lengths + self.prompt_len).sum(axis=1)
        order = np.arange(groups) if in_order else np.argsort(-durations, kind="stable")
        usable = len(order) - len(order) % self.batch_groups
        by_step = order[:usable].reshape(-1, self.batch_groups)
        longest = durations[by_step].max(axis=1)
        costs = self.learn_fixed_s + self.learn_per_token_s * tokens[by_step].sum(axis=1)
        return longest, costs

    def staleness_bound(
        self, eta: int, groups: int = 100_000, seed: int = 12345, *, in_order: bool = False
    ) -> float:
        """The most of the ideal (:meth:`limits`) any schedule reaches under staleness bound eta.

        A rigorous ceiling on the clairvoyant relaxation (:func:`makespan_floor`): a schedule
        that knows every length, decodes each group at the fastest a decode step ever runs and
        may put any groups together. At eta = 0 it is the sync limit (sample, learn, publish
        in turn). :meth:`staleness_reachable` is a schedule of that relaxation; the most any
        schedule reaches lies between the two. ``in_order``: the steps take the groups in the
        order drawn, not longest first (the module doc says what that figure is and is not).
        """
        longest, costs = self._sorted_steps(groups, seed, in_order)
        step_s = 1.0 / min(self.limits())
        floor = makespan_floor(longest, costs, self.sync_s, eta)
        return float(min(1.0, len(longest) * step_s / floor))

    def staleness_reachable(self, eta: int, groups: int = 100_000, seed: int = 12345) -> float:
        """What one constructed schedule of the same relaxation reaches, as a fraction of the ideal.

        The groups put together longest first (as in :meth:`staleness_bound`), the steps taken
        in that order or its reverse, whichever finishes first, each started as early as its
        window and the learner allow (:func:`earliest_makespan`), and the whole run no
        shorter than the sampler's limit at full occupancy.
        """
        longest, costs = self._sorted_steps(groups, seed)
        sampler, _ = self.limits()
        step_s = 1.0 / min(self.limits())
        steps = len(longest)
        makespan = min(
            earliest_makespan(longest, costs, self.sync_s, eta),
            earliest_makespan(longest[::-1], costs[::-1], self.sync_s, eta),
        )
        return float(steps * step_s / max(makespan, steps / sampler))

    def learner_cost(self, free: bool):
        if free:
            return lambda batch: 0.0
        return lambda batch: self.learn_fixed_s + self.learn_per_token_s * batch.num_tokens


def earliest_makespan(longest, costs, sync_s: float, eta: int) -> float:
    """When the last of these learner steps publishes, each started as early as allowed.

    Step k (in the given order, from 1) consumes groups whose oldest token is from params
    version k - eta or newer. Version j exists once step j - 1 has trained and published
    (version 1 at time 0), so step k's longest group, lasting ``longest[k]``, starts at the
    publish of step k - eta - 1 at the earliest and ends by the start of step k; the learner
    runs one step and its publish at a time. Both constraints only ask a step to start late
    enough, so starting each as early as they allow finishes every step earliest, for this
    order of steps.
    """
    publish = [0.0] * (eta + 1)  # publishes before step 1: version 1 exists at time 0
    for duration, cost in zip(longest, costs):
        start = max(publish[-1], publish[-eta - 1] + float(duration))
        publish.append(start + float(cost) + sync_s)
    return publish[-1]


def makespan_floor(longest, costs, sync_s: float, eta: int) -> float:
    """No schedule of these groups publishes its last step before this.

    ``longest`` must come from the groups put together longest first (the least sum any split
    into steps has; ``costs`` are the learner's, whose sum no split changes). For any order,
    chaining step k's window back through k - eta - 1, k - 2 (eta + 1), ... gives
    ``publish_k >= sum over that chain of (D + L + sync)``; the last eta + 1 steps' chains
    cover every step once, each ends by the last publish, so the last publish is at least
    their mean, ``sum(D + L + sync) / (eta + 1)``. It is also at least the learner's own
    ``sum(L + sync)``. At eta = 0 the chain is the whole run: the sync limit.
    """
    work = float(np.sum(costs)) + sync_s * len(costs)
    return max(work, (float(np.sum(longest)) + work) / (eta + 1))


@functools.cache
def _group_lengths(
    median: float, sigma: float, max_len: int, group_size: int, groups: int, seed: int
) -> np.ndarray:
    # Cached: both bounds and the reachable schedule of every eta draw the same groups, each
    # draw a Python call (about a second for 100,000 groups). Read-only, as it is shared.
    draw = lognormal_lengths(median, sigma, max_len)
    rng = np.random.default_rng(seed)
    lengths = np.array([[draw(rng) for _ in range(group_size)] for _ in range(groups)])
    lengths.setflags(write=False)
    return lengths


@functools.cache
def _mean_length(median: float, sigma: float, max_len: int, draws: int) -> float:
    # Cached: the limits and both bounds of every eta read it, and each draw is a Python call.
    draw = lognormal_lengths(median, sigma, max_len)
    rng = np.random.default_rng(12345)
    return float(np.mean([draw(rng) for _ in range(draws)]))
