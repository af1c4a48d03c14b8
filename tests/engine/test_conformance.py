"""rljax.Engine conforms to JetStream's final engine_api: driven as its orchestrator drives it.

JetStream's reference files (engine_api.py, tokenizer_api.py, orchestrator.py) sit in
``shared/reference/jetstream`` next to or inside the checkout (or ``$RLJAX_JETSTREAM_REF``):
their signatures are read with ``ast`` (importing them needs TensorFlow), and the orchestrator
drives the engine when its imports are available.
"""

import ast
import inspect
import os
import pathlib
import sys

import jax
import numpy as np
import pytest

from rljax.engine.engine import Engine, ResultTokens
from rljax.engine.tokenizer import EngineTokenizer
from rljax.models.tokenizer import Tokenizer
from rljax.testing.engines import TinyEngine, tiny_engine
from tests.engine.jetstream_harness import Harness, Request

ROOT = pathlib.Path(__file__).resolve().parents[2]
_CANDIDATES = [
    os.environ.get("RLJAX_JETSTREAM_REF", ""),
    ROOT / "shared" / "reference" / "jetstream",
    ROOT.parent / "shared" / "reference" / "jetstream",
]
JETSTREAM = next((pathlib.Path(p) for p in _CANDIDATES if p and pathlib.Path(p).is_dir()), None)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A greedy tiny engine whose tokenizer is the char tokenizer saved to a directory."""
    path = tmp_path_factory.mktemp("tok")
    Tokenizer.char_level().save(path)
    base = tiny_engine(temperature=0.0)
    e = base.engine
    eng = Engine(e.model_cfg, e.sampling_cfg, e.mesh, base.graphdef, tokenizer=path)
    return TinyEngine(eng.native, base.graphdef, eng.load_params(base.state), base.state, eng)


def _check_greedy(tiny, requests):
    tok = tiny.jetstream.build_tokenizer(tiny.jetstream.get_tokenizer())
    for r in requests:
        for tokens, text in zip(r.samples, r.texts, strict=True):
            assert 1 <= len(tokens) <= r.max_tokens
            assert tokens == tiny.greedy_reference(r.prompt_ids, len(tokens))
            stopped = tokens[-1] in tok.stop_tokens
            assert stopped or len(tokens) == r.max_tokens
            assert text == "".join(tok.decode([t]) for t in tokens)


@pytest.mark.parametrize("multi_sampling", [False, True])
def test_orchestrator_style_threads_decode_like_full_recompute(tiny, multi_sampling):
    """prefill thread -> transfer -> insert -> generate thread -> detokenize; 10 requests on
    4 slots, so slots are reused through free_resource."""
    eng = tiny.jetstream
    texts = ["12+7=", "3*4=", "9-5=", "1+1=", "77-8=", "6*6=", "0+0=", "45+5=", "8*9=", "2-2="]
    requests = [
        Request(t, max_tokens=3 + i % 9, num_samples=1 + (i % 3 if multi_sampling else 0))
        for i, t in enumerate(texts)
    ]
    harness = Harness(eng, tiny.params, multi_sampling=multi_sampling)
    _check_greedy(tiny, harness.run(requests))
    assert max(harness.inserts.values()) >= 2  # freed slots were reused
    assert (
        eng.native.pages.free_pages == eng.native.num_pages - eng.native.kv_shards
    )  # every page came back
    assert not eng.native.pages.active.any()


def _import_orchestrator():
    if JETSTREAM is None:
        pytest.skip("JetStream's reference files are not in shared/reference/jetstream")
    sys.path.insert(0, str(JETSTREAM))
    try:
        from jetstream.core import orchestrator
        from jetstream.core.utils import async_multifuture
    except ImportError as e:
        pytest.skip(
            f"JetStream's orchestrator cannot be imported here ({e}): it needs seqio "
            "(TensorFlow), shortuuid and jetstream.external_tokenizers, which are not installed"
        )
    finally:
        sys.path.remove(str(JETSTREAM))
    return orchestrator, async_multifuture


@pytest.mark.parametrize("multi_sampling", [False, True])
def test_jetstream_orchestrator_drives_the_engine(tiny, multi_sampling):
    """JetStream's own Driver, unchanged, with rljax.Engine as prefill and generate engine."""
    import asyncio

    orchestrator, async_multifuture = _import_orchestrator()
    eng = tiny.jetstream
    texts = ["12+7=", "3*4=", "9-5=", "1+1=", "77-8=", "6*6="]
    driver = orchestrator.Driver(
        prefill_engines=[eng],
        generate_engines=[eng],
        prefill_params=[tiny.params],
        generate_params=[tiny.params],
        multi_sampling=multi_sampling,
    )

    async def decode_all():
        active = []
        for i, text in enumerate(texts):
            req = orchestrator.ActiveRequest(
                max_tokens=4 + i,
                return_channel=async_multifuture.AsyncMultifuture(),
                prefill_content=text,
                num_samples=2 if multi_sampling else 1,
            )
            driver.place_request_on_prefill_queue(req)
            active.append(req)
        out = []
        for req in active:
            samples = [[] for _ in range(req.num_samples)]
            async for step in req.return_channel:
                for i, s in enumerate(step):
                    samples[i].extend(s.token_ids)
            out.append(samples)
        return out

    # The loop outlives the driver: its threads post to the channels until they stop.
    loop = asyncio.new_event_loop()
    try:
        results = loop.run_until_complete(decode_all())
    finally:
        driver.stop()
        loop.close()
    tok = eng.build_tokenizer(eng.get_tokenizer())
    for i, (text, samples) in enumerate(zip(texts, results, strict=True)):
        prompt, n = tok.encode(text, jax_padding=False)
        prompt = [int(t) for t in prompt[:n]]
        for tokens in samples:
            assert 1 <= len(tokens) <= 4 + i
            assert tokens == tiny.greedy_reference(prompt, len(tokens))
    assert eng.native.pages.free_pages == eng.native.num_pages - eng.native.kv_shards


