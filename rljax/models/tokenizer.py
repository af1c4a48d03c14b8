"""Tokenizer: one interface over Hugging Face ``tokenizers`` for tiny and real models.

Three constructors build the same object:

* :meth:`Tokenizer.char_level` - one id per character, for synthetic tasks and tiny models;
* :meth:`Tokenizer.from_dir` - a Hugging Face model directory (``tokenizer.json`` +
  ``tokenizer_config.json``);
* :meth:`Tokenizer.from_gguf` - the tokenizer metadata embedded in a GGUF checkpoint.

Paths may be local or ``gs://`` URLs: every file is read and written through :mod:`rljax.io`.

Special tokens are never added implicitly: ``encode`` returns exactly the tokens of the text,
plus BOS only when asked. Chat templates already write their own BOS/turn markers, and a
second, implicit BOS silently shifts every position of a prompt.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence

import jinja2
import jinja2.sandbox
import tokenizers
from tokenizers import Regex, decoders, models, pre_tokenizers

from rljax import io

PAD, BOS, EOS = "<pad>", "<bos>", "<eos>"
DEFAULT_ALPHABET = "0123456789+-*= "
TOKENIZER_FILE = "tokenizer.json"
CONFIG_FILE = "tokenizer_config.json"
CHAT_TEMPLATE_FILE = "chat_template.jinja"
GENERATION_CONFIG_FILE = "generation_config.json"
# The char-level "chat" format is the users' text concatenated: synthetic tasks have no turns.
# Every message's content, back to back (no role markers: the char-level tasks' prompts are
# their user message; a conversation's turns follow it as the model and the env wrote them).
CHAR_LEVEL_CHAT_TEMPLATE = (
    "{% for message in messages %}{% if message['role'] != 'system' %}"
    "{{ message['content'] }}{% endif %}{% endfor %}"
)


def _raise_exception(message: str):
    raise jinja2.exceptions.TemplateError(message)


def _tojson(value, indent=None):
    # Jinja's built-in tojson HTML-escapes quotes, which would corrupt prompts.
    return json.dumps(value, ensure_ascii=False, indent=indent)


def _token_content(value) -> str | None:
    """tokenizer_config stores special tokens as strings or as serialised AddedToken dicts."""
    if isinstance(value, dict):
        return value.get("content")
    return value


def _one_line(exc: BaseException, limit: int = 200) -> str:
    """An exception's text on one line, cut short (tokenizers' and Jinja's run long)."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= limit else text[:limit] + "..."


def _read_json(path: io.PathLike) -> dict:
    try:
        data = json.loads(io.read_text(path))
    except FileNotFoundError:
        raise FileNotFoundError(
            f"Tokenizer file {path} does not exist; point at a Hugging Face model or tokenizer "
            "directory that has it."
        ) from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(
            f"Tokenizer file {path} is not valid JSON: {_one_line(exc)}; re-download or fix it."
        ) from None
    if not isinstance(data, dict):
        raise ValueError(
            f"Tokenizer file {path} must hold a JSON object, not {type(data).__name__}; "
            "re-download it."
        )
    return data


def _select_template(chat_template, source: str) -> str | None:
    """Picks the template from a string or a list of ``{"name", "template"}`` entries."""
    if chat_template is None or isinstance(chat_template, str):
        return chat_template
    if isinstance(chat_template, list):
        named = {t.get("name"): t.get("template") for t in chat_template if isinstance(t, dict)}
        if "default" in named:
            return named["default"]
        if named:
            return next(iter(named.values()))
    raise ValueError(
        f"chat_template in {source} must be a string or a list of "
        "{'name': ..., 'template': ...} entries."
    )


