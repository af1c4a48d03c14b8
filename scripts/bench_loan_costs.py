"""What a Rollout-on-TrainPool loan costs RunLending on this machine, per model size.

  python scripts/bench_loan_costs.py                               # tiny + SmolLM2-135M, 7 each
  python scripts/bench_loan_costs.py --models=tiny --repeats=1     # a check that it runs

For each model a real ``Run`` is built on 8 fake CPU devices (a 6 / 2 sampler / learner split,
``lending.enabled``), and a loan of the learner's devices is forced and carried out through
RunLending's own hooks: ``waiting`` opens the lent replica (the learner's params cast and put
into the engine's layout on its devices, a ``Sampler`` built; the engine is built once per mesh,
so the first loan also pays its build and compiles), ``ready`` releases it (its requests handed
back, the replica closed). Prepare is timed to the copied weights being ready, release to its
return. The medians after the first loan are fitted across the models as
``seconds = fixed + per_gb * parameter GB`` (least squares; exact with two models): the form
``LendingConfig.prepare_s`` / ``release_s`` take for a model size. Prints one line per model and
ends with one line holding a JSON object. Times mean something only on an idle machine.
"""

from __future__ import annotations

import json
import os
import statistics
import tempfile
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import jax  # noqa: E402
from absl import app, flags  # noqa: E402
from rljax.configs import arith_tiny  # noqa: E402

from rljax.config import replace  # noqa: E402
from rljax.models.presets import get_preset  # noqa: E402
from rljax.policy.lending import LendDirection, LendingDecision  # noqa: E402
from rljax.runtime import Run  # noqa: E402

_MODELS = flags.DEFINE_list("models", ["tiny", "smollm2-135m"], "tiny and/or a preset name")
_REPEATS = flags.DEFINE_integer("repeats", 7, "loans timed per model after the first")
_CHIPS = flags.DEFINE_integer("chips", 2, "learner devices lent (of 2)")

# ModelConfig fields a preset carries (its architecture), dtype kept f32 for the CPU.
_ARCH = (
    "family",
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_layers",
    "num_heads",
    "num_kv_heads",
    "head_dim",
    "rope_theta",
    "norm_eps",
    "tie_embeddings",
    "qk_norm",
    "qkv_bias",
)


def config(model: str):
    """arith_tiny's small run on a 6 / 2 split with lending on, with ``model``'s shapes
    (randomly initialised: a loan moves bytes, whatever they hold)."""
    changes = {
        "mesh.mode": "split",
        "mesh.sampler_devices": 6,
        "mesh.learner_devices": 2,
        "lending.enabled": True,
    }
    if model != "tiny":
        preset = get_preset(model)
        changes.update({f"model.{k}": preset[k] for k in _ARCH if k in preset})
    return replace(arith_tiny.recipe("small"), **changes)


def measure(model: str, repeats: int, chips: int) -> dict:
    """Times ``repeats + 1`` loans of ``chips`` learner devices on one model."""
    with tempfile.TemporaryDirectory() as workdir:
        run = Run(config(model), workdir)
        try:
            lending = run.parts.lender
            lending.force = LendingDecision(LendDirection.ROLLOUT_ON_TRAIN, chips, 0.5, 0.0, "")
            params = run.learner.params
            nbytes = float(sum(x.nbytes for x in jax.tree.leaves(params)))
            prepare, release = [], []
            for _ in range(repeats + 1):
                start = time.perf_counter()
                lending.waiting(run.learner)
                lent = lending.replicas.lent
                if lent is None:
                    raise RuntimeError("the forced loan opened no replica; check lending.enabled")
                jax.block_until_ready(lent.params)
                opened = time.perf_counter()
                lending.ready()
                prepare.append(opened - start)
                release.append(time.perf_counter() - opened)
        finally:
            run.close()
    timed_p, timed_r = prepare[1:] or prepare, release[1:] or release
    return {
        "model": model,
        "param_bytes": nbytes,
        "first_prepare_s": round(prepare[0], 4),
        "prepare_s": round(statistics.median(timed_p), 4),
        "release_s": round(statistics.median(timed_r), 4),
        "prepare_range_s": [round(min(timed_p), 4), round(max(timed_p), 4)],
    }


def fit(rows: list[dict], key: str) -> dict | None:
    """Least-squares ``key = fixed + per_gb * GB`` over the models (None for one model)."""
    if len(rows) < 2:
        return None
    xs = [r["param_bytes"] / 1e9 for r in rows]
    ys = [r[key] for r in rows]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
    return {"fixed_s": round(my - slope * mx, 4), "per_gb_s": round(slope, 4)}


def main(argv) -> None:
    del argv
    rows = []
    for model in _MODELS.value:
        row = measure(model, _REPEATS.value, _CHIPS.value)
        rows.append(row)
        print(
            f"{model}: {row['param_bytes'] / 1e6:.1f} MB, first prepare {row['first_prepare_s']}"
            f" s (engine build + compile), prepare {row['prepare_s']} s, release "
            f"{row['release_s']} s",
            flush=True,
        )
    figures = {
        "rows": rows,
        "prepare_fit": fit(rows, "prepare_s"),
        "release_fit": fit(rows, "release_s"),
    }
    print(json.dumps(figures))


if __name__ == "__main__":
    app.run(main)
