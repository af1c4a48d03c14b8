"""The simulator and the runtime drive the policies through the same wiring.

The same event trace gives the same PhaseStats through the runtime's ``Reallocation`` as through
the simulator; both take admission's one ``max_concurrent`` rule and the same settings section.
"""

import dataclasses

import pytest
from rljax.configs import arith_tiny

from rljax.config import (
    ConfigError,
    MeshConfig,
    RunConfig,
    from_config_dict,
    replace,
    to_config_dict,
)
from rljax.mesh.resize import Reallocation
from rljax.policy import meter as phase_meter
from rljax.policy.admission import max_concurrent_groups
from rljax.policy.reallocation import ReallocatorConfig, reallocator_settings
from rljax.runtime import Run
from rljax.sim import simulator
from rljax.sim.simulator import SimConfig, Simulator
from tests.sim.test_simulator import COST, LENGTHS, small


class RecordingMeter(phase_meter.PhaseMeter):
    """A PhaseMeter that keeps the trace it was fed and each phase it closed."""

    def __init__(self, start=0.0):
        super().__init__(start)
        self.trace, self.closed = [], []

    def record(self, event):
        self.trace.append(event)
        super().record(event)

    def stats(self, **kwargs):
        out = super().stats(**kwargs)
        self.closed.append((len(self.trace), kwargs, out))
        return out


def simulate_with_trace(monkeypatch, config):
    meters = []

    def make(start=0.0):
        meters.append(RecordingMeter(start))
        return meters[-1]

    monkeypatch.setattr(simulator, "PhaseMeter", make)
    sim = Simulator(config, COST, LENGTHS)
    sim.run()
    (meter,) = meters
    return sim, meter


def test_one_trace_gives_equal_phase_stats_in_the_runtime_and_the_simulator(monkeypatch):
    config = small("realloc", steps=24, phase_steps=3, switch_cost_s=0.5)
    sim, meter = simulate_with_trace(monkeypatch, config)
    kinds = {type(e) for e in meter.trace}
    assert kinds == {
        phase_meter.Generate,
        phase_meter.SamplerIdle,
        phase_meter.Learn,
        phase_meter.LearnerWait,
        phase_meter.StepEnd,
    }
    assert len(meter.closed) == config.steps // config.phase_steps

    mesh = MeshConfig(
        mode="split",
        sampler_devices=config.sampler_chips,
        learner_devices=config.total_chips - config.sampler_chips,
        reallocate=True,
        reallocate_every=config.phase_steps,
        reallocate_granularity=sim.unit,
    )
    runtime = Reallocation(mesh, ReallocatorConfig(), max_staleness=config.max_staleness)
    fed = 0
    for until, kwargs, expected in meter.closed:
        for event in meter.trace[fed:until]:
            runtime.meter.record(event)
        fed = until
        assert runtime.due
        runtime.switch_cost_s = kwargs["switch_cost_s"]  # the simulator's cost of a resize
        got = runtime.phase(
            split=kwargs["split"],
            slots=kwargs["slots"],
            buffer_rows=kwargs["buffer_rows"],
            batch_groups=kwargs["batch_groups"],
            estimated_switch_s=0.0,
        )
        assert got == expected
        assert not runtime.due
    # The trace is not trivial: the decode-aware inputs and held-back idle are measured.
    stats = [c[2] for c in meter.closed]
    assert all(s.decode_step_s > 0 for s in stats)
    assert any(s.sampler_idle_s > 0 for s in stats)
    assert any(0 < s.decode_fixed_s < s.decode_step_s for s in stats)


def test_the_simulator_fits_the_weight_read_as_the_fixed_decode_part(monkeypatch):
    # The fit on busy slots and KV tokens recovers the cost model's fixed part (the weight read
    # plus launch), which a fit on busy slots alone misreads when stragglers carry long KV.
    config = small("realloc", steps=12, phase_steps=3, switch_cost_s=0.5)
    _, meter = simulate_with_trace(monkeypatch, config)
    fixed = COST.decode_memory_s(0.0)
    for _, _, stats in meter.closed:
        assert stats.decode_fixed_s == pytest.approx(fixed, rel=1e-3)


