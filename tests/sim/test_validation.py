"""The validation against published per-step figures (rljax.sim.validation): a fit recovers the
efficiencies that made the phases, every published figure is scored per step with its sign,
and the speed-ups are the published step times' ratio."""

import dataclasses

import ml_collections
import pytest

from rljax.sim import scenario, validation
from rljax.sim.workload import LengthModel

TRUE = dict(decode_hbm=0.45, decode_mfu=0.5, prefill_mfu=0.5, train_mfu=0.3, sync=0.5)


def _config(runs, speedups=(), knobs=None):
    c = scenario.scenario(
        "toy",
        model="qwen2.5-1.5b",
        chip="tpu-v5e",
        tp=1,
        efficiencies=dict(TRUE, decode_hbm=0.7, train_mfu=0.5),  # the fit's starting point
        train_flops=(8.0, 6.0),
        total_chips=8,
        steps=4,
        batch_groups=8,
        group_size=4,
        prompt_tokens=64,
        lengths=dict(median=200.0, sigma=0.5, tail_prob=0.0, max_tokens=1024),
        phase_steps=2,
    )
    system = dict(name="toy", source="here", eta=1, scenario={}, runs=runs, speedups=speedups)
    c.validation = ml_collections.ConfigDict(
        dict(
            enabled=True,
            steps=8,
            fit_steps=8,
            bisections=14,
            fit=dict(system="toy", run="colocated_8"),
            systems=[system],
            knobs=knobs or {},
        )
    )
    return c


def _truth(c, run, steps):
    """The phases the toy system 'publishes': the simulator at the TRUE efficiencies."""
    cost = scenario.cost_model(c)
    cost = dataclasses.replace(cost, efficiencies=dataclasses.replace(cost.efficiencies, **TRUE))
    lengths = validation.run_lengths(c, run)
    return validation.phases(c, cost, lengths, run, eta=1, steps=steps)


COLOCATED = dict(name="colocated_8", mode="sync", chips=8)
ASYNC = dict(name="async_4_4", mode="async", chips=8, sampler_chips=4)


@pytest.fixture(scope="module")
def published():
    c = _config([COLOCATED, ASYNC])
    runs = []
    for run, steps in ((COLOCATED, 8), (ASYNC, 8)):
        got = _truth(c, run, steps)
        runs.append(dict(run, step_s=got["step_s"], gen_s=got["gen_s"], train_s=got["train_s"]))
    return runs


def test_the_fit_recovers_the_efficiencies_that_made_the_phases(published):
    c = _config(published)
    cost, figures = validation.fit(c)
    assert figures["decode_hbm"] == pytest.approx(TRUE["decode_hbm"], abs=0.01)
    assert figures["train_mfu"] == pytest.approx(TRUE["train_mfu"], rel=0.01)
    assert cost.efficiencies.decode_mfu == TRUE["decode_mfu"]  # nothing else is fitted


def test_every_figure_is_scored_per_step_with_its_sign(published):
    c = _config(published, speedups=[("colocated_8", "async_4_4")])
    cost, _ = validation.fit(c)
    rows = validation.score(c, validation.predict(c, cost))
    by = {r.figure: r for r in rows}
    assert set(by) == {"colocated_8 step_s", "async_4_4 step_s", "colocated_8 / async_4_4"}
    assert by["colocated_8 step_s"].role == "fit"
    assert by["async_4_4 step_s"].role == "held-out"
    # The speed-up is the published colocated step over the published async step.
    pub = {r["name"]: r for r in published}
    assert by["colocated_8 / async_4_4"].published == pytest.approx(
        pub["colocated_8"]["step_s"] / pub["async_4_4"]["step_s"]
    )
    # Predicted from the same efficiencies it was made with: every error is small.
    for r in rows:
        assert abs(r.error) < 0.05, r
    assert by["async_4_4 step_s"].gen_error is not None  # phases published: phases scored
    table = validation.table(rows)
    assert table.count("\n") == len(rows) + 1 and "colocated_8 / async_4_4" in table


def test_a_slower_prediction_has_a_positive_error():
    row = validation.Scored("s", "f", "held-out", "src", published=100.0, predicted=125.0)
    assert row.error == pytest.approx(0.25)
    assert validation.signed_error(75.0, 100.0) == pytest.approx(-0.25)
    with pytest.raises(ValueError, match="must be > 0"):
        validation.signed_error(1.0, 0.0)


def test_a_held_out_figure_moves_no_fitted_efficiency(published):
    # Changing what a held-out run published changes its score, never the fit.
    edited = [dict(r, step_s=r["step_s"] * 3) if r["mode"] == "async" else r for r in published]
    assert validation.fit(_config(published))[1] == validation.fit(_config(edited))[1]


def test_the_fitted_run_must_publish_its_phases():
    c = _config([dict(COLOCATED, step_s=10.0)])
    with pytest.raises(ValueError, match="publishes its phases"):
        validation.fit(c)


def test_the_median_is_solved_for_a_published_mean():
    lengths = LengthModel(median=100.0, sigma=0.7, tail_prob=0.0, max_tokens=4000)
    median = validation.median_for_mean(lengths, 1060)
    assert dataclasses.replace(lengths, median=median).mean() == pytest.approx(1060, rel=0.005)
    with pytest.raises(ValueError, match="outside"):
        validation.median_for_mean(lengths, 5000)


def test_the_band_runs_each_unpublished_setting(published):
    c = _config(published, knobs={"toy": {"eta": [2], "sigma": [0.8]}})
    cost, _ = validation.fit(c)
    rows = validation.score(c, validation.predict(c, cost))
    lows, settings = validation.band(c, cost, rows)
    assert [s["setting"] for s in settings] == ["toy eta=2", "toy sigma=0.8"]
    for r in rows:
        lo, hi = lows[(r.system, r.figure)]
        assert lo <= r.predicted <= hi


def test_the_steady_step_leaves_the_pipeline_fill_out():
    from rljax.sim.results import SimResult
    from rljax.sim.simulator import Simulator
    from tests.sim.test_simulator import COST, LENGTHS, small

    res = Simulator(small("async", steps=8), COST, LENGTHS).run()
    assert len(res.step_ends) == res.steps == 8
    assert list(res.step_ends) == sorted(res.step_ends) and res.step_ends[-1] == res.wall_s
    ends = res.step_ends
    assert res.steady_step_s(2) == pytest.approx((ends[-1] - ends[2]) / 5)
    fill = SimResult(**{**res.__dict__, "step_ends": (100.0, 101.0, 102.0)})
    assert fill.steady_step_s(0) == pytest.approx(1.0)  # the 100 s fill is not a step
    with pytest.raises(ValueError, match="skip fewer"):
        res.steady_step_s(7)
