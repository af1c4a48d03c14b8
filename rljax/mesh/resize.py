"""Resizing the two meshes mid-run: the mechanism behind a Reallocator decision.

``Run.resize(split)`` does, at a safe point (between learner steps, with the sampler thread
parked between two ``generate`` calls):

1. interrupt every in-flight request; its samples keep the tokens, log-probs and per-token
   versions generated so far (partial rollouts, host memory only);
2. build the new :class:`~rljax.mesh.topology.Topology` (:func:`plan_resize`, which validates
   the split before anything changes);
3. reshard the learner's params, optimizer state and reference params onto the new learner mesh
   with ``jax.device_put`` (:func:`move_learner`);
4. rebuild the engine on the new sampler mesh and move the sampler to it
   (:func:`detach_sampler` before the learner moves, :func:`attach_sampler` after), publish the
   current weights there, and resume the partial rollouts, which re-prefill their prompt plus
   tokens so far under those weights.

The staleness buffer is host-side and untouched, so no group is lost or duplicated and its
staleness accounting carries on. Engines and learners are kept per mesh in a :class:`MeshCache`:
going back to a mesh already used (6/2 -> 4/4 -> 6/2) reuses its compiled functions.

:class:`Reallocation` is the config-driven trigger (``mesh.reallocate``): the driver reports its
events to its :class:`~rljax.policy.meter.PhaseMeter`, which turns each phase into the
PhaseStats that the pure :class:`Reallocator` policy (settings: ``RunConfig.reallocator``) reads.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import jax
from jax.sharding import Mesh

from rljax.config import ConfigError, MeshConfig
from rljax.learner.learner import Learner, data_parallel_size
from rljax.mesh.topology import Topology, build_topology
from rljax.models.sharding import LEARNER_RULES, ShardingRules
from rljax.policy.meter import PhaseMeter
from rljax.policy.reallocation import (
    PhaseStats,
    Reallocator,
    ReallocatorConfig,
    Split,
    reallocator_settings,
)

T = TypeVar("T")


def mesh_key(mesh: Mesh) -> tuple:
    """Identifies a mesh for caching: its devices in order, axis names and shape."""
    return (tuple(d.id for d in mesh.devices.flat), mesh.axis_names, mesh.devices.shape)


class MeshCache:
    """Objects built for one mesh (engines, learners), so a mesh used before compiles nothing.

    Attributes:
      builds: how many objects ``get`` had to build (a cache miss each).
    """

    def __init__(self) -> None:
        self._items: dict[tuple, Any] = {}
        self.builds = 0

    def put(self, mesh: Mesh, item: Any) -> None:
        self._items[mesh_key(mesh)] = item

    def get(self, mesh: Mesh, build: Callable[[], T]) -> T:
        """The object held for ``mesh``, building (and keeping) it on a miss."""
        key = mesh_key(mesh)
        if key not in self._items:
            self._items[key] = build()
            self.builds += 1
        return self._items[key]

    def peek(self, mesh: Mesh) -> Any | None:
        return self._items.get(mesh_key(mesh))

    def __len__(self) -> int:
        return len(self._items)


def plan_resize(
    cfg: MeshConfig,
    split: Split,
    devices: Sequence[jax.Device],
    *,
    batch: int,
    rules: ShardingRules = LEARNER_RULES,
) -> Topology:
    """The topology for ``split`` over ``devices``; raises a one-line error when it can't work.

    Args:
      cfg: the run's mesh config (its axis sizes are kept; only the split changes).
      split: chips per role (``Split`` itself rejects a side with no chip).
      devices: every device the run may use, in the order the first split took them.
      batch: sequences per learner step; the new learner mesh's data-parallel size must divide
        it.
    """
    if not isinstance(split, Split):
        raise TypeError(f"resize takes a Split(sampler_chips, learner_chips), got {split!r}")
    if cfg.mode != "split":
        raise ConfigError(
            "resize needs config key 'mesh.mode' = 'split' (colocated roles share every "
            "device, so there are no chips to move)"
        )
    if split.total > len(devices):
        raise ConfigError(
            f"cannot resize to {split.sampler_chips}/{split.learner_chips}: it needs "
            f"{split.total} devices and the run has {len(devices)}; keep sampler + learner "
            f"chips <= {len(devices)}"
        )
    topology = build_topology(
        dataclasses.replace(
            cfg, sampler_devices=split.sampler_chips, learner_devices=split.learner_chips
        ),
        devices,
    )
    dp = data_parallel_size(topology.learner, rules)
    if batch % dp:
        raise ConfigError(
            f"cannot resize to {split.sampler_chips}/{split.learner_chips}: the learner mesh "
            f"splits a batch {dp} ways and learner.batch_groups * learner.group_size = {batch} "
            f"is not a multiple of {dp}; pick a learner side whose data-parallel size divides "
            f"{batch}"
        )
    return topology


def move_learner(
    current: Learner,
    mesh: Mesh,
    cache: MeshCache,
    *,
    learning_rate: float | None = None,
) -> Learner:
    """The learner for ``mesh``, holding ``current``'s params, optimizer state, reference
    params and version, each resharded with ``jax.device_put``; ``current`` lets go of its
    arrays so the chips it leaves are free for the sampler.

    A learner built for ``mesh`` before is reused with its compiled step. A new one is built
    like ``current``: pass the ``learning_rate`` override ``current`` was built with (None:
    the config's).
    """
    if mesh_key(mesh) == mesh_key(current.mesh):
        return current
    fresh = cache.peek(mesh) is None
    target = cache.get(
        mesh,
        lambda: Learner(
            current.cfg,
            current.graphdef,
            current.params,
            mesh,
            rules=current.rules,
            loss=current.loss,
            learning_rate=learning_rate,
            temperature=current.temperature,
            ref_params=current.ref_params,
            kernel_impl=current.gradients.kernel_impl,
            router=current.router,
            critic=None if current.critic is None else current.critic.cfg,
            teacher=current.roles.teacher_arg(),
        ),
    )
    target.take_state(current, params=not fresh)  # a new learner copied them in its constructor
    return target


def detach_sampler(sampler) -> None:
    """Drop an idle sampler's device arrays (decode state, params) before its mesh changes.

    Its chips may go to the learner; freeing the KV pages first keeps peak memory at one
    copy. The sampler must have no sample in a slot (interrupt its requests first); queued
    and held samples are host data and survive.
    """
    if sampler.busy_slots:
        raise RuntimeError(
            f"the sampler has {sampler.busy_slots} sequences in slots; interrupt every "
            "in-flight request before moving it to a new mesh"
        )
    sampler.state = None
    sampler.params = None


def attach_sampler(sampler, engine, params, version: int) -> None:
    """Bind a detached sampler to ``engine`` (built on the new sampler mesh).

    ``params`` must already live on the engine's mesh. Held samples re-prefill there when
    resumed.
    """
    if engine.max_concurrent_decodes != sampler.engine.max_concurrent_decodes:
        raise ValueError(
            f"the new engine has {engine.max_concurrent_decodes} slots, the sampler "
            f"{sampler.engine.max_concurrent_decodes}; build it from the same SamplingConfig"
        )
    sampler.engine = engine
    sampler.state = engine.init_decode_state()
    sampler.set_params(params, version)  # no busy slot: applies at once, drops any staged copy


class Reallocation:
    """Config-driven resizing: a phase of measured events in, a split (or None) out.

    The driver reports what each role did as :mod:`rljax.policy.meter` events to ``meter``
    (the simulator reports the same events to its own meter); each ``StepEnd`` is a learner
    step. Once ``due`` (``mesh.reallocate_every`` steps), ``phase`` closes the meter's phase
    into :class:`PhaseStats` and the driver asks ``policy.decide(stats)``. Seconds the sampler
    spends parked for a resize are reported as ``SamplerIdle(held_back=False)``: neither busy
    nor idle; the resize itself is the ``switch_cost_s`` the next decision weighs.

    Args:
      mesh: the run's mesh section (``reallocate_every``, ``reallocate_granularity``, and the
        tensor-parallel sizes, the fewest chips a side runs on).
      settings: the run's ``reallocator`` section; the policy decides with
        :func:`~rljax.policy.reallocation.reallocator_settings` of it, as the simulator's does.
      max_staleness: eta, the run's ``buffer.max_staleness``.
      policy: a policy object to use instead of ``Reallocator(self.settings)`` (tests script
        one).
      meter: the meter the driver reports to (a new one by default).
    """

    def __init__(
        self,
        mesh: MeshConfig,
        settings: ReallocatorConfig | None = None,
        *,
        max_staleness: int,
        policy: Reallocator | None = None,
        meter: PhaseMeter | None = None,
    ):
        self.every = mesh.reallocate_every
        self.granularity = mesh.reallocate_granularity
        self.settings = reallocator_settings(
            settings or ReallocatorConfig(),
            max_staleness=max_staleness,
            granularity=mesh.reallocate_granularity,
            # -1 (the remaining devices) sets no floor beyond one chip.
            sampler_floor=max(1, mesh.sampler_tensor),
            learner_floor=max(1, mesh.learner_tensor),
        )
        self.policy = policy or Reallocator(self.settings)
        self.meter = meter or PhaseMeter()
        self.switch_cost_s: float | None = None  # measured by the last resize (resized)
        self.phases: list[PhaseStats] = []

    def resized(self, seconds: float) -> None:
        """A resize took ``seconds``: the cost the next decision weighs."""
        self.switch_cost_s = seconds

    @property
    def due(self) -> bool:
        """Whether the phase has run its ``reallocate_every`` learner steps."""
        return self.meter.steps >= self.every

    def phase(
        self,
        *,
        split: Split,
        slots: int,
        buffer_rows: list[dict[str, int]],
        batch_groups: int,
        estimated_switch_s: float,
    ) -> PhaseStats:
        """The phase since the last call, as PhaseStats; starts the next phase.

        ``slots`` is the sampler's decode slots (``max_concurrent_decodes`` over its engines);
        ``estimated_switch_s`` stands in for the switch cost until a resize has been measured.
        """
        switch = self.switch_cost_s if self.switch_cost_s is not None else estimated_switch_s
        stats = self.meter.stats(
            split=split,
            slots=slots,
            buffer_rows=buffer_rows,
            batch_groups=batch_groups,
            switch_cost_s=switch,
            granularity=self.granularity,
        )
        self.phases.append(stats)
        return stats
