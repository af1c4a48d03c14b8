"""The learner's gradients against PyTorch's, at SmolLM2-135M's layer and vocabulary shapes.

A random two-layer model with SmolLM2's widths (576 wide, 9 query heads over 3 kv heads of 64,
an MLP of 1536, a tied 49,152-token vocabulary) and the same weights in transformers'
``LlamaForCausalLM``. Both take the gradient of one weighted sum of target log-probs over
packed rows (two sequences a row, each attending only to itself); every parameter's gradient
must agree to f32 rounding, for each layer-stack variant the learner has (scanned and
unrolled), on the XLA paths the CPU runs: flash attention's blocked path, the fused chunked
log-probs and the SwiGLU backward.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from rljax.kernels.flash_attention.block_sizes import for_device
from rljax.kernels.fused_logprobs import token_logprobs_and_entropy

from rljax.config import ModelConfig
from rljax.models.families import config_to_hf
from rljax.models.hf import hf_tensors
from rljax.models.presets import get_preset
from rljax.models.sharding import LEARNER_RULES, make_mesh
from rljax.models.transformer import init_sharded

torch = pytest.importorskip("torch", reason="the reference is transformers on torch")
transformers = pytest.importorskip("transformers")

# Each row: a sequence of 72 tokens, then one of 88 that crosses the attention's query-block
# boundary at 128 (a row no longer than a block would run one block, never the later ones).
ROWS, ROW_LEN, SPLIT = 2, 160, 72


@pytest.fixture(scope="module")
def model():
    preset = dict(get_preset("smollm2-135m"), num_layers=2)
    fields = {f.name for f in dataclasses.fields(ModelConfig)}
    cfg = ModelConfig(**{k: v for k, v in preset.items() if k in fields}, param_dtype="float32")
    mesh = make_mesh(jax.devices()[:1], {"fsdp": 1, "tensor": 1})
    graphdef, params = init_sharded(cfg, mesh, LEARNER_RULES, seed=0)
    # Norm weights away from 1, so a mis-mapped or mis-differentiated norm shows.
    rng = np.random.default_rng(1)
    params = jax.tree_util.tree_map_with_path(
        lambda path, x: (
            x + 0.2 * rng.standard_normal(x.shape).astype(np.float32)
            if str(path[0].key).endswith("norm")  # attn_norm, mlp_norm, final_norm
            else x
        ),
        params,
    )
    return cfg, graphdef, params


def packed_batch(vocab):
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, vocab, (ROWS, ROW_LEN))
    positions = np.concatenate([np.arange(SPLIT), np.arange(ROW_LEN - SPLIT)])[None].repeat(ROWS, 0)
    segments = np.where(np.arange(ROW_LEN) < SPLIT, 1, 2)[None].repeat(ROWS, 0)
    targets = rng.integers(0, vocab, (ROWS, ROW_LEN))
    weights = rng.standard_normal((ROWS, ROW_LEN)).astype(np.float32)
    return tokens, positions, segments, targets, weights


def rljax_grads(cfg, graphdef, params, batch, unroll):
    tokens, positions, segments, targets, weights = (jnp.asarray(a) for a in batch)

    def loss(p):
        m = nnx.merge(graphdef, p)
        hidden = m(tokens, positions, segments.astype(jnp.int32), impl="xla", unroll=unroll)
        flat = hidden.reshape(-1, cfg.hidden_size)
        logp, _ = token_logprobs_and_entropy(flat, m.unembed_dv, targets.reshape(-1), impl="xla")
        return jnp.sum(logp * weights.reshape(-1))

    return dict(hf_tensors(cfg, jax.jit(jax.grad(loss))(params)))


def torch_grads(cfg, params, batch):
    hf_cfg = transformers.LlamaConfig(**config_to_hf(cfg))
    hf_cfg._attn_implementation = "sdpa"
    model = transformers.LlamaForCausalLM(hf_cfg).to(torch.float32)
    state = {n: torch.from_numpy(np.array(a, np.float32)) for n, a in hf_tensors(cfg, params)}
    model.load_state_dict(state, strict=False)
    tokens, positions, segments, targets, weights = (torch.from_numpy(np.asarray(a)) for a in batch)
    causal = torch.tril(torch.ones(ROW_LEN, ROW_LEN, dtype=torch.bool))
    mask = ((segments[:, :, None] == segments[:, None, :]) & causal)[:, None]
    logits = model(input_ids=tokens, position_ids=positions, attention_mask=mask).logits
    logp = torch.log_softmax(logits.double(), -1).gather(-1, targets[..., None])[..., 0]
    torch.sum(logp * weights.double()).backward()
    return {n: p.grad.numpy() for n, p in model.named_parameters() if p.grad is not None}


@pytest.fixture(scope="module")
def reference(model):
    cfg, _, params = model
    batch = packed_batch(cfg.vocab_size)
    return batch, torch_grads(cfg, params, batch)


@pytest.mark.parametrize("unroll", [1, 0])  # the scanned stack (the default), unrolled
def test_every_gradient_matches_torch(model, reference, unroll):
    cfg, graphdef, params = model
    batch, theirs = reference
    assert SPLIT < for_device().block_q < ROW_LEN
    ours = rljax_grads(cfg, graphdef, params, batch, unroll)
    assert set(ours) == set(theirs)
    for name, want in theirs.items():
        scale = float(np.abs(want).max())
        np.testing.assert_allclose(ours[name], want, atol=2e-4 * scale, rtol=0, err_msg=name)
