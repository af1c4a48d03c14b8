"""Hugging Face safetensors checkpoints in and out of the stacked NNX ``Decoder``.

Import never gathers the model: every parameter is built with
``jax.make_array_from_callback``, whose callback reads from the safetensors file only the
slice one device holds (``safe_open(...).get_slice``), for every layer (and expert), and
stacks them.

The layout map (:data:`rljax.models.hf_specs.TENSOR_SPECS`) says, for each ``Decoder``
parameter, which Hugging Face tensors hold it and how their axes become the parameter's. The
same map drives export in reverse and the GGUF loader (``gguf.py``), which presents GGUF
tensors under their Hugging Face names. RoPE uses the same half-split layout in both, so q/k
need no permutation.

Paths may be local or ``gs://`` URLs (:mod:`rljax.io`). ``safe_open`` memory-maps a local
file, so each remote safetensors file is copied to a temporary folder the reader owns, once,
when it is first opened; the copy goes when the reader does.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import tempfile
from collections.abc import Mapping
from typing import Any, Protocol

import jax
import ml_dtypes  # noqa: F401  (registers bfloat16 with numpy, which safetensors reads into)
import numpy as np
from flax import nnx
from jax.sharding import Mesh

from rljax import io
from rljax.config import ModelConfig
from rljax.models.families import config_from_hf, config_to_hf
from rljax.models.hf_fused import FusedExperts, fused_tensors, has_fused_experts
from rljax.models.hf_specs import TensorSpec, describe, tensor_specs
from rljax.models.sharding import ShardingRules, state_shardings
from rljax.models.transformer import abstract_decoder

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
# safetensors dtype names of the weights load_hf casts to the model's dtype.
FLOAT_DTYPES = ("F64", "F32", "BF16", "F16")


class TensorReader(Protocol):
    """Read access to a checkpoint's tensors under their Hugging Face names."""

    def shape(self, name: str) -> tuple[int, ...] | None:
        """The tensor's shape, or None when the checkpoint lacks it."""

    def read(self, name: str, index: tuple[slice, ...]) -> np.ndarray:
        """The ``index`` slice (unit-stride slices, one per dimension) of the tensor."""

    def where(self, name: str) -> str:
        """The file that holds (or should hold) the tensor, for error messages."""


# ---- safetensors ---------------------------------------------------------------------------


class SafetensorsReader:
    """A ``model.safetensors`` file or a sharded set listed in ``model.safetensors.index.json``."""

    def __init__(self, path: io.PathLike):
        from safetensors import safe_open

        self._safe_open = safe_open
        index_path = str(io.join(path, INDEX_FILE))
        single = str(io.join(path, WEIGHTS_FILE))
        self._local_dir: tempfile.TemporaryDirectory | None = None  # copies of remote files
        if io.is_file(index_path):
            self.source = index_path
            try:
                weight_map = json.loads(io.read_text(index_path))["weight_map"]
            except (OSError, ValueError, KeyError, TypeError) as exc:
                text = " ".join(str(exc).split())[:200]
                raise ValueError(
                    f"{index_path} is not a valid safetensors index ({text}); re-download it"
                ) from None
            self._file_of: dict[str, str] | None = {
                k: str(io.join(path, v)) for k, v in weight_map.items()
            }
        elif io.is_file(single):
            self.source = single
            self._file_of = None
        else:
            raise FileNotFoundError(
                f"{path} has neither {WEIGHTS_FILE} nor {INDEX_FILE}; point load_hf at a "
                "Hugging Face model directory saved with safetensors"
            )
        self._handles: dict[str, Any] = {}
        self._shapes: dict[str, tuple[int, ...]] = {}
        self._dtypes: dict[str, str] = {}
        files = sorted(set(self._file_of.values())) if self._file_of else [single]
        for file in files:
            handle = self._open(file)
            for key in handle.keys():  # noqa: SIM118  (safe_open handles are not iterable)
                if self._file_of is None or self._file_of.get(key) == file:
                    tensor = handle.get_slice(key)
                    self._shapes[key] = tuple(tensor.get_shape())
                    self._dtypes[key] = str(tensor.get_dtype())

    def _open(self, file: str):
        if file not in self._handles:
            if not io.is_file(file):
                raise FileNotFoundError(
                    f"safetensors file {file} (listed in {self.source}) does not exist; "
                    "re-download the checkpoint"
                )
            try:
                self._handles[file] = self._safe_open(self._local(file), framework="numpy")
            except Exception as exc:  # safetensors raises its own SafetensorError
                text = " ".join(str(exc).split())[:200]
                raise ValueError(
                    f"safetensors file {file} is corrupt or unreadable ({text}); re-download it"
                ) from None
        return self._handles[file]

    def _local(self, file: str) -> str:
        """``file`` itself when local, else its copy in the reader's temporary folder."""
        if io.is_local(file):
            return file
        if self._local_dir is None:
            self._local_dir = tempfile.TemporaryDirectory(prefix="rljax-safetensors-")
        name = f"{len(self._handles)}-{io.path(file).name}"
        return io.download(file, os.path.join(self._local_dir.name, name))

    def where(self, name: str) -> str:
        """The file that holds (or should hold) the tensor."""
        if self._file_of is None:
            return self.source
        return self._file_of.get(name, self.source)

    def shape(self, name: str) -> tuple[int, ...] | None:
        """The tensor's shape, or None when absent."""
        return self._shapes.get(name)

    def names(self) -> list[str]:
        """Every tensor's name."""
        return list(self._shapes)

    def dtype(self, name: str) -> str | None:
        """The tensor's safetensors dtype name ('F32', 'BF16', ...), or None when absent."""
        return self._dtypes.get(name)

    def read(self, name: str, index: tuple[slice, ...]) -> np.ndarray:
        """Reads only ``index`` of the tensor from disk."""
        return np.asarray(self._open(self.where(name)).get_slice(name)[index])