# -- the API's shape, read from JetStream's own files -------------------------------------


def _api_methods(filename: str, cls: str) -> dict[str, ast.FunctionDef]:
    if JETSTREAM is None:
        pytest.skip("JetStream's reference files are not in shared/reference/jetstream")
    tree = ast.parse((JETSTREAM / "jetstream" / "engine" / filename).read_text())
    (node,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls]
    return {f.name: f for f in node.body if isinstance(f, ast.FunctionDef)}


def _check_signature(ours, theirs: ast.FunctionDef):
    """Every JetStream parameter exists with its kind; any extra one of ours is optional."""
    params = inspect.signature(ours).parameters
    a = theirs.args
    for arg in a.args[1:] + a.posonlyargs:
        assert arg.arg in params, f"{theirs.name} lacks {arg.arg}"
        assert params[arg.arg].kind in (params[arg.arg].POSITIONAL_OR_KEYWORD,), arg.arg
    for arg in a.kwonlyargs:
        assert arg.arg in params, f"{theirs.name} lacks keyword {arg.arg}"
    if a.vararg:
        assert any(p.kind == p.VAR_POSITIONAL for p in params.values()) or theirs.name in (
            "load_params",
            "init_decode_state",
        )
    named = {x.arg for x in a.args + a.kwonlyargs}
    for name, p in params.items():
        if name not in named and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            assert p.default is not p.empty, f"{theirs.name}: extra {name} needs a default"


def test_every_engine_api_member_exists_with_jetstream_signature(tiny):
    eng = tiny.jetstream
    for name, fn in _api_methods("engine_api.py", "Engine").items():
        member = inspect.getattr_static(Engine, name)
        if isinstance(member, property):
            getattr(eng, name)  # readable
            continue
        _check_signature(getattr(eng, name), fn)