class Tokenizer:
    """Text <-> ids, special-token ids, and chat templating.

    Attributes:
      vocab_size: number of ids, added tokens included (largest id + 1).
      bos_id: beginning-of-sequence id, or None when the tokenizer has none.
      eos_id: end-of-sequence id.
      pad_id: padding id. Falls back to ``eos_id`` when the model defines no pad token
        (common for decoder-only models); padding is masked, so the id only has to be valid.
      stop_ids: ids that end generation: EOS plus any listed in ``generation_config.json``.
      chat_template: the Jinja chat template source, or None.
    """

    def __init__(
        self,
        hf_tokenizer: tokenizers.Tokenizer,
        *,
        eos_token: str,
        bos_token: str | None = None,
        pad_token: str | None = None,
        chat_template: str | None = None,
        extra_stop_ids: Sequence[int] = (),
        alphabet: str | None = None,
    ):
        self._tok = hf_tokenizer
        self._alphabet = None if alphabet is None else frozenset(alphabet)
        self._alphabet_str = alphabet
        self.bos_token = bos_token
        self.eos_token = eos_token
        self.pad_token = pad_token if pad_token is not None else eos_token
        self.bos_id = None if bos_token is None else self._require_id(bos_token, "bos_token")
        self.eos_id = self._require_id(eos_token, "eos_token")
        self.pad_id = self._require_id(self.pad_token, "pad_token")
        self.vocab_size = max(hf_tokenizer.get_vocab(with_added_tokens=True).values()) + 1
        for token_id in extra_stop_ids:
            if not 0 <= token_id < self.vocab_size:
                raise ValueError(
                    f"stop id {token_id} is outside the vocabulary [0, {self.vocab_size})."
                )
        self.stop_ids = frozenset({self.eos_id, *extra_stop_ids})
        self.chat_template = chat_template
        self._template: jinja2.Template | None = None  # parsed at the first use

    def _require_id(self, token: str, role: str) -> int:
        token_id = self._tok.token_to_id(token)
        if token_id is None:
            raise ValueError(
                f"{role} {token!r} is not in the tokenizer vocabulary; set {role} in "
                "tokenizer_config.json to a token that tokenizer.json has."
            )
        return token_id

    @classmethod
    def char_level(cls, alphabet: str = DEFAULT_ALPHABET) -> Tokenizer:
        """Builds a tokenizer with one id per character of ``alphabet``.

        Ids 0, 1, 2 are ``<pad>``, ``<bos>``, ``<eos>``; character ``alphabet[i]`` is id
        ``3 + i``. Encoding a character outside the alphabet raises a ValueError naming it.
        """
        if not isinstance(alphabet, str) or not alphabet:
            raise ValueError("alphabet must be a non-empty string of characters.")
        if len(set(alphabet)) != len(alphabet):
            dupes = sorted({c for c in alphabet if alphabet.count(c) > 1})
            raise ValueError(f"alphabet repeats character(s) {dupes}; list each one once.")
        vocab = {PAD: 0, BOS: 1, EOS: 2}
        for char in alphabet:
            vocab[char] = len(vocab)
        tok = tokenizers.Tokenizer(models.WordLevel(vocab=vocab, unk_token=None))
        # Every character is its own pre-token, newlines included, so WordLevel maps 1:1.
        tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
        tok.decoder = decoders.Fuse()
        tok.add_special_tokens([PAD, BOS, EOS])
        return cls(
            tok,
            bos_token=BOS,
            eos_token=EOS,
            pad_token=PAD,
            chat_template=CHAR_LEVEL_CHAT_TEMPLATE,
            alphabet=alphabet,
        )

    @classmethod
    def from_dir(cls, path: str | os.PathLike) -> Tokenizer:
        """Loads a Hugging Face model directory's tokenizer.

        Reads ``tokenizer.json`` and ``tokenizer_config.json`` (bos/eos/pad tokens and
        ``chat_template``, a string or a list of named templates, ``"default"`` preferred);
        ``chat_template.jinja`` overrides the config's template when present, and
        ``generation_config.json``'s ``eos_token_id`` adds stop ids. Without a pad token,
        ``pad_id`` falls back to ``eos_id``.
        """
        tok_path = io.join(path, TOKENIZER_FILE)
        if not io.is_file(tok_path):
            raise FileNotFoundError(
                f"Tokenizer file {tok_path} does not exist; point at a Hugging Face model or "
                "tokenizer directory (with tokenizer.json and tokenizer_config.json), or use "
                "tokenizer='char'."
            )
        try:
            tok = tokenizers.Tokenizer.from_str(io.read_text(tok_path))
        except Exception as exc:
            raise ValueError(
                f"Tokenizer file {tok_path} could not be parsed: {_one_line(exc)}; re-download "
                "it (tokenizers reads the format transformers saves)."
            ) from None
        config_path = io.join(path, CONFIG_FILE)
        config = _read_json(config_path)
        eos_token = _token_content(config.get("eos_token"))
        if eos_token is None:
            raise ValueError(
                f"{config_path} has no eos_token; the sampler needs one to stop: add "
                '"eos_token": "<the end token>" to it.'
            )
        template = _select_template(config.get("chat_template"), config_path)
        template_path = io.join(path, CHAT_TEMPLATE_FILE)
        if io.is_file(template_path):
            template = io.read_text(template_path)
        extra_stop_ids = []
        gen_path = io.join(path, GENERATION_CONFIG_FILE)
        if io.is_file(gen_path):
            eos_ids = _read_json(gen_path).get("eos_token_id")
            extra_stop_ids = [eos_ids] if isinstance(eos_ids, int) else list(eos_ids or [])
        return cls(
            tok,
            bos_token=_token_content(config.get("bos_token")),
            eos_token=eos_token,
            pad_token=_token_content(config.get("pad_token")),
            chat_template=template,
            extra_stop_ids=extra_stop_ids,
            alphabet=config.get("rljax_alphabet"),
        )

    @classmethod
    def from_gguf(cls, path: str | os.PathLike) -> Tokenizer:
        """Rebuilds the tokenizer stored in a GGUF file's metadata (needs the ``gguf`` package).

        Supports byte-level BPE (``tokenizer.ggml.model == "gpt2"``) with the GPT-2 or SmolLM
        pre-tokenizer, which is what SmolLM2 GGUF files carry. Control tokens become special
        tokens (skipped by ``decode``); the chat template comes from ``tokenizer.chat_template``.
        """
        return _load_gguf(cls, os.fspath(path))

    def vocab(self) -> dict[str, int]:
        """Every token and its id, added tokens included."""
        return self._tok.get_vocab(with_added_tokens=True)

    # ---- encoding ---------------------------------------------------------------------------

    def _check_chars(self, text: str) -> None:
        if self._alphabet is not None:
            for char in text:
                if char not in self._alphabet:
                    raise ValueError(
                        f"Character {char!r} is not in the tokenizer alphabet "
                        f"{self._alphabet_str!r}; remove it or build the tokenizer with it."
                    )

    def encode(self, text: str, *, add_bos: bool = False) -> list[int]:
        """Returns the ids of ``text``; special-token strings in it map to their ids."""
        if not isinstance(text, str):
            raise TypeError(f"encode expects a str, got {type(text).__name__}.")
        self._check_chars(text)
        ids = self._tok.encode(text, add_special_tokens=False).ids
        return self._with_bos(ids, add_bos)

    def encode_batch(self, texts: Sequence[str], *, add_bos: bool = False) -> list[list[int]]:
        """Encodes many texts at once (parallel inside ``tokenizers``)."""
        if isinstance(texts, str):
            raise TypeError("encode_batch expects a list of strings, got a single str.")
        for text in texts:
            self._check_chars(text)
        encodings = self._tok.encode_batch(list(texts), add_special_tokens=False)
        return [self._with_bos(e.ids, add_bos) for e in encodings]

    def _with_bos(self, ids: list[int], add_bos: bool) -> list[int]:
        if not add_bos:
            return ids
        if self.bos_id is None:
            raise ValueError("add_bos=True but this tokenizer has no bos_token.")
        return [self.bos_id, *ids]

    def decode(self, ids: Sequence[int], *, skip_special_tokens: bool = True) -> str:
        """Returns the text of ``ids``; special tokens are dropped unless asked for."""
        ids = [int(i) for i in ids]
        for token_id in ids:
            if not 0 <= token_id < self.vocab_size:
                raise ValueError(f"id {token_id} is outside the vocabulary [0, {self.vocab_size}).")
        return self._tok.decode(ids, skip_special_tokens=skip_special_tokens)

    # ---- chat -------------------------------------------------------------------------------

    def apply_chat_template(
        self, messages: list[dict], *, add_generation_prompt: bool = True, **kwargs
    ) -> str:
        """Renders ``[{"role", "content"}, ...]`` with the chat template, in a Jinja sandbox.

        The template sees ``messages``, ``add_generation_prompt``, ``bos_token``,
        ``eos_token``, ``raise_exception`` and any extra keyword arguments.
        """
        if self.chat_template is None:
            raise ValueError(
                "This tokenizer has no chat_template; add one to tokenizer_config.json."
            )
        if not isinstance(messages, list) or not all(
            isinstance(m, dict) and "role" in m and "content" in m for m in messages
        ):
            raise ValueError("messages must be a list of {'role': ..., 'content': ...} dicts.")
        if self._template is None:
            env = jinja2.sandbox.ImmutableSandboxedEnvironment(
                trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
            )
            env.filters["tojson"] = _tojson
            env.globals["raise_exception"] = _raise_exception
            try:
                self._template = env.from_string(self.chat_template)
            except jinja2.exceptions.TemplateSyntaxError as exc:
                raise ValueError(
                    f"The chat template does not parse (line {exc.lineno}: {_one_line(exc)}); "
                    "fix chat_template in tokenizer_config.json or chat_template.jinja."
                ) from None
        try:
            return self._template.render(
                messages=messages,
                add_generation_prompt=add_generation_prompt,
                bos_token=self.bos_token or "",
                eos_token=self.eos_token,
                **kwargs,
            )
        except jinja2.exceptions.TemplateError as exc:
            raise ValueError(
                f"The chat template failed to render {[m['role'] for m in messages]} "
                f"({type(exc).__name__}: {_one_line(exc)}); fix chat_template in "
                "tokenizer_config.json or chat_template.jinja, or pass the messages it expects."
            ) from None

    # ---- persistence and checks -------------------------------------------------------------

    def save(self, path: str | os.PathLike) -> None:
        """Writes ``tokenizer.json`` and ``tokenizer_config.json`` so that ``from_dir``
        rebuilds an identical tokenizer."""
        io.makedirs(path)
        io.write_text(io.join(path, TOKENIZER_FILE), self._tok.to_str(pretty=True))
        config = {
            "bos_token": self.bos_token,
            "eos_token": self.eos_token,
            "pad_token": self.pad_token,
            "chat_template": self.chat_template,
        }
        if self._alphabet_str is not None:
            config["rljax_alphabet"] = self._alphabet_str
        io.write_text(io.join(path, CONFIG_FILE), json.dumps(config, ensure_ascii=False, indent=2))
        extra = sorted(self.stop_ids - {self.eos_id})
        if extra:
            io.write_text(
                io.join(path, GENERATION_CONFIG_FILE),
                json.dumps({"eos_token_id": [self.eos_id, *extra]}),
            )

    def check_fits(self, model_vocab_size: int) -> None:
        """Raises if some token id would index past the model's embedding table."""
        if self.vocab_size > model_vocab_size:
            raise ValueError(
                f"Tokenizer has {self.vocab_size} ids but the model embedding has only "
                f"{model_vocab_size} rows; use a model config with vocab_size >= "
                f"{self.vocab_size}."
            )

    def __repr__(self) -> str:
        return (
            f"Tokenizer(vocab_size={self.vocab_size}, bos_id={self.bos_id}, "
            f"eos_id={self.eos_id}, pad_id={self.pad_id})"
        )


