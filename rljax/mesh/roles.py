"""Which process plays which role when the meshes sit on different processes (a pod).

A pod's split topology (``mesh.mode='split'``, each mesh made of whole hosts) gives every
process the devices of one mesh only, so each process plays that mesh's role; process 0, the
first sampler process, leads. :func:`roles` reads the roles off the topology, and refuses in one
line a split a pod cannot run (part of a host, a process with no device, a learner first).
"""

from __future__ import annotations

import dataclasses

import jax

from rljax.config import ConfigError
from rljax.mesh.topology import Topology


@dataclasses.dataclass(frozen=True)
class Roles:
    """Which processes own the sampler mesh and which the learner mesh."""

    sampler: tuple[int, ...]
    learner: tuple[int, ...]
    me: int

    @property
    def role(self) -> str:
        return "sampler" if self.me in self.sampler else "learner"

    @property
    def is_leader(self) -> bool:
        return self.me == self.sampler[0]

    @property
    def is_learner_leader(self) -> bool:
        return self.me == self.learner[0]


def roles(
    topology: Topology,
    process_count: int | None = None,
    me: int | None = None,
    per_host: int | None = None,
) -> Roles:
    """The pod's roles on a split ``topology``; one-line errors for splits a pod cannot run.

    ``per_host``: devices per process (default: this process's). A split that cuts a host in
    two is refused before, by ``build_topology``.
    """
    process_count = jax.process_count() if process_count is None else process_count
    me = jax.process_index() if me is None else me
    per_host = jax.local_device_count() if per_host is None else per_host
    for side in ("sampler", "learner"):
        n = getattr(topology, side).devices.size
        if n % per_host:
            raise ConfigError(
                f"config key 'mesh.{side}_devices' = {n} is not whole hosts on a pod of "
                f"{process_count} processes x {per_host} devices; use a multiple of {per_host} "
                f"(sampler + learner = {process_count * per_host}, every device of the pod)"
            )
    sampler = sorted({d.process_index for d in topology.sampler.devices.flat})
    learner = sorted({d.process_index for d in topology.learner.devices.flat})
    idle = sorted(set(range(process_count)) - set(sampler) - set(learner))
    if idle:
        raise ConfigError(
            f"process {idle[0]} owns no device of either mesh; make mesh.sampler_devices + "
            "mesh.learner_devices cover every host's devices"
        )
    if sampler[0] != 0:
        raise ConfigError(
            "process 0 must own sampler devices (it leads the pod and writes the metrics); the "
            "sampler mesh takes the first devices, so launch the sampler hosts first"
        )
    return Roles(tuple(sampler), tuple(learner), me)
