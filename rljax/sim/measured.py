"""A cost model from measured per-call seconds, for predicting a run whose costs were timed.

The roofline :class:`~rljax.sim.costs.CostModel` derives every cost from datasheet peaks and
efficiencies; it cannot describe a tiny model on fake CPU devices, whose calls cost dispatch
time, not FLOPs or bytes. :class:`MeasuredCosts` answers the same questions from seconds
measured on the run to be predicted (``scripts/bench_lending.py --simulate`` takes them from
its lending-off run): a decode step costs ``decode_s_per_step`` whatever the live sequences, a
group's prefill ``prefill_s``, a learner step ``train_step_s`` on ``learner_chips`` (scaled
linearly to other chip counts), a weight publish ``sync_s``; KV memory never limits the slots.
"""

from __future__ import annotations

import dataclasses

from rljax.config.checks import GEMMA_FAMILIES
from rljax.models import presets
from rljax.sim.chips import ChipSpec
from rljax.sim.costs import CostModel

# No HBM or link limit: the measured seconds already hold whatever the devices cost.
UNBOUNDED = ChipSpec("measured", 1e30, 1e30, 1e30, 1e30, 1e30, chips_per_host=1)


@dataclasses.dataclass(frozen=True)
class MeasuredCosts(CostModel):
    """Seconds per engine and learner call, as measured (see the module docstring).

    Attributes (beyond ``CostModel``'s, whose ``chip`` defaults to no limit):
      decode_s_per_step: one decode step of a replica, whatever its live sequences.
      prefill_s_per_group: one group's prompt prefill.
      train_step_s_per_token: one learner step's seconds per trained token on ``learner_chips``.
      learner_chips: the chips the training time was measured on.
      publish_s: one weight publish (learner to sampler).
      reprefill_s_per_token: prefill seconds per cached token of a request moved to another
        replica (a loan's hand-back; :func:`rljax.policy.lending.reprefill_s`).
    """

    chip: ChipSpec = UNBOUNDED
    decode_s_per_step: float = 0.01
    prefill_s_per_group: float = 0.0
    train_step_s_per_token: float = 0.0
    learner_chips: int = 1
    publish_s: float = 0.0
    reprefill_s_per_token: float = 0.0

    def __post_init__(self):
        super().__post_init__()
        times = (self.decode_s_per_step, self.prefill_s_per_group, self.train_step_s_per_token)
        low = min(*times, self.publish_s, self.reprefill_s_per_token)
        if self.decode_s_per_step <= 0 or low < 0 or self.learner_chips < 1:
            raise ValueError(
                "MeasuredCosts needs decode_s_per_step > 0, the other seconds >= 0 and "
                f"learner_chips >= 1; got {self}"
            )

    def decode_compute_s(self, batch: int) -> float:
        return 0.0

    def decode_memory_s(self, kv_tokens: float) -> float:
        return self.decode_s_per_step

    def kv_seconds_per_token(self) -> float:
        return 0.0

    def prefill_s(self, tokens: int) -> float:
        return self.prefill_s_per_group

    @property
    def prefill_s_per_token(self) -> float:
        return self.reprefill_s_per_token

    def train_step_s(self, tokens: int, chips: int) -> float:
        return self.train_step_s_per_token * tokens * self.learner_chips / chips

    def sync_s(self, sampler_chips: int, learner_chips: int) -> float:
        return self.publish_s

    def reshard_local_s(self) -> float:
        return self.publish_s

    def kv_slots(self, tokens_per_sequence: float, max_slots: int) -> int:
        return max_slots


def tiny_preset(model_cfg) -> dict:
    """A preset dict (``rljax.models.presets`` fields, a mixture of experts' and Gemma's too)
    from a run's ``ModelConfig``."""
    keys = presets.PRESET_KEYS + (presets.MOE_PRESET_KEYS if model_cfg.num_experts else ())
    keys += presets.GEMMA_PRESET_KEYS if model_cfg.family in GEMMA_FAMILIES else ()
    return {k: getattr(model_cfg, k) for k in keys if hasattr(model_cfg, k)}
