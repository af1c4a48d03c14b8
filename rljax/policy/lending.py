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
  capped at ``max_share``; ``gain = T - max((1 - s) T, c + s T L / k)`` (:class:`TrainLoan`,
  the model the simulator and the fakes carry loans out by too).

The larger positive gain wins if it is at least ``min_gain_frac`` of the step (a smaller one is
within the model's error); the other direction is lent too, in the same steps, when its own
gain clears that floor (the learner's wait and the sampler's held-back time are different
parts of the step, so the savings add). Every input is plain data and the arithmetic has no
iteration over unordered containers, so every host of a pod that decides from equal stats
decides the same.
"""

from __future__ import annotations

import dataclasses
import enum

from rljax.policy.reallocation import PhaseStats, ReallocatorConfig, Split

# ``reallocator.held_threshold``: when the sampler's live sequences count as capped by the
# staleness window. One figure for both policies, which read the same meter (the runtime and
# the simulator pass the reallocator section's value).
HELD_THRESHOLD = ReallocatorConfig.held_threshold


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
      sampler_margin: a Trainer-on-RollPool loan leaves the sampler chips with this much more
        capacity than its measured work per step (chip-seconds at full slots), and loads the
        kept chips at most ``1 + sampler_margin`` times as much (counting the replicas that held
        live sequences, ``PhaseStats.sampler_engaged_s``; empty ones move nothing), so the next
        batch (and its stragglers) is not late.
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
    sampler_margin: float = 0.25

    def __post_init__(self):
        def fail(name: str, expected: str) -> None:
            raise ValueError(
                f"config key 'lending.{name}' = {getattr(self, name)!r} is invalid: "
                f"expected {expected}"
            )

        if not isinstance(self.enabled, bool):
            fail("enabled", "True or False")
        timings = ("prepare_s", "release_s", "train_prepare_s", "grad_transfer_s_per_gb")
        for name in (*timings, "sampler_margin"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not value >= 0:
                fail(name, "a number >= 0 (seconds measured, or the documented default)")
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


@dataclasses.dataclass(frozen=True)
class TrainLoan:
    """One step's Trainer-on-RollPool loan: the one model of its cost, which the policy predicts
    with and the simulator and the fakes carry loans out by.

    The learner computes ``1 - share`` of its step of ``train_s`` seconds on its own
    ``learner_chips``; the ``lent_chips`` borrowed sampler chips compute ``share`` of it at the
    same per-chip rate, after ``cost_s`` (:func:`train_loan_cost_s`). The step takes the longer
    of the two.
    """

    train_s: float
    share: float
    learner_chips: int
    lent_chips: int
    cost_s: float

    @property
    def own_s(self) -> float:
        """Seconds of the learner's own part: ``(1 - share) T``."""
        return (1.0 - self.share) * self.train_s

    @property
    def lent_s(self) -> float:
        """Seconds of the borrowed chips' part: ``c + share T L / k``."""
        ratio = self.learner_chips / max(1, self.lent_chips)
        return self.cost_s + self.share * self.train_s * ratio

    @property
    def step_s(self) -> float:
        """Seconds of the step with the loan: the longer part."""
        return max(self.own_s, self.lent_s)

    @property
    def shortens(self) -> bool:
        """Whether the loan shortens the step at all (else the chips should keep sampling)."""
        return self.lent_chips > 0 and self.step_s < self.train_s


def train_loan_cost_s(config: LendingConfig, param_bytes: float) -> float:
    """Seconds a Trainer-on-RollPool loan costs the borrowed chips before their share is done:
    the partial step prepared, stragglers released, and the gradients (as many bytes as the
    parameters) moved to the learner."""
    transfer = config.grad_transfer_s_per_gb * param_bytes / 1e9
    return config.train_prepare_s + config.release_s + transfer


def reprefill_s(cached_tokens: int, prefill_s_per_token: float) -> float:
    """Seconds to prefill again, on the replica that takes them, the tokens a moved request had
    cached (prompt and response so far): a loan handing its requests back, or a parked replica's
    requests resumed elsewhere. The simulator and the fakes both charge it from here."""
    if cached_tokens < 0 or prefill_s_per_token < 0:
        raise ValueError(
            f"reprefill_s({cached_tokens}, {prefill_s_per_token}): tokens and seconds per "
            "token must be >= 0"
        )
    return cached_tokens * prefill_s_per_token


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
      expected_gain_s: predicted seconds saved per step, net of the costs (of both loans when
        ``also`` is set).
      reason: one line on why, for logs.
      also: a loan in the other direction carried out in the same steps, or None. Both idles
        exist in one step when the learner waits for its batch and the sampler is then held
        back while the learner trains (small eta): the first loan shortens the wait, the
        second the training.
    """

    direction: LendDirection
    chips: int
    share: float
    expected_gain_s: float
    reason: str
    also: LendingDecision | None = None

    def loan(self, direction: LendDirection) -> LendingDecision | None:
        """This decision's loan in ``direction`` (itself or ``also``), or None."""
        if self.direction is direction and direction is not LendDirection.NONE:
            return self
        if self.also is not None and self.also.direction is direction:
            return self.also
        return None


def no_loan(reason: str) -> LendingDecision:
    """A decision to lend nothing, and why."""
    return LendingDecision(LendDirection.NONE, 0, 0.0, 0.0, reason)


def units(chips: float, tp: int) -> int:
    """How many whole units of ``tp`` chips (sampler replicas, or hosts) ``chips`` holds.

    Chips are decided and lent in whole units: the policy rounds its loans with it, and the
    runtime, the simulator and the fakes carry them out with :func:`lent_units` and
    :func:`parked_units`, which round the same way.
    """
    if tp < 1:
        raise ValueError(f"units(chips={chips}, tp={tp}): a unit is >= 1 chip")
    return max(0, int(chips // tp))


def lent_units(chips: float, tp: int) -> int:
    """Units a loan of ``chips`` starts on the lender's chips: whole ones, and one at least
    (fewer lent chips than ``tp`` make one replica, as the runtime lends one engine on the
    chips it borrows)."""
    return max(1, units(chips, tp))


def parked_units(chips: float, tp: int, sampler_units: int) -> int:
    """Sampler replicas a Trainer-on-RollPool loan of ``chips`` parks (the simulator and the
    fakes, whose replicas stop sampling while they compute gradients): whole ones, leaving one
    of the ``sampler_units`` sampling."""
    return min(units(chips, tp), sampler_units - 1)


def sampler_speedup(stats: PhaseStats, sampler_chips: int, extra: int, held_threshold: float):
    """How many times faster the sampler decodes with ``extra`` more chips (see the module doc)."""
    phase = phase_s(stats)
    grown = (sampler_chips + extra) / sampler_chips
    if phase <= 0:
        return 1.0
    if stats.sampler_idle_s / phase <= held_threshold:
        return grown  # every slot was wanted: the live sequences scale with the slots
    if stats.decode_step_s > 0:
        # The window caps the live sequences: spread over more replicas, each step reads the
        # same weights (the fixed part) and fewer sequences' KV.
        step, fixed = stats.decode_step_s, min(stats.decode_fixed_s, stats.decode_step_s)
        return step / (fixed + (step - fixed) / grown)
    live = min(1.0, stats.sampler_busy_s * stats.sampler_occupancy / phase)
    return 1.0 + (grown - 1.0) * live  # no decode timings: the decoding share scales


def rollout_on_train(
    stats: PhaseStats, split: Split, config: LendingConfig, held_threshold: float = HELD_THRESHOLD
) -> tuple[int, float, float]:
    """(chips, share, gain seconds per step) of lending learner chips to rollout."""
    steps = max(1, stats.steps)
    phase = phase_s(stats)
    wait = stats.learner_idle_s / steps
    unit = stats.granularity
    chips = units(split.learner_chips * config.max_lend_frac, unit) * unit
    window = wait - config.prepare_s
    if chips <= 0 or window <= 0 or phase <= 0:
        return chips, 0.0, 0.0
    speedup = sampler_speedup(stats, split.sampler_chips, chips, held_threshold)
    saved = window * (1.0 - 1.0 / speedup)
    share = saved / (phase / steps)
    return chips, min(1.0, share), saved - config.release_s


def train_on_roll(
    stats: PhaseStats, split: Split, config: LendingConfig, param_bytes: float
) -> tuple[int, float, float]:
    """(chips, share, gain seconds per step) of lending sampler chips to training."""
    steps = max(1, stats.steps)
    phase = phase_s(stats)
    # Publishing the weights is learner work that no borrowed chip shortens.
    train = max(0.0, stats.learner_busy_s - stats.learner_publish_s) / steps
    if train <= 0 or phase <= 0:
        return 0, 0.0, 0.0
    idle = min(1.0, stats.sampler_idle_s / phase)
    unit = stats.granularity
    most = units(split.sampler_chips * idle * config.max_lend_frac, unit) * unit
    cost = train_loan_cost_s(config, param_bytes)
    # A shorter training step shortens the step only as far as the sampler waits on it (held
    # back until the learner's version moves the staleness window); a sampler never held back
    # paces the step itself, and the saving would become more learner waiting.
    pacing = min(1.0, stats.sampler_idle_s / steps / train)
    # The sampler's work per step (chip-seconds at full slots) must still fit on the chips it
    # keeps, with ``sampler_margin`` to spare, in the shorter step; and the live sequences of
    # the lent chips, piled onto the kept ones, may load them at most ``1 + sampler_margin``
    # times as much (a decode step near the compute roofline slows more than linearly with its
    # load, which the meter's fit over the loads it saw cannot tell; stragglers then pace).
    work = stats.sampler_busy_s / steps * split.sampler_chips * (1.0 + config.sampler_margin)
    # The chips whose replicas held live sequences: only their requests move. Replicas that sat
    # empty (the meter's engaged time; eta 0 leaves the sampler empty while the learner trains)
    # are lent without piling anything onto the kept ones.
    engaged = float(split.sampler_chips)
    if stats.sampler_engaged_s is not None:
        engaged *= min(1.0, stats.sampler_engaged_s / phase)
    step = phase / steps
    best = (0, 0.0, 0.0)
    worst = None  # the least negative gain, to report when every loan costs more than it saves
    for chips in range(stats.granularity, most + 1, stats.granularity):
        ratio = split.learner_chips / chips  # seconds on the borrowed chips per learner second
        # The share at which both parts finish together: (1 - s) T = c + s T L / k.
        share = min(config.max_share, (train - cost) / (train * (1.0 + ratio)))
        if share <= 0:
            gain = train - TrainLoan(train, 1.0, split.learner_chips, chips, cost).lent_s
            worst = gain if worst is None else max(worst, gain)
            continue
        loan = TrainLoan(train, share, split.learner_chips, chips, cost)
        gain = (train - loan.step_s) * pacing
        kept = split.sampler_chips - chips
        if kept * (step - gain) < work or engaged > kept * (1 + config.sampler_margin):
            break  # more chips only leave the sampler shorter
        if gain > best[2]:
            best = (chips, share, gain)
    if best[0] == 0 and worst is not None:
        return most, 0.0, worst
    return best


def phase_s(stats: PhaseStats) -> float:
    """Seconds of the phase ``stats`` measured: the longer of the two roles' busy + idle time."""
    sampler = stats.sampler_busy_s + stats.sampler_idle_s
    return max(sampler, stats.learner_busy_s + stats.learner_idle_s)


def decide(
    stats: PhaseStats,
    split: Split,
    config: LendingConfig,
    *,
    param_bytes: float = 0.0,
    held_threshold: float = HELD_THRESHOLD,
) -> LendingDecision:
    """What to lend in each step of the next phase (see the module docstring).

    Args:
      stats: the last phase, from a PhaseMeter (``stats.steps`` learner steps).
      split: the split the next steps run on (normally ``stats.split``).
      config: the policy's knobs.
      param_bytes: bytes of the model's parameters (and so of its gradients).
      held_threshold: ``reallocator.held_threshold``, the fraction of the sampler's slot
        capacity held back above which its live sequences count as capped by the staleness
        window (more chips then spread them thinner rather than run more of them).
    """
    if param_bytes < 0:
        raise ValueError(f"param_bytes={param_bytes} must be >= 0 (bytes of the parameters)")
    if not config.enabled:
        return no_loan("lending disabled (lending.enabled=False)")
    phase = phase_s(stats)
    if phase <= 0:
        return no_loan("empty phase: nothing measured")
    step = phase / max(1, stats.steps)
    floor = config.min_gain_frac * step
    candidates = []
    learner_idle = stats.learner_idle_s / phase
    if learner_idle > config.min_idle_frac:
        chips, share, gain = rollout_on_train(stats, split, config, held_threshold)
        candidates.append((gain, LendDirection.ROLLOUT_ON_TRAIN, chips, share))
    sampler_idle = stats.sampler_idle_s / phase
    if sampler_idle > config.min_idle_frac:
        chips, share, gain = train_on_roll(stats, split, config, param_bytes)
        candidates.append((gain, LendDirection.TRAIN_ON_ROLL, chips, share))
    if not candidates:
        return no_loan(
            f"nothing idle enough: learner {learner_idle:.2f}, sampler {sampler_idle:.2f} of "
            f"the phase, threshold {config.min_idle_frac}"
        )
    # Ties go to the first candidate (Rollout-on-TrainPool): a fixed order, never a set's.
    gain, direction, chips, share = max(candidates, key=lambda c: c[0])
    if chips <= 0 or gain < floor or gain <= 0:
        best = ", ".join(f"{d.value} {g:+.2f} s" for g, d, _, _ in candidates)
        return no_loan(
            f"predicted saving per step ({best}) is below {floor:.2f} s "
            f"({config.min_gain_frac} of a {step:.2f} s step) after costs"
        )
    decision = LendingDecision(
        direction,
        chips,
        share,
        gain,
        f"{direction.value}: lend {chips} chips, share {share:.2f}, saves {gain:.2f} s of a "
        f"{step:.2f} s step",
    )
    # The other direction too, when it pays on its own: the learner's wait and the sampler's
    # held-back time are different parts of the step, so the two savings add.
    for other_gain, other, other_chips, other_share in candidates:
        if other is not direction and other_chips > 0 and other_gain >= max(floor, 1e-9):
            also = LendingDecision(
                other,
                other_chips,
                other_share,
                other_gain,
                f"{other.value}: lend {other_chips} chips, share {other_share:.2f}, saves "
                f"{other_gain:.2f} s",
            )
            decision = dataclasses.replace(
                decision,
                expected_gain_s=gain + other_gain,
                reason=f"{decision.reason}; and {also.reason}",
                also=also,
            )
    return decision
