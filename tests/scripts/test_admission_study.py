"""scripts/admission_study.py: the event model's seats, and a tiny run of every rule."""

import importlib.util
import pathlib
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def study():
    path = REPO / "scripts/admission_study.py"
    spec = importlib.util.spec_from_file_location("admission_study", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_seats_follow_the_staleness_buffer(study):
    """A group reserved at version v needs a seat in buffers V..v+eta: eta + 1 buffers of B
    hold at most (eta + 1) B, and groups due at V fill V's B seats first."""
    g = lambda v: study._Group(v, [1], 0, 1)  # noqa: E731
    B, eta = 2, 1
    assert study._seat_free([g(0)] * 3, 0, 0, eta, B)
    assert not study._seat_free([g(0)] * 4, 0, 0, eta, B)
    # Two groups due at version 1 (reserved at 0) fill buffer 1 at V = 1: one reserved at 1
    # (due at 2) still fits, with buffer 2's seats.
    assert study._seat_free([g(0), g(0)], 1, 1, eta, B)
    assert not study._seat_free([g(0), g(0), g(0)], 1, 0, eta, B)


def test_every_rule_runs_and_stays_under_its_limits(study):
    out = study.main(["--rho=0,0.8", "--seeds=0", "--etas=1", "--steps=6", "--lookahead=8"])
    assert {r["rule"] for r in out["rows"]} == set(study.RULES)
    for row in out["rows"]:
        assert 0 < row["bound_of_ideal"] <= 1
        assert 0 < row["slot_occupancy_median"] <= 1
        assert 0 < row["of_bound_median"] * row["bound_of_ideal"] < 1.1  # of the ideal
