"""Config validation: every bad value names its key and the fix, in one line.

That every file in configs/ builds is tested in tests/configs/.
"""

import pytest
from rljax.configs import arith_tiny

from rljax import config as C

SPLIT = {"mesh.mode": "split", "mesh.sampler_devices": 4, "mesh.learner_devices": 4}


def _one_line(exc: pytest.ExceptionInfo) -> str:
    msg = str(exc.value)
    assert "\n" not in msg
    return msg


@pytest.mark.parametrize(
    "changes, key, fix",
    [
        ({"learner.learning_rate": -0.1}, "learner.learning_rate", ">= 0"),
        ({"learner.group_size": 1}, "learner.group_size", ">= 2"),
        ({"learner.micro_batches": 1000}, "learner.micro_batches", "cannot exceed the batch"),
        ({"mode": "async", "buffer.max_staleness": -1}, "buffer.max_staleness", "eta >= 0"),
        ({"sampling.top_p": 1.5}, "sampling.top_p", "(0, 1]"),
        ({"sampling.top_p": 0.0}, "sampling.top_p", "(0, 1]"),
        ({"sampling.max_new_tokens": 0}, "sampling.max_new_tokens", "> 0"),
        ({"model.num_kv_heads": 3}, "model.num_kv_heads", "divisor"),
        (
            {"mesh.mode": "split", "mesh.sampler_devices": 0, "mesh.learner_devices": 4},
            "mesh.sampler_devices",
            "each side needs a device",
        ),
        ({"buffer.max_staleness": 2}, "buffer.max_staleness", "mode='async'"),
        ({"data.task": "gsm8k"}, "data.path", "JSONL"),
        ({"sft.teacher": "oracle"}, "sft.teacher", "drops_carries"),
        ({"sft.schedule": "linear"}, "sft.schedule", "cosine"),
        ({"sft.steps": 10, "sft.warmup_steps": 10}, "sft.warmup_steps", "fewer than sft.steps=10"),
        ({"sft.exact_steps": 5}, "sft.exact_steps", "teacher='reference'"),
        (
            {"sft.teacher": "drops_carries", "sft.steps": 4, "sft.exact_steps": 4},
            "sft.exact_steps",
            "fewer than sft.steps=4",
        ),
        ({"learner.decay_steps": -1}, "learner.decay_steps", ">= 0"),
        (
            {"num_steps": 200, "learner.warmup_steps": 10, "learner.decay_steps": 100},
            "learner.decay_steps",
            "at least 190",
        ),
        ({"sft.teacher": "drops_carries", "sft.teacher_slip": 1.0}, "sft.teacher_slip", "[0, 1)"),
        ({"sft.teacher_slip": 0.5}, "sft.teacher_slip", "teacher='reference'"),
        (
            {"sft.teacher": "drops_carries", "sft.teacher_slip": 0.5, "data.ops": "+-"},
            "sft.teacher",
            "only sums carry",
        ),
        ({**SPLIT, "mesh.reallocate": True}, "mesh.reallocate", "set mode='async'"),
        (
            {**SPLIT, "mode": "async", "mesh.reallocate": True, "lending.enabled": True},
            "lending.enabled",
            "lends or reallocates, not both",
        ),
        ({"tokenizer": "init"}, "tokenizer", "or init to a model"),
    ],
)
def test_bad_values_name_key_and_fix(changes, key, fix):
    base = C.RunConfig()
    with pytest.raises(C.ConfigError) as exc:
        C.replace(base, **changes)
    msg = _one_line(exc)
    assert f"'{key}'" in msg
    assert fix in msg


def test_unknown_key_is_named_with_valid_keys():
    d = C.to_config_dict(C.RunConfig()).to_dict()
    d["learner"]["lr"] = 1e-3
    with pytest.raises(C.ConfigError) as exc:
        C.from_config_dict(d)
    msg = _one_line(exc)
    assert "unknown config key 'learner.lr'" in msg
    assert "learning_rate" in msg


def test_round_trip_through_config_dict():
    cfg = C.replace(C.RunConfig(), **{"learner.beta": 0.05, "sampling.prefill_buckets": (8, 32)})
    assert C.from_config_dict(C.to_config_dict(cfg)) == cfg


def test_default_buckets_are_powers_of_two_up_to_max():
    assert C.SamplingConfig(max_prefill_length=100).buckets == (8, 16, 32, 64, 100)


def test_sft_off_ignores_its_step_counts():
    # sft.steps=0 turns the warm start off; the default's warmup and exact steps may stay.
    cfg = C.replace(arith_tiny.recipe(), **{"sft.steps": 0})
    assert (cfg.sft.steps, cfg.sft.warmup_steps, cfg.sft.exact_steps) == (0, 100, 600)
