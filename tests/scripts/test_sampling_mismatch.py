"""scripts/sampling_mismatch.py --quick: f32 sampling matches the learner, bf16 measurably not."""

import importlib.util
import pathlib
import sys

REPO = pathlib.Path(__file__).resolve().parents[2]


def test_quick_run_separates_f32_from_bf16_sampling():
    spec = importlib.util.spec_from_file_location(
        "sampling_mismatch", REPO / "scripts/sampling_mismatch.py"
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    out = module.main(["--quick"])
    f32, bf16 = out["float32"], out["bfloat16"]
    assert f32["tokens"] > 0 and bf16["tokens"] > 0
    assert f32["abs_logp"] < 1e-5 and f32["k3"] < 1e-9  # the same program, the same precision
    assert 1e-4 < bf16["abs_logp"] < 0.1 and 0 < bf16["k3"] < 1e-2