@pytest.fixture(scope="module")
def runtime_admission(tmp_path_factory):
    """(config, sampler slots, admission controller) of a real Run's driver (not started)."""
    cfg = replace(
        arith_tiny.recipe("small"),
        **{"mode": "async", "buffer.max_staleness": 1, "buffer.overprovision": 2},
    )
    run = Run(cfg, str(tmp_path_factory.mktemp("run")))
    try:
        return cfg, run.sampler.num_slots, run._make_driver().controller
    finally:
        run.close()


@pytest.mark.parametrize("sampler_chips, max_slots", [(8, 32), (1, 4)])
def test_simulator_and_runtime_share_admission_and_settings(
    sampler_chips, max_slots, runtime_admission
):
    # (1, 4): one replica of 4 slots, fewer than a batch of 8 + 2 groups; the one rule still
    # lets a whole batch be in flight (the simulator alone used to cap it at the 4 slots).
    config = small("async", overprovision=2, sampler_chips=sampler_chips, max_slots=max_slots)
    sim = Simulator(config, COST, LENGTHS)
    result = sim.run()
    slots = len(sim.replicas) * sim.slots
    expected = max_concurrent_groups(
        slots=slots, group_size=config.group_size, batch_groups=8, overprovision=2
    )
    assert sim.controller.max_concurrent == expected == max(10, slots)
    assert result.steps == config.steps
    # The runtime's driver takes the same rule over its own sampler's slots.
    cfg, run_slots, runtime = runtime_admission
    assert runtime.max_concurrent == max_concurrent_groups(
        slots=run_slots,
        group_size=cfg.learner.group_size,
        batch_groups=cfg.learner.batch_groups,
        overprovision=2,
    )
    assert (runtime.max_staleness, runtime.overprovision) == (1, 2)


def test_the_simulators_lending_reads_the_reallocators_held_threshold():
    # As the runtime's (tests/runtime/test_lending_wiring.py): one key for both policies.
    config = small("lend", steps=2, reallocator=ReallocatorConfig(held_threshold=0.3))
    sim = Simulator(config, COST, LENGTHS)
    sim.run()
    assert sim.lender.policy.held_threshold == 0.3


@pytest.mark.parametrize("eta", [0, 2])
def test_one_config_gives_the_simulator_and_the_runtime_equal_reallocator_settings(eta):
    # Guards the two paths deriving the policy's settings differently (the simulator floored
    # the sides and scaled full_fill; the runtime used the section as written, so one config
    # decided differently in each): both build them with reallocator_settings.
    section = ReallocatorConfig(min_sampler_chips=1, min_learner_chips=1, full_fill=0.8)
    config = small("realloc", max_staleness=eta, reallocator=section)
    sim = Simulator(config, COST, LENGTHS)
    sim.run()
    mesh = MeshConfig(
        mode="split",
        sampler_devices=config.sampler_chips,
        learner_devices=config.total_chips - config.sampler_chips,
        sampler_tensor=COST.tp,
        learner_tensor=sim._min_learner_chips(),  # the floor the simulator's memory model sets
        reallocate=True,
        reallocate_granularity=sim.unit,
    )
    runtime = Reallocation(mesh, section, max_staleness=eta)
    assert runtime.policy.config == sim.reallocator.config == sim.reallocator_settings()
    expected = reallocator_settings(
        section, max_staleness=eta, granularity=2, sampler_floor=1, learner_floor=2
    )
    assert runtime.settings == expected
    assert expected.full_fill == pytest.approx(0.8 * eta / (eta + 1) if eta else 0.8)
    assert (expected.min_sampler_chips, expected.min_learner_chips) == (2, 2)


def test_every_reallocator_setting_is_a_run_config_key():
    # Every Reallocator setting is a RunConfig key, and SimConfig takes the same section.
    settings = ReallocatorConfig(patience=3, margin=2.0, held_threshold=0.2)
    cfg = from_config_dict({"reallocator": dataclasses.asdict(settings)})
    assert cfg.reallocator == settings
    assert set(to_config_dict(RunConfig()).reallocator) == {
        f.name for f in dataclasses.fields(ReallocatorConfig)
    }
    assert SimConfig(reallocator=cfg.reallocator).reallocator is cfg.reallocator
    with pytest.raises(ConfigError, match="'reallocator.patience' = 0 is invalid"):
        from_config_dict({"reallocator": {"patience": 0}})
