"""Per-chip memory of a real config's learner step and sampler generate, compiled on the CPU.

    python scripts/plan_memory.py --config=configs/qwen2_5_1_5b_gsm8k.py:v5e8
    python scripts/plan_memory.py --config=configs/qwen2_5_1_5b_gsm8k.py:v6e8
    python scripts/plan_memory.py --config=configs/qwen3_8b_gsm8k.py:v5p32
    python scripts/plan_memory.py --config=configs/qwen3_8b_gsm8k.py:v5e8_lora
    python scripts/plan_memory.py --config=configs/qwen3_8b_gsm8k.py:v5e8_lora \
      --config.lora.enabled=False   # the same run with full fine-tuning
    python scripts/plan_memory.py --config=configs/qwen3_30b_a3b_gsm8k.py:v5p16 \
      --kernel_impl=pallas --no_sampler_hoist   # a mixture of experts, colocated
    python scripts/plan_memory.py --config=configs/gemma3_27b_gsm8k.py:v5p16 \
      --kernel_impl=pallas --no_sampler_hoist   # sliding windows: two KV pools
    python scripts/plan_memory.py --config=configs/gemma3_12b_gsm8k.py:v5e8_lora \
      --kernel_impl=pallas --no_sampler_hoist --no_learner_hoist   # a bf16 learner

``--config.KEY=VALUE`` overrides one field of the config (the value is a Python literal, else
a string), as the launcher's flags do.

The config file's ``TARGETS[arg]`` names the chip (rljax.sim.chips) and chip count. The script
fakes that many CPU devices, builds the learner and the engine with abstract arrays
(``Learner.abstract``: nothing is allocated), and compiles ``Learner.lower_step`` for the
largest batch the config can pack and ``PagedEngine.lower_generate`` with their real shardings. It
reads XLA's ``memory_analysis()`` per device:

- learner: params, optimiser state and batch (the step's arguments, exact from the shardings),
  temp (gradients, their accumulator and the activations of one micro-batch), peak;
- sampler: weights, KV page pool (exact), temp, peak, plus a second copy of the weights that
  lives while an in-flight weight update is staged (async mode), which the fit must include.

A model with sliding-window layers (Gemma 2/3) keeps their KV in a second, smaller pool
(rljax.engine.pools; ``sampling.num_local_pages``, 0: every slot's window plus one slot at full
length): the KV figure is both pools, each read from the engine's own decode state and its
shardings, and the table and JSON give each pool (``kv_pool_global``, ``kv_pool_local``, their
pages a kv shard) beside ``kv_pool_windowless``, the pool of the same engine for the model with
every layer global (every layer's KV at full length), and their difference,
``kv_window_saving``: what the window saves. A slot's local pages cover its window and the
tokens of its decode call, so the engine is planned with the target's ``decode_steps`` (0: the
accelerator's default, 8, not the fake CPU devices' 1); the compiled program is still the
one-token generate.

With ``lora.enabled`` both roles hold the frozen base plus the adapters (rljax.models.lora):
the learner's optimiser state, gradients and accumulator cover the adapters alone and it keeps
no reference copy (the KL reference is the base); the sampler serves the adapters as the
target accelerator does ('auto' is unmerged there, rljax.engine.weights.lora_merged), and an
update stages only the adapters (WeightSync(adapters_only=True)), so the staged second copy is
the adapters' bytes. ``lora.serving='merged'`` decodes from a merged copy while the unmerged
base and adapters stay held beside it; the sampler's total counts both. The table and the
JSON name the LoRA settings and the trainable parameter count against the total.

A mixture of experts (``model.num_experts`` > 0) is planned from every parameter: the learner
and the sampler hold all E experts (split over ``mesh.expert_parallel``), whatever k a token
uses. Its FLOPs are the active parameters' (attention, the router, k of the E experts, a
shared expert: ``rljax.models.presets.active_param_count``); the JSON's ``params`` gives both
counts and the FLOPs of a token and of a step. On the CPU, the experts' 'xla' grouped matmul
holds temporaries the TPU kernel does not (its row tiles gather a copy of their expert's
weights, and ``jax.lax.ragged_dot`` lowers to a dense product masked per expert, E times the
real temp): plan a mixture with ``--kernel_impl=pallas``, which compiles the grouped-matmul
kernel (and the attention kernels) in interpret mode, holding their blocks as the TPU does.

A bf16 sampler (``sampling.dtype``) on the CPU computes its dots in f32, and XLA's
while-loop-invariant code motion hoists the upcast of every weight out of the decode loop: a
whole f32 copy of the model in the generate's temp, which a TPU (bf16 natively) never makes.
``--no_sampler_hoist`` compiles the sampler's generate without that pass (the learner's step
keeps it), so each layer's weights are upcast inside the loop: a 30B-parameter sampler's temp
is then GiBs, not twice its weights. ``--no_learner_hoist`` does the same for the learner's
step, for a learner in bf16 (a LoRA run's bf16 base: configs/gemma3_12b_gsm8k.py), whose
layer loops would otherwise hold an f32 copy of their weights.

A colocated run (``mesh.mode='colocated'``) holds both roles on the same chips: its verdict is
the larger of the learner's step beside the sampler's weights and KV pool, and the sampler's
generate (with its staged update) beside the learner's params and optimiser state.

CPU compilation is a proxy for the TPU one: the same shardings and buffers, a different fusion
and scheduler, and the XLA attention (which materialises [T, T] scores per layer) where the
TPU runs the Pallas kernel, so read it as a plan, not a measurement. It prints a table, then
one JSON line holding every figure; it exits 1, with the reason on stderr, when a role does
not fit the chip's HBM (or ``--hbm_gib``).
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import importlib.util
import json
import math
import os
import sys

GIB = 1024**3


def load_config_module(spec: str):
    """(module, arg) for ``path.py[:arg]``; the module must define TARGETS and get_config."""
    path, _, arg = spec.partition(":")
    if not path.endswith(".py") or not os.path.exists(path):
        raise SystemExit(
            f"plan_memory: --config={spec!r}: no such file; pass configs/NAME.py[:arg]"
        )
    mod_spec = importlib.util.spec_from_file_location("plan_target", path)
    module = importlib.util.module_from_spec(mod_spec)
    mod_spec.loader.exec_module(module)
    if not hasattr(module, "TARGETS"):
        raise SystemExit(f"plan_memory: {path} has no TARGETS table; add {{arg: (chip, chips)}}")
    arg = arg or next(iter(module.TARGETS))
    if arg not in module.TARGETS:
        raise SystemExit(
            f"plan_memory: unknown variant {arg!r} of {path}; use one of {list(module.TARGETS)}"
        )
    return module, arg


def parse_overrides(args: list[str], parser: argparse.ArgumentParser) -> dict:
    """``--config.KEY=VALUE`` arguments as {KEY: VALUE}: a Python literal, else the string."""
    out = {}
    for a in args:
        key, eq, text = a.removeprefix("--config.").partition("=")
        if not a.startswith("--config.") or not eq or not key:
            parser.error(f"unrecognised argument {a!r}; overrides are --config.KEY=VALUE")
        text = {"true": "True", "false": "False"}.get(text, text)
        try:
            out[key] = ast.literal_eval(text)
        except (ValueError, SyntaxError):
            out[key] = text
    return out


def _per_device_bytes(tree) -> int:
    """Bytes one device holds of ``tree``'s ShapeDtypeStructs, from their shardings."""
    import jax

    total = 0
    for x in jax.tree.leaves(tree):
        if x is None:
            continue
        shard = x.sharding.shard_shape(x.shape)
        total += math.prod(shard) * x.dtype.itemsize
    return total


