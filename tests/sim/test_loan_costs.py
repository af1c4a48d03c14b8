"""Loan costs from published measurements (rljax.sim.loan_costs) and their use by every
lending scenario (rljax.sim.scenario.add_lending)."""

import pathlib

import pytest

from rljax.sim import loan_costs, scenario

CONFIGS = sorted(pathlib.Path("configs/sim").glob("lend_*.py"))


def test_the_line_goes_through_two_published_updates():
    for points in loan_costs.CHECKPOINT_ENGINE.values():
        line = loan_costs.fit_line(points)
        for p in points:
            assert line(p.gb_per_gpu) == pytest.approx(p.seconds)
        assert line.per_gb_s > 0 and line.fixed_s > 0


def test_published_rows_are_read_per_gpu():
    glm = loan_costs.CHECKPOINT_ENGINE["h800"][0]
    assert glm.gb_per_gpu == pytest.approx(106e9 * 2 / 8 / 1e9)
    assert glm.seconds == pytest.approx(3.59)


def test_a_line_needs_two_sizes():
    one = loan_costs.CHECKPOINT_ENGINE["h20"][:1]
    with pytest.raises(ValueError, match="two or more"):
        loan_costs.fit_line(one)
    with pytest.raises(ValueError, match="same bytes"):
        loan_costs.fit_line(one * 2)


def test_each_chip_takes_its_own_line_and_the_bytes_each_chip_holds():
    h20 = loan_costs.fit_line(loan_costs.CHECKPOINT_ENGINE["h20"])
    h800 = loan_costs.fit_line(loan_costs.CHECKPOINT_ENGINE["h800"])
    got = loan_costs.sourced(16e9, 2, "h20")
    assert got == {"prepare_s": round(h20(8.0), 3), "release_s": loan_costs.VERL_OMNI_RELEASE_S}
    assert loan_costs.sourced(16e9, 4, "tpu-v5p")["prepare_s"] == round(h800(4.0), 3)
    assert "no TPU figure" in loan_costs.basis(16e9, 4, "tpu-v5p")


@pytest.mark.parametrize("path", CONFIGS, ids=[p.stem for p in CONFIGS])
def test_every_lending_scenario_charges_the_sourced_costs(path):
    c = scenario.load_config_module(path).get_config("")
    want = loan_costs.sourced(scenario.cost_model(c).weight_bytes, c.tp, c.chip)
    assert c.lend.lending.prepare_s == want["prepare_s"]
    assert c.lend.lending.release_s == want["release_s"]
    assert "release" in c.lend.costs_basis


def test_an_explicit_cost_overrides_the_sourced_one():
    c = scenario.load_config_module("configs/sim/lend_short.py").get_config("small")
    again = scenario.add_lending(c, eta=1, splits=[16], lending={"prepare_s": 9.1})
    assert again.lend.lending.prepare_s == 9.1
    assert again.lend.lending.release_s == loan_costs.VERL_OMNI_RELEASE_S
