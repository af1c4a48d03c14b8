"""scripts/plan_memory.py on a tiny split config over the 8 fake devices, in-process.

Checks the report's figures against what they must be from the shapes (params and optimiser
bytes, the KV pool sharded over the sampler's data axis), that the fit verdict follows from the
numbers, and that the last line is the JSON of the figures. The same config with LoRA on
(``--config.lora.enabled=True``) must plan Adam moments for the adapters alone and stage only
the adapters on the sampler.
"""

import contextlib
import importlib.util
import io
import json
import pathlib

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
GIB = 1024**3

# A tiny run split 4/4: sampler data=2 x tensor=2, learner fsdp=4. The model is wide enough
# (vocab 256) that every figure is well above XLA's bookkeeping bytes.
CONFIG = """
from rljax.config import MeshConfig, ModelConfig, LearnerConfig, SamplingConfig, replace
from rljax.config import to_config_dict
from rljax.configs import arith_tiny

TARGETS = {"cpu8": ("tpu-v5e", 8)}


def get_config(arg):
    cfg = arith_tiny.recipe("small")
    cfg = replace(
        cfg,
        model=ModelConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_layers=2,
                          num_heads=4, num_kv_heads=2, head_dim=16),
        sampling=SamplingConfig(max_new_tokens=16, max_prefill_length=16,
                                max_concurrent_decodes=8, page_size=8),
        learner=LearnerConfig(group_size=4, batch_groups=4, micro_batches=2, remat="full"),
        mesh=MeshConfig(mode="split", sampler_devices=4, learner_devices=4, sampler_data=2,
                        sampler_tensor=2, learner_fsdp=4, learner_tensor=1),
    )
    return to_config_dict(cfg)
"""


