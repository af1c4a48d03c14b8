"""The staleness bound (rljax.testing.pipeline_workload) checked both ways.

No schedule beats it: on tiny instances, every split of the groups into learner steps and every
order of the steps is searched. A schedule reaches what it allows: the two-batch pipeline,
built by hand here, and the constructed schedule of the relaxation.
"""

import itertools

import numpy as np
import pytest
from scipy.optimize import linprog

from rljax.testing.pipeline_workload import Workload, earliest_makespan, makespan_floor

# Every response 40 tokens; 4 samples a step (B = 2 groups of G = 2) on 8 slots, a learner that
# costs next to nothing and a free publish: a step's batch decodes for longer than a step.
FIXED = Workload(
    slots=8,
    group_size=2,
    batch_groups=2,
    prompt_len=32,
    median_len=40,
    sigma=0.0,
    max_len=64,
    decode_s=0.002,
    decode_per_slot_s=1e-5,
    learn_per_token_s=1e-7,
    learn_fixed_s=0.0,
    sync_s=0.0,
    steps=6,
    warmup=2,
)


def test_the_two_batch_pipeline_reaches_the_ideal_at_eta_1():
    """Two batches in flight, each on 4 of the 8 slots, keep every slot busy.

    Batch k starts decoding at the publish of step k - 2 (version k - 1, one version old at
    step k) and runs its 40 tokens with all 8 slots live; the steps come one period P apart.
    The window of step k is a_k - p_(k-2) = 2 P - L - sync, which must hold that decode.
    """
    w = FIXED
    ideal_step_s = 1 / min(w.limits())
    decode_s = 40 * (w.decode_s + w.decode_per_slot_s * w.slots)  # 8 live slots
    learn_s = w.learn_fixed_s + w.learn_per_token_s * 4 * (w.prompt_len + 40)
    period = (decode_s + learn_s + w.sync_s) / 2
    assert period >= learn_s + w.sync_s  # the learner keeps up
    starts = np.arange(2, 40) * period
    publishes = starts + learn_s + w.sync_s
    # Each batch's decode fits in its window, and at most two batches (8 samples) overlap.
    windows = starts[2:] - publishes[:-2]
    assert np.all(windows >= decode_s - 1e-12)
    begins = publishes[:-2]
    for t in begins:
        live = np.sum((begins <= t) & (t < begins + decode_s))
        assert live * 4 <= w.slots
    reached = ideal_step_s / period
    assert reached == pytest.approx(1.0, abs=2e-3)
    # The bound may not claim less than a schedule reaches (it claimed 0.517 here).
    assert w.staleness_bound(1, groups=64) >= reached - 1e-9
    assert w.staleness_reachable(1, groups=64) >= reached - 1e-9


def test_eta_0_is_the_sync_limit():
    """At eta 0 every step samples, learns and publishes in turn."""
    w = FIXED
    one_slot_s = 40 * (w.decode_s + w.decode_per_slot_s)
    learn_s = w.learn_fixed_s + w.learn_per_token_s * 4 * (w.prompt_len + 40)
    expected = (1 / min(w.limits())) / (one_slot_s + learn_s + w.sync_s)
    assert w.staleness_bound(0, groups=64) == pytest.approx(expected)
    assert w.staleness_reachable(0, groups=64) == pytest.approx(expected)


def test_a_longer_bound_reaches_the_ideal():
    # Window eta + 1 gaps less one step: with the learner nearly free, D <= (eta + 1) T.
    assert FIXED.staleness_bound(2, groups=64) == pytest.approx(1.0)
    assert FIXED.staleness_reachable(2, groups=64) == pytest.approx(1.0, abs=1e-3)


def _random_instance(rng, steps, batch):
    groups = steps * batch
    return (
        rng.lognormal(0.0, 1.0, groups),  # each group's longest response, seconds
        rng.integers(1, 50, groups).astype(float),  # its tokens
        rng.uniform(0.0, 0.5),  # learner step: fixed seconds
        rng.uniform(0.0, 0.05),  # and per token
        rng.uniform(0.0, 0.2),  # publish
    )


def _steps(durations, tokens, fixed, per_token, split):
    longest = np.array([durations[list(s)].max() for s in split])
    costs = np.array([fixed + per_token * tokens[list(s)].sum() for s in split])
    return longest, costs