def _count(tree) -> int:
    """Parameters (elements) in ``tree``'s leaves."""
    import jax

    return sum(math.prod(x.shape) for x in jax.tree.leaves(tree) if x is not None)


def _served_lora(lora):
    """The run's LoRAConfig as the target chip serves it; None without LoRA.

    The plan lays its meshes on fake CPU devices, where 'auto' would merge the adapters; every
    chip of rljax.sim.chips is an accelerator, where 'auto' serves them unmerged
    (rljax.engine.weights.lora_merged), so that is what is planned.
    """
    if not lora.enabled:
        return None
    if lora.serving == "auto":
        return dataclasses.replace(lora, serving="unmerged")
    return lora


def _served_sampling(sampling, chip_name: str):
    """The run's SamplingConfig as the target chip decodes it: ``decode_steps`` 0 becomes the
    accelerator's default (rljax.engine.decode.DEFAULT_DECODE_STEPS), not the CPU's 1 the fake
    devices would pick. The engine sizes a local layers' pool by it: a slot holds the pages
    of its window and of every token its call writes."""
    from rljax.engine.decode import DEFAULT_DECODE_STEPS

    if sampling.decode_steps:
        return sampling
    kind = "tpu" if chip_name.startswith("tpu") else "gpu"
    return dataclasses.replace(sampling, decode_steps=DEFAULT_DECODE_STEPS[kind])


