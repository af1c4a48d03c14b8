"""scripts/soak.py, short: every host queue within its bound, threads back, no group lost.

Boundedness is structural (each queue's peak against its bound from the config); nothing here
depends on how fast the machine is.
"""

import importlib.util
import json
import pathlib
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def soak():
    spec = importlib.util.spec_from_file_location("soak", REPO / "scripts/soak.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_short_soak_is_bounded_and_loses_nothing(soak):
    result = soak.soak(20 * soak.BATCH, interval=5 * soak.BATCH, log=lambda *_: None)
    assert result["over_bound"] == {}
    assert result["lost"] == 0 and result["duplicated"] == 0
    assert result["groups"] == 20 * soak.BATCH
    assert result["threads_after"] <= result["threads_before"]
    assert len(result["intervals"]) == 4
    bounds = result["bounds"]
    for row in result["intervals"]:
        assert all(row[k] <= bounds[k] for k in soak.QUEUES), row
    # Backpressure, not luck: the sampler filled what the staleness bound allows.
    assert result["peak"]["buffer_groups"] >= soak.BATCH
    assert result["ok"]


def test_main_prints_one_json_line_and_refuses_bad_sizes(soak, capsys):
    assert soak.main(["--groups", str(2 * soak.BATCH), "--interval", str(soak.BATCH)]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert json.loads(last)["ok"] is True
    with pytest.raises(SystemExit):
        soak.main(["--groups", "1"])
    assert f"at least one batch ({soak.BATCH} groups)" in capsys.readouterr().err