def test_result_tokens_and_tokenizer_have_jetstream_members(tiny):
    for name in _api_methods("engine_api.py", "ResultTokens"):
        assert callable(getattr(ResultTokens, name)), name
    for name in ("data", "tokens_idx", "valid_idx", "length_idx", "samples_per_slot", "log_prob"):
        assert name in ResultTokens.__dataclass_fields__, name
    tok = tiny.jetstream.build_tokenizer(tiny.jetstream.get_tokenizer())
    for name, fn in _api_methods("tokenizer_api.py", "Tokenizer").items():
        if isinstance(inspect.getattr_static(EngineTokenizer, name), property):
            assert isinstance(getattr(tok, name), int | set), name
        else:
            _check_signature(getattr(tok, name), fn)
    padded, n = tok.encode("12+7=", is_bos=True, max_prefill_length=16, jax_padding=False)
    assert n == 6 and padded.shape == (8,) and padded[0] == tok.bos_id
    assert tok.decode(padded[1:n]) == "12+7="


def test_prefill_multisampling_draws_each_first_token_from_its_own_key():
    """Sample i of a multisampling prefill, bulk-inserted into any slot, decodes exactly as a
    one-sample prefill with key i inserted alone."""
    tiny = tiny_engine(temperature=1.0)
    eng, prompt = tiny.jetstream, np.array([1, 4, 6, 2, 3], np.int32)
    keys = jax.random.split(jax.random.key(3), 4)
    args = dict(params=tiny.params, padded_tokens=prompt, true_length=5)
    prefix, first = eng.prefill_multisampling(**args, rng=keys, num_samples=4)
    first = first.convert_to_numpy()
    assert first.samples_per_slot == 4 and first.get_result_at_slot(0).tokens.shape == (4, 1)
    slots = [3, 0, 2, 1]
    state = eng.bulk_insert(prefix, eng.init_decode_state(), slots)
    bulk = []
    for _ in range(3):
        state, step = eng.generate(tiny.params, state)
        bulk.append(step.convert_to_numpy().tokens[slots])
    bulk = np.stack(bulk, axis=1)  # [sample, step]
    for i in range(4):
        one_prefix, one = eng.prefill(**args, rng=keys[i])
        one = one.convert_to_numpy()
        assert one.tokens[0] == first.tokens[i]
        assert one.logprobs[0] == pytest.approx(first.logprobs[i], abs=1e-6)
        state = eng.insert(one_prefix, eng.init_decode_state(), 2)
        alone = []
        for _ in range(3):
            state, step = eng.generate(tiny.params, state)
            alone.append(step.convert_to_numpy().tokens[2])
        assert alone == bulk[i].tolist()
    assert len({tuple(row) for row in np.c_[first.tokens, bulk]}) > 1  # samples differ


def test_result_tokens_layout_host_copy_and_slot_reads():
    data = np.array([[5, 1, 2], [7, 0, 1]], np.int32)
    r = ResultTokens(jax.numpy.asarray(data), log_prob=jax.numpy.asarray([[-0.5], [-1.0]]))
    r.copy_to_host_async()
    host = r.convert_to_numpy()
    assert isinstance(host.data, np.ndarray) and isinstance(host.log_prob, np.ndarray)
    got = host.get_result_at_slot(1)
    assert got.tokens.tolist() == [[7]] and got.valid.tolist() == [[0]]
    assert got.lengths.tolist() == [1] and got.log_prob.tolist() == [[-1.0]]
    both = host.get_result_at_slots((1, 0))
    assert both.tokens[:, 0].tolist() == [7, 5] and both.lengths.tolist() == [1, 2]


def test_registers_with_jetstream_abcs_once_the_caller_imported_them(tiny, monkeypatch):
    """The orchestrator tells first tokens from steps with isinstance(x, ResultTokens)."""
    import abc
    import types

    api = types.ModuleType("jetstream.engine.engine_api")
    api.ResultTokens = type("ResultTokens", (abc.ABC,), {})
    api.Engine = type("Engine", (abc.ABC,), {})
    monkeypatch.setitem(sys.modules, "jetstream.engine.engine_api", api)
    eng = tiny.jetstream
    _, first = eng.prefill(params=tiny.params, padded_tokens=np.array([1, 2]), true_length=2)
    assert isinstance(first, api.ResultTokens) and isinstance(eng, api.Engine)