def _analysis(compiled) -> dict[str, int]:
    a = compiled.memory_analysis()
    out = {
        "argument": int(a.argument_size_in_bytes),
        "output": int(a.output_size_in_bytes),
        "temp": int(a.temp_size_in_bytes),
        "alias": int(a.alias_size_in_bytes),
    }
    # Donated inputs count as arguments and as outputs; the alias size removes them once.
    out["peak"] = out["argument"] + out["output"] + out["temp"] - out["alias"]
    return out


def plan(
    cfg,
    chip_name: str,
    *,
    devices=None,
    hbm_bytes: float | None = None,
    kernel_impl: str = "xla",
    hoist_sampler_upcasts: bool = True,
    hoist_learner_upcasts: bool = True,
) -> dict:
    """Compiles both roles of ``cfg`` abstractly; per-device bytes and the fit verdict.

    Args:
      cfg: a RunConfig.
      chip_name: a chip of rljax.sim.chips; its HBM is the budget unless ``hbm_bytes`` is set.
      devices: the devices to lay the meshes on (default: all visible).
      hbm_bytes: budget per chip in bytes, overriding the chip's HBM.
      kernel_impl: the kernels' implementation: 'xla' (the CPU cannot compile Pallas TPU
        kernels), or 'pallas' in interpret mode (a mixture of experts: see the module doc).
      hoist_sampler_upcasts: False compiles the sampler's generate without XLA's
        while-loop-invariant code motion (see the module doc).
      hoist_learner_upcasts: the same for the learner's step.
    """
    from rljax.learner.learner import Learner
    from rljax.mesh.topology import build_topology
    from rljax.models.loading import abstract_params
    from rljax.sim.chips import get_chip

    hbm = int(get_chip(chip_name).hbm_bytes if hbm_bytes is None else hbm_bytes)
    cfg = dataclasses.replace(cfg, sampling=_served_sampling(cfg.sampling, chip_name))
    topo = build_topology(cfg.mesh, devices)
    lora = _served_lora(cfg.lora)
    graphdef, abstract = abstract_params(cfg.model, topo.learner, lora=lora)
    learner = Learner.abstract(
        cfg.learner,
        graphdef,
        abstract,
        topo.learner,
        temperature=cfg.sampling.temperature,
        kernel_impl=kernel_impl,
        critic=cfg.critic if cfg.critic.enabled else None,  # gae's: trained beside the policy
    )
    out = {
        "chip": chip_name,
        "hbm": hbm,
        "lora": {
            "enabled": lora is not None,
            "rank": lora.rank if lora else None,
            "alpha": lora.alpha if lora else None,
            "targets": list(lora.targets) if lora else None,
            "serving": lora.serving if lora else None,
            "trainable_params": _count(learner.trainable(learner.params)),
            "total_params": _count(learner.params),
        },
        "params": _param_figures(cfg),
    }
    for role, r in (
        ("learner", _plan_learner(cfg, learner, topo.learner_devices, hoist_learner_upcasts)),
        ("sampler", _plan_sampler(cfg, graphdef, topo, lora, kernel_impl, hoist_sampler_upcasts)),
    ):
        r["fits"] = r["total"] <= hbm
        r["headroom"] = hbm - r["total"]
        out[role] = r
    out["params"]["step_train_flops"] = out["params"]["train_flops_per_token"] * math.prod(
        out["learner"]["batch_shape"]
    )
    out["colocated"] = topo.colocated
    if topo.colocated:
        together = _together(out["learner"], out["sampler"])
        out["together"] = {"total": together, "fits": together <= hbm, "headroom": hbm - together}
        out["fits"] = out["together"]["fits"]
    else:
        out["fits"] = out["learner"]["fits"] and out["sampler"]["fits"]
    return out


