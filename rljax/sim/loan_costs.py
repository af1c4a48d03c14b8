"""What lending a pool costs, from published measurements: prepare as fixed + per byte.

A Rollout-on-TrainPool loan prepares a rollout engine on the learner's chips (the weights put
into the engine, its KV pool allocated) and releases it when the batch is ready. The simulator
charges ``LendingConfig.prepare_s`` / ``release_s``; this module derives them for a scenario
from figures other systems published, so no lending result rests on an invented cost:

- **Prepare, GPU**: MoonshotAI's checkpoint-engine benchmark (in-place weight update of vLLM
  instances; "GatherMetas" + "Update (Broadcast)" seconds),
  https://github.com/MoonshotAI/checkpoint-engine#benchmark. Two rows per GPU kind give the
  line ``fixed + per_gb * weight GB per GPU`` (:data:`CHECKPOINT_ENGINE`, :func:`fit_line`).
- **Release**: verl-omni's hybrid rollout switching, ``switch_to_trainer`` 3.3 s (its
  ``switch_to_rollout``, 9.1 s for a naive sync of 5B weights plus the resume, is the top of
  the prepare band), https://github.com/verl-project/verl-omni/pull/575.
- **TPU**: no published measurement was found; TPU scenarios use the H800 line (the faster of
  the two GPU fits), and say so.

Trainer-on-RollPool's costs (``train_prepare_s``, ``grad_transfer_s_per_gb``) stay at the
documented defaults of :class:`~rljax.policy.lending.LendingConfig`: nothing published measures
them.
"""

from __future__ import annotations

import dataclasses

CHECKPOINT_ENGINE_URL = "https://github.com/MoonshotAI/checkpoint-engine#benchmark"
VERL_OMNI_URL = "https://github.com/verl-project/verl-omni/pull/575"
VERL_OMNI_PREPARE_S = 9.1  # switch_to_rollout: naive sync of 5B weights + resume
VERL_OMNI_RELEASE_S = 3.3  # switch_to_trainer


@dataclasses.dataclass(frozen=True)
class Update:
    """One published weight update: a model's weight bytes spread over ``gpus`` (tensor
    parallel), and the seconds it took (metadata gathered + broadcast update)."""

    model: str
    params: float
    bytes_per_param: float
    gpus: int
    seconds: float

    @property
    def gb_per_gpu(self) -> float:
        return self.params * self.bytes_per_param / self.gpus / 1e9


# checkpoint-engine's table, vLLM v0.10.2rc1: GatherMetas + Update (Broadcast).
CHECKPOINT_ENGINE = {
    "h800": (
        Update("GLM-4.5-Air BF16, 8xH800 TP8", 106e9, 2, 8, 0.12 + 3.47),
        Update("Qwen3-235B-A22B BF16, 8xH800 TP8", 235e9, 2, 8, 0.33 + 6.22),
    ),
    "h20": (
        Update("DeepSeek-V3.1 FP8, 16xH20 TP16", 671e9, 1, 16, 1.17 + 10.19),
        Update("Kimi-K2-Instruct FP8, 16xH20 TP16", 1.0e12, 1, 16, 1.33 + 14.36),
    ),
}


@dataclasses.dataclass(frozen=True)
class Line:
    """``seconds = fixed_s + per_gb_s * GB``."""

    fixed_s: float
    per_gb_s: float

    def __call__(self, gb: float) -> float:
        return self.fixed_s + self.per_gb_s * gb


def fit_line(points: tuple[Update, ...]) -> Line:
    """Least squares of seconds on weight GB per GPU (exact through two points)."""
    if len(points) < 2:
        raise ValueError("fit_line needs two or more published updates of different sizes")
    xs = [p.gb_per_gpu for p in points]
    ys = [p.seconds for p in points]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx == 0:
        raise ValueError("the published updates all move the same bytes per GPU; no slope")
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx
    return Line(my - slope * mx, slope)


def prepare_line(chip: str) -> tuple[Line, str]:
    """The published prepare line for ``chip`` and what it stands on."""
    if chip in CHECKPOINT_ENGINE:
        return fit_line(CHECKPOINT_ENGINE[chip]), f"checkpoint-engine {chip} fit"
    if chip.startswith("tpu"):
        return fit_line(CHECKPOINT_ENGINE["h800"]), "no TPU figure published: the H800 fit"
    return fit_line(CHECKPOINT_ENGINE["h800"]), f"no {chip} figure published: the H800 fit"


def sourced(weight_bytes: float, tp: int, chip: str) -> dict[str, float]:
    """``LendingConfig`` cost overrides for lending ``tp``-chip replicas of a model of
    ``weight_bytes``: prepare from the published line at the bytes each chip takes, release
    verl-omni's measured 3.3 s (:func:`basis` says what each stands on)."""
    line, _ = prepare_line(chip)
    return {"prepare_s": round(line(weight_bytes / tp / 1e9), 3), "release_s": VERL_OMNI_RELEASE_S}


def basis(weight_bytes: float, tp: int, chip: str) -> str:
    """What :func:`sourced`'s figures stand on, in words."""
    line, what = prepare_line(chip)
    gb = weight_bytes / tp / 1e9
    return (
        f"prepare {line.fixed_s:.2f} s + {line.per_gb_s:.4f} s/GB x {gb:.2f} GB per chip "
        f"({what}); release {VERL_OMNI_RELEASE_S} s (verl-omni)"
    )
