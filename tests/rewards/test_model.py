"""The reward model scores as transformers' *ForSequenceClassification does, and is refused
when its checkpoint is not a one-label sequence classifier."""

from __future__ import annotations

import pickle

import jax
import numpy as np
import pytest

from rljax.config import DataConfig, RewardModelConfig
from rljax.data.tasks import encode_prompt
from rljax.models.classifier import load_classifier, save_classifier
from rljax.models.sharding import SAMPLER_RULES, make_mesh
from rljax.models.tokenizer import Tokenizer
from rljax.models.transformer import init_sharded
from rljax.rewards.model import RewardContext, RewardModel, build_model_reward
from rljax.testing.configs import TINY_MODEL

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

SIZES = dict(
    vocab_size=64,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=8,
    max_position_embeddings=64,
    num_labels=1,
    pad_token_id=0,
)
FAMILIES = {
    "llama": ("LlamaConfig", "LlamaForSequenceClassification"),
    "qwen2": ("Qwen2Config", "Qwen2ForSequenceClassification"),
    "qwen3": ("Qwen3Config", "Qwen3ForSequenceClassification"),
}
# Token ids 1..63: none is the pad id, so transformers' last non-pad token is the last token.
SEQUENCES = [
    [5, 9, 3, 7, 11, 2, 40],
    [17, 4],
    [8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 60],
    [33],
]


def hf_classifier(family: str, path, seed: int = 0):
    """A random transformers sequence classifier saved to ``path``, weights large enough that
    scores are O(1) and differ between sequences."""
    config_cls, model_cls = (getattr(transformers, n) for n in FAMILIES[family])
    torch.manual_seed(seed)
    model = model_cls(config_cls(**SIZES)).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
            else:
                p.copy_(0.3 * torch.randn_like(p))
    model.save_pretrained(path)
    return model


def hf_scores(model, sequences) -> np.ndarray:
    """transformers' scores of right-padded sequences (pad id 0, masked)."""
    t = max(len(s) for s in sequences)
    ids = torch.zeros((len(sequences), t), dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, s in enumerate(sequences):
        ids[i, : len(s)] = torch.tensor(s)
        mask[i, : len(s)] = 1
    with torch.no_grad():
        return model(input_ids=ids, attention_mask=mask).logits[:, 0].numpy()


def reward_model(path, batch_size: int = 4) -> RewardModel:
    mesh = make_mesh(jax.devices()[:1], {"data": 1, "tensor": 1})
    cfg, graphdef, params, score = load_classifier(path, mesh=mesh, rules=SAMPLER_RULES)
    return RewardModel(
        cfg, graphdef, params, score, mesh=mesh, batch_size=batch_size, max_length=32
    )


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_scores_equal_transformers(tmp_path, family):
    reference = hf_classifier(family, tmp_path)
    want = hf_scores(reference, SEQUENCES)
    # 3 rows a forward pass: two passes, the second padded with an empty row.
    got = reward_model(tmp_path, batch_size=3).score_tokens(SEQUENCES)
    assert np.ptp(want) > 0.1, "the scores barely differ: the test could not tell sequences apart"
    np.testing.assert_allclose(got, want, rtol=2e-4, atol=2e-5)
    # The score is the last token's: scoring one token fewer changes it.
    shorter = reward_model(tmp_path).score_tokens([SEQUENCES[0][:-1]])
    assert abs(float(shorter[0]) - float(want[0])) > 1e-3


def test_a_sequence_past_max_length_or_empty_is_refused(tmp_path):
    hf_classifier("llama", tmp_path)
    model = reward_model(tmp_path)
    assert model.buckets == (16, 32)
    with pytest.raises(ValueError, match="raise reward.model.max_length"):
        model.score_tokens([[1] * 33])
    with pytest.raises(ValueError, match="is empty"):
        model.score_tokens([[1], []])


def test_saved_classifier_loads_in_transformers_and_scores_prompt_plus_completion(tmp_path):
    """save_classifier writes what transformers reads; the 'model' reward scores the policy's
    prompt followed by the completion, with the policy's tokenizer."""
    mesh = make_mesh(jax.devices()[:1], {"data": 1, "tensor": 1})
    graphdef, params = init_sharded(TINY_MODEL, mesh, SAMPLER_RULES, 0)
    score = jax.random.normal(jax.random.key(1), (TINY_MODEL.hidden_size,))
    tokenizer = Tokenizer.char_level()
    save_classifier(tmp_path, TINY_MODEL, params, score, pad_token_id=tokenizer.pad_id)
    data = DataConfig(prompt_template="= {prompt}")
    context = RewardContext(tokenizer, data, max_seq_len=16)
    reward = build_model_reward(RewardModelConfig(path=str(tmp_path), batch_size=2), context)
    completions, examples = ["12", "7", "120"], [{"prompt": "5+7="}, {"prompt": "3+4="}] * 2
    got = np.asarray(reward(completions, examples[:3]))
    # A completion it cannot encode, or too long, fails alone.
    failed = reward(["12", "x", "1" * 20], examples[:3])
    assert failed[0] == pytest.approx(got[0], rel=1e-6)
    assert "not in the tokenizer alphabet" in str(failed[1])
    assert "raise reward.model.max_length" in str(failed[2])
    sequences = [
        encode_prompt(tokenizer, data, e) + tokenizer.encode(c)
        for c, e in zip(completions, examples)
    ]
    reference = transformers.AutoModelForSequenceClassification.from_pretrained(tmp_path)
    np.testing.assert_allclose(got, hf_scores(reference.eval(), sequences), rtol=2e-4, atol=2e-5)
    assert len(set(np.round(got, 4))) == 3
    with pytest.raises(TypeError, match="thread mode only"):
        pickle.dumps(reward)
