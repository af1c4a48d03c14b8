"""The prologue every kernel op shares: which implementation runs, with which scale and tiles.

Each public op takes ``impl``:

- ``'auto'``: the Pallas kernel on TPU, the XLA (plain jnp) implementation elsewhere. Pallas
  interpret mode is a correctness tool, far too slow to be a default.
- ``'pallas'``: always the Pallas kernel; on a non-TPU backend it runs in interpret mode, which
  is how the CPU tests exercise the kernels.
- ``'xla'``: always the plain jnp implementation.

The ops' public wrappers resolve their options here, once: ``resolve_impl``, the default
softmax scale (``resolve_sm_scale``), the attention ops' sliding window and score soft-cap
(``resolve_window``, ``resolve_softcap``) and the block sizes (``resolve_block_sizes``: the
caller's, else the tuned entry for this chip). It also maps ``jax.Device.device_kind``
strings to the TPU generation keys ('v4', 'v5e', 'v5p', 'v6e') that every ``block_sizes.py``
tuning table is keyed by.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from collections.abc import Callable
from typing import Any, TypeVar

import jax
from rljax.kernels import validation

T = TypeVar("T")

IMPLS = ("auto", "pallas", "xla")

# device_kind strings as TPU runtimes report them, lower-cased, most specific first: "tpu v5"
# must not swallow "tpu v5 lite", so prefixes are checked in this order.
_DEVICE_KIND_TO_GENERATION = (
    ("tpu v6 lite", "v6e"),
    ("tpu v6e", "v6e"),
    ("tpu v5 lite", "v5e"),
    ("tpu v5e", "v5e"),
    ("tpu v5p", "v5p"),
    ("tpu v5", "v5p"),
    ("tpu v4", "v4"),
)


@dataclasses.dataclass(frozen=True)
class Backend:
    """A resolved implementation choice.

    Attributes:
      use_pallas: run the Pallas kernel (else the XLA implementation).
      interpret: the value for ``pallas_call(interpret=...)``: ``False`` to compile with Mosaic
        on TPU, ``True`` to run the Pallas interpreter elsewhere.
    """

    use_pallas: bool
    interpret: Any = False


def on_tpu() -> bool:
    """Whether JAX's default backend is a TPU."""
    return jax.default_backend() == "tpu"


def resolve_impl(impl: str) -> Backend:
    """Turns a user-facing ``impl`` string into a :class:`Backend`.

    Raises:
      ValueError: ``impl`` is not one of 'auto', 'pallas', 'xla'.
    """
    if impl not in IMPLS:
        raise ValueError(f"impl must be one of {IMPLS}, got {impl!r}; pass impl='auto'.")
    tpu = on_tpu()
    if impl == "xla" or (impl == "auto" and not tpu):
        return Backend(use_pallas=False)
    # Off TPU, the generic Pallas interpreter: it lowers the kernel body to ordinary XLA ops and
    # compiles 2-3x faster than the TPU interpreter (pltpu.InterpretParams), which simulates
    # TPU memory and DMA semantics op by op. The tests also run each kernel once under the TPU
    # interpreter, calling kernel.py directly, for its NaN-filled scratch and race detection.
    return Backend(use_pallas=True, interpret=not tpu)


def resolve_sm_scale(sm_scale: float | None, head_dim: int) -> float:
    """``sm_scale`` as a positive float; None gives the standard 1 / sqrt(head_dim)."""
    if sm_scale is None:
        sm_scale = 1.0 / math.sqrt(head_dim)
    validation.check_positive_scalar("sm_scale", sm_scale)
    return float(sm_scale)


def resolve_window(window, capacity: int) -> int | None:
    """``window`` as a Python int, or None where it can never mask a key.

    A window of at least ``capacity`` keys (a sequence's length; ``pages_per_seq * S`` for
    paged attention, whose lengths are clamped to the table) covers every key a query may see,
    so the op runs its global program.

    Raises:
      ValueError: ``window`` is not an int >= 1.
    """
    if window is None:
        return None
    if isinstance(window, bool) or not isinstance(window, numbers.Integral) or int(window) < 1:
        raise ValueError(
            f"window must be an int >= 1 (the keys each query attends, itself included), got "
            f"{window!r}; pass window=None for global attention."
        )
    return None if int(window) >= capacity else int(window)


def resolve_softcap(softcap, message: str | None = None) -> float | None:
    """``softcap`` as a Python float, or None. A static Python or NumPy number only: not a
    bool, a string that float() would parse, or an array (a traced one could not be static).

    Raises:
      ValueError: ``softcap`` is not a finite number > 0; ``message`` (default: the attention
        ops' wording) says so.
    """
    if softcap is None:
        return None
    ok = isinstance(softcap, numbers.Real) and not isinstance(softcap, bool)
    if not ok or not math.isfinite(softcap) or softcap <= 0:
        raise ValueError(
            message
            or f"softcap must be a finite float > 0 (scores become softcap * tanh(scores / "
            f"softcap)), got {softcap!r}; pass softcap=None for no soft-capping."
        )
    return float(softcap)


def resolve_block_sizes(op: str, block_sizes: T | None, cls: type[T], tuned: Callable[[], T]) -> T:
    """The caller's ``block_sizes``, else ``tuned()`` (the op's entry for this chip).

    Raises:
      ValueError: ``block_sizes`` is neither None nor a ``cls`` (the op's own BlockSizes).
    """
    if block_sizes is None:
        return tuned()
    if not isinstance(block_sizes, cls):
        raise ValueError(f"block_sizes must be a {op} BlockSizes or None, got {block_sizes!r}.")
    return block_sizes


def round_up(x: int, multiple: int) -> int:
    """The smallest multiple of ``multiple`` that is >= ``x``."""
    return -(-x // multiple) * multiple


def tpu_generation(device_kind: str | None = None) -> str | None:
    """The tuning-table key for a device kind, e.g. 'TPU v5 lite' -> 'v5e'.

    Args:
      device_kind: a ``jax.Device.device_kind`` string; defaults to ``jax.devices()[0]``'s.

    Returns:
      'v4', 'v5e', 'v5p' or 'v6e', or None for anything else (CPU, GPU, unknown TPUs).
    """
    if device_kind is None:
        device_kind = jax.devices()[0].device_kind
    kind = device_kind.lower().strip()
    for prefix, generation in _DEVICE_KIND_TO_GENERATION:
        if kind.startswith(prefix):
            return generation
    return None


def check_positive_int(owner: str, name: str, value: Any) -> None:
    """Raises ValueError unless ``value`` is a positive Python int; used by every BlockSizes."""
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{owner}.{name} must be a positive int, got {value!r}.")


def check_multiple(owner: str, name: str, value: int, multiple: int) -> None:
    """Raises ValueError unless ``value`` is a multiple of ``multiple`` (TPU tiling)."""
    if value % multiple:
        raise ValueError(
            f"{owner}.{name} must be a multiple of {multiple} for TPU tiling, got {value}."
        )