def _param_figures(cfg) -> dict:
    """Every parameter (what the memory holds) and the active ones (what a token computes
    with), and the FLOPs of a token: 2 N_active forward, 6 N_active trained."""
    from rljax.models import presets
    from rljax.sim.measured import tiny_preset

    preset = tiny_preset(cfg.model)
    active = presets.active_param_count(preset)
    return {
        "total": presets.param_count(preset),
        "active": active,
        "experts": cfg.model.num_experts,
        "experts_per_token": cfg.model.num_experts_per_tok if cfg.model.num_experts else 0,
        "forward_flops_per_token": 2 * active,
        "train_flops_per_token": 6 * active,
    }


def _together(learner: dict, sampler: dict) -> int:
    """Bytes per chip of both roles on the same chips: each role's peak beside what the other
    holds between its own calls (the learner its params, reference and optimiser state; the
    sampler its weights, KV pool and what a LoRA merge keeps)."""
    learner_held = learner["params"] + learner["optimizer"]
    sampler_held = sampler["weights"] + sampler["kv_pool"] + sampler["weights_kept"]
    return max(learner["total"] + sampler_held, sampler["total"] + learner_held)


def _no_hoist(hoist: bool) -> dict:
    """Compile options: none, or (``hoist`` False) XLA without while-loop-invariant code motion,
    which on the CPU hoists an f32 copy of every bf16 weight out of the layer loops."""
    return {} if hoist else {"xla_disable_hlo_passes": "while-loop-invariant-code-motion"}


def _plan_learner(cfg, learner, devices: int, hoist: bool = True) -> dict:
    """The learner step's per-device bytes, for the largest batch ``cfg`` can pack."""
    from rljax.models.lora import split_adapters

    row_len = cfg.learner.pack_length or (
        cfg.sampling.max_prefill_length + cfg.sampling.max_new_tokens
    )
    batch_shape = learner.batch_shape(cfg.learner.batch_size, row_len)
    learn = _analysis(learner.lower_step(batch_shape).compile(_no_hoist(hoist)))
    params = _per_device_bytes(learner.params)
    refs = _per_device_bytes(learner.ref_params)
    optimizer = _per_device_bytes(learner.opt_state)
    learn.update(
        params=params + refs,
        adapters=_per_device_bytes(split_adapters(learner.params)[0]),
        optimizer=optimizer,
        batch=learn["argument"] - params - refs - optimizer,
        batch_shape=list(batch_shape),
        devices=devices,
    )
    learn["total"] = learn["peak"]
    return learn


def _plan_sampler(cfg, graphdef, topo, lora, kernel_impl: str, hoist: bool) -> dict:
    """The engine's generate per device, plus what a weight update holds beside it."""
    from flax import nnx

    from rljax.engine.paged import PagedEngine
    from rljax.mesh.weight_sync import sampler_model
    from rljax.models.lora import split_adapters
    from rljax.models.sharding import with_shardings
    from rljax.models.transformer import abstract_decoder

    # The sampler holds its own copy in sampling.dtype (cast at every publish), as the runtime.
    sampler_cfg, sampler_graphdef = sampler_model(cfg.model, graphdef, cfg.sampling.dtype, lora)
    # ... its adapters too (lora.dtype is the learner's: the weight sync casts them as well).
    sampler_lora = lora if lora is None else dataclasses.replace(lora, dtype=None)
    sampler_params = nnx.split(abstract_decoder(sampler_cfg, sampler_lora))[1]
    engine = PagedEngine(
        sampler_cfg, cfg.sampling, topo.sampler, sampler_graphdef, impl=kernel_impl, lora=lora
    )
    gen = _analysis(engine.lower_generate(sampler_params).compile(_no_hoist(hoist)))
    placed = with_shardings(sampler_params, engine.param_shardings(sampler_params))
    weights = _per_device_bytes(placed)
    pools = _pool_bytes(engine)
    # The same engine for the model with every layer global: what the window saves.
    windowless_cfg = dataclasses.replace(
        sampler_cfg, layer_types=("full_attention",) * sampler_cfg.num_layers
    )
    windowless_sampling = dataclasses.replace(cfg.sampling, num_local_pages=0)
    windowless = PagedEngine(
        windowless_cfg,
        windowless_sampling,
        topo.sampler,
        sampler_graphdef,
        impl=kernel_impl,
        lora=lora,
    )
    pool, (windowless_pool,) = sum(pools), _pool_bytes(windowless)
    # An update in flight is staged beside the served weights: with LoRA, the adapters alone.
    staged = _per_device_bytes(split_adapters(placed)[0]) if lora else weights
    # Merged adapters are served from a merged copy (generate's argument), while the sampler
    # keeps the base and adapters it was sent beside it (rljax.engine.weights.lora_merged).
    kept = weights if lora and lora.serving == "merged" else 0
    gen.update(
        weights=weights,
        kv_pool=pool,
        kv_pool_global=pools[0],
        kv_pool_local=sum(pools[1:]),
        kv_pages_per_shard=list(engine.pool_layout.pages_per_shard),
        kv_pool_windowless=windowless_pool,
        kv_window_saving=windowless_pool - pool,
        kv_shards=engine.kv_shards,
        decode_steps=cfg.sampling.decode_steps,
        weights_in_flight=staged,
        weights_kept=kept,
        devices=topo.sampler_devices,
    )
    gen["total"] = gen["peak"] + staged + kept
    return gen


