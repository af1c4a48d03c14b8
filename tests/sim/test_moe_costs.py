"""The cost model on a mixture of experts: FLOPs from the active parameters (k of E experts,
the router, attention, a shared expert), bytes from all of them (every expert)."""

import dataclasses

import pytest

from rljax.models.presets import PRESETS, active_param_count, moe_layer_count, param_count
from rljax.sim.chips import CHIPS
from rljax.sim.costs import CostModel

MOE = PRESETS["qwen3-30b-a3b"]


def test_qwen3_30b_a3b_counts_are_the_published_ones():
    # The model card: 30.5B parameters, 3.3B activated.
    assert param_count(MOE) / 1e9 == pytest.approx(30.5, rel=0.01)
    assert active_param_count(MOE) / 1e9 == pytest.approx(3.3, rel=0.02)
    assert moe_layer_count(MOE) == 48


def _dense_twin(preset, **moe):
    """``preset`` as a mixture whose E experts of width F / E, all active, sum to its MLP."""
    e = moe.get("num_experts", 4)
    return {
        **preset,
        "family": "qwen2_moe" if preset["family"] == "qwen2" else "qwen3_moe",
        "num_experts": e,
        "num_experts_per_tok": e,
        "moe_intermediate_size": preset["intermediate_size"] // e,
        "norm_topk_prob": False,
        "decoder_sparse_step": 1,
        "mlp_only_layers": (),
        "shared_expert_intermediate_size": 0,
        **moe,
    }


def test_counts_of_mixtures_built_from_a_dense_model():
    dense = PRESETS["qwen2.5-0.5b"]
    h, layers = dense["hidden_size"], dense["num_layers"]
    twin = _dense_twin(dense)  # 4 experts of F / 4, all active: the dense MLP plus a router
    router = layers * h * 4
    assert param_count(twin) == active_param_count(twin) == param_count(dense) + router
    top1 = {**twin, "num_experts_per_tok": 1}  # one of 4 experts active
    mlp = layers * 3 * h * dense["intermediate_size"]
    assert param_count(top1) == param_count(twin)
    assert active_param_count(top1) == param_count(dense) + router - mlp * 3 // 4
    # Every second layer dense (decoder_sparse_step=2): those keep their MLP whole.
    step2 = {**top1, "decoder_sparse_step": 2}
    assert moe_layer_count(step2) == layers // 2
    assert active_param_count(step2) == param_count(dense) + router // 2 - mlp * 3 // 8


def test_flops_follow_the_active_parameters_and_bytes_all_of_them():
    chip = CHIPS["tpu-v5p"]
    cost = CostModel(MOE, chip, tp=1)
    assert cost.n_params == param_count(MOE) and cost.n_active == active_param_count(MOE)
    assert cost.weight_bytes == 2 * param_count(MOE)
    eff = cost.efficiencies
    tokens, chips = 4096, 8
    want_train = 6.0 * cost.n_active * tokens / (chips * chip.bf16_flops * eff.train_mfu)
    assert cost.train_step_s(tokens, chips) == pytest.approx(want_train)
    want_prefill = 2.0 * cost.n_active * tokens / (chip.bf16_flops * eff.prefill_mfu)
    assert cost.prefill_s(tokens) == pytest.approx(want_prefill)
    want_decode = 2.0 * cost.n_active * 64 / (chip.bf16_flops * eff.decode_mfu)
    assert cost.decode_compute_s(64) == pytest.approx(want_decode)
    bw = chip.hbm_bytes_per_s * eff.decode_hbm
    assert cost.decode_memory_s(0) == pytest.approx(2 * param_count(MOE) / bw)
    # Against Qwen3-8B: 3.7x the bytes to sync, 0.4x the FLOPs to train.
    dense = CostModel(PRESETS["qwen3-8b"], chip, tp=1)
    moved = cost.sync_s(8, 8) - cost.sync_latency_s
    assert moved == pytest.approx(3.73 * (dense.sync_s(8, 8) - dense.sync_latency_s), rel=0.01)
    assert cost.train_step_s(tokens, chips) < 0.5 * dense.train_step_s(tokens, chips)


def test_a_dense_preset_is_unchanged():
    cost = CostModel(PRESETS["qwen2.5-1.5b"], CHIPS["tpu-v5e"], tp=1)
    assert cost.n_active == cost.n_params == param_count(PRESETS["qwen2.5-1.5b"])
    as_moe = dataclasses.replace(cost, model=_dense_twin(PRESETS["qwen2.5-1.5b"]))
    # All experts active: the same FLOPs but the router's.
    assert as_moe.train_step_s(1000, 4) == pytest.approx(cost.train_step_s(1000, 4), rel=1e-3)