def test_insert_waits_for_a_free_resource_already_on_its_way(tiny):
    """JetStream's detokenize thread returns a slot to the free queue just before it calls
    free_resource(slot); an insert racing it waits for that free instead of failing."""
    import threading

    eng = tiny.jetstream
    state = eng.init_decode_state()
    prefix, _ = eng.prefill(params=tiny.params, padded_tokens=np.arange(1, 6), true_length=5)
    state = eng.insert(prefix, state, 1)
    free = eng.native.pages.free_pages
    waiting = threading.Event()

    class Announcing(threading.Condition):
        def wait_for(self, predicate, timeout=None):
            waiting.set()  # insert found slot 1 busy and is about to wait
            return super().wait_for(predicate, timeout=None)

    eng.native._freed = Announcing(eng.native._lock)
    freer = threading.Thread(target=lambda: (waiting.wait(), eng.free_resource(1)))
    freer.start()
    try:
        state = eng.insert(prefix, state, 1)
    finally:
        freer.join()
        eng.native._freed = threading.Condition(eng.native._lock)
    assert eng.native.pages.free_pages == free and eng.native.pages.active[1]
    eng.free_resource(1)


def _argmin(logits):
    return logits.argmin(axis=-1)


def test_a_callers_sampler_picks_the_tokens_and_log_probs_follow_it(tiny):
    """JetStream's optional ``sampler``: logits [rows, V] -> tokens; log_prob is the model's."""
    eng, prompt = tiny.jetstream, [3, 1, 4, 1, 5]
    args = dict(params=tiny.params, padded_tokens=np.array(prompt), true_length=5)
    prefix, first = eng.prefill(**args, sampler=_argmin)
    state = eng.insert(prefix, eng.init_decode_state(), 0)
    rows = [first.convert_to_numpy()]
    for _ in range(2):
        state, result = eng.generate(tiny.params, state, sampler=_argmin)
        rows.append(result.convert_to_numpy())
    seq = list(prompt)
    for r in rows:
        z = tiny.next_logits(seq).astype(np.float64)
        token = int(np.argmin(z))
        assert r.tokens[0] == token
        want = z[token] - z.max() - np.log(np.sum(np.exp(z - z.max())))
        assert r.logprobs[0] == pytest.approx(want, abs=1e-3)
        seq.append(token)
    eng.free_resource(0)


def test_load_params_with_no_params_reads_the_engines_checkpoint(tiny, tmp_path):
    """JetStream's server calls load_params() bare: the engine reads its checkpoint."""
    import dataclasses

    from rljax.models.hf import save_hf

    e = tiny.engine
    save_hf(tmp_path, e.model_cfg, tiny.state, Tokenizer.char_level())

    def build(cfg, path):
        return Engine(cfg, e.sampling_cfg, e.mesh, tiny.graphdef, tokenizer=path, checkpoint=path)

    loaded = build(e.model_cfg, tmp_path).load_params()
    for a, b in zip(jax.tree.leaves(loaded), jax.tree.leaves(tiny.params), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
        assert a.sharding.is_equivalent_to(b.sharding, a.ndim)
    other = dataclasses.replace(e.model_cfg, num_layers=e.model_cfg.num_layers + 1)
    n = e.model_cfg.num_layers
    with pytest.raises(ValueError, match=rf"another model: num_layers={n} \(engine: {n + 1}\)"):
        build(other, tmp_path).load_params()
    with pytest.raises((FileNotFoundError, ValueError)) as err:
        build(e.model_cfg, tmp_path / "missing").load_params()
    assert "missing" in str(err.value) and "\n" not in str(err.value)
