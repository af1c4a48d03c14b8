"""build_topology: meshes from the config, and splits that cannot work on several hosts."""

from __future__ import annotations

import dataclasses

import jax
import pytest

from rljax.config import ConfigError, MeshConfig
from rljax.mesh.topology import build_topology, check_host_boundary


@dataclasses.dataclass(frozen=True)
class Host:
    """A stand-in device: only its process index matters to the host check."""

    id: int
    process_index: int


def _pod(hosts: int, per_host: int) -> list[Host]:
    return [Host(h * per_host + i, h) for h in range(hosts) for i in range(per_host)]


@pytest.mark.parametrize("sampler", [2, 4, 6])
def test_splits_on_host_boundaries_pass(sampler):
    check_host_boundary(_pod(4, 2), sampler)


@pytest.mark.parametrize("sampler,host", [(1, 0), (3, 1), (5, 2)])
def test_a_split_that_cuts_a_host_is_refused(sampler, host):
    with pytest.raises(ConfigError, match=rf"= {sampler} cuts host {host} in two.*multiple of 2"):
        check_host_boundary(_pod(4, 2), sampler)


def test_build_topology_checks_the_host_boundary():
    cfg = MeshConfig(mode="split", sampler_devices=3, learner_devices=5)
    with pytest.raises(ConfigError, match="cuts host 1 in two"):
        build_topology(cfg, _pod(4, 2))


def test_one_host_splits_anywhere():
    topology = build_topology(MeshConfig(mode="split", sampler_devices=3, learner_devices=5))
    assert (topology.sampler_devices, topology.learner_devices) == (3, 5)
    assert len(jax.devices()) == 8
