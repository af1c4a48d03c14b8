"""Per-chip memory of a real config's learner step and sampler generate, compiled on the CPU.

    python scripts/plan_memory.py --config=configs/qwen2_5_1_5b_gsm8k.py:v5e8
    python scripts/plan_memory.py --config=configs/qwen3_8b_gsm8k.py:v5p32

The config file's ``TARGETS[arg]`` names the chip (rljax.sim.chips) and chip count. The script
fakes that many CPU devices, builds the learner and sampler states as abstract arrays (nothing
is materialised), lowers and compiles ``Learner._train_step`` and ``Engine.generate`` with
their real shardings, and reads XLA's ``memory_analysis()`` per device. CPU compilation is a
proxy for the TPU one: same shardings and buffers, different fusion, so read it as a plan.
Prints a table, then one JSON line; exits 1 when a role does not fit the chip's HBM.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys


def load_config_module(spec: str):
    """(module, arg) for ``path.py[:arg]``."""
    path, _, arg = spec.partition(":")
    mod_spec = importlib.util.spec_from_file_location("plan_target", path)
    if mod_spec is None or not os.path.exists(path):
        sys.exit(f"plan_memory: --config={spec!r}: no such file; pass configs/<name>.py[:arg]")
    module = importlib.util.module_from_spec(mod_spec)
    mod_spec.loader.exec_module(module)
    if not hasattr(module, "TARGETS"):
        sys.exit(f"plan_memory: {path} has no TARGETS table; add {{arg: (chip, chips)}}")
    arg = arg or next(iter(module.TARGETS))
    if arg not in module.TARGETS:
        sys.exit(f"plan_memory: unknown variant {arg!r}; use one of {list(module.TARGETS)}")
    return module, arg


def _bytes(analysis) -> dict[str, int]:
    return {
        "argument": int(analysis.argument_size_in_bytes),
        "output": int(analysis.output_size_in_bytes),
        "temp": int(analysis.temp_size_in_bytes),
        "alias": int(analysis.alias_size_in_bytes),
    }


def plan(cfg, chip_name: str) -> dict:
    """Compiles both roles abstractly; returns per-device bytes and the fit verdict."""
    import jax
    import jax.numpy as jnp
    from flax import nnx
    from jax.sharding import NamedSharding, PartitionSpec

    from rljax.engine.engine import Engine
    from rljax.learner.batch import _FLOATS, FIELDS
    from rljax.learner.learner import (
        Learner,
        data_parallel_size,
        make_optimizer,
        optimizer_shardings,
    )
    from rljax.learner.losses import get_loss
    from rljax.mesh.topology import build_topology
    from rljax.models.sharding import LEARNER_RULES, state_shardings
    from rljax.models.transformer import Decoder
    from rljax.sim.chips import get_chip

    hbm = get_chip(chip_name).hbm_bytes
    topo = build_topology(cfg.mesh)
    abstract = nnx.eval_shape(lambda: Decoder(cfg.model, rngs=nnx.Rngs(0)))
    graphdef, abstract_params = nnx.split(abstract)

    def with_sharding(tree, shardings):
        # The sharding trees hold bare NamedShardings where the state holds nnx Variables.
        leaves, treedef = jax.tree.flatten(tree)
        sh = jax.tree.leaves(shardings, is_leaf=lambda x: isinstance(x, NamedSharding))
        if len(sh) != len(leaves):
            raise ValueError(f"{len(sh)} shardings for {len(leaves)} arrays")
        structs = [jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s) for a, s in zip(leaves, sh)]
        return treedef.unflatten(structs)

    # Learner: the object is assembled without its constructor, which would place real arrays.
    mesh = topo.learner
    learner = Learner.__new__(Learner)
    learner.cfg, learner.loss, learner.mesh = cfg.learner, get_loss(cfg.learner.loss), mesh
    learner.rules, learner.graphdef, learner.kernel_impl = LEARNER_RULES, graphdef, cfg.kernel_impl
    learner.temperature = cfg.sampling.temperature or 1.0
    learner.dp = data_parallel_size(mesh, LEARNER_RULES)
    learner.tx, _ = make_optimizer(cfg.learner)
    p_sh = state_shardings(abstract_params, mesh, LEARNER_RULES)
    params = with_sharding(abstract_params, p_sh)
    replicated = NamedSharding(mesh, PartitionSpec())
    opt_abstract = jax.eval_shape(learner.tx.init, params)
    opt_sh = optimizer_shardings(learner.tx, params, p_sh, replicated)
    opt_state = with_sharding(opt_abstract, opt_sh)
    rows = cfg.learner.batch_size * cfg.learner.ppo_epochs // cfg.learner.ppo_epochs
    row_len = cfg.learner.pack_length or (
        cfg.sampling.max_prefill_length + cfg.sampling.max_new_tokens
    )
    per_mb = max(rows // cfg.learner.micro_batches, learner.dp)
    batch_sh = NamedSharding(mesh, PartitionSpec(None, LEARNER_RULES.rules["batch"]))
    batch = {
        name: jax.ShapeDtypeStruct(
            (cfg.learner.micro_batches, per_mb, row_len),
            jnp.float32 if name in _FLOATS else jnp.int32,
            sharding=batch_sh,
        )
        for name in FIELDS
    }
    step = jax.jit(learner._train_step, donate_argnums=(0, 1))
    version = jax.ShapeDtypeStruct((), jnp.int32, sharding=replicated)
    learn = step.lower(params, opt_state, None, batch, version).compile().memory_analysis()

    # Sampler: decode state and bf16 weights on the sampler mesh.
    engine = Engine(cfg.model, cfg.sampling, topo.sampler, graphdef, impl="xla")
    s_params = with_sharding(abstract_params, engine.param_shardings(abstract_params))
    state = jax.eval_shape(engine.init_decode_state)
    state = with_sharding(state, engine._decode_state_shardings())
    gen = engine._generate.lower(s_params, state).compile().memory_analysis()

    out = {}
    for role, analysis, devices in (
        ("learner", learn, topo.learner_devices),
        ("sampler", gen, topo.sampler_devices),
    ):
        b = _bytes(analysis)
        # Donated inputs are counted both as arguments and outputs; alias subtracts them once.
        peak = b["argument"] + b["output"] + b["temp"] - b["alias"]
        out[role] = {**b, "peak": peak, "devices": devices, "fits": peak <= hbm}
    return {"chip": chip_name, "hbm": int(hbm), **out}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", required=True, help="configs/<name>.py[:arg]")
    args = parser.parse_args(argv)
    module, arg = load_config_module(args.config)
    chip, chips = module.TARGETS[arg]
    # The fake devices must exist before JAX starts its CPU backend.
    os.environ["JAX_PLATFORMS"] = "cpu"
    os.environ["JAX_NUM_CPU_DEVICES"] = str(chips)
    os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={chips}"
    cfg = module.run_config(arg)
    result = plan(cfg, chip)
    gib = 1024**3
    print(f"{args.config}: {chips} x {chip} ({result['hbm'] / gib:.1f} GiB HBM per chip)")
    print(
        f"{'role':8} {'devices':>7} {'args GiB':>9} {'out GiB':>8} {'temp GiB':>9} "
        f"{'peak GiB':>9} fits"
    )
    for role in ("learner", "sampler"):
        r = result[role]
        print(
            f"{role:8} {r['devices']:>7} {r['argument'] / gib:>9.2f} {r['output'] / gib:>8.2f} "
            f"{r['temp'] / gib:>9.2f} {r['peak'] / gib:>9.2f} {'yes' if r['fits'] else 'NO'}"
        )
    fits = result["learner"]["fits"] and result["sampler"]["fits"]
    print(json.dumps({"config": args.config, "fits": fits, **result}))
    return 0 if fits else 1


if __name__ == "__main__":
    sys.exit(main())
