"""Lending: the pure policy that lends one role's idle chips to the other inside a step.

The coarse :class:`~rljax.policy.reallocation.Reallocator` moves chips between meshes for good
(a reshard and an engine rebuild, tens of seconds); it suits lasting shifts. The idle time that
long response tails and the staleness window leave lives *inside* a step, and lending reclaims
it without moving the meshes (the bidirectional resource scheduling of BiDiRL):

* **Rollout-on-TrainPool** (``ROLLOUT_ON_TRAIN``): while the learner waits for the last groups
  of its batch, an extra engine replica on the learner's chips serves routed requests. It costs
  ``prepare_s`` per lend (the learner's weights ``device_put`` into the engine's layout on the
  same chips, the KV pool allocated; the engine compile is cached per mesh) and, when the batch
  is ready, ``release_s`` (its requests are interrupted and resumed on the sampler as partial
  rollouts) before the learner may start.
* **Trainer-on-RollPool** (``TRAIN_ON_ROLL``): while the staleness window or a full buffer
  holds the sampler back, its chips compute the gradients of a share of the learner's
  micro-batches; the learner stays the only optimizer and version authority. It costs
  ``train_prepare_s`` (the cached partial-step compile, the share of the batch moved),
  ``release_s`` (stragglers on the borrowed chips are interrupted and resumed elsewhere) and the
  gradient transfer, ``grad_transfer_s_per_gb`` per GB of gradients (as many bytes as the
  parameters).

:func:`decide` reads the same :class:`~rljax.policy.reallocation.PhaseStats` the Reallocator
reads (a phase of ``stats.steps`` learner steps from one
:class:`~rljax.policy.meter.PhaseMeter`) and predicts, per step of the next phase:

* Rollout-on-TrainPool. The learner waits ``w = learner_idle_s / steps``. Only the part of the
  wait in which the sampler is throughput bound shrinks with more replicas; the meter's live
  fraction ``u = sampler_busy_s * sampler_occupancy / phase`` (the sampler's slot capacity that
  decoded) estimates it, since a wait paced by a few stragglers on an otherwise held-back
  sampler does not end sooner with more slots. Lending ``k`` chips to a sampler of ``S`` makes
  that part ``S / (S + k)`` as long: ``gain = u * (w - prepare_s) * k / (S + k) - release_s``.
* Trainer-on-RollPool. The learner is busy ``T = learner_busy_s / steps``; the sampler holds
  ``h = sampler_idle_s / steps`` seconds of its whole capacity back per step, most of it while
  the learner trains, so ``k = S * min(1, h / T)`` chips (whole units) are free to borrow. The
  share ``s`` of the micro-batches done on them is chosen so both sides finish together,
  ``(1 - s) T = c + s T L / k`` with ``c`` the costs above (same chips, same per-chip rate),
  capped at ``max_share``; ``gain = T - max((1 - s) T, c + s T L / k)``.

The larger positive gain wins if it is at least ``min_gain_frac`` of the step (a smaller one is
within the model's error). Every input is plain data and the arithmetic has no iteration over
unordered containers, so every host of a pod that decides from equal stats decides the same.
"""

from __future__ import annotations

import dataclasses
import enum

from rljax.policy.reallocation import PhaseStats, Split