# ---- import --------------------------------------------------------------------------------


def _view_index(spec: TensorSpec, cfg: ModelConfig, target: tuple[slice, ...]):
    """Hugging Face read ranges, view shape and post-read index for a per-tensor target slice."""
    groups = spec.groups(cfg)
    view = [slice(0, 0)] * len(spec.perm)
    for axis, view_axis in enumerate(spec.perm):
        view[view_axis] = target[axis]
    hf_index, view_shape, post, v = [], [], [], 0
    for group in groups:
        if not group:  # a dimension of size 1 that rljax drops
            hf_index.append(slice(0, 1))
            continue
        inner = math.prod(group[1:])
        outer = view[v]
        # Reads whole inner blocks (e.g. whole heads); the inner slices are taken after.
        hf_index.append(slice(outer.start * inner, outer.stop * inner))
        view_shape.extend([outer.stop - outer.start, *group[1:]])
        post.extend([slice(None), *view[v + 1 : v + len(group)]])
        v += len(group)
    return tuple(hf_index), tuple(view_shape), tuple(post)


def _read_target(reader: TensorReader, spec: TensorSpec, cfg, name: str, target) -> np.ndarray:
    hf_index, view_shape, post = _view_index(spec, cfg, target)
    block = reader.read(name, hf_index).reshape(view_shape)
    return block[post].transpose(spec.perm)


def _read_block(reader: TensorReader, spec: TensorSpec, cfg, target) -> np.ndarray:
    """The ``target`` slice of a parameter: for a stacked one, its leading slices pick the
    Hugging Face tensors (layers, experts) and the rest is read from each."""
    stacked = spec.stacked(cfg)
    k = len(stacked)
    if not k:
        return _read_target(reader, spec, cfg, spec.hf_name, target)
    ranges = [axis[s.start : s.stop] for axis, s in zip(stacked, target[:k])]
    parts = [
        _read_target(reader, spec, cfg, spec.name(*index), target[k:])
        for index in itertools.product(*ranges)
    ]
    return np.stack(parts).reshape(*(len(r) for r in ranges), *parts[0].shape)


def check_tensors(reader: TensorReader, cfg: ModelConfig, config_source: str) -> None:
    """Raises, naming the file, if a tensor the config implies is missing or mis-shaped, or
    (readers that know dtypes) holds no floating-point weights."""
    dtype_of = getattr(reader, "dtype", None)
    fix = "re-download the checkpoint, or fix config.json if it was edited"
    specs = tensor_specs(cfg)
    for pname in _param_names(cfg):
        spec = specs[pname]
        want = spec.hf_shape(cfg)
        for index, name in spec.tensors(cfg):
            got = reader.shape(name)
            if got is None:
                raise ValueError(
                    f"{reader.where(name)}: tensor {name}{describe(spec, index, cfg)} is missing "
                    f"(expected shape {list(want)} from {config_source}); the checkpoint does "
                    f"not match its config: {fix}"
                )
            if tuple(got) != want:
                raise ValueError(
                    f"{reader.where(name)}: tensor {name} has shape {list(got)} but "
                    f"{config_source} implies {list(want)}; the checkpoint does not match its "
                    f"config: {fix}"
                )
            dtype = dtype_of(name) if dtype_of is not None else None
            if dtype is not None and dtype not in FLOAT_DTYPES:
                raise ValueError(
                    f"{reader.where(name)}: tensor {name} has dtype {dtype}; rljax loads float "
                    f"weights ({', '.join(FLOAT_DTYPES)}): dequantize the checkpoint, or export "
                    "it unquantized"
                )


