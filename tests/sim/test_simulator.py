"""Simulator invariants, cost-model sanity and determinism, on small fast scenarios."""

import collections
import dataclasses

import pytest

from rljax.models.presets import PRESETS
from rljax.policy.reallocation import ReallocatorConfig
from rljax.sim.chips import CHIPS, get_chip
from rljax.sim.costs import CostModel, Efficiencies
from rljax.sim.simulator import SimConfig, Simulator
from rljax.sim.workload import LengthModel, load_histogram

COST = CostModel(PRESETS["qwen2.5-1.5b"], CHIPS["tpu-v5e"], tp=1)
LENGTHS = LengthModel(median=300, sigma=0.8, tail_prob=0.05, max_tokens=2048)


def small(mode="async", **overrides):
    fields = dict(
        mode=mode,
        total_chips=16,
        sampler_chips=8,
        steps=12,
        batch_groups=8,
        group_size=4,
        prompt_tokens=64,
        max_staleness=0 if mode == "sync" else 2,
        max_slots=32,
        granularity=2,
        seed=3,
    )
    fields.update(overrides)
    return SimConfig(**fields)


def run(config, cost=COST, lengths=LENGTHS):
    return Simulator(config, cost, lengths).run()


def check_invariants(result, config):
    assert result.steps == config.steps
    assert len(result.staleness) == config.steps * config.batch_groups
    # Staleness never exceeds eta and is never negative.
    assert all(0 <= s <= config.max_staleness for s in result.staleness)
    # No group consumed twice.
    counts = collections.Counter(result.consumed_prompts)
    assert max(counts.values()) == 1
    # Every dispatched request is consumed, aborted, still in flight, or held in the buffer.
    consumed = len(result.consumed_prompts)
    assert result.dispatched == consumed + result.aborted + result.in_flight + result.held


@pytest.mark.parametrize(
    "config",
    [
        small("sync"),
        small("async", max_staleness=0),
        small("async"),
        small("async", overprovision=2),
        small("realloc", phase_steps=2, switch_cost_s=0.5),
    ],
    ids=["sync", "async-eta0", "async-eta2", "async-overprovision", "realloc"],
)
def test_no_group_lost_or_duplicated_and_staleness_bounded(config):
    result = run(config)
    check_invariants(result, config)
    assert 0.0 < result.sampler_util <= 1.0 + 1e-9
    assert 0.0 < result.learner_util <= 1.0 + 1e-9


def test_overprovision_aborts_surplus():
    result = run(small("async", overprovision=3))
    assert result.aborted > 0


def test_same_seed_same_run_and_other_seed_differs():
    a, b = run(small("async")), run(small("async"))
    assert a == b
    c = run(small("async", seed=4))
    assert c.wall_s != a.wall_s


def test_async_beats_sync_on_long_tail_and_staleness_helps():
    tail = LengthModel(median=200, sigma=1.0, tail_prob=0.05, max_tokens=4096)
    sync = run(small("sync", total_chips=16), lengths=tail)
    eta0 = run(small("async", max_staleness=0), lengths=tail)
    eta2 = run(small("async", max_staleness=2), lengths=tail)
    assert eta2.samples_per_s > eta0.samples_per_s
    assert eta2.samples_per_s > sync.samples_per_s


def test_reallocation_moves_chips_towards_the_bottleneck():
    # Throughput-bound sampler (no tail) on 2 of 16 chips; training is cheap, so the learner
    # idles and chips should move to the sampler.
    steady = LengthModel(median=300, sigma=0.3, tail_prob=0.0, max_tokens=2048)
    config = small(
        "realloc",
        steps=30,
        sampler_chips=2,
        batch_groups=32,
        max_slots=16,
        phase_steps=3,
        switch_cost_s=0.1,
        reallocator=ReallocatorConfig(patience=1, cooldown=1),
    )
    result = run(config, lengths=steady)
    check_invariants(result, config)
    assert result.moves and result.final_split[0] > 2
    static = run(dataclasses.replace(config, mode="async"), lengths=steady)
    assert result.samples_per_s > 1.5 * static.samples_per_s


