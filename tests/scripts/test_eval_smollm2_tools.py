"""scripts/eval_smollm2_tools.py: McNemar's exact test, and the figures of a run."""

import importlib.util
import math
import pathlib

import pytest

_PATH = pathlib.Path(__file__).resolve().parents[2] / "scripts" / "eval_smollm2_tools.py"
_SPEC = importlib.util.spec_from_file_location("eval_smollm2_tools", _PATH)
script = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(script)


def binomial_two_sided(k: int, n: int) -> float:
    """The two-sided p of k successes in n fair draws, summed outcome by outcome: every
    outcome no likelier than k's (the definition, not the script's tail formula)."""
    pmf = [math.comb(n, i) * 0.5**n for i in range(n + 1)]
    return min(1.0, sum(q for q in pmf if q <= pmf[k] * (1 + 1e-12)))


@pytest.mark.parametrize("b,c", [(0, 0), (1, 0), (3, 3), (5, 1), (1, 5), (10, 2), (40, 25)])
def test_mcnemar_exact_is_the_two_sided_binomial_tail(b, c):
    assert script.mcnemar_exact(b, c) == pytest.approx(binomial_two_sided(b, b + c), rel=1e-9)


def test_mcnemar_exact_where_every_change_goes_one_way():
    # base 2/96 right, final 96/96: b = 94, c = 0, p = 2 * 2**-94
    assert script.mcnemar_exact(94, 0) == pytest.approx(2.0**-93, rel=1e-12)
    assert script.mcnemar_exact(0, 94) == script.mcnemar_exact(94, 0)
    assert script.mcnemar_exact(5, 0) == pytest.approx(1 / 16)  # 2 * (1/2)**5


def test_paired_counts_problems_that_changed():
    before = [1.0, 0.0, 0.0, 1.0, 0.0, 0.5]  # 0.5: a partial reward is not right
    after = [1.0, 1.0, 1.0, 0.0, 0.0, 1.0]
    out = script.paired(before, after)
    assert (out["b"], out["c"]) == (3, 1)
    assert out["p"] == script.mcnemar_exact(3, 1)
    with pytest.raises(ValueError, match="4 and 3"):
        script.paired([0.0] * 4, [0.0] * 3)


def test_one_seed_reads_the_curve_after_the_warm_start(monkeypatch):
    runs = []

    def fake_train(cfg):
        runs.append(cfg)
        if cfg.num_steps == 0:  # the base model: no warm start, no RL
            base = {"step": 0, "phase": "eval_final", "heldout_accuracy": 0.25}
            return {"initial_accuracy": 0.25}, [base | {"heldout_rewards": [0, 0, 0, 1]}], 5.0
        records = [
            {"step": 0, "phase": "eval_initial", "heldout_accuracy": 0.25},
            {"step": 0, "phase": "train", "reward": 0.2},
            {"step": 2, "phase": "eval", "heldout_accuracy": 0.5},
            {"step": 4, "phase": "eval_final", "heldout_accuracy": 0.75},
        ]
        records[0]["heldout_rewards"] = [1, 0, 0, 0]
        records[2]["heldout_rewards"] = [1, 1, 0, 0]
        records[3]["heldout_rewards"] = [0, 1, 1, 1]
        summary = {"last": {"turns_per_conversation": 2.0}, "phase_s": {"learn": 1.234}}
        return summary, records, 99.0

    monkeypatch.setattr(script, "train", fake_train)
    out = script.one_seed(3)
    assert [c.seed for c in runs] == [3, 3] and runs[0].sft.steps == 0 and runs[1].sft.steps > 0
    assert out["base"] == 0.25 and out["curve"] == {0: 0.25, 2: 0.5, 4: 0.75}
    assert out["gain_points"] == pytest.approx(50.0)
    # the final model against the warm start, then against the base, problem by problem
    assert out["mcnemar"] == {"b": 3, "c": 1, "p": script.mcnemar_exact(3, 1)}
    assert out["mcnemar_vs_base"] == {"b": 2, "c": 0, "p": script.mcnemar_exact(2, 0)}
    assert out["phase_s"] == {"learn": 1.2} and out["wall_s"] == 99.0