@pytest.fixture(scope="module")
def planner():
    spec = importlib.util.spec_from_file_location("plan_memory", REPO / "scripts/plan_memory.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def config_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("cfg") / "tiny_split.py"
    path.write_text(CONFIG)
    return path


def _run(planner, argv):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = planner.main(argv)
    return code, out.getvalue().splitlines(), err.getvalue()


@pytest.fixture(scope="module")
def fitting(planner, config_file):
    return _run(planner, [f"--config={config_file}:cpu8"])


def test_report_fits_and_ends_with_its_json(fitting):
    code, lines, err = fitting
    assert code == 0 and err == ""
    assert "learner (4 chips" in "\n".join(lines) and "sampler (4 chips" in "\n".join(lines)
    result = json.loads(lines[-1])
    assert result["chips"] == 8 and result["chip"] == "tpu-v5e" and result["hbm"] == 16 * GIB
    assert result["fits"] is True


def test_figures_are_positive_and_match_the_shapes(fitting):
    result = json.loads(fitting[1][-1])
    lrn, smp = result["learner"], result["sampler"]
    for role in (lrn, smp):
        for key in ("argument", "output", "temp", "peak", "total"):
            assert role[key] > 0, key
        assert role["fits"] == (role["total"] <= result["hbm"])
        assert role["headroom"] == result["hbm"] - role["total"]
    # Learner: f32 params, 2 f32 Adam moments, all sharded 4 ways (fsdp=4 divides every dim).
    n_params = 256 * 64 + 64 * 256 + 64 + 2 * (2 * 64 + 64 * 64 * 2 + 2 * 64 * 32 + 3 * 64 * 128)
    assert lrn["params"] == pytest.approx(n_params * 4 / 4, rel=0.02)
    assert lrn["optimizer"] == pytest.approx(2 * lrn["params"], rel=0.01)
    assert lrn["argument"] == lrn["params"] + lrn["optimizer"] + lrn["batch"]
    assert lrn["total"] == lrn["peak"] >= lrn["argument"]
    # 16 sequences of up to 32 tokens, one per row: 2 micro-batches of 8 rows.
    assert lrn["batch_shape"] == [2, 8, 32]
    # Sampler: the pool [L, K, P, Z, H] = [2, 2, 8 slots * 4 pages + 2 null, 8, 16] f32, K and
    # V, split over tensor=2 (kv heads) and data=2 (the kv shards).
    assert smp["kv_shards"] == 2
    assert smp["kv_pool"] == 2 * (2 * 2 * 34 * 8 * 16 * 4) // 4
    assert smp["weights"] == smp["weights_in_flight"] > 0
    assert smp["total"] == smp["peak"] + smp["weights"]
    assert smp["peak"] >= smp["weights"] + smp["kv_pool"]


# The tiny model's adapters at rank 4 on all 7 projections, per layer: q 64*4 + 4*64, k and v
# 64*4 + 4*32, o 64*4 + 4*64, gate and up 64*4 + 4*128, down 128*4 + 4*64; 2 layers.
N_ADAPTERS = 2 * (2 * 512 + 2 * 384 + 3 * 768)


@pytest.fixture(scope="module")
def with_lora(planner, config_file):
    return _run(
        planner,
        [f"--config={config_file}:cpu8", "--config.lora.enabled=True", "--config.lora.rank=4"],
    )


def test_lora_trains_the_adapters_alone(fitting, with_lora):
    code, lines, err = with_lora
    assert code == 0 and err == ""
    assert "LoRA r=4" in lines[1] and "staged adapters" in "\n".join(lines)
    full, lora = json.loads(fitting[1][-1]), json.loads(lines[-1])
    assert full["lora"]["enabled"] is False
    assert full["lora"]["trainable_params"] == full["lora"]["total_params"]
    assert lora["lora"]["enabled"] is True and lora["lora"]["rank"] == 4
    assert lora["lora"]["serving"] == "unmerged"  # as the target accelerator serves them
    assert lora["lora"]["trainable_params"] == N_ADAPTERS
    assert lora["lora"]["total_params"] == full["lora"]["total_params"] + N_ADAPTERS
    lrn, full_lrn = lora["learner"], full["learner"]
    # f32 adapters, each device holding at least its 1/4 share and at most all of them.
    assert N_ADAPTERS * 4 // 4 <= lrn["adapters"] <= N_ADAPTERS * 4
    assert lrn["params"] == full_lrn["params"] + lrn["adapters"]  # base + adapters, no ref
    # Adam's two moments of the adapters, plus the optimiser's few scalars (step counts, rate).
    assert 0 <= lrn["optimizer"] - 2 * lrn["adapters"] < 256
    assert lrn["params"] + lrn["optimizer"] < full_lrn["params"] + full_lrn["optimizer"]


def test_lora_stages_only_the_adapters(fitting, with_lora):
    full, lora = json.loads(fitting[1][-1])["sampler"], json.loads(with_lora[1][-1])["sampler"]
    assert lora["weights"] > full["weights"]  # the base and the unmerged adapters
    assert lora["weights_in_flight"] == lora["weights"] - full["weights"]
    assert N_ADAPTERS * 4 // 4 <= lora["weights_in_flight"] <= N_ADAPTERS * 4
    assert lora["total"] == lora["peak"] + lora["weights_in_flight"]
    assert lora["kv_pool"] == full["kv_pool"]


def test_merged_adapters_count_the_unmerged_state_held_beside_them(planner, config_file):
    code, lines, _ = _run(
        planner,
        [
            f"--config={config_file}:cpu8",
            "--config.lora.enabled=True",
            "--config.lora.serving=merged",
        ],
    )
    result = json.loads(lines[-1])
    smp = result["sampler"]
    assert code == 0 and result["lora"]["serving"] == "merged"
    assert smp["weights_kept"] == smp["weights"] > 0
    assert smp["total"] == smp["peak"] + smp["weights_in_flight"] + smp["weights"]


def test_an_unknown_override_is_a_clear_error(planner, config_file):
    with pytest.raises(SystemExit, match="lora.bogus"):
        planner.main([f"--config={config_file}:cpu8", "--config.lora.bogus=1"])


def test_a_budget_too_small_exits_1_naming_the_role(planner, config_file, fitting):
    code, lines, err = _run(planner, [f"--config={config_file}:cpu8", "--hbm_gib=0.0001"])
    assert code == 1
    result = json.loads(lines[-1])
    assert result["fits"] is False and not result["learner"]["fits"]
    assert "the learner needs" in err and "learner.micro_batches" in err
    # A budget the sampler fits and the learner does not: one role short is a misfit, and
    # only that role is named.
    lrn, smp = (json.loads(fitting[1][-1])[role]["total"] for role in ("learner", "sampler"))
    assert smp < lrn
    budget = f"--hbm_gib={(smp + lrn) / 2 / GIB}"
    code, lines, err = _run(planner, [f"--config={config_file}:cpu8", budget])
    result = json.loads(lines[-1])
    assert code == 1 and result["fits"] is False
    assert result["sampler"]["fits"] and not result["learner"]["fits"]
    assert "the learner needs" in err and "the sampler needs" not in err


def test_unknown_variant_is_a_clear_error(planner, config_file):
    with pytest.raises(SystemExit, match="unknown variant 'v9'.*cpu8"):
        planner.main([f"--config={config_file}:v9"])


# ---- mixtures of experts ----------------------------------------------------------------------

# A tiny Qwen3-MoE colocated on the 8 devices, its 8 experts split over expert_parallel=4 on
# both meshes (x tensor=2): the plan counts every expert's bytes and the active ones' FLOPs.
MOE_CONFIG = """
from rljax.config import LearnerConfig, MeshConfig, ModelConfig, SamplingConfig, replace
from rljax.config import to_config_dict
from rljax.configs import arith_tiny

TARGETS = {"cpu8": ("tpu-v5e", 8)}
MODEL = ModelConfig(family="qwen3_moe", vocab_size=256, hidden_size=64, intermediate_size=128,
                    num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16, qk_norm=True,
                    num_experts=8, num_experts_per_tok=2, moe_intermediate_size=64)


def get_config(arg):
    cfg = replace(
        arith_tiny.recipe("small"),
        model=MODEL,
        sampling=SamplingConfig(max_new_tokens=16, max_prefill_length=16,
                                max_concurrent_decodes=8, page_size=8),
        learner=LearnerConfig(group_size=4, batch_groups=4, micro_batches=2, remat="full"),
        mesh=MeshConfig(expert_parallel=4, learner_fsdp=1, learner_tensor=2, sampler_data=1,
                        sampler_tensor=2),
    )
    return to_config_dict(replace(cfg, **{"moe.router_replay": "rollout"}))
"""
# Per layer: attention 64*64*2 + 64*32*2 + 2*16 (q/k norms), 2 norms of 64, router 64*8,
# 8 experts of 3*64*64; embeddings 256*64 twice (untied) and the final norm.
MOE_ATTENTION = 2 * 64 * 64 + 2 * 64 * 32 + 2 * 16 + 2 * 64 + 64 * 8
MOE_EXPERT = 3 * 64 * 64
MOE_TOTAL = 2 * 256 * 64 + 64 + 2 * (MOE_ATTENTION + 8 * MOE_EXPERT)
MOE_ACTIVE = 2 * 256 * 64 + 64 + 2 * (MOE_ATTENTION + 2 * MOE_EXPERT)


@pytest.fixture(scope="module")
def moe_plan(planner, tmp_path_factory):
    path = tmp_path_factory.mktemp("cfg") / "tiny_moe.py"
    path.write_text(MOE_CONFIG)
    return _run(planner, [f"--config={path}:cpu8", "--kernel_impl=pallas", "--no_sampler_hoist"])


def test_a_mixture_is_planned_from_every_expert_and_its_flops_from_k(moe_plan):
    code, lines, err = moe_plan
    assert code == 0 and err == ""
    result = json.loads(lines[-1])
    params = result["params"]
    assert params["total"] == MOE_TOTAL == result["lora"]["total_params"]  # the built model's
    assert params["active"] == MOE_ACTIVE
    assert (params["experts"], params["experts_per_token"]) == (8, 2)
    assert params["train_flops_per_token"] == 6 * MOE_ACTIVE
    assert params["step_train_flops"] == 6 * MOE_ACTIVE * 2 * 8 * 32  # [micro, rows, len]
    # Every expert's f32 bytes are held, split 8 ways (4 expert shards x 2 tensor).
    lrn = result["learner"]
    assert lrn["params"] >= 4 * 2 * 8 * MOE_EXPERT / 8
    assert lrn["params"] <= 4 * MOE_TOTAL / 2
    assert "mixture of 8 experts, 2 a token" in "\n".join(lines)


def test_colocated_roles_add_up_on_the_same_chips(moe_plan):
    result = json.loads(moe_plan[1][-1])
    lrn, smp, both = result["learner"], result["sampler"], result["together"]
    assert result["colocated"] is True and result["fits"] == both["fits"] is True
    sampler_held = smp["weights"] + smp["kv_pool"] + smp["weights_kept"]
    learner_held = lrn["params"] + lrn["optimizer"]
    assert both["total"] == max(lrn["total"] + sampler_held, smp["total"] + learner_held)
    assert both["total"] > max(lrn["total"], smp["total"])
    assert both["headroom"] == result["hbm"] - both["total"]


def test_colocated_misfit_names_both_roles(planner, tmp_path, moe_plan):
    # A budget either role fits alone but not both together: colocated, that is a misfit.
    planned = json.loads(moe_plan[1][-1])
    alone = max(planned["learner"]["total"], planned["sampler"]["total"])
    budget = f"--hbm_gib={(alone + planned['together']['total']) / 2 / GIB}"
    path = tmp_path / "tiny_moe.py"
    path.write_text(MOE_CONFIG)
    argv = [f"--config={path}:cpu8", "--kernel_impl=pallas", "--no_sampler_hoist", budget]
    code, lines, err = _run(planner, argv)
    result = json.loads(lines[-1])
    assert code == 1 and result["together"]["fits"] is False and result["fits"] is False
    assert result["learner"]["fits"] and result["sampler"]["fits"]
    assert "both roles on the same chips (colocated) need" in err
    assert "mesh.mode='split'" in err and len(err.strip().splitlines()) == 1


# ---- sliding windows (Gemma) -------------------------------------------------------------------

# A tiny Gemma 3 (two local layers of window 8, then a global one) on the split meshes above:
# slots of 8 + 56 = 64 tokens, eight times the window, so the local layers' own pool is smaller
# than every layer's KV at full length.
GEMMA_CONFIG = (
    CONFIG.replace("num_layers=2,\n", "num_layers=3,\n")
    .replace(
        "num_heads=4, num_kv_heads=2, head_dim=16),",
        """num_heads=4, num_kv_heads=2, head_dim=16, family="gemma3",
                          layer_types=("sliding_attention",) * 2 + ("full_attention",),
                          sliding_window=8, qk_norm=True, hidden_act="gelu_pytorch_tanh",
                          post_norms=True, norm_unit_offset=True, scale_embeddings=True,
                          tie_embeddings=True),""",
    )
    .replace("max_new_tokens=16, max_prefill_length=16", "max_new_tokens=56, max_prefill_length=8")
)


@pytest.fixture(scope="module")
def gemma_plan(planner, tmp_path_factory):
    path = tmp_path_factory.mktemp("cfg") / "tiny_gemma.py"
    path.write_text(GEMMA_CONFIG)
    return _run(planner, [f"--config={path}:cpu8"])


def test_the_local_pool_is_counted_beside_the_global_one(gemma_plan):
    code, lines, err = gemma_plan
    assert code == 0 and err == ""
    smp = json.loads(lines[-1])["sampler"]
    # Planned as a v5e decodes: 8 tokens a call (decode_steps 0), not the CPU's 1.
    assert smp["decode_steps"] == 8
    # Per kv shard (data=2: 4 slots each), pages of 8 tokens: the global pool every slot's
    # 8 pages + the null page; the local pool every slot's window and call (8 + 8 - 1
    # positions touch at most 3 pages) + one slot at full length (8) + the null page
    # (rljax.engine.pools).
    assert smp["kv_pages_per_shard"] == [4 * 8 + 1, 4 * 3 + 8 + 1]
    # A pool [L, K, P, Z, H] f32, K and V, split over tensor=2 (kv heads) and data=2 (pages).
    page = 2 * 2 * 8 * 16 * 4 // 2  # K and V of one page of one layer on one device
    assert smp["kv_pool_global"] == 1 * 33 * page
    assert smp["kv_pool_local"] == 2 * 21 * page
    assert smp["kv_pool"] == smp["kv_pool_global"] + smp["kv_pool_local"]
    # Without the window all three layers would sit in the global pool at full length.
    assert smp["kv_pool_windowless"] == 3 * 33 * page
    assert smp["kv_window_saving"] == smp["kv_pool_windowless"] - smp["kv_pool"] == 2 * 12 * page
    assert smp["peak"] >= smp["weights"] + smp["kv_pool"]
    assert "local layers" in lines[6] and "the window saves" in lines[6]


def test_a_model_without_windows_saves_nothing(fitting):
    code, lines, _ = fitting
    smp = json.loads(lines[-1])["sampler"]
    assert smp["kv_pool_local"] == smp["kv_window_saving"] == 0
    assert smp["kv_pool_windowless"] == smp["kv_pool"] == smp["kv_pool_global"]
    assert len(smp["kv_pages_per_shard"]) == 1 and "the window saves" not in "\n".join(lines)


@pytest.mark.parametrize(
    "name, variant, preset, chip, lora",
    [
        ("gemma3_12b_gsm8k", "v5e8_lora", "gemma3-12b", "tpu-v5e", True),
        ("gemma3_27b_gsm8k", "v5p16", "gemma3-27b", "tpu-v5p", False),
    ],
)
def test_gemma_recipes_decode_past_the_window(name, variant, preset, chip, lora):
    """The Gemma recipes' shape, without compiling them (a plan of the 12B takes ~1.5 min;
    their figures are in their docstrings and docs/benchmarks.md): the published model, slots
    twice the local window long, so the plan's local pool is smaller than full length."""
    from rljax.models.families import model_config

    spec = importlib.util.spec_from_file_location(name, REPO / "configs" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    cfg = module.recipe(variant)
    assert module.TARGETS[variant] == (chip, 8)
    dtype = cfg.model.param_dtype
    assert cfg.model == model_config(preset, dtype=cfg.model.dtype, param_dtype=dtype)
    assert cfg.lora.enabled == lora and cfg.mesh.mode == "colocated"
    assert not lora or cfg.lora.dtype == "float32"  # f32 adapters on the bf16 base
    assert cfg.tokenizer == "init" and cfg.data.prompt_format == "chat"
    assert cfg.sampling.dtype == "bfloat16"
    window, slot = cfg.model.sliding_window, cfg.sampling.max_seq_len
    assert slot == 2 * window == 2048 and cfg.sampling.num_local_pages == 0


@pytest.mark.slow
@pytest.mark.parametrize("variant", ["v5p16"])
def test_qwen3_30b_a3b_recipes_fit(planner, variant):
    """configs/qwen3_30b_a3b_gsm8k.py's full fine-tune fits its chips (about a minute). The
    LoRA variant (v6e8_lora) is planned by the same code; its figures are in docs/benchmarks.md
    with the command, and it left CI for time (the tiny LoRA plans above check LoRA's terms)."""
    config = REPO / "configs" / "qwen3_30b_a3b_gsm8k.py"
    argv = [f"--config={config}:{variant}", "--kernel_impl=pallas", "--no_sampler_hoist"]
    code, lines, err = _run(planner, argv)
    result = json.loads(lines[-1])
    assert code == 0 and err == "" and result["fits"] and result["colocated"]
    assert result["params"]["total"] == 30_532_122_624
    assert result["params"]["active"] == 3_353_032_704
    # The learner holds its share of every expert: 30.5B f32 weights over 8 chips, and more.
    assert result["learner"]["params"] >= 4 * 30_532_122_624 / 8
