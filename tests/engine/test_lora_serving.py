"""An engine serves base plus LoRA adapters merged (folded in at the swap) or unmerged (the
low-rank product every step), in both weights layouts: the same tokens and log-probs, equal
to a full forward pass of the adapted model."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from rljax.config import LoRAConfig, SamplingConfig
from rljax.engine.paged import PagedEngine
from rljax.engine.sampler import Request, Sampler
from rljax.engine.weights import lora_merged
from rljax.models.sharding import SAMPLER_RULES, make_mesh
from rljax.models.transformer import init_sharded, with_adapters
from rljax.testing.configs import TINY_MODEL

LORA = LoRAConfig(enabled=True, rank=4, alpha=16.0)
SAMPLING = dict(max_new_tokens=10, max_prefill_length=16, max_concurrent_decodes=4, page_size=4)


def _adapted(mesh):
    """Params with random (non-zero) adapters, so they change what is sampled."""
    _, base = init_sharded(TINY_MODEL, mesh, SAMPLER_RULES, 0)
    graphdef, params = with_adapters(TINY_MODEL, base, LORA, mesh, SAMPLER_RULES, 0)
    model = nnx.merge(graphdef, params)
    for i, name in enumerate(n for n in vars(model) if n.endswith("_lora_b")):
        var = getattr(model, name)
        var[...] = 0.3 * jax.random.normal(jax.random.key(i), var.shape)
    return graphdef, base, nnx.state(model)


def _sample(graphdef, params, mesh, layout, serving, requests):
    cfg = SamplingConfig(**SAMPLING, weights_layout=layout)
    lora = LoRAConfig(**{**vars(LORA), "serving": serving})
    engine = PagedEngine(TINY_MODEL, cfg, mesh, graphdef, lora=lora)
    assert lora_merged(lora, mesh) == (serving == "merged")
    return Sampler(engine, engine.load_params(params)).run(requests)


@pytest.mark.parametrize("layout", ["per_layer", "stacked"])
def test_merged_and_unmerged_serving_sample_the_same(layout):
    mesh = make_mesh(jax.devices()[:1], {"data": 1, "tensor": 1})
    graphdef, base, params = _adapted(mesh)
    requests = [Request([1, 4, 6, 2, 3], num_samples=2, seed=1), Request([5, 9], seed=2)]
    merged = _sample(graphdef, params, mesh, layout, "merged", requests)
    unmerged = _sample(graphdef, params, mesh, layout, "unmerged", requests)
    assert [t.response_tokens for t in merged] == [t.response_tokens for t in unmerged]
    for a, b in zip(merged, unmerged, strict=True):
        np.testing.assert_allclose(a.logprobs, b.logprobs, atol=2e-5)
    # The adapters matter: the base samples something else.
    plain = LoRAConfig(**{**vars(LORA), "enabled": False})
    cfg = SamplingConfig(**SAMPLING, weights_layout=layout)
    base_graphdef = init_sharded(TINY_MODEL, mesh, SAMPLER_RULES, 0)[0]
    engine = PagedEngine(TINY_MODEL, cfg, mesh, base_graphdef, lora=plain)
    from_base = Sampler(engine, engine.load_params(base)).run(requests)
    assert [t.response_tokens for t in from_base] != [t.response_tokens for t in merged]
    # And the sampled log-probs are the adapted model's, by a full forward pass.
    model = nnx.merge(graphdef, params)
    t = merged[0]
    seq = jnp.asarray([t.prompt_tokens + t.response_tokens])
    n = seq.shape[1]
    hidden = model(seq, jnp.arange(n)[None], jnp.ones((1, n), jnp.int32))
    logp = jax.nn.log_softmax(model.logits(hidden)[0], axis=-1)
    p = len(t.prompt_tokens)
    want = [float(logp[p - 1 + i, tok]) for i, tok in enumerate(t.response_tokens)]
    np.testing.assert_allclose(t.logprobs, want, atol=1e-4)


def test_auto_merges_on_cpu_only():
    mesh = make_mesh(jax.devices()[:1], {"data": 1, "tensor": 1})
    assert lora_merged(LORA, mesh)
    assert not lora_merged(LoRAConfig(**{**vars(LORA), "enabled": False}), mesh)
    assert not lora_merged(None, mesh)