def _pool_bytes(engine) -> list[int]:
    """Per-device bytes of each of ``engine``'s KV page pools (keys and values): the global
    layers', then the local layers' if the model has a window (rljax.engine.pools)."""
    import jax

    from rljax.models.sharding import with_shardings

    state = with_shardings(
        jax.eval_shape(engine.init_decode_state), engine.decode_state_shardings()
    )
    return [_per_device_bytes((k, v)) for k, v, _ in state.pools()]


def report(result: dict, title: str) -> str:
    """The human-readable table of :func:`plan`'s result."""

    def g(x):
        return f"{x / GIB:7.2f}"

    hbm = result["hbm"]
    lrn, smp, lora = result["learner"], result["sampler"], result["lora"]
    share = f"{lora['trainable_params']:,} of {lora['total_params']:,} params trainable"
    if lora["enabled"]:
        tuning = (
            f"LoRA r={lora['rank']} alpha={lora['alpha']:g} on {','.join(lora['targets'])}"
            f" (served {lora['serving']}): {share}"
            f" ({100 * lora['trainable_params'] / lora['total_params']:.2f}%)"
        )
    else:
        tuning = f"full fine-tuning (LoRA off): {share}"
    lines = [
        f"{title}: {result['chip']} ({hbm / GIB:.1f} GiB HBM per chip); GiB per chip",
        tuning,
        f"learner ({lrn['devices']} chips, batch {lrn['batch_shape']} = [micro, rows, len]):",
        f"  params {g(lrn['params'])} (adapters {g(lrn['adapters'])})"
        f"  optimizer {g(lrn['optimizer'])}  batch {g(lrn['batch'])}"
        f"  temp {g(lrn['temp'])}  total {g(lrn['total'])} of {hbm / GIB:.1f}"
        f"  {'fits' if lrn['fits'] else 'DOES NOT FIT'} (headroom {g(lrn['headroom'])})",
        f"sampler ({smp['devices']} chips, {smp['kv_shards']} kv shard(s),"
        f" {smp['decode_steps']} tokens a decode call):",
        f"  weights {g(smp['weights'])}  kv pool {g(smp['kv_pool'])}  temp {g(smp['temp'])}"
        f"  peak {g(smp['peak'])}  + staged {'adapters' if lora['enabled'] else 'weights'}"
        f" {g(smp['weights_in_flight'])}"
        + (f"  + held unmerged {g(smp['weights_kept'])}" if smp["weights_kept"] else "")
        + f"  = total {g(smp['total'])} of {hbm / GIB:.1f}"
        f"  {'fits' if smp['fits'] else 'DOES NOT FIT'} (headroom {g(smp['headroom'])})",
    ]
    if smp["kv_pool_local"]:
        pages = smp["kv_pages_per_shard"]
        lines.append(
            f"  kv pool {g(smp['kv_pool'])} = global layers {g(smp['kv_pool_global'])}"
            f" ({pages[0]} pages a shard) + local layers {g(smp['kv_pool_local'])}"
            f" ({pages[1]} pages a shard); every layer at full length (no window):"
            f" {g(smp['kv_pool_windowless'])}, so the window saves {g(smp['kv_window_saving'])}"
        )
    if result["colocated"]:
        both = result["together"]
        lines.append(
            f"both roles on the same chips (colocated): total {g(both['total'])} of "
            f"{hbm / GIB:.1f}  {'fits' if both['fits'] else 'DOES NOT FIT'}"
            f" (headroom {g(both['headroom'])})"
        )
    p = result["params"]
    if p["experts"]:
        lines.append(
            f"mixture of {p['experts']} experts, {p['experts_per_token']} a token: memory holds "
            f"{p['total']:,} params, FLOPs use {p['active']:,} ({p['train_flops_per_token']:.3g}"
            f" a trained token, {p['step_train_flops']:.3g} a step)"
        )
    return "\n".join(lines)


