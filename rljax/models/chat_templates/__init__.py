"""Chat templates rljax ships, byte for byte as their models publish them.

A model directory brings its own template (``tokenizer_config.json`` or
``chat_template.jinja``, read by :meth:`rljax.models.tokenizer.Tokenizer.from_dir`); these are
for a tokenizer that has none or a different one, and for the tests that check rljax renders
them as transformers does.

``gemma3.jinja``
  The ``chat_template`` of Google's Gemma 3 instruction-tuned checkpoints
  (``google/gemma-3-{1b,4b,12b,27b}-it``, ``tokenizer_config.json``). No model hub is
  reachable from here: the text was taken from two independent copies of that field, the
  Hugging Face hub's metadata of ``ggml-org/gemma-3-1b-it-GGUF`` and of
  ``ggml-org/gemma-3-12b-it-GGUF`` (``gguf.chat_template``, both converted from Google's
  checkpoints), and a debugger dump of the template llama.cpp read from a Gemma 3 GGUF; all
  three agree character for character (sha256 ``7de1c58e...``). Gemma has no system role: a
  system message is folded into the first user turn (its text, a blank line, then the
  user's), and the roles after it must alternate user/assistant, so a tool's result comes back
  as a user turn (:func:`rljax.envs.tool_calls.tool_results`). The assistant's role is written
  ``model``; every message's text is trimmed of surrounding whitespace.
"""

from __future__ import annotations

import importlib.resources

# name -> file in this package.
TEMPLATES = {"gemma3": "gemma3.jinja"}


def chat_template(name: str) -> str:
    """The text of the shipped template ``name`` (one of :data:`TEMPLATES`)."""
    if name not in TEMPLATES:
        raise ValueError(
            f"rljax ships no chat template {name!r}; use one of {sorted(TEMPLATES)}, or the "
            "template of the model's own tokenizer_config.json"
        )
    files = importlib.resources.files(__package__)
    return files.joinpath(TEMPLATES[name]).read_text(encoding="utf-8")
