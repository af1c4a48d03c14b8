"""Scenario configs: the builder behind ``configs/sim/*.py`` and the reader the scripts share.

A scenario is one ``ml_collections.ConfigDict`` that ``scripts/simulate.py`` or
``scripts/sim_lending.py`` runs: the model, the chip and its efficiencies, the job, the
response-length model and the sections each script reads (``lend`` for lending, ``growth``,
``tails`` x ``etas`` or ``validation`` for simulate.py). :func:`scenario` builds the common part
with every script section switched off, :func:`add_lending` adds the ``lend`` section;
:func:`cost_model`, :func:`length_model` and :func:`sim_config` turn a scenario into the inputs
of one :class:`~rljax.sim.simulator.Simulator` run.
"""

from __future__ import annotations

import importlib.util
import pathlib
import types

import ml_collections

from rljax.models.presets import get_preset
from rljax.policy.lending import LendingConfig
from rljax.sim import loan_costs
from rljax.sim.chips import get_chip
from rljax.sim.config import SimConfig
from rljax.sim.costs import CostModel, Efficiencies, learner_flops_per_param
from rljax.sim.workload import LengthModel

# Fractions of datasheet peak used where nothing was fitted (pod_compare, the v5p workloads).
GENERIC_EFFICIENCIES = dict(
    decode_hbm=0.6, decode_mfu=0.5, prefill_mfu=0.5, train_mfu=0.4, sync=0.5
)
# decode_hbm and train_mfu fitted to verl's 32-GPU colocated per-phase times at the nominal
# knobs (configs/sim/verl_async_h20.py at the freeze commit 01d72b5, docs/simulator.md); the
# rest generic.
VERL_H20_EFFICIENCIES = dict(
    decode_hbm=0.3792, decode_mfu=0.5, prefill_mfu=0.5, train_mfu=0.3641, sync=0.5
)


def check_variant(path: str, arg: str, variants: tuple[str, ...]) -> bool:
    """Raises on an unknown variant of the config at ``path``; returns whether it is "small"."""
    if arg and arg not in variants:
        raise ValueError(f"unknown variant {arg!r} of {path}; use one of {variants} or none")
    return arg == "small"


def load_config_module(path: str | pathlib.Path) -> types.ModuleType:
    """Imports a ``configs/`` file by path (a config that shares another's workload)."""
    path = pathlib.Path(path)
    spec = importlib.util.spec_from_file_location(f"rljax_config_{path.stem}", path)
    if spec is None or spec.loader is None:
        raise ValueError(f"{path} is not a Python file; give the path of a configs/*.py file")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def scenario(
    name: str,
    *,
    model: str,
    chip: str,
    tp: int,
    efficiencies: dict,
    train_flops: tuple[float, float],
    total_chips: int,
    steps: int,
    batch_groups: int,
    group_size: int,
    prompt_tokens: int,
    lengths: dict,
    phase_steps: int,
    max_slots: int = 256,
    granularity: int | None = None,
    critic: bool = False,
    teacher: float = 0.0,
) -> ml_collections.ConfigDict:
    """The fields every scenario has, with every script section off.

    Args:
      name: printed and written in the JSON line.
      model: a preset of ``rljax.models.presets``.
      chip: a chip of ``rljax.sim.chips``.
      tp: chips per sampler replica.
      efficiencies: ``rljax.sim.costs.Efficiencies`` fields.
      train_flops: training FLOPs per parameter per token, (colocated sync, async).
      total_chips, steps, batch_groups (B), group_size (G), prompt_tokens, max_slots: as in
        :class:`~rljax.sim.config.SimConfig`.
      lengths: ``LengthModel`` fields.
      phase_steps: learner steps per reallocation (or lending) decision.
      granularity: chips move (and are lent) in units of this many; None (the key left out):
        the chip's ``chips_per_host``.
      critic: the learner also trains gae's critic (the policy's size): each train_flops
        figure grows by its scoring forward and update (``costs.learner_flops_per_param``).
      teacher: opd's teacher, this many times the policy's active parameters: its forward.
    """
    c = ml_collections.ConfigDict()
    c.name = name
    c.model = model
    c.chip = chip
    c.tp = tp
    c.efficiencies = ml_collections.ConfigDict(dict(efficiencies))
    sync_flops, async_flops = (
        learner_flops_per_param(f, critic=critic, teacher=teacher) for f in train_flops
    )
    c.train_flops_per_param = ml_collections.ConfigDict(dict(sync=sync_flops, async_=async_flops))
    c.total_chips = total_chips
    c.steps = steps
    c.batch_groups = batch_groups
    c.group_size = group_size
    c.prompt_tokens = prompt_tokens
    c.max_slots = max_slots
    c.phase_steps = phase_steps
    c.switch_cost_s = -1.0  # < 0: estimate from the cost model (reshard + engine rebuild)
    c.seed = 0
    c.lengths = ml_collections.ConfigDict(dict(lengths))
    if granularity is not None:
        c.granularity = granularity
    c.etas, c.sampler_fractions, c.tails = [], [], []
    c.validation = ml_collections.ConfigDict(dict(enabled=False))
    c.growth = ml_collections.ConfigDict(dict(median=0.0, growth=1.0, tail=0.0, eta=1))
    c.perf_steps = 0
    c.plot = ""
    return c


