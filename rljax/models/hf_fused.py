"""transformers 5's fused expert tensors, read under the Hub's per-expert names.

transformers 5 holds a mixture-of-experts layer's routed experts fused:
``mlp.experts.gate_up_proj`` [E, 2*Fe, D] (each expert's gate_proj rows, then its up_proj rows)
and ``mlp.experts.down_proj`` [E, D, Fe]. ``save_pretrained`` writes them back one tensor per
expert and matrix, as the Hub holds them, unless it is called with
``save_original_format=False``, which leaves them fused on disk. :class:`FusedExperts` presents
such a checkpoint's experts under the per-expert names that
:data:`rljax.models.hf_specs.MOE_TENSOR_SPECS` reads; each read takes only its expert's slice of
the fused tensor. ``load_hf`` picks it once, when the checkpoint holds a fused tensor.

Gemma 4's mixture-of-experts block holds its experts fused the same way, under
``model.layers.{i}.experts.gate_up_proj`` and ``.experts.down_proj`` (no ``mlp.``), and
transformers has no per-expert form of them: ``save_hf`` writes them fused
(:func:`fused_tensors`), and reads them through :class:`FusedExperts` under the per-expert names
of :data:`rljax.models.hf_specs.GEMMA4_MOE_TENSOR_SPECS`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from typing import Protocol

import numpy as np


class _Files(Protocol):
    """What this reads of a checkpoint's files (``hf.SafetensorsReader`` has it)."""

    def shape(self, name: str) -> tuple[int, ...] | None: ...

    def dtype(self, name: str) -> str | None: ...

    def read(self, name: str, index: tuple[slice, ...]) -> np.ndarray: ...

    def where(self, name: str) -> str: ...


_PER_EXPERT = re.compile(
    r"(?P<prefix>.+\.experts)\.(?P<expert>\d+)\.(?P<proj>gate|up|down)_proj\.weight"
)
FUSED_GATE_UP = ".experts.gate_up_proj"
FUSED_DOWN = ".experts.down_proj"


def has_fused_experts(names: Iterable[str]) -> bool:
    """Whether a checkpoint with these tensor names holds its experts fused."""
    return any(name.endswith(FUSED_GATE_UP) for name in names)


class FusedExperts:
    """A ``hf.TensorReader`` over a checkpoint whose experts are fused; every other tensor is
    read as it is."""

    def __init__(self, reader: _Files):
        self._reader = reader

    def _locate(self, name: str) -> tuple[str, int, int] | None:
        """(the fused tensor, the expert, its first row there) of a per-expert name the
        checkpoint holds fused; None for any other name."""
        match = _PER_EXPERT.fullmatch(name)
        if match is None:
            return None
        down = match["proj"] == "down"
        fused = match["prefix"].removesuffix(".experts") + (FUSED_DOWN if down else FUSED_GATE_UP)
        shape = self._reader.shape(fused)
        expert = int(match["expert"])
        if shape is None or len(shape) != 3 or expert >= shape[0]:
            return None
        return fused, expert, shape[1] // 2 if match["proj"] == "up" else 0

    def shape(self, name: str) -> tuple[int, ...] | None:
        """The per-expert tensor's shape: [Fe, D] for gate/up, [D, Fe] for down."""
        located = self._locate(name)
        if located is None:
            return self._reader.shape(name)
        fused, _, _ = located
        _, rows, cols = self._reader.shape(fused) or (0, 0, 0)
        return (rows, cols) if fused.endswith(FUSED_DOWN) else (rows // 2, cols)

    def dtype(self, name: str) -> str | None:
        """The safetensors dtype of the tensor that holds ``name``."""
        located = self._locate(name)
        return self._reader.dtype(located[0] if located else name)

    def where(self, name: str) -> str:
        """The file that holds (or should hold) the tensor."""
        located = self._locate(name)
        return self._reader.where(located[0] if located else name)

    def read(self, name: str, index: tuple[slice, ...]) -> np.ndarray:
        """Reads only ``index`` of the expert's matrix from its fused tensor."""
        located = self._locate(name)
        if located is None:
            return self._reader.read(name, index)
        fused, expert, first = located
        rows, cols = index
        fused_index = (
            slice(expert, expert + 1),
            slice(rows.start + first, rows.stop + first),
            cols,
        )
        return self._reader.read(fused, fused_index)[0]


def fused_tensors(
    tensors: Iterable[tuple[str, np.ndarray]], num_experts: int
) -> Iterator[tuple[str, np.ndarray]]:
    """``(name, array)`` pairs with each layer's per-expert matrices fused, as transformers
    holds them: a layer's E gate_proj [Fe, D] and E up_proj become one ``gate_up_proj``
    [E, 2*Fe, D], its E down_proj [D, Fe] one ``down_proj`` [E, D, Fe]; other tensors pass as
    they come. A layer's matrices are held until its last one arrives."""
    held: dict[tuple[str, str], dict[int, np.ndarray]] = {}
    for name, array in tensors:
        match = _PER_EXPERT.fullmatch(name)
        if match is None:
            yield name, array
            continue
        prefix = match["prefix"].removesuffix(".experts")
        key = (prefix, "down" if match["proj"] == "down" else "gate_up")
        part = held.setdefault(key, {})
        part[int(match["expert"]) + (num_experts if match["proj"] == "up" else 0)] = array
        if len(part) < (num_experts if key[1] == "down" else 2 * num_experts):
            continue
        del held[key]
        if key[1] == "down":
            yield prefix + FUSED_DOWN, np.stack([part[e] for e in range(num_experts)])
        else:
            pairs = [np.concatenate([part[e], part[num_experts + e]]) for e in range(num_experts)]
            yield prefix + FUSED_GATE_UP, np.stack(pairs)
    if held:
        raise ValueError(f"experts without all their matrices: {sorted(held)}")
