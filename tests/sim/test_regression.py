"""The simulator's optimised hot paths reproduce the figures of the straightforward version.

``EXPECTED_*`` were computed by the simulator at commit 11db115, before the event loop, replica
clock and length draws were optimised (the optimisation reorders no arithmetic, so the figures
agree to float rounding). A change that alters results, not just speed, fails here. The async
cases were re-taken when the staleness buffer's seats began to float (earliest deadline first:
a group that completes early fills the buffer the learner waits on), a deliberate policy change
that made every async case faster (overprovision: 61.3 -> 54.7 s).
"""

import math
import random

import pytest

from rljax.models.presets import PRESETS
from rljax.sim.chips import CHIPS
from rljax.sim.costs import CostModel
from rljax.sim.simulator import SimConfig, Simulator
from rljax.sim.workload import LengthModel

SMALL_COST = CostModel(PRESETS["qwen2.5-1.5b"], CHIPS["tpu-v5e"], tp=1)
SMALL_LENGTHS = LengthModel(median=300, sigma=0.8, tail_prob=0.05, max_tokens=2048)
POD_COST = CostModel(PRESETS["qwen2.5-7b"], CHIPS["tpu-v5p"], tp=4)
GROWING = LengthModel(
    median=700, sigma=0.7, tail_prob=0.002, max_tokens=16384, growth=10.0, growth_steps=40
)


def small(mode, **overrides):
    fields = dict(
        mode=mode,
        total_chips=16,
        sampler_chips=8,
        steps=12,
        batch_groups=8,
        group_size=4,
        prompt_tokens=64,
        max_staleness=0 if mode == "sync" else 2,
        max_slots=32,
        granularity=2,
        seed=3,
    )
    fields.update(overrides)
    return SimConfig(**fields), SMALL_COST, SMALL_LENGTHS


def pod(mode, sampler_chips):
    # Qwen2.5-7B on 64 v5p chips with growing lengths: the growing_v5p128 scenario, 40 steps.
    config = SimConfig(
        mode=mode,
        total_chips=64,
        sampler_chips=sampler_chips,
        steps=40,
        batch_groups=64,
        group_size=16,
        prompt_tokens=512,
        max_staleness=0 if mode == "sync" else 4,
        max_slots=256,
        seed=0,
    )
    return config, POD_COST, GROWING


CASES = {
    "sync": small("sync"),
    "async": small("async"),
    "overprovision": small("async", overprovision=2),
    "pod-sync": pod("sync", 32),
    "pod-async-16": pod("async", 16),
    "pod-async-44": pod("async", 44),
}

# (wall_s, sampler_util, learner_util) and (dispatched, aborted, in_flight, held,
# sum(staleness), timeline spans) of each case.
EXPECTED_FIGURES = {
    "sync": (169.70027091080587, 0.2360937946172514, 0.009560810543827502),
    "async": (65.7245062025323, 0.8765921017271412, 0.04937190807990898),
    "overprovision": (54.69711145031056, 0.9091502053488572, 0.048098744141142076),
    "pod-sync": (2965.49411773103, 0.5899526607217376, 0.2759962902426935),
    "pod-async-16": (2148.958984376554, 0.9995790759702992, 0.44673309123871807),
    "pod-async-44": (2321.977060183673, 0.8324497874510981, 0.9790892756979687),
}
EXPECTED_COUNTS = {
    "sync": (96, 0, 0, 0, 0, 120),
    "async": (112, 0, 4, 12, 168, 57),
    "overprovision": (143, 27, 20, 0, 165, 55),
    "pod-sync": (2560, 0, 0, 0, 0, 720),
    "pod-async-16": (2716, 0, 135, 21, 8592, 85),
    "pod-async-44": (2816, 0, 0, 256, 9600, 390),
}


@pytest.mark.parametrize("name", list(CASES))
def test_results_match_the_unoptimised_simulator(name):
    config, cost, lengths = CASES[name]
    r = Simulator(config, cost, lengths).run()
    got = [r.wall_s, r.sampler_util, r.learner_util]
    counts = [r.dispatched, r.aborted, r.in_flight, r.held, sum(r.staleness), len(r.spans)]
    assert got == pytest.approx(EXPECTED_FIGURES[name], rel=1e-9)
    assert tuple(counts) == EXPECTED_COUNTS[name]


def test_group_draws_are_the_lognormvariate_stream():
    model = LengthModel(median=700, sigma=0.7, tail_prob=0.02, max_tokens=16384, growth=10.0)
    draw = model.group_sampler(5)
    rng, mu = random.Random(5), math.log(model.median)

    def reference(version):
        if rng.random() < model.tail_prob:
            return model.max_tokens
        length = rng.lognormvariate(mu, model.sigma) * model.scale(version)
        return int(min(model.max_tokens, max(1, round(length))))

    got = [x for version in range(0, 1000, 5) for x in draw(version, 16)]
    assert got == [reference(version) for version in range(0, 1000, 5) for _ in range(16)]
    assert model.max_tokens in got  # the tail branch ran
    one, group = model.sampler(5), model.group_sampler(5)
    assert [one(v) for v in range(50)] == [x for v in range(50) for x in group(v, 1)]
