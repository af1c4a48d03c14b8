"""Per-chip hardware specs for the simulator's roofline cost models.

Numbers are per chip, dense bf16, from the vendors' public datasheets:
  TPU v4:  cloud.google.com/tpu/docs/v4  (275 TFLOP/s, 32 GiB HBM2, 1200 GB/s, ICI 2400 Gbps)
  TPU v5e: cloud.google.com/tpu/docs/v5e (197 TFLOP/s, 16 GiB HBM2, 819 GB/s, ICI 1600 Gbps)
  TPU v5p: cloud.google.com/tpu/docs/v5p (459 TFLOP/s, 95 GiB HBM2e, 2765 GB/s, ICI 4800 Gbps)
  TPU v6e: cloud.google.com/tpu/docs/v6e (918 TFLOP/s, 32 GiB HBM, 1640 GB/s, ICI 3584 Gbps)
  H100 SXM: NVIDIA H100 datasheet (989 TFLOP/s dense bf16, 80 GB HBM3, 3.35 TB/s, NVLink
    900 GB/s); H800 SXM is the export variant with NVLink cut to 400 GB/s.
  H20: NVIDIA H20 product brief (148 TFLOP/s bf16, 96 GB HBM3, 4.0 TB/s, NVLink 900 GB/s).
  A100 SXM 80GB: NVIDIA A100 datasheet (312 TFLOP/s, 80 GB HBM2e, 2039 GB/s, NVLink 600 GB/s).
``network_bytes_per_s`` is the per-chip bandwidth for traffic that leaves a host: the ICI
link budget on TPU pods (meshes on one slice share the ICI torus), and a 400 Gb/s
InfiniBand NIC per GPU on the GPU clusters the validation cases ran on.
"""

from __future__ import annotations

import dataclasses

_GIB = 1024**3
_GB = 1e9


@dataclasses.dataclass(frozen=True)
class ChipSpec:
    """Peak figures of one accelerator chip.

    Attributes:
      name: registry key.
      bf16_flops: dense bf16 peak FLOP/s.
      hbm_bytes: HBM capacity in bytes.
      hbm_bytes_per_s: HBM bandwidth in bytes/s.
      local_link_bytes_per_s: chip-to-chip bandwidth inside a host / NVLink domain, bytes/s.
      network_bytes_per_s: bandwidth per chip for traffic between hosts, bytes/s.
      chips_per_host: chips sharing a host (the natural reallocation unit).
    """

    name: str
    bf16_flops: float
    hbm_bytes: float
    hbm_bytes_per_s: float
    local_link_bytes_per_s: float
    network_bytes_per_s: float
    chips_per_host: int

    def __post_init__(self):
        figures = (self.bf16_flops, self.hbm_bytes, self.hbm_bytes_per_s)
        if min((*figures, self.local_link_bytes_per_s, self.network_bytes_per_s)) <= 0:
            raise ValueError(f"ChipSpec {self.name!r}: every peak figure must be positive")


def _tpu(name, tflops, hbm_gib, hbm_gbps, ici_gbit, per_host=4) -> ChipSpec:
    ici = ici_gbit * 1e9 / 8
    return ChipSpec(name, tflops * 1e12, hbm_gib * _GIB, hbm_gbps * _GB, ici, ici, per_host)


def _gpu(name, tflops, hbm_gb, hbm_tbps, nvlink_gbps, nic_gbit=400.0) -> ChipSpec:
    nic = nic_gbit * 1e9 / 8
    return ChipSpec(name, tflops * 1e12, hbm_gb * _GB, hbm_tbps * 1e12, nvlink_gbps * _GB, nic, 8)


CHIPS: dict[str, ChipSpec] = {
    "tpu-v4": _tpu("tpu-v4", 275, 32, 1200, 2400),
    "tpu-v5e": _tpu("tpu-v5e", 197, 16, 819, 1600, per_host=8),
    "tpu-v5p": _tpu("tpu-v5p", 459, 95, 2765, 4800),
    "tpu-v6e": _tpu("tpu-v6e", 918, 32, 1640, 3584, per_host=8),
    "h100": _gpu("h100", 989, 80, 3.35, 900),
    "h800": _gpu("h800", 989, 80, 3.35, 400),
    "h20": _gpu("h20", 148, 96, 4.0, 900),
    "a100": _gpu("a100", 312, 80, 2.039, 600),
}


def get_chip(name: str) -> ChipSpec:
    """Looks a chip up by name; raises with the known names on a typo."""
    if name not in CHIPS:
        raise KeyError(f"unknown chip {name!r}; choose one of {sorted(CHIPS)}")
    return CHIPS[name]