# ---- GGUF ------------------------------------------------------------------------------------

# llama.cpp token types (gguf.TokenType): 3 = CONTROL, 4 = USER_DEFINED.
_GGUF_CONTROL, _GGUF_USER_DEFINED = 3, 4


def _gguf_pre_tokenizer(pre: str, path: str):
    """Maps llama.cpp's ``tokenizer.ggml.pre`` name to the equivalent HF pre-tokenizer."""
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if pre in ("default", "gpt-2"):
        return byte_level
    if pre == "smollm":
        # SmolLM splits every digit into its own token before the GPT-2 byte-level regex.
        return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
    raise ValueError(
        f"GGUF file {path} uses pre-tokenizer {pre!r}; from_gguf supports 'gpt-2' and 'smollm'. "
        "Use the model's tokenizer.json with Tokenizer.from_dir instead."
    )


def _load_gguf(cls, path: str) -> Tokenizer:
    try:
        import gguf
    except ImportError:
        raise ImportError(
            "Tokenizer.from_gguf needs the gguf package; run `pip install gguf`."
        ) from None
    if not io.is_file(path):
        raise FileNotFoundError(
            f"GGUF file {path} does not exist; check the path, or use Tokenizer.from_dir."
        )
    # gguf memory-maps a local file: a remote one is copied first.
    with io.local_copy(path) as local:
        try:
            reader = gguf.GGUFReader(local)
        except Exception as exc:
            raise ValueError(
                f"GGUF file {path} could not be read: {_one_line(exc)}; re-download it (it may "
                "be truncated or not a GGUF file)."
            ) from None
        return _from_gguf_reader(cls, reader, path)