def _param_names(cfg: ModelConfig) -> list[str]:
    return list(nnx.to_pure_dict(nnx.split(abstract_decoder(cfg))[1]))


def load_params(
    reader: TensorReader, cfg: ModelConfig, *, mesh: Mesh, rules: ShardingRules
) -> tuple[nnx.GraphDef, nnx.State]:
    """Builds every parameter straight into its sharding, reading per-device slices only."""
    graphdef, abstract = nnx.split(abstract_decoder(cfg))
    shardings = nnx.to_pure_dict(state_shardings(abstract, mesh, rules))
    target_dtype = np.dtype(jax.numpy.dtype(cfg.param_dtype))
    arrays = {}
    specs = tensor_specs(cfg)
    for pname, struct in nnx.to_pure_dict(abstract).items():
        spec, shape = specs[pname], struct.shape
        cache: dict[tuple, np.ndarray] = {}

        def callback(index, spec=spec, shape=shape, cache=cache):
            full = tuple(index) + (slice(None),) * (len(shape) - len(index))
            norm = tuple(slice(*s.indices(d)[:2]) for s, d in zip(full, shape))
            key = tuple((s.start, s.stop) for s in norm)
            if key not in cache:  # replicated shards are read once
                block = _read_block(reader, spec, cfg, norm)
                cache[key] = np.ascontiguousarray(block.astype(target_dtype))
            return cache[key]

        arrays[pname] = jax.make_array_from_callback(shape, shardings[pname], callback)
    nnx.replace_by_pure_dict(abstract, arrays)
    return graphdef, abstract


def read_config(path: io.PathLike) -> dict[str, Any]:
    """The parsed ``config.json`` of a model directory, with clear errors."""
    file = str(io.join(path, CONFIG_FILE))
    try:
        data = json.loads(io.read_text(file))
    except FileNotFoundError:
        raise FileNotFoundError(
            f"{file} does not exist; point at a Hugging Face model directory"
        ) from None
    except (OSError, ValueError) as exc:
        text = " ".join(str(exc).split())[:200]
        raise ValueError(f"{file} is not valid JSON ({text}); re-download it") from None
    if not isinstance(data, dict):
        raise ValueError(
            f"{file} must hold a JSON object, not {type(data).__name__}; re-download it"
        )
    return data


def load_hf(
    path: str | os.PathLike,
    *,
    mesh: Mesh,
    rules: ShardingRules,
    dtype: str | None = None,
) -> tuple[ModelConfig, nnx.GraphDef, nnx.State]:
    """Loads a Hugging Face Llama/Qwen2/Qwen3/Qwen3-MoE/Qwen2-MoE/Gemma 2/Gemma 3/Gemma 4
    (text) safetensors directory, sharded on ``mesh``.

    Reads ``config.json`` and ``model.safetensors`` (or the shards listed in
    ``model.safetensors.index.json``), bf16 or f32; routed experts one tensor per expert (the
    Hub's layout) or fused (:mod:`rljax.models.hf_fused`). ``dtype`` ("float32"/"bfloat16") sets the
    parameter and compute dtype; None keeps the checkpoint's. Returns ``(cfg, graphdef,
    params)``; ``nnx.merge(graphdef, params)`` is the Decoder.
    """
    config_source = str(io.join(path, CONFIG_FILE))
    overrides = {} if dtype is None else {"dtype": dtype, "param_dtype": dtype}
    cfg = config_from_hf(read_config(path), source=config_source, **overrides)
    files = SafetensorsReader(path)
    reader: TensorReader = FusedExperts(files) if has_fused_experts(files.names()) else files
    check_tensors(reader, cfg, config_source)
    graphdef, params = load_params(reader, cfg, mesh=mesh, rules=rules)
    return cfg, graphdef, params


