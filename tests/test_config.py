"""Config validation: every bad value names its key and the fix, in one line.

That every file in configs/ builds is tested in tests/configs/.
"""

import dataclasses
import pathlib

import pytest
from rljax.configs import arith_tiny

from rljax import config as C
from rljax.config import keys

DOC = pathlib.Path(__file__).resolve().parents[1] / "docs" / "runtime.md"

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


def test_docs_list_every_config_key_with_its_default():
    doc = DOC.read_text()
    assert keys.with_table(doc) == doc, (
        "docs/runtime.md's config key table differs from the config dataclasses; run "
        "`python scripts/config_keys.py --write`"
    )


def _dotted(config: dict, cfg, prefix: str = "") -> list[str]:
    """Every key of a ConfigDict's dict form, walking into the sections and their sub-sections
    (``reward.model``) but not into a mapping-valued key (``reward.weights``)."""
    out = []
    for name, value in config.items():
        section = getattr(cfg, name)
        if dataclasses.is_dataclass(section):
            out += _dotted(value, section, f"{prefix}{name}.")
        else:
            out.append(f"{prefix}{name}")
    return out


def test_every_key_is_in_the_table_once():
    table = keys.markdown()
    paths = _dotted(C.to_config_dict(C.RunConfig()).to_dict(), C.RunConfig())
    assert "reward.model.path" in paths and "reward.weights" in paths
    assert sorted(paths) == sorted(k for s in keys.sections() for k, _, _ in s.rows)
    assert all(table.count(f"| `{p}` |") == 1 for p in paths)


@dataclasses.dataclass(frozen=True)
class _Section:
    """A section.

    Attributes:
      short: one line.
      long: a first line
        that goes on.
      low / high: two fields, one entry.
    """

    short: int = 0
    long: str = "x"
    low: float = 0.0
    high: float = 1.0


def test_field_docs_read_the_attributes_entries():
    assert keys.field_docs(_Section) == {
        "short": "one line.",
        "long": "a first line that goes on.",
        "low": "two fields, one entry.",
        "high": "two fields, one entry.",
    }
    (section,) = keys.sections(_Section)
    assert section.rows[1] == ("long", "x", "a first line that goes on.")


def test_a_field_without_an_entry_is_refused():
    def section(name, fields):
        cls = dataclasses.make_dataclass(name, fields, frozen=True)
        cls.__doc__ = _Section.__doc__
        return cls

    undocumented = section("Undocumented", [*_FIELDS, ("new_key", int, 0)])
    with pytest.raises(ValueError, match="Undocumented.new_key has no entry under Attributes:"):
        keys.sections(undocumented)
    with pytest.raises(ValueError, match="documents 'high' under Attributes:, which is not"):
        keys.sections(section("Renamed", _FIELDS[:3]))


_FIELDS = [("short", int, 0), ("long", str, "x"), ("low", float, 0.0), ("high", float, 1.0)]
