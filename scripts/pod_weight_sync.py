"""Weight sync across hosts: the learner mesh on some processes, the sampler mesh on others.

    python scripts/pod_weight_sync.py                      # 4 processes x 2 CPU devices, SmolLM2
    python scripts/pod_weight_sync.py --model tiny --runs 3
    python scripts/pod_weight_sync.py --slices 2 --sampler-data 2   # two emulated slices

Starts a localhost pod (``rljax.testing.pod``): hosts 0-1 hold the sampler mesh, hosts 2-3 the
learner mesh with the model's params (the config's shapes; values do not matter to a copy).
Every process enters ``PodWeights.move`` (``rljax.mesh.transfer``: one computation over the
union of both meshes, the pod's weight sync) ``--runs`` times in f32 and in bf16 (the learner
casts first), and process 0 times it. In the same run, process 0 times ``jax.device_put`` of
the same bytes between two of its own devices: the copy bandwidth a transfer could reach here.
With ``--slices 2`` the hosts form two emulated slices (the sampler's, then the learner's),
the sampler has ``--sampler-data`` replicas, and the sync runs in two stages (one copy into
the sampler slice, then a fan-out inside it, ``rljax.mesh.fan_out``); bf16 is then also timed
in one stage on the same meshes, for comparison.

The union transfer is point to point where each leaf's shardings allow it (every sampler device
receives its shard once, from the learner devices, in rounds of ``ppermute``); with one slice the
same moves are also timed through the all-reduce every leaf can take (every device of the union
receives and sends about twice the model's bytes), the baseline the point-to-point path
replaced. On this CPU (gloo over localhost TCP) both are far below a device-to-device copy; what
they buy is that they run at all across processes. Last, the ICI model for Qwen3-8B on a v5p-32
(8 + 8 chips, bf16 sampler): datasheet arithmetic, not a measurement. Ends with one JSON line of
figures.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

MODELS = {"smollm2": "smollm2_arith", "tiny": "arith_tiny"}  # modules of rljax.configs


def _worker(model: str, runs: int, slices: int, sampler_data: int) -> None:
    from rljax.mesh import distributed

    distributed.maybe_initialize()
    import importlib

    import jax
    import jax.numpy as jnp
    import numpy as np

    from rljax.config import MeshConfig
    from rljax.mesh.pod_weights import PodWeights
    from rljax.mesh.topology import build_topology
    from rljax.mesh.transfer import transfer
    from rljax.mesh.weight_sync import cast_floating
    from rljax.models.loading import abstract_params, initial_model_config

    cfg = importlib.import_module(f"rljax.configs.{MODELS[model]}").recipe()
    devices = jax.devices()
    half = len(devices) // 2
    topo = build_topology(
        MeshConfig(
            mode="split",
            num_slices=slices,
            sampler_devices=half,
            learner_devices=half,
            sampler_data=sampler_data,
            sampler_tensor=half // sampler_data,
        )
    )
    sampler, learner = topo.sampler, topo.learner
    _, abstract = abstract_params(initial_model_config(cfg), learner)
    owns_learner = jax.process_index() >= jax.process_count() // 2
    params = None
    if owns_learner:
        params = jax.tree.map(
            lambda a: jax.jit(lambda: jnp.full(a.shape, 0.01, a.dtype), out_shardings=a.sharding)(),
            abstract,
        )
    from jax._src import distributed as jax_distributed

    client = jax_distributed.global_state.client
    out = {}
    variants = [("float32", "float32", topo.slices), ("bfloat16", "bfloat16", topo.slices)]
    if slices > 1:
        variants.append(("bfloat16_one_stage", "bfloat16", ()))
    else:  # the baseline: the same move with every leaf through the all-reduce
        variants += [("float32_all_reduce", "float32", ()), ("bfloat16_all_reduce", "bfloat16", ())]
    for name, dtype, smap in variants:
        weights = PodWeights(abstract, sampler, dtype, smap)

        def move(weights=weights, dtype=dtype, name=name):
            if not name.endswith("_all_reduce"):
                return weights.move(params if owns_learner else None)
            src = cast_floating(params, dtype) if owns_learner else weights.full.source
            out = transfer(src, weights.full.targets, force_all_reduce=True)
            jax.block_until_ready([x for x in jax.tree.leaves(out) if x is not None])

        times = []
        for i in range(runs + 1):  # the first compiles
            client.wait_at_barrier(f"sync_{name}_{i}", 600_000)
            start = time.perf_counter()
            move()
            times.append(time.perf_counter() - start)
        out[name] = {"bytes": weights.bytes, "stage_bytes": weights.stage_bytes}
        out[name]["seconds"] = times[1:]
    if jax.process_index() == 0:
        nbytes = out["float32"]["bytes"]
        x = jax.device_put(np.zeros(nbytes // 4, np.float32), devices[0])
        copies = []
        for _ in range(runs + 1):
            start = time.perf_counter()
            jax.block_until_ready(jax.device_put(x, devices[1]))
            copies.append(time.perf_counter() - start)
        out["device_put_s"] = copies[1:]
        print("RESULT " + json.dumps(out), flush=True)


def _summary(xs: list[float]) -> dict[str, float]:
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", choices=sorted(MODELS), default="smollm2")
    p.add_argument("--processes", type=int, default=4)
    p.add_argument("--devices", type=int, default=2, help="CPU devices per process")
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--slices", type=int, default=1, help="emulated slices (1 or 2)")
    p.add_argument("--sampler-data", type=int, default=1, help="sampler replicas (mesh data)")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        _worker(args.model, args.runs, args.slices, args.sampler_data)
        return
    from rljax.sim.chips import CHIPS
    from rljax.testing import pod

    with tempfile.TemporaryDirectory() as logdir:
        argv = [
            str(Path(__file__).resolve()),
            "--worker",
            f"--model={args.model}",
            f"--runs={args.runs}",
            f"--slices={args.slices}",
            f"--sampler-data={args.sampler_data}",
        ]
        codes, logs = pod.run(
            argv, processes=args.processes, devices=args.devices, logdir=Path(logdir), timeout=1800
        )
    if codes != [0] * args.processes:
        sys.exit(f"the pod failed (exit codes {codes}):\n{logs[0][-3000:]}")
    raw = pod.result(logs[0])
    copy = _summary(raw["device_put_s"])
    copy_bw = raw["float32"]["bytes"] / copy["median"]
    figures = {
        "model": args.model,
        "processes": args.processes,
        "devices": args.devices,
        "slices": args.slices,
        "sampler_data": args.sampler_data,
        "device_put_s": copy,
        "device_put_gb_s": copy_bw / 1e9,
    }
    print(
        f"{args.model}: {args.processes} processes x {args.devices} CPU devices; sampler on "
        f"hosts 0-{args.processes // 2 - 1}, learner on the rest"
    )
    print(
        f"  device_put of {raw['float32']['bytes'] / 1e6:.1f} MB between two devices of "
        f"process 0: {copy['median'] * 1e3:.1f} ms ({copy_bw / 1e9:.2f} GB/s)"
    )
    names = ("float32", "bfloat16", "bfloat16_one_stage")
    names += ("float32_all_reduce", "bfloat16_all_reduce")
    for name in [k for k in names if k in raw]:
        s = _summary(raw[name]["seconds"])
        bw = raw[name]["bytes"] / s["median"]
        figures[name] = {
            "bytes": raw[name]["bytes"],
            "stage_bytes": raw[name]["stage_bytes"],
            "seconds": s,
            "gb_s": bw / 1e9,
            "of_device_put": bw / copy_bw,
        }
        stages = f", {raw[name]['stage_bytes'] / 1e6:.1f} MB across slices" * (args.slices > 1)
        print(
            f"  transfer {name}: {raw[name]['bytes'] / 1e6:.1f} MB in {s['median']:.3f} s "
            f"[{s['min']:.3f}, {s['max']:.3f}] = {bw / 1e9:.3f} GB/s, "
            f"{bw / copy_bw:.3f} of device_put{stages}"
        )
    for dtype in ("float32", "bfloat16"):
        if f"{dtype}_all_reduce" in raw:  # point-to-point over the all-reduce, per run's median
            ratio = figures[f"{dtype}_all_reduce"]["seconds"]["median"]
            ratio /= figures[dtype]["seconds"]["median"]
            figures[f"{dtype}_point_to_point_speedup"] = ratio
            print(f"  {dtype}: point-to-point is {ratio:.2f}x faster than the all-reduce")
    # ICI model: Qwen3-8B in bf16 on a v5p-32 split 8 sampler + 8 learner chips.
    ici = CHIPS["tpu-v5p"].network_bytes_per_s  # per chip, datasheet
    model_bytes = 8.19e9 * 2
    ideal = model_bytes / 4 / ici  # each sampler chip receives its tensor=4 shard
    allreduce = 2 * model_bytes * 15 / 16 / ici  # ring all-reduce over the 16-chip union
    figures["v5p32_qwen3_8b_model"] = {
        "ici_gb_s": ici / 1e9,
        "ideal_s": ideal,
        "allreduce_s": allreduce,
    }
    print(
        f"  model, Qwen3-8B bf16 on v5p-32 (ICI {ici / 1e9:.0f} GB/s per chip): point-to-point "
        f"bound {ideal * 1e3:.1f} ms; the all-reduce {allreduce * 1e3:.1f} ms"
    )
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
