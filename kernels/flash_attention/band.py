"""Which tiles the flash attention kernels visit: the band of a causal, maybe windowed, mask.

One source for the forward, dQ and dK/dV kernels. Each kernel's innermost grid axis is a
reduction over tiles of the other sequence (key tiles for a query tile, or query tiles for a
key tile); a grid step there is a *step*, and this module maps (outer tile, step) to:

- the tile the step computes, and whether it holds any unmasked entry (``pl.when``);
- the tile its BlockSpec fetches: the computed one clamped into the needed range, so a step
  with nothing to compute repeats its neighbour's block index and the pipeline issues no DMA.

Without a window (today's programs, unchanged) the steps are all tiles: causal tiles above
the diagonal are skipped and clamped. With a window W the steps start at the first tile the
window reaches, and there are only as many as the widest band needs (``kv_steps``,
``q_steps``): tiles wholly before the window are not grid steps at all, so a local layer's
grid, DMA and compute grow with W rather than T.

Index arithmetic uses ``lax.div`` on non-negative ints: ``//`` on a traced int adds a sign
op, whose Mosaic lowering needs the chip's identity (it breaks ahead-of-time export).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp


def _div(a, b: int):
    return a // b if isinstance(a, int) else jax.lax.div(a, jnp.int32(b))


def _max(a, b):
    return max(a, b) if isinstance(a, int) else jnp.maximum(a, b)


def _min(a, b):
    return min(a, b) if isinstance(a, int) else jnp.minimum(a, b)


@dataclasses.dataclass(frozen=True)
class TileBand:
    """The tiles of a [padded_len, padded_len] score matrix that a mask leaves unmasked.

    Attributes:
      block_q: query rows per tile.
      block_kv: key columns per tile.
      padded_len: the padded sequence length, a multiple of both blocks.
      causal: key index <= query index.
      window: None, or W >= 1 (with ``causal``): query index - key index < W.
    """

    block_q: int
    block_kv: int
    padded_len: int
    causal: bool
    window: int | None = None

    def __post_init__(self):
        if self.window is not None and not self.causal:
            raise ValueError(f"TileBand: window={self.window} needs causal=True.")

    @property
    def q_tiles(self) -> int:
        return self.padded_len // self.block_q

    @property
    def kv_tiles(self) -> int:
        return self.padded_len // self.block_kv

    # -- key tiles of a query tile (forward, dQ) ----------------------------------------------

    def kv_steps(self) -> int:
        """Grid length along the key-tile axis, per query tile."""
        if self.window is None:
            return self.kv_tiles
        return max(self._kv_last(qi) - self._kv_first(qi) + 1 for qi in range(self.q_tiles))

    def kv_tile(self, qi, step):
        """The key tile that ``step`` of query tile ``qi`` stands for (traced ints)."""
        return step if self.window is None else self._kv_first(qi) + step

    def kv_run(self, qi, kj):
        """Whether key tile ``kj`` holds an entry query tile ``qi`` may see (else skipped)."""
        return kj <= self._kv_last(qi) if self.causal else True

    def kv_fetch(self, qi, kj):
        """The key tile the BlockSpecs fetch at key tile ``kj``: clamped into the band."""
        return _min(kj, self._kv_last(qi)) if self.causal else kj

    def _kv_first(self, qi):  # with a window: the tile of the first key the window reaches
        return _div(_max(qi * self.block_q - (self.window - 1), 0), self.block_kv)

    def _kv_last(self, qi):  # the tile of the query tile's last row: nothing after it
        return _div((qi + 1) * self.block_q - 1, self.block_kv)

    # -- query tiles of a key tile (dK/dV) ----------------------------------------------------

    def q_steps(self) -> int:
        """Grid length along the query-tile axis, per key tile."""
        if self.window is None:
            return self.q_tiles
        return max(self._q_last(kj) - self._q_first(kj) + 1 for kj in range(self.kv_tiles))

    def q_tile(self, kj, step):
        """The query tile that ``step`` of key tile ``kj`` stands for (traced ints)."""
        return step if self.window is None else self._q_first(kj) + step

    def q_run(self, kj, qi):
        """Whether query tile ``qi`` sees any of key tile ``kj`` (else skipped)."""
        if not self.causal:
            return True
        if self.window is None:  # query tiles ending before the key tile starts see none of it
            return (qi + 1) * self.block_q > kj * self.block_kv
        return qi <= self._q_last(kj)

    def q_fetch(self, kj, qi):
        """The query tile the BlockSpecs fetch at query tile ``qi``: clamped into the band."""
        if not self.causal:
            return qi
        if self.window is None:  # leading, fully masked query tiles onto the first needed one
            return _max(qi, self._q_first(kj))
        return _min(qi, self._q_last(kj))

    def _q_first(self, kj):  # the tile of the key tile's first column: nothing before it
        return _div(kj * self.block_kv, self.block_q)

    def _q_last(self, kj):  # with a window: the tile of the last query that reaches the key tile
        last_query = (kj + 1) * self.block_kv - 1 + self.window - 1
        return _min(_div(last_query, self.block_q), self.q_tiles - 1)
