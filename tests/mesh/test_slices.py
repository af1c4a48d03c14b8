"""Multislice meshes on 8 fake CPU devices: slices are contiguous groups of devices."""

from __future__ import annotations

import dataclasses
import importlib.util
import pathlib

import jax
import numpy as np
import pytest
from jax.experimental import mesh_utils

from rljax.config import ConfigError, MeshConfig
from rljax.mesh.slices import hybrid_mesh, slice_groups
from rljax.mesh.topology import build_topology

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _ids(mesh) -> list[list[int]]:
    return np.vectorize(lambda d: d.id)(mesh.devices).tolist()


def _split(**kw) -> MeshConfig:
    base = dict(mode="split", num_slices=2, sampler_devices=4, learner_devices=4)
    return MeshConfig(**{**base, **kw})


def test_by_role_gives_each_role_a_slice():
    topo = build_topology(_split(sampler_data=2, sampler_tensor=2))
    assert _ids(topo.sampler) == [[0, 1], [2, 3]]
    assert _ids(topo.learner) == [[4], [5], [6], [7]]
    assert topo.num_slices == 2
    assert dict(topo.slices) == {i: i // 4 for i in range(8)}


def test_spread_puts_the_dcn_axis_across_slices():
    # Slices {0..3} and {4..7}, each cut 2 sampler + 2 learner: 'data' and 'fsdp' cross them.
    topo = build_topology(_split(slice_layout="spread", sampler_data=2, sampler_tensor=2))
    assert _ids(topo.sampler) == [[0, 1], [4, 5]]  # one data replica in each slice
    assert _ids(topo.learner) == [[2], [3], [6], [7]]


def test_colocated_spans_every_slice_with_tensor_inside_one():
    topo = build_topology(
        MeshConfig(num_slices=2, sampler_data=4, sampler_tensor=2, learner_tensor=2)
    )
    assert topo.colocated
    for mesh in (topo.sampler, topo.learner):
        for row in _ids(mesh):  # a 'tensor' row never leaves its slice
            assert len({i // 4 for i in row}) == 1


@dataclasses.dataclass(frozen=True)
class TpuLike:
    """A stand-in device that carries ``slice_index``, as TPU devices do."""

    id: int
    slice_index: int
    process_index: int = 0
    platform: str = "cpu"
    device_kind: str = "cpu"


def test_emulated_layout_matches_create_hybrid_device_mesh():
    devices = [TpuLike(i, i // 4) for i in range(8)]
    groups = slice_groups(devices, 2)
    assert [[d.id for d in g] for g in groups] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    want = mesh_utils.create_hybrid_device_mesh((2, 2), (2, 1), devices=devices)
    cpu = jax.devices()
    got = hybrid_mesh([cpu[:4], cpu[4:]], {"data": 4, "tensor": 2}, "data", "mesh.sampler_*")
    assert _ids(got) == np.vectorize(lambda d: d.id)(want).tolist()


def test_slice_index_decides_the_groups_not_the_order():
    devices = [TpuLike(i, i % 2, platform="tpu") for i in range(8)]
    assert [[d.id for d in g] for g in slice_groups(devices, 2)] == [[0, 2, 4, 6], [1, 3, 5, 7]]
    with pytest.raises(ConfigError, match=r"'mesh.num_slices' = 4 .* 2 slice\(s\).*set it to 2"):
        slice_groups(devices, 4)


@pytest.mark.parametrize(
    "cfg, match",
    [
        (_split(num_slices=3), r"'mesh.num_slices' = 3 does not divide the 8 .* divisor of 8"),
        (_split(sampler_devices=2, learner_devices=6), r"'mesh.sampler_devices' = 2 cuts a slice"),
        (_split(sampler_devices=8), r"= 12 is invalid: the 2 slices hold 8 devices"),
        (
            _split(slice_layout="spread", sampler_data=1, sampler_tensor=4),
            r"axis 'data' size 1 over 2 slices.*of 2",
        ),
        (
            _split(slice_layout="spread", sampler_devices=3, learner_devices=4),
            r"'mesh.sampler_devices' = 3 .* multiple of mesh.num_slices = 2",
        ),
        (
            _split(slice_layout="spread", sampler_devices=6, learner_devices=4),
            r"= 10 is invalid: spread over 2 slices",
        ),
    ],
)
def test_bad_multislice_splits_are_one_line_errors(cfg, match):
    with pytest.raises(ConfigError, match=match) as exc:
        build_topology(cfg)
    assert "\n" not in str(exc.value)


@pytest.mark.parametrize(
    "kw, match",
    [
        ({"num_slices": 0}, r"'mesh.num_slices' = 0 is invalid"),
        ({"slice_layout": "diagonal"}, r"'mesh.slice_layout' = 'diagonal' .* by_role, spread"),
        ({"reallocate": True}, r"'mesh.reallocate' = True .*num_slices > 1"),
    ],
)
def test_config_refuses_bad_slice_settings(kw, match):
    with pytest.raises(ConfigError, match=match):
        _split(**kw)


def test_two_v5e8_slices_config_builds_one_role_per_slice():
    """configs/qwen2_5_1_5b_gsm8k.py:v5e8x2 on 16 stand-in TPU devices (two hosts, two slices):
    the real path through create_hybrid_device_mesh, since the devices carry slice_index."""
    path = ROOT / "configs" / "qwen2_5_1_5b_gsm8k.py"
    spec = importlib.util.spec_from_file_location("q15", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    cfg = module.recipe("v5e8x2")
    assert cfg.mode == "async" and cfg.buffer.max_staleness >= 1
    assert module.TARGETS["v5e8x2"] == ("tpu-v5e", 16)
    devices = [TpuLike(i, i // 8, i // 8, "tpu", "TPU v5 lite") for i in range(16)]
    topo = build_topology(cfg.mesh, devices)
    assert topo.sampler.devices.shape == (4, 2) and topo.learner.devices.shape == (8, 1)
    assert {d.slice_index for d in topo.sampler.devices.flat} == {0}
    assert {d.slice_index for d in topo.learner.devices.flat} == {1}
    assert topo.num_slices == 2