def test_latency_bound_sampler_does_not_get_chips():
    # Long-tailed lengths with few groups: replicas hold a few stragglers, so more sampler
    # chips would not finish a batch sooner and the occupancy-aware policy stays put.
    config = small(
        "realloc",
        steps=30,
        sampler_chips=4,
        phase_steps=3,
        switch_cost_s=0.1,
        reallocator=ReallocatorConfig(patience=1, cooldown=1),
    )
    assert run(config).moves == ()


def test_decode_time_scales_with_bytes():
    big = CostModel(PRESETS["qwen2.5-7b"], CHIPS["tpu-v5e"], tp=2)
    small_model = CostModel(PRESETS["qwen2.5-1.5b"], CHIPS["tpu-v5e"], tp=2)
    ratio = big.decode_step_s(1, 0) / small_model.decode_step_s(1, 0)
    assert ratio == pytest.approx(big.weight_bytes / small_model.weight_bytes)
    # Reading KV grows the step linearly; more bandwidth shrinks it.
    assert COST.decode_step_s(8, 10_000) > COST.decode_step_s(8, 0)
    slope = COST.decode_step_s(8, 20_000) - COST.decode_step_s(8, 10_000)
    assert slope == pytest.approx(10_000 * COST.kv_seconds_per_token())
    fast = dataclasses.replace(COST, chip=CHIPS["tpu-v5p"])
    assert fast.decode_step_s(8, 0) < COST.decode_step_s(8, 0)
    # At a huge batch decode turns compute bound.
    assert COST.decode_step_s(100_000, 0) == COST.decode_compute_s(100_000)


def test_train_and_sync_costs():
    assert COST.train_step_s(1000, 8) == pytest.approx(COST.train_step_s(1000, 4) / 2)
    n = COST.n_params
    expected = 6 * n * 1000 / (4 * COST.chip.bf16_flops * COST.efficiencies.train_mfu)
    assert COST.train_step_s(1000, 4) == pytest.approx(expected)
    assert COST.sync_s(16, 4) > COST.sync_s(4, 4)  # more replicas to feed
    assert COST.prefill_s(2000) == pytest.approx(2 * COST.prefill_s(1000))


def test_replica_clock_matches_stepwise_sum():
    # The analytic replica must agree with summing decode steps one by one.
    from rljax.sim.replica import Replica

    class Req:
        live = 0
        start = 0.0

    rep = Replica(0, COST, 8, 0.0)
    rep.admit(0.0, Req(), [100, 300], prompt=50, prefill_s=0.0)
    t, kv = 0.0, 100
    for step in range(300):
        batch = 2 if step < 100 else 1
        t += COST.decode_step_s(batch, kv)
        kv += batch - (50 + 100 if step == 99 else 0)
    times = []
    while (finish := rep.next_finish_time()) is not None:
        times.append(finish)
        rep.pop_finished(finish, 50)
    assert times[-1] == pytest.approx(t, rel=1e-3)


def test_length_model_growth_and_histogram(tmp_path):
    grow = LengthModel(median=100, sigma=0.0, tail_prob=0.0, growth=3.0, growth_steps=10)
    draw = grow.sampler(0)
    assert draw(0) == 100 and draw(5) == 200 and draw(10) == 300 and draw(99) == 300
    path = tmp_path / "hist.txt"
    path.write_text("# length count\n10 1\n20,3\n")
    hist = LengthModel(histogram=load_histogram(path))
    draw_hist = hist.sampler(1)
    values = collections.Counter(draw_hist(0) for _ in range(4000))
    assert set(values) == {10, 20} and values[20] > 2 * values[10]