# ---- export --------------------------------------------------------------------------------


def hf_tensors(cfg: ModelConfig, params: nnx.State | Mapping[str, Any]):
    """Yields ``(hf_name, numpy array)`` for every tensor, gathering one parameter at a time."""
    # nnx.State is itself a Mapping (of Variables), so test for it first.
    pure = nnx.to_pure_dict(params) if isinstance(params, nnx.State) else params
    specs = tensor_specs(cfg)
    for pname, value in pure.items():
        if pname not in specs:
            raise ValueError(f"parameter {pname!r} has no Hugging Face tensor; not a Decoder state")
        spec = specs[pname]
        inverse = tuple(int(a) for a in np.argsort(spec.perm))
        hf_shape = spec.hf_shape(cfg)
        host = np.asarray(jax.device_get(value))
        stacked = spec.stacked(cfg)
        # A stacked axis may hold a prefix of its tensors (a model cut to its first layers).
        if any(n > len(axis) for n, axis in zip(host.shape, stacked)):
            raise ValueError(
                f"parameter {pname!r} has shape {list(host.shape)} but the config stacks "
                f"{[len(axis) for axis in stacked]} Hugging Face tensors in it; pass the "
                "params' own config"
            )
        for pos in np.ndindex(*host.shape[: len(stacked)]):
            index = tuple(axis[p] for axis, p in zip(stacked, pos))
            yield spec.name(*index), host[pos].transpose(inverse).reshape(hf_shape)


def save_hf(
    path: str | os.PathLike,
    cfg: ModelConfig,
    params: nnx.State | Mapping[str, Any],
    tokenizer=None,
    *,
    max_shard_bytes: int = 4 << 30,
) -> None:
    """Writes a directory ``transformers.AutoModelForCausalLM.from_pretrained`` loads.

    Tensors keep the parameters' dtype. Files past ``max_shard_bytes`` split into
    ``model-0000k-of-0000n.safetensors`` plus ``model.safetensors.index.json``. With a
    ``tokenizer`` (``rljax.models.tokenizer.Tokenizer``) its files are written too and its
    special-token ids go into ``config.json``.
    """
    if max_shard_bytes <= 0:
        raise ValueError(f"max_shard_bytes={max_shard_bytes} must be positive; use e.g. 4 << 30")
    io.makedirs(path)
    shards: list[dict[str, np.ndarray]] = [{}]
    size = 0
    tensors = hf_tensors(cfg, params)
    if cfg.enable_moe_block:  # Gemma 4's experts exist only fused in transformers
        tensors = fused_tensors(tensors, cfg.num_experts)
    for name, array in tensors:
        if shards[-1] and size + array.nbytes > max_shard_bytes:
            shards.append({})
            size = 0
        shards[-1][name] = np.ascontiguousarray(array)
        size += array.nbytes
    metadata = {"format": "pt"}  # transformers refuses safetensors without a format tag
    if len(shards) == 1:
        save_safetensors(shards[0], io.join(path, WEIGHTS_FILE), metadata)
    else:
        weight_map, total = {}, 0
        for k, shard in enumerate(shards):
            file = f"model-{k + 1:05d}-of-{len(shards):05d}.safetensors"
            save_safetensors(shard, io.join(path, file), metadata)
            weight_map.update({name: file for name in shard})
            total += sum(a.nbytes for a in shard.values())
        index = {"metadata": {"total_size": total}, "weight_map": weight_map}
        io.write_text(io.join(path, INDEX_FILE), json.dumps(index, indent=2))
    config = config_to_hf(cfg)
    if tokenizer is not None:
        tokenizer.save(path)
        config.update(
            bos_token_id=tokenizer.bos_id,
            eos_token_id=tokenizer.eos_id,
            pad_token_id=tokenizer.pad_id,
        )
    io.write_text(io.join(path, CONFIG_FILE), json.dumps(config, indent=2))


def save_safetensors(tensors: dict[str, np.ndarray], file, metadata: dict[str, str]) -> None:
    """Writes one safetensors file: streamed to a local path; a remote one is uploaded from
    bytes (one shard in memory)."""
    from safetensors.numpy import save, save_file

    if io.is_local(file):
        save_file(tensors, os.fspath(file), metadata=metadata)
    else:
        io.write_bytes(file, save(tensors, metadata=metadata))
