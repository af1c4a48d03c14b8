"""Role clocks: what each role did since the last learner step, and the step's metric record.

One definition for every schedule: a role's busy seconds are the seconds it spent in its own
work (``generate`` calls for the sampler, train steps for the learner); its idle seconds are
the rest of the step's wall time. Every measurement also goes to the optional ``PhaseMeter``,
which turns the same trace into the ``PhaseStats`` the reallocation and lending policies read.
"""

from __future__ import annotations

import collections
import threading
import time
from typing import TYPE_CHECKING, Any

import numpy as np

from rljax.policy import meter as phase_meter
from rljax.runtime.parts import SamplerPart
from rljax.runtime.rollout import routes_digest

if TYPE_CHECKING:
    from rljax.mesh.weight_sync import SyncStats


class RoleClocks:
    """Thread-safe accumulators of one step's role times; ``take()`` reads and resets them."""

    def __init__(self, meter: phase_meter.PhaseMeter | None = None):
        self.meter = meter
        self._lock = threading.Lock()
        self._t: collections.defaultdict[str, float] = collections.defaultdict(float)
        self._since = time.perf_counter()
        self._slots = 0  # the sampler's decode slots, once a generate call has reported them

    def start(self) -> None:
        with self._lock:
            self._t.clear()
            self._since = time.perf_counter()
        if self.meter is not None:  # the meter's first phase starts with the run, not at 0
            self.meter.phase_start = self._since

    def _record(self, event: phase_meter.Event) -> None:
        if self.meter is not None:
            self.meter.record(event)

    def generate(self, start: float, end: float, finished: list, sampler: SamplerPart) -> None:
        """One sampler ``generate`` call that finished ``finished`` trajectories."""
        busy, total = sampler.busy_slots, sampler.num_slots
        # KV the step read: the live slots' tokens now, plus the sequences it just finished.
        kv = sampler.kv_tokens + sum(
            len(t.prompt_tokens) + len(t.response_tokens) for t in finished
        )
        tokens = sum(len(t.response_tokens) for t in finished)
        with self._lock:
            self._t["sampler_busy_s"] += end - start
            self._t["sampler_tokens"] += tokens
            if not total:
                return
            # Slots used by this call: those still running plus those it just finished.
            used = min(total, busy + len(finished))
            self._t["fill"] += used / total
            self._t["calls"] += 1
            self._slots = total
        self._record(phase_meter.Generate(start, end, used, total, tokens=tokens, kv_tokens=kv))
        if used < total:
            # Slots the driver left empty: admission (the staleness window) or a full buffer
            # held them back, since it fills every free slot it is allowed to.
            self._record(phase_meter.SamplerIdle(start, end, total - used, held_back=True))

    def sampler_wait(self, start: float, end: float) -> None:
        """The sampler had nothing to generate: admission held it back or the buffer is full."""
        if self._slots:
            self._record(phase_meter.SamplerIdle(start, end, self._slots, held_back=True))

    def sampler_parked(self, start: float, end: float) -> None:
        """The sampler was parked for a resize: its slots count as neither busy nor idle."""
        if self._slots:
            self._record(phase_meter.SamplerIdle(start, end, self._slots, held_back=False))

    def learner_wait(self, start: float, end: float) -> None:
        self._record(phase_meter.LearnerWait(start, end))

    def publish(self, start: float, end: float) -> None:
        """The learner published its weights (learner work, as the meter counts it)."""
        self._record(phase_meter.Learn(start, end))

    def reward(self, start: float, end: float) -> None:
        with self._lock:
            self._t["reward_s"] += end - start

    def learn(self, start: float, end: float, tokens: int) -> None:
        with self._lock:
            self._t["learner_busy_s"] += end - start
            self._t["learner_tokens"] += tokens
        self._record(phase_meter.Learn(start, end, tokens=tokens))

    def take(self) -> dict[str, float | None]:
        """This step's role times (and resets them): busy, idle, tokens, occupancy, reward."""
        now = time.perf_counter()
        with self._lock:
            t, wall = self._t, now - self._since
            out = {
                "wall_s": wall,
                "sampler_busy_s": t["sampler_busy_s"],
                "sampler_idle_s": max(0.0, wall - t["sampler_busy_s"]),
                "learner_busy_s": t["learner_busy_s"],
                "learner_idle_s": max(0.0, wall - t["learner_busy_s"]),
                "reward_s": t["reward_s"],
                "sampler_tokens": t["sampler_tokens"],
                "learner_tokens": t["learner_tokens"],
                "occupancy": t["fill"] / t["calls"] if t["calls"] else None,
            }
            self._t = collections.defaultdict(float)
            self._since = now
        return out

    def step_end(self) -> None:
        """A learner step finished: the PhaseMeter's phases end at step boundaries."""
        self._record(phase_meter.StepEnd(time.perf_counter()))


def step_metrics(
    groups: list, staleness: collections.Counter, clocks: dict, sync: SyncStats | None
) -> dict:
    """The driver's part of a step's metric record: the same keys in every mode."""
    rewards = np.concatenate([g.rewards for g in groups])
    lengths = [len(t.response_tokens) for g in groups for t in g.trajectories]
    out: dict[str, Any] = {
        "reward": float(rewards.mean()),
        "response_length": float(np.mean(lengths)),
        "staleness_hist": {str(k): v for k, v in sorted(staleness.items())},
        "staleness_max": max(staleness),
        # The consumed prompts' ids, so a run can be audited from its metrics alone.
        "prompt_ids": [_example_id(g.example) for g in groups],
        "step_s": clocks["wall_s"],
        "sampler_busy_s": clocks["sampler_busy_s"],
        "sampler_idle_s": clocks["sampler_idle_s"],
        "learner_busy_s": clocks["learner_busy_s"],
        "learner_idle_s": clocks["learner_idle_s"],
        "reward_s": clocks["reward_s"],
        "sampler_tokens_per_s": clocks["sampler_tokens"] / max(clocks["sampler_busy_s"], 1e-9),
        "learner_tokens_per_s": clocks["learner_tokens"] / max(clocks["learner_busy_s"], 1e-9),
        # None when no generate call ran in the step (or the sampler has no slots).
        "sampler_occupancy": clocks["occupancy"],
        "sync_bytes": sync.bytes if sync else 0,
        "sync_s": sync.seconds if sync else 0.0,
        "sync_stage_bytes": sync.stage_bytes if sync else 0,
    }
    if any(t.routes is not None for g in groups for t in g.trajectories):
        # A mixture of experts recording routes: each consumed group's, digested (audits).
        out["routes_digest"] = [routes_digest([t.routes for t in g.trajectories]) for g in groups]
    return out


def _example_id(example: Any) -> Any:
    return example.get("id") if isinstance(example, dict) else None


# jax.monitoring events whose seconds count as compiling (tracing, lowering, XLA).
COMPILE_EVENTS = (
    "/jax/core/compile/jaxpr_trace_duration",
    "/jax/core/compile/jaxpr_to_mlir_module_duration",
    "/jax/core/compile/backend_compile_duration",
)
_compile = {"seconds": 0.0, "listening": False}
_compile_lock = threading.Lock()


def compile_seconds() -> float:
    """Seconds this process spent compiling since the first call (a jax.monitoring listener)."""
    with _compile_lock:
        if not _compile["listening"]:
            import jax

            _compile["listening"] = True
            jax.monitoring.register_event_duration_secs_listener(_on_duration)
        return _compile["seconds"]


def _on_duration(event: str, duration_secs: float, **_: str | int) -> None:
    if event in COMPILE_EVENTS:
        with _compile_lock:
            _compile["seconds"] += duration_secs
