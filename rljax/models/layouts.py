"""The two layouts of the decoder's weights, and how each one computes.

The decoder's computation (:class:`rljax.models.call_paths.CallPaths`) is the same in both;
what differs is a :class:`Layout`: how a projection multiplies, how the layers run, and how a
block's MLP is computed. The model object that holds the weights names its layout once, as a
class attribute; nothing looks at the weights to find it.

- :data:`STACKED` (:class:`rljax.models.transformer.Decoder`, what the learner trains and a TPU
  sampler serves): each kind of layer weight is one array stacked along a leading layer axis,
  [in..., out...]; the layers run under ``jax.lax.scan`` (one block is compiled however deep
  the model is), projections are einsums, and the MLP has a hand-written backward
  (:func:`gated_mlp`: SwiGLU, or Gemma's GeGLU).
- :data:`PER_LAYER` (:class:`rljax.models.serving.ServingDecoder`, what a CPU sampler decodes
  from): each layer's weights are their own arrays, every matrix transposed to [out..., in...]
  and stored under :meth:`PerLayer.key`; the layers run as straight-line code. Inference only.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import jax
import jax.numpy as jnp

# Layer i's weights: name -> array (one layer's slice in PER_LAYER, the stack in STACKED).
Weights = dict[str, jax.Array]
# block(carry, (weights, layer index)) -> (carry, output), as jax.lax.scan runs it.
Block = Callable[[Any, tuple[Weights, Any]], tuple[Any, Any]]


class Layout(Protocol):
    """What differs between the two weights layouts; the decoder's code is otherwise shared."""

    def project(self, x: jax.Array, p: Weights, name: str, spec: str) -> jax.Array:
        """``x`` times weight ``name`` of ``p``, cast to x's dtype; ``spec`` is the einsum of
        the product in the stacked layout's axis order (e.g. ``'BTD,DNH->BTNH'``)."""
        ...

    def run_layers(self, block: Block, carry: Any, layers: Any, *, unroll: int = 1):
        """``block`` over every layer's weights; returns the carry and the blocks' outputs
        stacked by layer (None when the blocks output None)."""
        ...

    def mlp(self, h_btd: jax.Array, p: Weights, act: str = "silu") -> jax.Array:
        """The gated MLP of one block over its normed input; ``act``: the gate's activation
        (``'silu'``: SwiGLU, ``'gelu_pytorch_tanh'``: GeGLU)."""
        ...


_GELU_C = math.sqrt(2 / math.pi)  # tanh-GELU: 0.5 x (1 + tanh(c (x + 0.044715 x^3)))


def gate_activation(act: str, gate: jax.Array) -> jax.Array:
    """The MLP gate's activation: SiLU, or tanh-approximated GELU (Hugging Face's
    ``gelu_pytorch_tanh``, Gemma's)."""
    return jax.nn.silu(gate) if act == "silu" else jax.nn.gelu(gate, approximate=True)


def _activation_and_slope(act: str, gate: jax.Array) -> tuple[jax.Array, jax.Array]:
    """The activation at ``gate`` and its derivative there, in one elementwise pass."""
    if act == "silu":
        sig = jax.nn.sigmoid(gate)
        return gate * sig, sig * (1 + gate * (1 - sig))
    t = jnp.tanh(_GELU_C * (gate + 0.044715 * gate**3))
    slope = 0.5 * (1 + t) + 0.5 * gate * (1 - t * t) * _GELU_C * (1 + 3 * 0.044715 * gate * gate)
    return 0.5 * gate * (1 + t), slope


@functools.partial(jax.custom_vjp, nondiff_argnums=(4,))
def gated_mlp(x_btd, w_gate, w_up, w_down, act: str = "silu") -> jax.Array:
    """The gated MLP ``(act(x W_gate) * x W_up) W_down`` (SwiGLU with ``act='silu'``, GeGLU
    with ``'gelu_pytorch_tanh'``) with a hand-written backward.

    Autodiff's backward of the 3-D einsums has XLA's CPU backend fuse the activation's
    derivative with a transpose of the [tokens, F] gradient into the layout its weight-gradient
    GEMM wants, a strided loop that took as long as the GEMMs. Here every product is a plain
    2-D matmul over the flattened tokens (the weight gradients ``x^T dy``), the derivative is
    one elementwise pass, and only the two pre-activations are saved: 1.5x faster forward +
    backward at SmolLM2's shapes on the CPU, same values.
    """
    return _gated_fwd(x_btd, w_gate, w_up, w_down, act)[0]


def swiglu(x_btd: jax.Array, w_gate: jax.Array, w_up: jax.Array, w_down: jax.Array) -> jax.Array:
    """:func:`gated_mlp` with SiLU."""
    return gated_mlp(x_btd, w_gate, w_up, w_down, "silu")


def _gated_fwd(x_btd, w_gate, w_up, w_down, act):
    x_nd = x_btd.reshape(-1, x_btd.shape[-1])
    gate, up = x_nd @ w_gate, x_nd @ w_up
    out = (gate_activation(act, gate) * up) @ w_down
    return out.reshape(x_btd.shape), (x_nd, w_gate, w_up, w_down, gate, up)