def add_lending(
    c: ml_collections.ConfigDict,
    *,
    eta: int,
    splits: list[int],
    lending: dict | None = None,
    perf_steps: int = 0,
) -> ml_collections.ConfigDict:
    """Adds the section scripts/sim_lending.py reads: ``eta``, the static ``splits`` (sampler
    chips) compared, ``lending`` overrides of ``LendingConfig`` and ``perf_steps`` of a timed
    lending run (0: none). A loan's ``prepare_s`` and ``release_s`` default to the published
    measurements of :func:`rljax.sim.loan_costs.sourced` for the scenario's model, chip and
    ``tp`` (``lending`` may override them); the other costs keep ``LendingConfig``'s."""
    weight_bytes = cost_model(c).weight_bytes
    costs = dict(loan_costs.sourced(weight_bytes, c.tp, c.chip), **(lending or {}))
    c.lend = ml_collections.ConfigDict(
        dict(
            eta=eta,
            splits=list(splits),
            lending=costs,
            perf_steps=perf_steps,
            costs_basis=loan_costs.basis(weight_bytes, c.tp, c.chip),
        )
    )
    return c


# ----- reading a scenario ----------------------------------------------------------------------


def cost_model(c) -> CostModel:
    """The scenario's model on its chip with its efficiencies."""
    eff = Efficiencies(**c.efficiencies.to_dict())
    return CostModel(get_preset(c.model), get_chip(c.chip), tp=c.tp, efficiencies=eff)


def length_model(c, **overrides) -> LengthModel:
    """The scenario's response lengths, with ``overrides`` of ``LengthModel`` fields."""
    return LengthModel(**dict(c.lengths.to_dict(), **overrides))


def sim_config(
    c,
    mode: str,
    sampler_chips: int,
    *,
    eta: int,
    steps: int | None = None,
    lending: LendingConfig | None = None,
    timeline: bool = False,
) -> SimConfig:
    """One run of the scenario in ``mode`` on ``sampler_chips`` (mode "sync" runs at eta 0 with
    the colocated training FLOPs)."""
    sync = mode == "sync"
    flops = c.train_flops_per_param
    return SimConfig(
        mode=mode,
        total_chips=c.total_chips,
        sampler_chips=sampler_chips,
        steps=steps or c.steps,
        batch_groups=c.batch_groups,
        group_size=c.group_size,
        prompt_tokens=c.prompt_tokens,
        max_staleness=0 if sync else eta,
        max_slots=c.max_slots,
        train_flops_per_param=flops.sync if sync else flops.async_,
        phase_steps=c.phase_steps,
        switch_cost_s=None if c.switch_cost_s < 0 else c.switch_cost_s,
        granularity=c.get("granularity"),
        lending=lending,
        seed=c.seed,
        timeline=timeline,
    )