def _from_gguf_reader(cls, reader, path: str) -> Tokenizer:
    def field(key: str, default=None):
        value = reader.fields.get(key)
        return default if value is None else value.contents()

    model = field("tokenizer.ggml.model")
    if model != "gpt2":
        raise ValueError(
            f"GGUF file {path} has tokenizer model {model!r}; from_gguf supports only 'gpt2' "
            "(byte-level BPE). Use the model's tokenizer.json with Tokenizer.from_dir instead."
        )
    tokens = field("tokenizer.ggml.tokens")
    merges = field("tokenizer.ggml.merges")
    if not tokens or not merges:
        raise ValueError(f"GGUF file {path} has no tokenizer.ggml.tokens/merges metadata.")
    token_types = field("tokenizer.ggml.token_type", [1] * len(tokens))
    vocab = {token: index for index, token in enumerate(tokens)}
    merge_pairs = [tuple(merge.split(" ", 1)) for merge in merges]
    tok = tokenizers.Tokenizer(models.BPE(vocab=vocab, merges=merge_pairs, fuse_unk=False))
    tok.pre_tokenizer = _gguf_pre_tokenizer(field("tokenizer.ggml.pre", "default"), path)
    tok.decoder = decoders.ByteLevel()
    tok.add_tokens(
        [
            tokenizers.AddedToken(token, special=False, normalized=False)
            for token, kind in zip(tokens, token_types)
            if kind == _GGUF_USER_DEFINED
        ]
    )
    tok.add_special_tokens(
        [
            tokenizers.AddedToken(token, special=True, normalized=False)
            for token, kind in zip(tokens, token_types)
            if kind == _GGUF_CONTROL
        ]
    )

    def token_at(key: str) -> str | None:
        index = field(key)
        return None if index is None else tokens[int(index)]

    eos_token = token_at("tokenizer.ggml.eos_token_id")
    if eos_token is None:
        raise ValueError(f"GGUF file {path} has no tokenizer.ggml.eos_token_id.")
    extra_stop = [
        field(key) for key in ("tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id")
    ]
    return cls(
        tok,
        bos_token=token_at("tokenizer.ggml.bos_token_id"),
        eos_token=eos_token,
        pad_token=token_at("tokenizer.ggml.padding_token_id"),
        chat_template=field("tokenizer.chat_template"),
        extra_stop_ids=[int(i) for i in extra_stop if i is not None],
    )