@pytest.mark.parametrize("eta", [0, 1, 2, 3])
def test_no_schedule_beats_the_floor_on_tiny_instances(eta):
    """Every split of the groups into steps and every order of the steps, on 21 instances."""
    rng = np.random.default_rng(eta)
    gaps = []
    for steps, batch in [(2, 1), (3, 1), (4, 1), (5, 1), (6, 1), (2, 2), (3, 2)] * 3:
        durations, tokens, fixed, per_token, sync = _random_instance(rng, steps, batch)
        best, least_sum = np.inf, np.inf
        for perm in itertools.permutations(range(steps * batch)):
            split = [perm[i * batch : (i + 1) * batch] for i in range(steps)]
            longest, costs = _steps(durations, tokens, fixed, per_token, split)
            best = min(best, earliest_makespan(longest, costs, sync, eta))
            least_sum = min(least_sum, longest.sum())
        # The floor's split (longest first, B at a time) has the least sum of D of any split.
        order = np.argsort(-durations, kind="stable")
        split = order.reshape(steps, batch)
        longest, costs = _steps(durations, tokens, fixed, per_token, split)
        assert longest.sum() == pytest.approx(least_sum)
        floor = makespan_floor(longest, costs, sync, eta)
        assert floor <= best * (1 + 1e-12)
        built = min(
            earliest_makespan(longest, costs, sync, eta),
            earliest_makespan(longest[::-1], costs[::-1], sync, eta),
        )
        assert built >= best * (1 - 1e-12)
        gaps.append(built / best)
    if eta == 0:
        # The sync limit is exact: the floor, the best schedule and the constructed one meet.
        assert max(gaps) == pytest.approx(1.0)


def test_earliest_start_is_the_best_start_for_an_order():
    """The LP over step start times (every constraint of the relaxation) finds no earlier end."""
    rng = np.random.default_rng(0)
    for eta in (0, 1, 2):
        for _ in range(5):
            n = 6
            longest, costs = rng.lognormal(0, 1, n), rng.uniform(0.05, 0.5, n)
            sync = 0.1
            # Variables: start of each step; publish_k = start_k + costs_k + sync.
            rows, bounds = [], []
            for k in range(n):
                if k > 0:  # start_k >= publish_(k-1)
                    row = np.zeros(n)
                    row[k - 1], row[k] = 1, -1
                    rows.append(row)
                    bounds.append(-(costs[k - 1] + sync))
                j = k - eta - 1
                row = np.zeros(n)
                row[k] = -1
                if j >= 0:  # start_k >= publish_j + longest_k
                    row[j] = 1
                    bounds.append(-(costs[j] + sync + longest[k]))
                else:  # the version exists at time 0
                    bounds.append(-longest[k])
                rows.append(row)
            objective = np.zeros(n)
            objective[-1] = 1
            lp = linprog(objective, A_ub=np.array(rows), b_ub=np.array(bounds))
            assert lp.status == 0
            expected = lp.fun + costs[-1] + sync
            assert earliest_makespan(longest, costs, sync, eta) == pytest.approx(expected)


def test_the_corrected_bound_on_the_benchmark_workload():
    """sigma 1.0 (the benchmark's first workload): the figures the docs quote."""
    w = Workload(
        slots=64,
        group_size=8,
        batch_groups=8,
        prompt_len=32,
        median_len=64,
        sigma=1.0,
        max_len=512,
        decode_s=0.002,
        decode_per_slot_s=1e-5,
        learn_per_token_s=3e-5,
        learn_fixed_s=0.02,
        sync_s=0.005,
        steps=16,
        warmup=3,
    )
    bound = [w.staleness_bound(eta, groups=4000) for eta in (0, 1, 2)]
    reached = [w.staleness_reachable(eta, groups=4000) for eta in (0, 1, 2)]
    assert bound == pytest.approx([0.33, 0.65, 0.98], abs=0.01)
    assert reached == pytest.approx([0.33, 0.65, 0.92], abs=0.01)
    # The steps taking the groups in the order drawn, not longest first: the sort is the
    # clairvoyant bound's whole margin over them (a third at every eta).
    in_order = [w.staleness_bound(eta, groups=4000, in_order=True) for eta in (0, 1, 2)]
    assert in_order == pytest.approx([0.22, 0.45, 0.67], abs=0.01)
