"""Resuming with a changed config: refused with one line naming the keys, unless every change
is among the keys that may change on resume (rljax.runtime.resume.RESUMABLE_KEYS)."""

from __future__ import annotations

import logging

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import NamedSharding, PartitionSpec
from rljax.configs import arith_tiny

from rljax.checkpoint import Checkpointer
from rljax.config import CheckpointConfig, ConfigError, RunConfig, replace
from rljax.models.sharding import make_mesh
from rljax.runtime import resume

CFG = arith_tiny.recipe("small")


def _meta(cfg: RunConfig) -> dict:
    return resume.checkpoint_meta(
        version=3, data_state={"i": 0}, initial_accuracy=0.5, metrics_offset=0, config=cfg
    )


def test_flat_config_names_every_key():
    flat = resume.flat_config(CFG)
    assert flat["learner.learning_rate"] == CFG.learner.learning_rate
    assert flat["num_steps"] == 3 and flat["reward.on_failure"] == "zero"
    assert all(not isinstance(v, dict) for v in flat.values())


@pytest.mark.parametrize(
    "changes",
    [
        {},
        {"num_steps": 50, "eval_every": 5, "eval_examples": 8, "kernel_impl": "xla"},
        {"checkpoint.keep": 7, "checkpoint.every_steps": 2, "metrics.trace": True},
        {"mesh.mode": "split", "mesh.sampler_devices": 2, "mesh.learner_devices": 2},
        {"reward.timeout_s": 30.0, "reward.num_workers": 8, "reward.mode": "process"},
    ],
)
def test_resumable_changes_pass(changes):
    resume.check_resume_config(_meta(CFG), replace(CFG, **changes), where="/w")


def test_changed_keys_are_named_in_one_line():
    changed = replace(CFG, **{"learner.learning_rate": 5e-4, "model.num_layers": 3, "num_steps": 9})
    with pytest.raises(ConfigError) as err:
        resume.check_resume_config(_meta(CFG), changed, where="/w/checkpoints")
    msg = str(err.value)
    assert "\n" not in msg
    assert msg.startswith("the checkpoint in /w/checkpoints was saved with a different config: ")
    assert "learner.learning_rate (0.001 -> 0.0005)" in msg
    assert "model.num_layers (2 -> 3)" in msg
    assert "num_steps (" not in msg  # may change
    assert "set those keys back to the saved values, or use a new workdir" in msg


def test_keys_newer_than_the_checkpoint_compare_with_their_default(caplog):
    meta = _meta(CFG)
    del meta["config"]["reward.on_failure"]  # saved before the key existed
    resume.check_resume_config(meta, CFG)
    with pytest.raises(ConfigError, match=r"reward.on_failure \('zero' -> 'drop'\)"):
        resume.check_resume_config(meta, replace(CFG, **{"reward.on_failure": "drop"}))
    meta["config"]["a.removed.key"] = 1  # a key this rljax no longer has is ignored
    resume.check_resume_config(meta, CFG)
    del meta["config"]
    with caplog.at_level(logging.WARNING, logger="rljax.runtime.resume"):
        resume.check_resume_config(meta, CFG, where="/old")
    assert "checkpoint /old holds no run config" in caplog.text


def test_restore_refuses_before_touching_the_model(tmp_path):
    mesh = make_mesh(jax.devices()[:1], {"fsdp": 1, "tensor": 1})
    tree = {"w": jax.device_put(jnp.zeros(4), NamedSharding(mesh, PartitionSpec()))}
    cfg = CheckpointConfig(enabled=True, every_steps=1, keep=2, async_save=False)
    with Checkpointer(tmp_path, cfg) as ckpt:
        ckpt.save(3, params=tree, opt_state=tree, meta=_meta(CFG))
        assert ckpt.read_meta()["config"] == resume.flat_config(CFG)
        changed = replace(CFG, **{"learner.group_size": 4})
        # The saved arrays are no learner state, and there is no restore target at all: only
        # the config check, before anything is read, can stop it.
        with pytest.raises(ConfigError, match=r"learner.group_size \(8 -> 4\)"):
            resume.restore(ckpt, changed, None)


def test_a_lora_checkpoint_records_its_base_and_refuses_another(tmp_path):
    base = tmp_path / "base.gguf"
    base.write_bytes(b"\0" * 100)
    cfg = replace(CFG, **{"lora.enabled": True, "init": str(base), "tokenizer": "char"})
    meta = _meta(cfg)
    assert meta["lora_base"] == {"init": str(base), "bytes": 100}
    assert "lora_base" not in _meta(CFG)  # full fine-tuning checkpoints the base itself
    resume.check_lora_base(meta, cfg, where="/w")
    base.write_bytes(b"\0" * 90)  # another file at the same path
    with pytest.raises(ConfigError) as err:
        resume.check_lora_base(meta, cfg, where="/w")
    msg = str(err.value)
    assert "\n" not in msg and "restore the base it was trained on, or use a new workdir" in msg
