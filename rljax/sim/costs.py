"""Roofline cost models that stand in for the engines in the simulator.

Decode is memory bound: each step a replica of ``tp`` chips streams its shard of the weights
plus the KV cache of every live sequence, so
  step_s = max((param_bytes + kv_bytes_read) / tp / (hbm_bw * decode_efficiency),
               2 N batch / (tp * peak * decode_mfu)).
Prefill and training are compute bound: 2 N FLOPs per token forward, ``train_flops_per_param``
N per token for a training step (6 for fwd+bwd; GRPO stacks add forward passes for the old
and reference log-probs), divided by peak * MFU. Weight sync is bytes / link bandwidth.
The efficiencies are the only free parameters; calibrate them once per hardware family.

A mixture of experts splits N in two (``rljax.models.presets``): the FLOPs above count the
active parameters (attention, the router, k of the E experts, a shared expert), the bytes
(weights streamed by decode, held in HBM, moved by a weight sync) count all of them. Decode
streams every expert: a batch of B sequences routes B * k tokens over E experts, which at the
batch sizes RL decodes (B * k >> E) touches them all.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from rljax.models import presets
from rljax.sim.chips import ChipSpec


@dataclasses.dataclass(frozen=True)
class Efficiencies:
    """Fractions of peak the software stack achieves (the calibration knobs).

    Attributes:
      decode_hbm: fraction of HBM bandwidth a decode step achieves.
      decode_mfu: fraction of peak FLOP/s for the compute side of a decode step.
      prefill_mfu: fraction of peak FLOP/s during prefill.
      train_mfu: fraction of peak FLOP/s during a training step.
      sync: fraction of link bandwidth a weight broadcast achieves.
      kv_memory_fraction: fraction of HBM left after weights that the KV cache may fill.
    """

    decode_hbm: float = 0.6
    decode_mfu: float = 0.5
    prefill_mfu: float = 0.5
    train_mfu: float = 0.4
    sync: float = 0.5
    kv_memory_fraction: float = 0.85

    def __post_init__(self):
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if not 0.0 < value <= 1.0:
                raise ValueError(
                    f"efficiency {field.name}={value} must be in (0, 1]; it is a fraction of peak"
                )


def learner_flops_per_param(
    policy: float = 6.0, *, critic: bool = False, teacher: float = 0.0, reference: bool = False
) -> float:
    """A learner step's FLOPs per policy parameter per trained token, with the models beside
    the policy (rljax.learner.roles): ``policy`` its own (6: forward and backward; 8 when the
    proximal log-probs are recomputed); a ``critic`` of the policy's size adds its scoring
    forward (2) and its update (6); a ``teacher`` of that many times the policy's active
    parameters adds its forward (2 x teacher); a ``reference`` (a KL) adds a forward (2)."""
    return policy + (8.0 if critic else 0.0) + 2.0 * teacher + (2.0 if reference else 0.0)


@dataclasses.dataclass(frozen=True)
class CostModel:
    """Seconds for each engine/learner operation of one model on one chip type.

    Attributes:
      model: a preset dict (see ``rljax.models.presets``).
      chip: the chip spec.
      tp: chips per sampler replica (tensor parallel degree of the decode engine).
      efficiencies: calibration fractions.
      param_bytes_per: bytes per weight (2 for bf16).
      kv_bytes_per: bytes per KV element.
      train_flops_per_param: FLOPs per parameter per trained token (6 = fwd + bwd).
      sync_latency_s: fixed overhead per weight sync (barriers, resharding launch).
    """

    model: Mapping[str, Any]
    chip: ChipSpec
    tp: int = 1
    efficiencies: Efficiencies = Efficiencies()
    param_bytes_per: int = 2
    kv_bytes_per: int = 2
    train_flops_per_param: float = 6.0
    sync_latency_s: float = 1.0

    def __post_init__(self):
        if self.tp < 1:
            raise ValueError(f"tp must be >= 1 chip per sampler replica, got {self.tp}")
        if self.train_flops_per_param < 6.0:
            raise ValueError("train_flops_per_param must be >= 6 (forward 2N + backward 4N)")
        if self.weight_bytes > self.tp * self.chip.hbm_bytes:
            raise ValueError(
                f"{self.weight_bytes / 1e9:.1f} GB of weights do not fit in {self.tp} x "
                f"{self.chip.name} HBM; raise tp"
            )

    @property
    def n_params(self) -> int:
        """Every parameter (every expert): the weights' bytes and a sync's."""
        return presets.param_count(self.model)

    @property
    def n_active(self) -> int:
        """The parameters one token computes with: what the FLOPs scale with."""
        return presets.active_param_count(self.model)

    @property
    def weight_bytes(self) -> float:
        return self.n_params * self.param_bytes_per

    @property
    def kv_token_bytes(self) -> int:
        return presets.kv_bytes_per_token(self.model, self.kv_bytes_per)

    def decode_compute_s(self, batch: int) -> float:
        """Compute-side time of one decode step for ``batch`` live sequences."""
        eff = self.efficiencies
        return 2.0 * self.n_active * batch / (self.tp * self.chip.bf16_flops * eff.decode_mfu)

    def decode_memory_s(self, kv_tokens: float) -> float:
        """Memory-side time of one decode step that reads ``kv_tokens`` cached tokens."""
        bw = self.tp * self.chip.hbm_bytes_per_s * self.efficiencies.decode_hbm
        return (self.weight_bytes + kv_tokens * self.kv_token_bytes) / bw

    def decode_step_s(self, batch: int, kv_tokens: float) -> float:
        """Roofline time of one decode step (the slower of memory and compute)."""
        return max(self.decode_memory_s(kv_tokens), self.decode_compute_s(batch))

    def kv_seconds_per_token(self) -> float:
        """Extra decode-step seconds per cached token read (slope of decode_memory_s)."""
        bw = self.tp * self.chip.hbm_bytes_per_s * self.efficiencies.decode_hbm
        return self.kv_token_bytes / bw

    def prefill_s(self, tokens: int) -> float:
        """Time for one replica to prefill ``tokens`` prompt tokens."""
        flops = 2.0 * self.n_active * tokens
        return flops / (self.tp * self.chip.bf16_flops * self.efficiencies.prefill_mfu)

    @property
    def prefill_s_per_token(self) -> float:
        """One replica's prefill seconds per token (prefill is linear in its tokens here)."""
        return self.prefill_s(1)

    def train_step_s(self, tokens: int, chips: int) -> float:
        """Time for ``chips`` learner chips to train on ``tokens`` tokens (one optimizer step)."""
        if chips < 1:
            raise ValueError(f"train_step_s needs >= 1 learner chip, got {chips}")
        flops = self.train_flops_per_param * self.n_active * tokens
        return flops / (chips * self.chip.bf16_flops * self.efficiencies.train_mfu)

    def sync_s(self, sampler_chips: int, learner_chips: int) -> float:
        """Time to broadcast new weights from the learner mesh to every sampler replica.

        The learner's egress carries one copy per replica; each sampler chip takes its shard.
        """
        eff = self.efficiencies.sync
        replicas = max(1, sampler_chips // self.tp)
        link = self.chip.network_bytes_per_s * eff
        egress = self.weight_bytes * replicas / (max(1, learner_chips) * link)
        ingress = self.weight_bytes / self.tp / link
        return self.sync_latency_s + max(egress, ingress)

    def reshard_local_s(self) -> float:
        """Colocated switch from training to generation layout: weights move over local links."""
        link = self.chip.local_link_bytes_per_s * self.efficiencies.sync
        return self.sync_latency_s + self.weight_bytes / self.tp / link

    def kv_slots(self, tokens_per_sequence: float, max_slots: int) -> int:
        """Concurrent sequences a replica's KV memory holds at ``tokens_per_sequence`` each."""
        free = self.tp * self.chip.hbm_bytes - self.weight_bytes
        budget = free * self.efficiencies.kv_memory_fraction
        fit = int(budget // (self.kv_token_bytes * max(1.0, tokens_per_sequence)))
        return max(1, min(max_slots, fit))
