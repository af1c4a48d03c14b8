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


@pytest.mark.parametrize("module", (flash_bs, logprobs_bs))
def test_tiled_block_sizes_must_fit_tpu_sublanes(module):
    field = dataclasses.fields(module.DEFAULT)[0].name
    with pytest.raises(ValueError, match=f"{field} must be a multiple of 8 for TPU tiling, got 12"):
        module.BlockSizes(**{field: 12})


def test_clamping_to_small_shapes():
    assert paged_bs.BlockSizes(8).for_pages_per_seq(3).pages_per_block == 3
    assert flash_bs.BlockSizes(128, 256, 512).for_seq_len(20) == flash_bs.BlockSizes(24, 24, 24)
    assert logprobs_bs.BlockSizes(256, 512).for_shape(5, 100) == logprobs_bs.BlockSizes(8, 104)
