"""A LoRA run end to end: the sampler receives the base once and the adapters at every
publish, checkpoints hold the adapters and their optimiser state only, and a stopped run
resumes bitwise (sync mode)."""

from __future__ import annotations

import json

import jax
import numpy as np
import pytest
from rljax.configs import arith_tiny

from rljax.config import replace
from rljax.models import lora
from rljax.runtime.run import Run

STEPS = 3


def _length_reward(completion: str, example: dict) -> float:
    return float(len(completion) % 3)  # varied, so every group has signal


def _cfg(**changes):
    return replace(
        arith_tiny.recipe("small"),
        **{
            "num_steps": STEPS,
            "lora.enabled": True,
            "lora.rank": 4,
            "learner.learning_rate": 1e-2,
            "checkpoint.enabled": True,
            "checkpoint.every_steps": 1,
            "checkpoint.async_save": False,
            "metrics.progress_bar": False,
            **changes,
        },
    )


def _train(cfg, workdir, stop_after=None, lend=None):
    run = Run(cfg, str(workdir), reward_fn=_length_reward)
    if lend is not None:
        run.parts.lender.force = lend
    if stop_after is not None:
        run.step_hooks.append(lambda r, step: r.request_stop() if step == stop_after else None)
    try:
        summary = run.train()
    finally:
        run.close()
    return run, summary


def _train_rows(workdir):
    rows = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if r["phase"] == "train"]


def _host(tree):
    return [np.asarray(x) for x in jax.tree.leaves(jax.device_get(tree))]


def test_lora_run_moves_adapters_and_resumes_bitwise(tmp_path):
    whole, _ = _train(_cfg(), tmp_path / "whole")
    rows = _train_rows(tmp_path / "whole")
    assert [r["step"] for r in rows] == list(range(STEPS))
    assert all(r["grad_norm"] > 0 for r in rows)
    adapters, base = lora.split_adapters(whole.learner.params)
    adapter_bytes = sum(x.nbytes for x in jax.tree.leaves(adapters))
    base_bytes = sum(x.nbytes for x in jax.tree.leaves(base))
    # Every publish after the sampler's first copy moves the adapters alone.
    assert [r["sync_bytes"] for r in rows] == [adapter_bytes] * STEPS
    assert adapter_bytes < base_bytes / 10
    # The checkpoint holds no base weight: its params item names adapters only.
    params_dir = tmp_path / "whole" / "checkpoints" / str(STEPS) / "params"
    names = (params_dir / "_METADATA").read_text()
    assert "wq_lora_a" in names and "'embed'" not in names and '"embed"' not in names

    _, summary = _train(_cfg(), tmp_path / "cut", stop_after=1)
    assert summary["stopped"] and summary["steps"] == 2
    resumed, _ = _train(_cfg(), tmp_path / "cut")
    cut_rows = _train_rows(tmp_path / "cut")
    keys = ("loss", "grad_norm", "reward")
    assert [[r[k] for k in keys] for r in cut_rows] == [[r[k] for k in keys] for r in rows]
    for a, b in zip(_host(resumed.learner.params), _host(whole.learner.params), strict=True):
        np.testing.assert_array_equal(a, b)
    for a, b in zip(_host(resumed.learner.opt_state), _host(whole.learner.opt_state), strict=True):
        np.testing.assert_array_equal(a, b)


def test_lora_lends_gradients_like_the_unlent_run(tmp_path):
    # Trainer-on-RollPool with adapters: the lent micro-batch's adapter gradients come back
    # and sum into the update as the learner's own would.
    from rljax.policy.lending import LendDirection, LendingDecision

    split = {
        "mesh.mode": "split",
        "mesh.sampler_devices": 6,
        "mesh.learner_devices": 2,
        "learner.micro_batches": 2,
        "num_steps": 2,
        "checkpoint.enabled": False,
    }
    plain, _ = _train(_cfg(**split), tmp_path / "plain")
    lend = LendingDecision(LendDirection.TRAIN_ON_ROLL, 6, 0.5, 0.0, "test")
    run, _ = _train(_cfg(**split, **{"lending.enabled": True}), tmp_path / "lent", lend=lend)
    want, got = _train_rows(tmp_path / "plain"), _train_rows(tmp_path / "lent")
    assert [r["lending/lent_micro_batches"] for r in got] == [1, 1]
    for key in ("loss", "grad_norm"):
        np.testing.assert_allclose([r[key] for r in got], [r[key] for r in want], rtol=1e-5)
    assert all(r["grad_norm"] > 0 for r in got)
    for a, b in zip(_host(run.learner.params), _host(plain.learner.params), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


def test_lora_trains_an_agent(tmp_path):
    # Conversations with a tool: env tokens carry no loss, the adapters alone train and move.
    from rljax.configs import arith_tools

    cfg = replace(
        arith_tools.recipe("small"),
        **{"lora.enabled": True, "lora.rank": 8, "metrics.progress_bar": False},
    )
    run = Run(cfg, str(tmp_path))
    try:
        run.train()
    finally:
        run.close()
    rows = _train_rows(tmp_path)
    adapters = lora.split_adapters(run.learner.params)[0]
    moved = sum(x.nbytes for x in jax.tree.leaves(adapters))
    assert [r["sync_bytes"] for r in rows] == [moved] * cfg.num_steps
    assert (
        sum(r["tool_calls"] for r in rows) > 0
        and max(r["turns_per_conversation"] for r in rows) > 1
    )
    assert any(r["grad_norm"] > 0 for r in rows)


@pytest.mark.parametrize("serving", ["merged", "unmerged"])
def test_f32_adapters_on_a_bf16_base(tmp_path, serving):
    """``lora.dtype='float32'`` on a bf16 base: the learner trains f32 adapters (their Adam
    moments f32 too) beside the bf16 base, and the bf16 sampler serves them in bf16, merged
    into its weights or beside them."""
    bf16, f32 = jax.numpy.dtype("bfloat16"), jax.numpy.dtype("float32")
    cfg = _cfg(
        **{
            "model.dtype": "bfloat16",
            "model.param_dtype": "bfloat16",
            "sampling.dtype": "bfloat16",
            "lora.dtype": "float32",
            "lora.serving": serving,
            "num_steps": 2,
            "checkpoint.enabled": False,
        }
    )
    run, summary = _train(cfg, tmp_path)
    assert summary["steps"] == 2 and all(r["grad_norm"] > 0 for r in _train_rows(tmp_path))
    adapters, base = lora.split_adapters(run.learner.params)
    assert {x.dtype for x in jax.tree.leaves(adapters)} == {f32}
    assert {x.dtype for x in jax.tree.leaves(base)} == {bf16}
    floating = [x for x in jax.tree.leaves(run.learner.opt_state) if x.ndim >= 2]
    assert floating and {x.dtype for x in floating} == {f32}  # the adapters' moments
    served = [x for x in jax.tree.leaves(run.sampler.params) if x.dtype in (bf16, f32)]
    assert {x.dtype for x in served} == {bf16}
    layers = run.sampler.params.layers  # the CPU's per-layer serving layout
    adapter_keys = {k for layer in layers for k in layer if lora.is_adapter(k)}
    assert bool(adapter_keys) == (serving == "unmerged")  # unmerged: beside the base