def _gated_bwd(act, residuals, dy_btd):
    x_nd, w_gate, w_up, w_down, gate, up = residuals
    dy_nd = dy_btd.reshape(-1, dy_btd.shape[-1])
    activated, slope = _activation_and_slope(act, gate)
    d_act = dy_nd @ w_down.T
    d_up = d_act * activated
    d_gate = d_act * up * slope
    dx = d_gate @ w_gate.T + d_up @ w_up.T
    x_dn = x_nd.T
    grads = (x_dn @ d_gate, x_dn @ d_up, (activated * up).T @ dy_nd)
    return (dx.reshape(dy_btd.shape), *grads)


gated_mlp.defvjp(_gated_fwd, _gated_bwd)


class Stacked:
    """Weights stacked by layer, [in..., out...]: einsums under a ``jax.lax.scan``."""

    def project(self, x: jax.Array, p: Weights, name: str, spec: str) -> jax.Array:
        return jnp.einsum(spec, x, p[name].astype(x.dtype))

    def run_layers(self, block: Block, carry: Any, layers: Weights, *, unroll: int = 1):
        """A scan over the stacked weights; the block's layer index is a traced int."""
        depth = jax.tree.leaves(layers)[0].shape[0]
        return jax.lax.scan(block, carry, (layers, jnp.arange(depth)), unroll=unroll)

    def mlp(self, h_btd: jax.Array, p: Weights, act: str = "silu") -> jax.Array:
        dt = h_btd.dtype
        w = [p[name].astype(dt) for name in ("w_gate", "w_up", "w_down")]
        return gated_mlp(h_btd, *w, act)


def contract_last(w_oi: jax.Array, rows_ri: jax.Array) -> jax.Array:
    """``w [out, in] . rows [r, in] -> [out, r]`` in float32, as one dot over both last axes."""
    dims = (((1,), (1,)), ((), ()))
    return jax.lax.dot_general(w_oi, rows_ri, dims, preferred_element_type=jnp.float32)


class PerLayer:
    """Each layer's own arrays, matrices [out..., in...]: ``[out, in] @ [in, rows]`` matmuls
    in straight-line code.

    A decode step reads every weight once for a few rows of activations, and XLA's CPU dot
    kernels stream a weight fastest as the left operand of ``[out, in] @ [in, rows]``
    (docs/benchmarks.md, engine section). The barriers keep XLA from folding the transposes
    into the dot, which would turn it back into the slow operand order.

    16-bit weights (``sampling.dtype='bfloat16'``) take another form: XLA's CPU backend runs a
    bfloat16 ``[out, in] @ [in, rows]`` dot whose right operand is a transpose by converting
    both operands to float32, the weight included (a read, a float32 write and a float32
    read of every weight in every step: 5.6x slower than the float32 model at SmolLM2's
    shapes), while a dot contracting both operands' last axes (``[out, in] . [rows, in]``)
    accumulating in float32 runs on the bfloat16 weight as it is.
    """

    @staticmethod
    def key(name: str) -> str:
        """Where this layout stores the transposed matrix ``name`` of the stacked layout."""
        return name + "_t"

    def project(self, x: jax.Array, p: Weights, name: str, spec: str) -> jax.Array:
        w = p[self.key(name)].astype(x.dtype)
        ins, out = spec.split("->")
        contracted = len(set(ins.split(",")[0]) - set(out))  # x's trailing dims the product sums
        lead, inner = x.shape[: x.ndim - contracted], x.shape[x.ndim - contracted :]
        rows = x.reshape(-1, math.prod(inner))
        w_oi = w.reshape(-1, rows.shape[1])
        if x.dtype.itemsize < 4:
            out_rows = contract_last(w_oi, rows).astype(x.dtype)
        else:
            out_rows = w_oi @ jax.lax.optimization_barrier(rows.T)
        out_rows = jax.lax.optimization_barrier(out_rows)
        return out_rows.T.reshape(*lead, *w.shape[: w.ndim - contracted])

    def run_layers(self, block: Block, carry: Any, layers: Sequence[Weights], *, unroll: int = 1):
        """Straight-line code, one block per layer; the block's layer index is a Python int.
        ``unroll`` has nothing left to unroll."""
        del unroll
        outs = []
        for i, p in enumerate(layers):
            carry, out = block(carry, (p, i))
            outs.append(out)
        return carry, None if outs[0] is None else jax.tree.map(lambda *x: jnp.stack(x), *outs)

    def mlp(self, h_btd: jax.Array, p: Weights, act: str = "silu") -> jax.Array:
        """Three projections; no custom backward, as nothing trains in this layout."""
        gate = self.project(h_btd, p, "w_gate", "BTD,DF->BTF")
        up = self.project(h_btd, p, "w_up", "BTD,DF->BTF")
        return self.project(gate_activation(act, gate) * up, p, "w_down", "BTF,FD->BTD")


STACKED: Layout = Stacked()
PER_LAYER: Layout = PerLayer()
