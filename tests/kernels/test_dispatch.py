"""Tests for impl resolution, chip lookup and the BlockSizes of every kernel op."""

import dataclasses

import pytest
from rljax.kernels import dispatch
from rljax.kernels.flash_attention import block_sizes as flash_bs
from rljax.kernels.fused_logprobs import block_sizes as logprobs_bs
from rljax.kernels.paged_attention import block_sizes as paged_bs

ALL_BLOCK_SIZES = (paged_bs, flash_bs, logprobs_bs)


def test_auto_is_xla_off_tpu_and_pallas_interprets():
    assert dispatch.resolve_impl("auto") == dispatch.Backend(use_pallas=False)
    assert dispatch.resolve_impl("xla") == dispatch.Backend(use_pallas=False)
    backend = dispatch.resolve_impl("pallas")
    assert backend.use_pallas
    # Off TPU the kernel must run in the TPU interpreter, never be compiled.
    assert backend.interpret is not False


def test_unknown_impl_names_the_choices():
    with pytest.raises(ValueError, match=r"impl must be one of .*'pallas'.*got 'triton'"):
        dispatch.resolve_impl("triton")


@pytest.mark.parametrize(
    "kind, generation",
    [
        ("TPU v4", "v4"),
        ("TPU v5 lite", "v5e"),
        ("TPU v5e", "v5e"),
        ("TPU v5", "v5p"),
        ("TPU v5p", "v5p"),
        ("TPU v6 lite", "v6e"),
        ("cpu", None),
        ("NVIDIA H100", None),
    ],
)
def test_tpu_generation(kind, generation):
    assert dispatch.tpu_generation(kind) == generation


@pytest.mark.parametrize("module", ALL_BLOCK_SIZES)
def test_tuning_tables_cover_every_generation(module):
    assert set(module.TUNING_TABLE) == {"v4", "v5e", "v5p", "v6e"}
    assert module.for_device("TPU v5 lite") == module.TUNING_TABLE["v5e"]
    assert module.for_device("cpu") == module.DEFAULT
    assert module.for_device() == module.DEFAULT  # The test machine is a CPU.


@pytest.mark.parametrize("module", ALL_BLOCK_SIZES)
def test_block_sizes_are_frozen_and_self_checking(module):
    sizes = module.DEFAULT
    field = dataclasses.fields(sizes)[0].name
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(sizes, field, 8)
    with pytest.raises(ValueError, match=f"BlockSizes.{field} must be a positive int, got 0"):
        module.BlockSizes(**{field: 0})
    with pytest.raises(ValueError, match=f"BlockSizes.{field} must be a positive int"):
        module.BlockSizes(**{field: 2.0})


@pytest.mark.parametrize(
    "module, field",
    [(flash_bs, "block_q"), (flash_bs, "block_kv"), (flash_bs, "block_kv_bwd")]
    + [(logprobs_bs, "block_t")],
)
def test_tiled_block_sizes_must_fit_tpu_sublanes(module, field):
    with pytest.raises(ValueError, match=f"{field} must be a multiple of 8 for TPU tiling, got 12"):
        module.BlockSizes(**{field: 12})


def test_clamping_to_small_shapes():
    assert paged_bs.BlockSizes(8).for_pages_per_seq(3).pages_per_block == 3
    # A short sequence is one tile, padded to 8 rows only.
    assert flash_bs.BlockSizes(128, 256, 512).for_seq_len(20) == flash_bs.BlockSizes(24, 24, 24)
    # A vocabulary narrower than block_v is one tile of exactly V lanes (TPU: the whole dim).
    assert logprobs_bs.BlockSizes(256, 512).for_shape(5, 100) == logprobs_bs.BlockSizes(8, 100)
    assert logprobs_bs.BlockSizes(256, 512).for_shape(5, 18).block_v == 18


@pytest.mark.parametrize("sizes", [flash_bs.DEFAULT, *flash_bs.TUNING_TABLE.values()])
def test_flash_tiles_fit_tpu_lanes_and_pad_little(sizes):
    for t in [*range(1, 300), 513, 1000, 4095, 4096, 128 * 37]:
        fit = sizes.for_seq_len(t)
        padded = fit.padded_len(t)
        one_tile = fit.block_q == padded
        assert padded >= t and padded - t < (8 if one_tile else 128), (t, fit)
        for block in (fit.block_q, fit.block_kv, fit.block_kv_bwd):
            assert padded % block == 0 and block % 8 == 0
        for block in (fit.block_kv, fit.block_kv_bwd):  # key tiles sit on the lanes
            assert block % 128 == 0 or block == padded, (t, fit)


def test_flash_small_test_blocks_still_give_many_tiles():
    fit = flash_bs.BlockSizes(8, 16, 8).for_seq_len(20)
    assert fit == flash_bs.BlockSizes(8, 8, 8) and fit.padded_len(20) == 24


def test_logprob_token_tiles_are_balanced():
    assert logprobs_bs.BlockSizes(256, 512).for_shape(257, 50257).block_t == 136
    assert logprobs_bs.BlockSizes(256, 512).for_shape(1000, 50257).block_t == 256
    assert logprobs_bs.BlockSizes(256, 512).for_shape(1000, 50257).block_v == 512


def test_prologue_resolves_scale_and_block_sizes():
    assert dispatch.resolve_sm_scale(None, 64) == 0.125
    assert dispatch.resolve_sm_scale(2, 64) == 2.0
    with pytest.raises(ValueError, match="sm_scale must be a positive Python float, got 0"):
        dispatch.resolve_sm_scale(0, 64)
    tuned = lambda: flash_bs.DEFAULT
    assert dispatch.resolve_block_sizes("op", None, flash_bs.BlockSizes, tuned) is flash_bs.DEFAULT
    mine = flash_bs.BlockSizes(8, 8, 8)
    assert dispatch.resolve_block_sizes("op", mine, flash_bs.BlockSizes, tuned) is mine
    with pytest.raises(ValueError, match="block_sizes must be a op BlockSizes or None, got 4"):
        dispatch.resolve_block_sizes("op", 4, flash_bs.BlockSizes, tuned)
