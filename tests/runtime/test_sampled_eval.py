"""A run's held-out evaluation with eval.k samples per problem: it logs rljax eval's figures, the
held-out problems are the ones it evaluates, and no held-out problem is ever trained on."""

from __future__ import annotations

import json

import numpy as np
import pytest
from rljax.configs import arith_tiny

from rljax.config import ConfigError, replace
from rljax.data.tasks import load_task
from rljax.eval.estimators import pass_at_k
from rljax.runtime.run import Run

K = 4


def _parity(completion: str, example: dict) -> float:
    # Right on some problems and some samples: the figures are neither all 0 nor all 1.
    return float((len(completion) + int(example["answer"])) % 2 == 0)


def test_a_run_evaluates_k_samples_per_problem_and_never_trains_on_them(tmp_path):
    cfg = replace(
        arith_tiny.recipe("small"),
        **{
            "num_steps": 2,
            "eval_every": 1,
            "sft.steps": 0,
            "eval.k": K,
            "eval.temperature": 1.0,
        },
    )
    scored: list[str] = []  # every prompt whose completion was scored, trained or evaluated

    def parity(completion: str, example: dict) -> float:
        scored.append(example["prompt"])
        return _parity(completion, example)

    run = Run(cfg, str(tmp_path), reward_fn=parity)
    trained: list[str] = []
    make_batch = run.make_batch

    def spy(groups):
        trained.extend(g.example["prompt"] for g in groups)
        return make_batch(groups)

    run.make_batch = spy  # the driver is made when the run trains, after this
    try:
        run.train()
    finally:
        run.close()
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in rows if "heldout_rewards" in r]
    assert [r["phase"] for r in evals] == ["eval_initial", "eval", "eval_final"]
    for r in evals:
        assert r["eval_k"] == K and r["examples"] == cfg.eval_examples
        per_problem = np.asarray(r["heldout_rewards"])  # each problem's share of right samples
        assert np.all(per_problem * K == np.round(per_problem * K))
        assert r["heldout_accuracy"] == pytest.approx(per_problem.mean())
        assert r["eval/avg@k"] == pytest.approx(per_problem.mean())
        for j in (1, 2, 4):
            want = np.mean([pass_at_k(K, round(c * K), j) for c in per_problem])
            assert r[f"eval/pass@{j}"] == pytest.approx(want)
        assert {"eval/maj@k", "eval/tokens", "eval/truncated", "eval/pass@4_se"} <= set(r)
    assert 0 < sum(np.mean(r["heldout_rewards"]) for r in evals) < len(evals)
    # Sampled at eval.temperature, not greedily: some problem's k samples are not all alike.
    assert any(0 < c < 1 for r in evals for c in r["heldout_rewards"])
    # The held-out split is never trained on: no prompt of a trained group is held out.
    heldout = [ex["prompt"] for ex in load_task(cfg.data, cfg.seed)[1]]
    assert trained and not set(trained) & set(heldout)
    # The evaluated problems are the held-out ones (never trained: scored by the evaluation).
    assert set(heldout[: cfg.eval_examples]) <= set(scored)


def test_greedy_with_k_above_one_is_refused_in_one_line():
    with pytest.raises(ConfigError, match=r"'eval.k' = 4.*set eval.temperature above 0") as e:
        replace(arith_tiny.recipe("small"), **{"eval.k": 4})
    assert "\n" not in str(e.value)
