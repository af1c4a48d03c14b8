"""Model-based rewards that cannot work: refused in one line before the run writes anything."""

import dataclasses
import json

import jax
import numpy as np
import pytest
from flax import nnx
from rljax.configs import arith_tiny

from rljax.config import ConfigError, replace
from rljax.models import hf
from rljax.models.classifier import save_classifier
from rljax.models.transformer import abstract_decoder
from rljax.runtime.run import Run
from rljax.testing import TINY_MODEL

CFG = arith_tiny.recipe("small")


def random_params(cfg):
    """Random weights of the right shapes, straight from the abstract model: nothing compiles."""
    abstract = nnx.to_pure_dict(nnx.split(abstract_decoder(cfg))[1])
    rng = np.random.default_rng(0)
    return {k: rng.standard_normal(v.shape).astype(v.dtype) for k, v in abstract.items()}


def classifier(path, cfg=TINY_MODEL):
    save_classifier(path, cfg, random_params(cfg), np.ones(cfg.hidden_size), pad_token_id=0)
    return str(path)


def model_run(workdir, path):
    cfg = replace(CFG, **{"reward.name": "model", "reward.model.path": path})
    return lambda: Run(cfg, str(workdir))


def test_a_causal_lm_is_not_a_reward_model(refused, check_row, workdir, tmp_path):
    hf.save_hf(tmp_path / "lm", TINY_MODEL, random_params(TINY_MODEL))
    message = refused(model_run(workdir, str(tmp_path / "lm")), ConfigError, workdir)
    check_row("R01", message, "train or convert one (scripts/train_rm.py writes one)")


def test_a_reward_model_has_one_label(refused, check_row, workdir, tmp_path):
    path = classifier(tmp_path / "rm")
    config = json.loads((tmp_path / "rm" / "config.json").read_text())
    config["id2label"] = {"0": "bad", "1": "good"}
    (tmp_path / "rm" / "config.json").write_text(json.dumps(config))
    message = refused(model_run(workdir, path), ConfigError, workdir)
    check_row("R02", message, "use a checkpoint trained with num_labels=1")


def test_the_policy_tokenizer_must_fit_the_reward_model(refused, check_row, workdir, tmp_path):
    path = classifier(tmp_path / "rm", dataclasses.replace(TINY_MODEL, vocab_size=16))
    message = refused(model_run(workdir, path), ConfigError, workdir)
    check_row("R09", message, "set reward.model.tokenizer to the tokenizer it was trained with")


CASES = [
    ("R03", ["--config.reward.judge.template=Rate: {prompt}"], "a {response} slot"),
    (
        "R04",
        ["--config.reward.judge.template={question} {response}"],
        "expected only the slots {prompt}, {response}, {answer}",
    ),
    ("R05", ["--config.reward.name=model"], "expected a checkpoint directory"),
    (
        "R06",
        [
            "--config.reward.name=judge",
            "--config.reward.judge.path=/no/judge",
            "--config.reward.mode=process",
        ],
        "set reward.mode='thread'",
    ),
    (
        "R10",
        [
            "--config.reward.name=model",
            "--config.reward.model.path=/no/model",
            f"--config.reward.model.devices=({len(jax.local_devices())},)",
        ],
        f"use indices below {len(jax.local_devices())}",
    ),
    (
        "R11",
        [
            "--config.reward.name=model",
            "--config.reward.model.path=/no/model",
            "--config.env.name=lookup",
        ],
        "set env.name='' or reward.name to a verifier",
    ),
]


@pytest.mark.parametrize("row_id, args, fix", CASES, ids=[c[0] for c in CASES])
def test_bad_reward_command_line(launch_error, check_row, row_id, args, fix):
    check_row(row_id, launch_error(*args), fix)


@pytest.mark.parametrize(
    "row_id, changes, fix",
    [
        ("R07", {"reward.weights": {"exact_match": 0.5, "math_answer": 0.5}}, "or neither"),
        (
            "R08",
            {"reward.name": "weighted", "reward.weights": {"exact_match": 0.5, "f1": 0.5}},
            "set config key 'reward.weights' to one of them",
        ),
    ],
    ids=["R07", "R08"],
)
def test_bad_weights(refused, check_row, workdir, row_id, changes, fix):
    message = refused(lambda: Run(replace(CFG, **changes), str(workdir)), ConfigError, workdir)
    check_row(row_id, message, fix)