def test_bad_input_messages(tmp_path):
    with pytest.raises(ValueError, match="mode='sync' is on-policy: set max_staleness=0"):
        small("sync", max_staleness=1)
    with pytest.raises(ValueError, match="must leave chips for both meshes"):
        small("async", sampler_chips=16)
    with pytest.raises(ValueError, match="a replica must hold one whole group"):
        small("async", max_slots=2)
    with pytest.raises(ValueError, match="unknown; choose one of"):
        small("colocated")
    with pytest.raises(KeyError, match="unknown chip 'tpu-v9'"):
        get_chip("tpu-v9")
    with pytest.raises(ValueError, match="efficiency train_mfu=1.5 must be in"):
        Efficiencies(train_mfu=1.5)
    with pytest.raises(ValueError, match="do not fit in 1 x tpu-v5e HBM; raise tp"):
        CostModel(PRESETS["qwen3-8b"], CHIPS["tpu-v5e"], tp=1, param_bytes_per=4)
    bad = tmp_path / "bad.txt"
    bad.write_text("10 1 7\n")
    with pytest.raises(ValueError, match="expected 'length count'"):
        load_histogram(bad)
    with pytest.raises(ValueError, match="not a multiple of tp=2"):
        Simulator(small("async", sampler_chips=7), dataclasses.replace(COST, tp=2), LENGTHS)


def test_replica_queues_samples_beyond_free_slots_and_refills_freed_slots():
    # Slots are filled per sequence, as the runtime's Sampler does: a group larger than the
    # free slots waits in the queue, and each finished sequence frees a slot for the next.
    from rljax.sim.replica import Replica

    class Req:
        pass

    rep = Replica(0, COST, 4, 0.0)
    long, short = Req(), Req()
    rep.admit(0.0, long, [1000, 1000, 1000], prompt=10, prefill_s=0.0)
    rep.admit(0.0, short, [10, 20, 30], prompt=10, prefill_s=0.0)
    assert (rep.n, rep.queued, rep.headroom) == (4, 2, -2)
    first = rep.next_finish_time()
    done = rep.pop_finished(first, 10)
    assert done == [short] and (rep.n, rep.queued) == (4, 1)  # the freed slot was refilled
    rep.remove(first, long, prompt=10)
    assert (rep.n, rep.queued, long.live) == (2, 0, 0)  # short's last sample took a slot
    while (t := rep.next_finish_time()) is not None:
        rep.pop_finished(t, 10)
    assert (rep.n, rep.queued, rep.base) == (0, 0, 0.0)


def test_held_back_slots_count_as_sampler_idle_and_send_chips_to_the_learner():
    # Expensive training on 4 of 16 chips with a long tail: a straggler keeps every replica
    # alive, so only the slots the staleness window holds empty show that the sampler waits.
    config = small(
        "realloc",
        steps=40,
        sampler_chips=12,
        phase_steps=4,
        switch_cost_s=0.1,
        train_flops_per_param=200.0,
        reallocator=ReallocatorConfig(patience=1, cooldown=1),
    )
    sim = Simulator(config, COST, LENGTHS)
    result = sim.run()
    check_invariants(result, config)
    assert sim.blocked_slot_s > 0
    assert result.moves and result.final_split[0] < 12
    static = run(dataclasses.replace(config, mode="async"))
    assert result.samples_per_s > static.samples_per_s


def test_phase_stats_carry_decode_step_timings(monkeypatch):
    # The decode-aware policy reads the mean step time and its fixed part (the weight read);
    # the simulator's PhaseMeter measures both from the replicas' Generate events.
    from rljax.policy.reallocation import Reallocator

    seen, decide = [], Reallocator.decide

    def record(self, stats):
        seen.append(stats)
        return decide(self, stats)

    monkeypatch.setattr(Reallocator, "decide", record)
    config = small("realloc", phase_steps=2, switch_cost_s=0.5)
    run(config)
    assert len(seen) == config.steps // config.phase_steps
    fixed = COST.decode_memory_s(0.0)
    slowest = COST.decode_step_s(config.max_slots, config.max_slots * (64 + 2048))
    for stats in seen:
        assert stats.decode_fixed_s == pytest.approx(fixed)
        assert fixed * (1 - 1e-9) <= stats.decode_step_s <= slowest
    assert max(s.decode_step_s for s in seen) > 1.01 * fixed  # the KV read shows up
