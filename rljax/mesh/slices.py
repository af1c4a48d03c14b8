"""Multislice meshes: devices grouped into slices (ICI inside, DCN between), hybrid meshes.

A multislice job (``mesh.num_slices`` > 1, MaxText's name) joins several TPU slices over the
data-centre network. Every mesh axis is laid out so that at most one axis crosses slices: its
**DCN axis**, the sampler's ``data`` (replicas) and the learner's ``fsdp`` (data-parallel
shards). Every other axis (``tensor``) stays inside a slice, on ICI. An axis of size n over k
slices is k blocks of n / k devices, block i on slice i.

On a TPU the devices say which slice they sit on (``device.slice_index``), and
:func:`hybrid_mesh` asks ``jax.experimental.mesh_utils.create_hybrid_device_mesh`` for the
ICI-aware order within each slice. The CPU has no slices, so ``num_slices`` contiguous groups
of devices stand in for them (on a multi-process CPU pod the devices are ordered by process,
so a group is a run of whole processes when the counts divide); the meshes, the checks and the
two-stage weight sync (:mod:`rljax.mesh.fan_out`) are then the same as on a TPU.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import jax
import numpy as np
from jax.experimental import mesh_utils
from jax.sharding import Mesh

from rljax.config import ConfigError

# device id -> slice index, as a hashable tuple of (id, slice) pairs (Topology is frozen).
SliceMap = tuple[tuple[int, int], ...]


def on_slices(devices: Sequence[jax.Device]) -> bool:
    """Whether ``devices`` say which slice they sit on: TPU devices do. (The CPU devices of a
    multi-process run report ``slice_index`` 0 too; they are emulated like one process's.)"""
    return bool(devices) and all(d.platform == "tpu" and hasattr(d, "slice_index") for d in devices)


def slice_groups(devices: Sequence[jax.Device], num_slices: int) -> list[list[jax.Device]]:
    """``devices`` grouped by slice, slice 0 first; each group keeps the given device order.

    Devices with ``slice_index`` (TPU) are grouped by it and must form ``num_slices`` equal
    slices; devices without it (CPU) are cut into ``num_slices`` contiguous groups.
    """
    devices = list(devices)
    if num_slices < 1 or len(devices) % num_slices:
        raise ConfigError(
            f"config key 'mesh.num_slices' = {num_slices} does not divide the {len(devices)} "
            f"visible device(s); set it to the number of slices (a divisor of {len(devices)})"
        )
    if on_slices(devices):
        by_slice: dict[int, list] = {}
        for d in devices:
            by_slice.setdefault(d.slice_index, []).append(d)
        sizes = {len(g) for g in by_slice.values()}
        if len(by_slice) != num_slices or len(sizes) != 1:
            raise ConfigError(
                f"config key 'mesh.num_slices' = {num_slices} does not match the devices: they "
                f"sit on {len(by_slice)} slice(s) of sizes {sorted(sizes)}; set it to "
                f"{len(by_slice)}"
            )
        return [by_slice[k] for k in sorted(by_slice)]
    per = len(devices) // num_slices
    return [devices[i * per : (i + 1) * per] for i in range(num_slices)]


def slice_map(groups: Sequence[Sequence[jax.Device]]) -> SliceMap:
    """The (device id, slice) pairs of ``groups``, in id order."""
    return tuple(sorted((d.id, s) for s, g in enumerate(groups) for d in g))


def count(smap: SliceMap) -> int:
    """The slices ``smap`` names (1 for a single-slice job's empty map)."""
    return len({s for _, s in smap}) or 1


def hybrid_mesh(
    groups: Sequence[Sequence[jax.Device]], axes: dict[str, int], dcn_axis: str, key: str
) -> Mesh:
    """A mesh over the devices of ``groups`` whose ``dcn_axis`` alone crosses slices.

    ``axes`` are the whole mesh's sizes (one may be -1); ``dcn_axis`` must be a multiple of the
    number of slices, and it is split into that many blocks, one per slice.
    """
    k = len(groups)
    n = sum(len(g) for g in groups)
    sizes = dict(axes)
    fixed = math.prod(v for v in sizes.values() if v != -1)
    free = [a for a, v in sizes.items() if v == -1]
    if n % fixed or (not free and fixed != n):
        raise ConfigError(
            f"config key '{key}' gives mesh axes {axes} that do not fit {n} device(s); make "
            f"their product divide the device count (use -1 for the rest)"
        )
    if free:
        sizes[free[0]] = n // fixed
    if sizes[dcn_axis] % k:
        raise ConfigError(
            f"config key '{key}' gives axis '{dcn_axis}' size {sizes[dcn_axis]} over {k} slices; "
            f"make it a multiple of {k} (it is the one axis that crosses slices, over DCN)"
        )
    ici = tuple(v // k if a == dcn_axis else v for a, v in sizes.items())
    dcn = tuple(k if a == dcn_axis else 1 for a in sizes)
    flat = [d for g in groups for d in g]
    if on_slices(flat):
        arr = mesh_utils.create_hybrid_device_mesh(ici, dcn, devices=flat)
    else:
        # Emulated slices: block i of the DCN axis is slice i, laid out as np.block would.
        per_slice = np.stack([np.array(g, dtype=object).reshape(ici) for g in groups])
        d = list(sizes).index(dcn_axis)
        arr = np.moveaxis(per_slice, 0, d).reshape(tuple(sizes.values()))
    return Mesh(arr, tuple(sizes))


def check_whole_slices(groups: Sequence[Sequence[jax.Device]], sampler: int, learner: int):
    """For ``slice_layout='by_role'``: each role must take whole slices."""
    per = len(groups[0])
    for key, v in (("mesh.sampler_devices", sampler), ("mesh.learner_devices", learner)):
        if v % per:
            raise ConfigError(
                f"config key '{key}' = {v} cuts a slice in two (slices of {per} devices) with "
                f"mesh.slice_layout='by_role'; use a multiple of {per}, or slice_layout='spread'"
            )
    if sampler + learner > per * len(groups):
        raise ConfigError(
            f"config key 'mesh.sampler_devices' + 'mesh.learner_devices' = {sampler + learner} "
            f"is invalid: the {len(groups)} slices hold {per * len(groups)} devices; shrink the "
            "split or add slices"
        )
