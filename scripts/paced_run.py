"""One process on a slower learner's schedule: each RL learner step padded to ``--learner_step_s``.

An asynchronous run's schedule (how far ahead the sampler runs, so the staleness each group is
consumed at) follows from how long each role's step takes. A localhost pod's learner steps pay
for gloo collectives and take about twice as long as one process's, so its sampler always runs
the full eta ahead, while one process consumes most groups one version fresher. To compare the
pod's arithmetic with one process's on the same schedule, this runs the launcher's config in
one process with every RL learner step padded (a sleep after it) to the pod's median learner
step; the warm start and evaluations are not padded.

    JAX_NUM_CPU_DEVICES=8 python scripts/paced_run.py --learner_step_s=0.8 \\
        --config=configs/arith_async.py --config.mesh.sampler_devices=4 \\
        --config.mesh.learner_devices=4 --config.buffer.max_staleness=2 --workdir=/tmp/paced

Prints the launcher's summary, then one JSON line: final accuracy, consumed staleness
histogram, median learner and sampler busy seconds per step, and the pad.
"""

from __future__ import annotations

import collections
import json
import pathlib
import time

import numpy as np
from absl import app, flags

from rljax import launch
from rljax.testing import audit

_PACE = flags.DEFINE_float("learner_step_s", 0.8, "Each RL learner step lasts at least this.")


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    import jax

    jax.config.update("jax_threefry_partitionable", True)
    from rljax import config as config_lib
    from rljax.runtime.run import Run

    class PacedRun(Run):
        def _make_driver(self):
            step, pace = self.learner.step, _PACE.value

            def paced(batch):
                start = time.perf_counter()
                out = step(batch)
                time.sleep(max(0.0, pace - (time.perf_counter() - start)))
                return out

            self.learner.step = paced
            return super()._make_driver()

    cfg = launch._run_config(config_lib)
    run = PacedRun(cfg, launch._WORKDIR.value)
    try:
        summary = run.train()
    finally:
        run.close()
    records = audit.read_metrics(pathlib.Path(run.workdir))
    records = [r for r in records if r.get("phase") == "train"]
    hist: collections.Counter = collections.Counter()
    for r in records:
        hist.update({int(k): v for k, v in r["staleness_hist"].items()})
    print(json.dumps({k: v for k, v in summary.items() if k != "last"}, default=float))
    figures = {
        "final_accuracy": summary["final_accuracy"],
        "initial_accuracy": summary["initial_accuracy"],
        "staleness_hist": {str(k): hist[k] for k in sorted(hist)},
        "learner_step_s": _PACE.value,
        "learner_busy_s_median": float(np.median([r["learner_busy_s"] for r in records])),
        "sampler_busy_s_median": float(np.median([r["sampler_busy_s"] for r in records])),
        "wall_s": summary["wall_s"],
    }
    print(json.dumps(figures))


if __name__ == "__main__":
    app.run(main)
