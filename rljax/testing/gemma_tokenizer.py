"""A small, offline tokenizer laid out as Gemma's, carrying Gemma 3's chat template.

For tests and research code that need Gemma's chat format without the real tokenizer (no model
hub is reachable from the CPU runners): :func:`write_gemma_style_tokenizer` writes a Hugging
Face tokenizer directory that both :meth:`rljax.models.tokenizer.Tokenizer.from_dir` and
transformers' ``AutoTokenizer.from_pretrained`` load.

What it shares with Gemma's own: the special tokens ``<pad>`` (0), ``<eos>`` (1), ``<bos>`` (2),
``<unk>`` (3), ``<start_of_turn>`` and ``<end_of_turn>``; a BPE model with byte fallback, so any
text encodes (characters outside the small vocabulary become their UTF-8 bytes); spaces
written ``▁``; ``<eos>`` as the config's eos_token and ``<end_of_turn>`` as a second stop id
(``generation_config.json``), as Gemma 3's checkpoints have them; and the chat template,
:func:`rljax.models.chat_templates.chat_template` ``('gemma3')``. What it does not share: the
vocabulary (a few hundred ids, not 262k) and so the ids of the turn markers.
"""

from __future__ import annotations

import json
import os

import tokenizers
from tokenizers import decoders, models, normalizers

from rljax.models.chat_templates import chat_template

SPECIAL_TOKENS = ("<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>")
# A few merges, so that words are several characters a token as in a real BPE ("▁" is a space).
_MERGES = (
    ("▁", "t"),
    ("h", "e"),
    ("▁t", "he"),
    ("e", "r"),
    ("u", "s"),
    ("us", "er"),
    ("m", "o"),
    ("d", "e"),
    ("mo", "de"),
    ("mode", "l"),
    ("`", "`"),
    ("``", "`"),
    ("t", "o"),
    ("to", "o"),
    ("too", "l"),
    ("\n", "\n"),
)


def _tokenizer() -> tokenizers.Tokenizer:
    vocab = {token: i for i, token in enumerate(SPECIAL_TOKENS)}
    for byte in range(256):
        vocab[f"<0x{byte:02X}>"] = len(vocab)
    for char in "▁\n" + "".join(chr(c) for c in range(33, 127)):
        vocab.setdefault(char, len(vocab))
    for left, right in _MERGES:
        vocab.setdefault(left + right, len(vocab))
    bpe = models.BPE(vocab=vocab, merges=list(_MERGES), unk_token="<unk>", byte_fallback=True)
    tok = tokenizers.Tokenizer(bpe)
    tok.normalizer = normalizers.Replace(" ", "▁")
    tok.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()]
    )
    tok.add_special_tokens(
        [tokenizers.AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS]
    )
    return tok


def write_gemma_style_tokenizer(path: str | os.PathLike) -> str:
    """Writes the tokenizer directory (``tokenizer.json``, ``tokenizer_config.json`` with
    Gemma 3's chat template, ``generation_config.json``) at ``path``; returns ``path``."""
    os.makedirs(path, exist_ok=True)
    tok = _tokenizer()
    tok.save(os.path.join(path, "tokenizer.json"))
    config = {
        "tokenizer_class": "GemmaTokenizer",
        "bos_token": "<bos>",
        "eos_token": "<eos>",
        "pad_token": "<pad>",
        "unk_token": "<unk>",
        "chat_template": chat_template("gemma3"),
    }
    with open(os.path.join(path, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f, ensure_ascii=False, indent=2)
    stop_ids = [tok.token_to_id("<eos>"), tok.token_to_id("<end_of_turn>")]
    with open(os.path.join(path, "generation_config.json"), "w", encoding="utf-8") as f:
        json.dump({"eos_token_id": stop_ids}, f)
    return os.fspath(path)
