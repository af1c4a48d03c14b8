"""Split the devices into the sampler mesh and the learner mesh.

``colocated``: both roles use every device (two Mesh objects over the same devices, each with
its role's axes); the runtime time-shares them, which is the synchronous baseline.
``split``: the first ``sampler_devices`` devices form the sampler mesh and the next
``learner_devices`` the learner mesh; the two are disjoint, so weights cross between them with
``jax.device_put`` (a jit cannot write outputs onto a disjoint mesh).

With ``num_slices`` > 1 (multislice, :mod:`rljax.mesh.slices`) each mesh is a hybrid mesh
whose DCN axis (sampler ``data``, learner ``fsdp``) alone crosses slices. ``slice_layout``
``'by_role'`` gives each role whole slices, the sampler the first; ``'spread'`` cuts every
slice the same way, its first ``sampler_devices / num_slices`` devices to the sampler and the
next ``learner_devices / num_slices`` to the learner, so both meshes span every slice.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import jax
from jax.sharding import Mesh

from rljax.config import ConfigError, MeshConfig
from rljax.mesh.slices import (
    SliceMap,
    check_whole_slices,
    count,
    hybrid_mesh,
    slice_groups,
    slice_map,
)
from rljax.models.sharding import make_mesh
from rljax.policy.reallocation import Split


@dataclasses.dataclass(frozen=True)
class Topology:
    """The two meshes, and whether they share devices."""

    sampler: Mesh
    learner: Mesh
    colocated: bool
    # (device id, slice) of every device when the job has several slices; () for one slice.
    slices: SliceMap = ()

    @property
    def num_slices(self) -> int:
        return count(self.slices)

    @property
    def sampler_devices(self) -> int:
        return self.sampler.devices.size

    @property
    def learner_devices(self) -> int:
        return self.learner.devices.size

    @property
    def split(self) -> Split | None:
        """Chips per role, or None when both roles share every device (colocated)."""
        if self.colocated:
            return None
        return Split(self.sampler_devices, self.learner_devices)


def _axes_mesh(devices, axes: dict[str, int], key: str) -> Mesh:
    fixed = math.prod(v for v in axes.values() if v != -1)
    if len(devices) % fixed or (-1 not in axes.values() and fixed != len(devices)):
        raise ConfigError(
            f"config key '{key}' gives mesh axes {axes} that do not fit {len(devices)} "
            f"device(s); make their product divide the device count (use -1 for the rest)"
        )
    return make_mesh(devices, axes)


def build_topology(cfg: MeshConfig, devices: Sequence[jax.Device] | None = None) -> Topology:
    """Meshes for ``cfg`` over ``devices`` (default: all), with clear errors when they don't fit."""
    devices = list(jax.devices() if devices is None else devices)
    learner_axes = {"fsdp": cfg.learner_fsdp, "tensor": cfg.learner_tensor}
    sampler_axes = {"data": cfg.sampler_data, "tensor": cfg.sampler_tensor}
    if cfg.expert_parallel > 1:  # a mixture-of-experts model's experts split over 'expert'
        learner_axes = {"expert": cfg.expert_parallel, **learner_axes}
        sampler_axes = {"expert": cfg.expert_parallel, **sampler_axes}
    if cfg.num_slices > 1:
        return _multislice(cfg, devices, sampler_axes, learner_axes)
    if cfg.mode == "colocated":
        return Topology(
            sampler=_axes_mesh(devices, sampler_axes, "mesh.sampler_*"),
            learner=_axes_mesh(devices, learner_axes, "mesh.learner_*"),
            colocated=True,
        )
    need = cfg.sampler_devices + cfg.learner_devices
    if need > len(devices):
        raise ConfigError(
            f"config key 'mesh.sampler_devices' + 'mesh.learner_devices' = {need} is invalid: "
            f"only {len(devices)} device(s) are visible; shrink the split or add devices "
            "(on CPU set JAX_NUM_CPU_DEVICES)"
        )
    check_host_boundary(devices[:need], cfg.sampler_devices)
    return Topology(
        sampler=_axes_mesh(devices[: cfg.sampler_devices], sampler_axes, "mesh.sampler_*"),
        learner=_axes_mesh(devices[cfg.sampler_devices : need], learner_axes, "mesh.learner_*"),
        colocated=False,
    )


def _multislice(cfg: MeshConfig, devices, sampler_axes, learner_axes) -> Topology:
    """Hybrid meshes over ``cfg.num_slices`` slices (see the module docstring)."""
    groups = slice_groups(devices, cfg.num_slices)
    smap = slice_map(groups)

    def meshes(sampler_groups, learner_groups) -> tuple:
        return (
            hybrid_mesh(sampler_groups, sampler_axes, "data", "mesh.sampler_*"),
            hybrid_mesh(learner_groups, learner_axes, "fsdp", "mesh.learner_*"),
        )

    if cfg.mode == "colocated":
        sampler, learner = meshes(groups, groups)
        return Topology(sampler, learner, colocated=True, slices=smap)
    if cfg.slice_layout == "by_role":
        check_whole_slices(groups, cfg.sampler_devices, cfg.learner_devices)
        per = len(groups[0])
        s, n = cfg.sampler_devices // per, (cfg.sampler_devices + cfg.learner_devices) // per
        sampler, learner = meshes(groups[:s], groups[s:n])
        return Topology(sampler, learner, colocated=False, slices=smap)
    k = len(groups)  # spread: every slice is cut the same way
    for key, v in (
        ("mesh.sampler_devices", cfg.sampler_devices),
        ("mesh.learner_devices", cfg.learner_devices),
    ):
        if v % k:
            raise ConfigError(
                f"config key '{key}' = {v} is invalid: expected a multiple of mesh.num_slices = "
                f"{k} (slice_layout='spread' cuts every slice alike)"
            )
    s, n = cfg.sampler_devices // k, (cfg.sampler_devices + cfg.learner_devices) // k
    if n > len(groups[0]):
        raise ConfigError(
            f"config key 'mesh.sampler_devices' + 'mesh.learner_devices' = {n * k} is invalid: "
            f"spread over {k} slices that needs {n} devices per slice and a slice has "
            f"{len(groups[0])}; shrink the split"
        )
    for g in groups:
        check_host_boundary(g[:n], s)
    sampler, learner = meshes([g[:s] for g in groups], [g[s:n] for g in groups])
    return Topology(sampler, learner, colocated=False, slices=smap)


def check_host_boundary(devices: Sequence, sampler_devices: int) -> None:
    """Refuse a split that gives one host's devices to both meshes.

    The sampler takes the first ``sampler_devices`` devices, the learner the rest. One host
    holds both meshes by definition; on several hosts each mesh must be made of whole hosts,
    so that a host runs one role and the weight sync is a transfer between hosts.
    """
    sides: dict[int, set[bool]] = {}
    for i, d in enumerate(devices):
        sides.setdefault(getattr(d, "process_index", 0), set()).add(i < sampler_devices)
    cut = sorted(p for p, s in sides.items() if len(s) > 1)
    if cut and len(sides) > 1:  # one host holds both meshes by definition
        per_host = sum(getattr(d, "process_index", 0) == cut[0] for d in devices)
        raise ConfigError(
            f"config key 'mesh.sampler_devices' = {sampler_devices} cuts host {cut[0]} in two "
            f"(its {per_host} devices would serve both meshes); use a multiple of {per_host}, "
            "the devices per host"
        )