@dataclasses.dataclass(frozen=True)
class LendingConfig:
    """Knobs of the lending policy (``RunConfig.lending`` and ``SimConfig.lending``).

    Attributes:
      enabled: whether the policy may lend at all (off: :func:`decide` always says NONE).
      min_idle_frac: lend only when the lender's idle fraction of the phase exceeds this.
      prepare_s: seconds from a Rollout-on-TrainPool lend to the borrowed replica decoding:
        the learner's weights resharded into the engine's layout on the same chips (on-chip
        and ICI traffic: well under a second for an 8B model) and the KV pool allocated; the
        engine compile is cached per mesh, so only the first lend pays it. 2 s.
      release_s: seconds the borrowing side waits when borrowed chips are given back: the
        borrowed replica's (or, lending sampler chips, the stragglers') requests interrupted
        and their prefixes handed to the sampler (host work; their re-prefill is paid there).
        0.5 s.
      train_prepare_s: seconds before borrowed sampler chips compute gradients: the cached
        partial-step compile and the share of the batch moved to them (the sampler already
        holds the current weights after the publish). 1 s.
      grad_transfer_s_per_gb: seconds per GB of gradients moved from the sampler mesh to the
        learner mesh (as many bytes as the parameters). 0.1 s/GB is 10 GB/s in all, a
        conservative figure for ICI within a slice or a 400 Gb/s NIC per GPU.
      max_lend_frac: the most of the lender's chips one decision lends.
      max_share: the most of the learner's micro-batches computed on borrowed chips.
      min_gain_frac: the smallest predicted saving, as a fraction of the step, that lends.
    """

    enabled: bool = False
    min_idle_frac: float = 0.1
    prepare_s: float = 2.0
    release_s: float = 0.5
    train_prepare_s: float = 1.0
    grad_transfer_s_per_gb: float = 0.1
    max_lend_frac: float = 1.0
    max_share: float = 0.5
    min_gain_frac: float = 0.02

    def __post_init__(self):
        def fail(name: str, expected: str) -> None:
            raise ValueError(
                f"config key 'lending.{name}' = {getattr(self, name)!r} is invalid: "
                f"expected {expected}"
            )

        if not isinstance(self.enabled, bool):
            fail("enabled", "True or False")
        for name in ("prepare_s", "release_s", "train_prepare_s", "grad_transfer_s_per_gb"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not value >= 0:
                fail(name, "a number of seconds >= 0 (measured, or the documented default)")
        for name, low, high in (
            ("min_idle_frac", "[0", "1)"),
            ("max_lend_frac", "(0", "1]"),
            ("max_share", "(0", "1]"),
            ("min_gain_frac", "[0", "1)"),
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float):
                fail(name, f"a fraction in {low}, {high}")
            above = value >= 0 if low == "[0" else value > 0
            below = value < 1 if high == "1)" else value <= 1
            if not (above and below):
                fail(name, f"a fraction in {low}, {high}")


class LendDirection(enum.Enum):
    """Which role lends chips to the other for the next steps."""

    NONE = "none"
    ROLLOUT_ON_TRAIN = "rollout_on_train"  # learner chips run an extra rollout replica
    TRAIN_ON_ROLL = "train_on_roll"  # sampler chips compute part of the training step


@dataclasses.dataclass(frozen=True)
class LendingDecision:
    """What to lend in each step of the next phase.

    Attributes:
      direction: who lends to whom.
      chips: how many of the lender's chips to lend (0 for NONE).
      share: TRAIN_ON_ROLL: the fraction of the learner's micro-batches computed on the
        sampler's chips; ROLLOUT_ON_TRAIN: the expected fraction of the step's rollout work
        the lent replica takes; 0 for NONE.
      expected_gain_s: predicted seconds saved per step, net of the costs.
      reason: one line on why, for logs.
    """

    direction: LendDirection
    chips: int
    share: float
    expected_gain_s: float
    reason: str


def _none(reason: str) -> LendingDecision:
    return LendingDecision(LendDirection.NONE, 0, 0.0, 0.0, reason)


def _whole_units(chips: float, unit: int) -> int:
    return int(chips // unit) * unit if chips >= unit else 0


def rollout_on_train(
    stats: PhaseStats, split: Split, config: LendingConfig
) -> tuple[int, float, float]:
    """(chips, share, gain seconds per step) of lending learner chips to rollout."""
    steps = max(1, stats.steps)
    phase = _phase(stats)
    wait = stats.learner_idle_s / steps
    chips = _whole_units(split.learner_chips * config.max_lend_frac, stats.granularity)
    window = wait - config.prepare_s
    if chips <= 0 or window <= 0 or phase <= 0:
        return chips, 0.0, 0.0
    live = min(1.0, stats.sampler_busy_s * stats.sampler_occupancy / phase)
    faster = chips / (split.sampler_chips + chips)
    gain = live * window * faster - config.release_s
    share = live * faster * window / (phase / steps)
    return chips, min(1.0, share), gain


def train_on_roll(
    stats: PhaseStats, split: Split, config: LendingConfig, param_bytes: float
) -> tuple[int, float, float]:
    """(chips, share, gain seconds per step) of lending sampler chips to training."""
    steps = max(1, stats.steps)
    train = stats.learner_busy_s / steps
    held = stats.sampler_idle_s / steps
    if train <= 0:
        return 0, 0.0, 0.0
    free = split.sampler_chips * min(1.0, held / train) * config.max_lend_frac
    chips = _whole_units(free, stats.granularity)
    if chips <= 0:
        return 0, 0.0, 0.0
    cost = config.train_prepare_s + config.release_s
    cost += config.grad_transfer_s_per_gb * param_bytes / 1e9
    ratio = split.learner_chips / chips  # seconds on the borrowed chips per learner second
    share = min(config.max_share, (train - cost) / (train * (1.0 + ratio)))
    if share <= 0:
        return chips, 0.0, train - cost - train * ratio  # negative: costs exceed the step
    gain = train - max((1.0 - share) * train, cost + share * train * ratio)
    return chips, share, gain


def _phase(stats: PhaseStats) -> float:
    sampler = stats.sampler_busy_s + stats.sampler_idle_s
    return max(sampler, stats.learner_busy_s + stats.learner_idle_s)


def decide(
    stats: PhaseStats, split: Split, config: LendingConfig, *, param_bytes: float = 0.0
) -> LendingDecision:
    """What to lend in each step of the next phase (see the module docstring).

    Args:
      stats: the last phase, from a PhaseMeter (``stats.steps`` learner steps).
      split: the split the next steps run on (normally ``stats.split``).
      config: the policy's knobs.
      param_bytes: bytes of the model's parameters (and so of its gradients).
    """
    if param_bytes < 0:
        raise ValueError(f"param_bytes={param_bytes} must be >= 0 (bytes of the parameters)")
    if not config.enabled:
        return _none("lending disabled (lending.enabled=False)")
    phase = _phase(stats)
    if phase <= 0:
        return _none("empty phase: nothing measured")
    step = phase / max(1, stats.steps)
    floor = config.min_gain_frac * step
    candidates = []
    learner_idle = stats.learner_idle_s / phase
    if learner_idle > config.min_idle_frac:
        chips, share, gain = rollout_on_train(stats, split, config)
        candidates.append((gain, LendDirection.ROLLOUT_ON_TRAIN, chips, share))
    sampler_idle = stats.sampler_idle_s / phase
    if sampler_idle > config.min_idle_frac:
        chips, share, gain = train_on_roll(stats, split, config, param_bytes)
        candidates.append((gain, LendDirection.TRAIN_ON_ROLL, chips, share))
    if not candidates:
        return _none(
            f"nothing idle enough: learner {learner_idle:.2f}, sampler {sampler_idle:.2f} of "
            f"the phase, threshold {config.min_idle_frac}"
        )
    # Ties go to the first candidate (Rollout-on-TrainPool): a fixed order, never a set's.
    gain, direction, chips, share = max(candidates, key=lambda c: c[0])
    if chips <= 0 or gain < floor or gain <= 0:
        best = ", ".join(f"{d.value} {g:+.2f} s" for g, d, _, _ in candidates)
        return _none(
            f"predicted saving per step ({best}) is below {floor:.2f} s "
            f"({config.min_gain_frac} of a {step:.2f} s step) after costs"
        )
    return LendingDecision(
        direction,
        chips,
        share,
        gain,
        f"{direction.value}: lend {chips} chips, share {share:.2f}, saves {gain:.2f} s of a "
        f"{step:.2f} s step",
    )
