"""Bad input to the JetStream API: one-line errors, and no page leaked (free pages counted)."""

import numpy as np
import pytest

from rljax.engine.engine import Engine
from rljax.engine.pages import OutOfPages
from rljax.models.tokenizer import Tokenizer
from rljax.testing.engines import tiny_engine


@pytest.fixture(scope="module")
def tiny():
    return tiny_engine(temperature=0.0)


@pytest.fixture
def armed(tiny):
    """A fresh decode state with slot 1 busy (a 5-token prompt), and the free page count."""
    eng = tiny.jetstream
    state = eng.init_decode_state()
    prefix, _ = eng.prefill(params=tiny.params, padded_tokens=np.arange(1, 6), true_length=5)
    state = eng.insert(prefix, state, 1)
    return eng, state, prefix, eng.native.pages.free_pages


def _raises(exc, match, fn, *args, **kwargs):
    with pytest.raises(exc, match=match) as e:
        fn(*args, **kwargs)
    assert "\n" not in str(e.value)


def test_inserting_into_a_busy_slot(armed):
    eng, state, prefix, free = armed
    _raises(ValueError, r"slot 1 is busy; free_resource\(1\)", eng.insert, prefix, state, 1)
    assert eng.native.pages.free_pages == free
    _raises(ValueError, r"slot 1 is busy", eng.bulk_insert, prefix, state, [0, 1])
    assert (
        eng.native.pages.free_pages == free and not eng.native.pages.active[0]
    )  # slot 0 took nothing either
    eng.free_resource(1)
    state = eng.insert(prefix, state, 1)  # freed: the slot takes a prefix again
    assert eng.native.pages.free_pages == free


@pytest.mark.parametrize("slot", [4, -1, 99])
def test_a_slot_index_out_of_range(armed, slot):
    eng, state, prefix, free = armed
    _raises(ValueError, rf"slot {slot} is out of range \[0, 4\)", eng.insert, prefix, state, slot)
    _raises(ValueError, rf"slot {slot} is out of range \[0, 4\)", eng.free_resource, slot)
    assert eng.native.pages.free_pages == free


def test_a_prompt_longer_than_the_largest_bucket(armed, tiny):
    eng, _, _, free = armed
    n = eng.native.buckets[-1] + 1
    _raises(
        ValueError,
        rf"sequence of {n} tokens exceeds the largest prefill bucket {n - 1}",
        eng.prefill,
        params=tiny.params,
        padded_tokens=np.ones(n, np.int32),
        true_length=n,
    )
    _raises(
        ValueError,
        r"true_length=9 must be in \[1, 8\]",
        eng.prefill,
        params=tiny.params,
        padded_tokens=np.ones(8, np.int32),
        true_length=9,
    )
    assert eng.native.pages.free_pages == free


def test_stepping_a_finished_slot_reports_invalid_and_takes_no_page(armed, tiny):
    """A slot at max_seq_len is finished: generate marks it invalid (JetStream's orchestrator
    steps it until its detokenize thread frees it) and takes no page for it."""
    eng, state, _, _ = armed
    for _ in range(eng.native.max_seq_len - 5):  # 5 cached: fill slot 1 to max_seq_len
        state, result = eng.generate(tiny.params, state)
    assert eng.native.slot_length(1) == eng.native.max_seq_len
    free = eng.native.pages.free_pages
    state, result = eng.generate(tiny.params, state)
    assert not result.convert_to_numpy().valid[1]
    assert (
        eng.native.pages.free_pages == free and eng.native.slot_length(1) == eng.native.max_seq_len
    )
    eng.free_resource(1)
    assert eng.native.pages.free_pages == eng.native.num_pages - 1


def test_prefix_and_slot_count_mismatch(armed, tiny):
    eng, state, _, free = armed
    two, _ = eng.prefill_multisampling(
        params=tiny.params, padded_tokens=np.arange(1, 4), true_length=3, num_samples=2
    )
    _raises(ValueError, "insert takes a one-sample prefix, got 2", eng.insert, two, state, 0)
    _raises(ValueError, "prefix of 2 samples for slots", eng.bulk_insert, two, state, [0, 2, 3])
    _raises(ValueError, "repeat a slot", eng.bulk_insert, two, state, [0, 0])
    _raises(
        ValueError,
        "existing_prefix is not supported",
        eng.prefill,
        params=tiny.params,
        existing_prefix=object(),
        padded_tokens=np.arange(1, 4),
        true_length=3,
    )
    assert eng.native.pages.free_pages == free


def test_out_of_pages_on_insert_takes_nothing():
    tiny = tiny_engine(num_pages=3, max_concurrent_decodes=2)
    eng = tiny.jetstream
    state = eng.init_decode_state()
    prefix, _ = eng.prefill(params=tiny.params, padded_tokens=np.arange(1, 13), true_length=12)
    free = eng.native.pages.free_pages
    with pytest.raises(OutOfPages):
        eng.insert(prefix, state, 0)
    assert eng.native.pages.free_pages == free and not eng.native.pages.active.any()


def test_tokenizer_files_missing(tiny, tmp_path):
    e = tiny.engine
    build = lambda tok: Engine(e.model_cfg, e.sampling_cfg, e.mesh, tiny.graphdef, tokenizer=tok)  # noqa: E731
    _raises(
        ValueError,
        r"no tokenizer; build it with Engine\(..., tokenizer=PATH\)",
        tiny.jetstream.get_tokenizer,
    )
    missing = build(tmp_path / "nowhere")
    _raises(
        FileNotFoundError,
        "nowhere has no tokenizer.json",
        missing.build_tokenizer,
        missing.get_tokenizer(),
    )
    _raises(
        FileNotFoundError,
        r"model.gguf does not exist",
        build(tmp_path / "model.gguf").build_tokenizer,
        build(tmp_path / "model.gguf").get_tokenizer(),
    )
    Tokenizer.char_level().save(tmp_path / "tok")
    (tmp_path / "tok" / "tokenizer_config.json").unlink()
    _raises(
        FileNotFoundError,
        "tokenizer_config.json does not exist",
        build(tmp_path / "tok").build_tokenizer,
        build(tmp_path / "tok").get_tokenizer(),
    )


def test_load_params_needs_params(tiny):
    _raises(ValueError, r"load_params\(\) needs the params to serve", tiny.jetstream.load_params)