def _misfits(result: dict, config: str) -> list[str]:
    """One line per role (or, colocated, for both together) that does not fit, with the fix."""
    budget = f"the budget is {result['hbm'] / GIB:.2f} GiB ({result['chip']}); lower "
    fixes = {
        "learner": "the rows per micro-batch (raise learner.micro_batches), set learner.remat, "
        "or give the learner more chips",
        "sampler": "sampling.max_concurrent_decodes or max_new_tokens, or give the sampler "
        "more chips (mesh.sampler_data / sampler_tensor)",
    }
    out = []
    if result["colocated"] and not result["fits"]:
        need = result["together"]["total"] / GIB
        out.append(
            f"plan_memory: {config}: both roles on the same chips (colocated) need {need:.2f} GiB "
            f"per chip but {budget}either role's load ({fixes['learner']}; "
            f"{fixes['sampler']}), or split the mesh (mesh.mode='split')"
        )
    for role in () if result["colocated"] else ("learner", "sampler"):
        r = result[role]
        if not r["fits"]:
            need = r["total"] / GIB
            out.append(
                f"plan_memory: {config}: the {role} needs {need:.2f} GiB per chip but "
                f"{budget}{fixes[role]}"
            )
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", required=True, help="configs/NAME.py[:arg]")
    parser.add_argument(
        "--hbm_gib", type=float, default=None, help="budget per chip in GiB (default: the chip's)"
    )
    parser.add_argument(
        "--kernel_impl",
        choices=("xla", "pallas"),
        default="xla",
        help="the kernels' implementation; 'pallas' (interpret mode) for a mixture of experts",
    )
    parser.add_argument(
        "--no_sampler_hoist",
        action="store_true",
        help="compile generate without hoisting the CPU's bf16->f32 weight upcasts out of the "
        "decode loop (a bf16 sampler: see the module doc)",
    )
    parser.add_argument(
        "--no_learner_hoist",
        action="store_true",
        help="compile the learner's step without that pass (a bf16 learner, such as a LoRA "
        "run's bf16 base: see the module doc)",
    )
    args, rest = parser.parse_known_args(argv)
    overrides = parse_overrides(rest, parser)
    module, arg = load_config_module(args.config)
    chip, chips = module.TARGETS[arg]
    # The fake devices must exist before JAX starts its CPU backend (importing jax does not
    # start it). Where a backend has started already (a test), the devices it has must do.
    os.environ["JAX_PLATFORMS"] = "cpu"
    os.environ["JAX_NUM_CPU_DEVICES"] = str(chips)
    os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={chips}"
    import jax

    from rljax.config import from_config_dict, replace

    if len(jax.devices()) < chips:
        raise SystemExit(
            f"plan_memory: {args.config} needs {chips} devices but JAX has {len(jax.devices())}; "
            f"run it in a fresh process (it sets JAX_NUM_CPU_DEVICES={chips})"
        )
    cfg = from_config_dict(module.get_config(arg))
    try:
        cfg = replace(cfg, **overrides)
    except (TypeError, AttributeError, ValueError) as e:  # an unknown key, a bad value
        raise SystemExit(f"plan_memory: --config overrides {overrides}: {e}") from None
    hbm = None if args.hbm_gib is None else args.hbm_gib * GIB
    result = plan(
        cfg,
        chip,
        devices=jax.devices()[:chips],
        hbm_bytes=hbm,
        kernel_impl=args.kernel_impl,
        hoist_sampler_upcasts=not args.no_sampler_hoist,
        hoist_learner_upcasts=not args.no_learner_hoist,
    )
    print(report(result, f"{args.config} on {chips} chips"), flush=True)
    for reason in _misfits(result, args.config):
        print(reason, file=sys.stderr, flush=True)
    # Last, so `| tail -1` gives the figures even when stderr is merged in.
    print(json.dumps({"config": args.config, "chips": chips, **result}), flush=True)
    return 0 if result["fits"] else 1


if __name__ == "__main__":
    sys.exit(main())
