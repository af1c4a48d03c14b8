"""Trainer-on-RollPool's half of a train step: a step's last micro-batches lent to chips
outside the learner mesh (the sampler's), their gradients computed there with the current
params (:meth:`rljax.learner.learner.Learner.step` with a :class:`GradLoan`; the learner
compiles a :class:`LentGrads` per set of lent chips,
:meth:`~rljax.learner.learner.Learner.lent_grads`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import NamedSharding

from rljax.learner.gradients import Gradients
from rljax.models.sharding import make_mesh, state_shardings


@dataclasses.dataclass(frozen=True)
class GradLoan:
    """Lend a step's last ``micro_batches`` micro-batches to ``devices`` (Trainer-on-RollPool).

    ``devices`` are chips outside the learner mesh (the sampler's); the lent gradients are
    computed there on a mesh of as many of them as divide a micro-batch's rows.
    """

    devices: tuple[jax.Device, ...]
    micro_batches: int

    def __post_init__(self) -> None:
        if not self.devices:
            raise ValueError("GradLoan.devices is empty; lend at least one device")
        if not (isinstance(self.micro_batches, int) and self.micro_batches >= 1):
            raise ValueError(
                f"GradLoan.micro_batches={self.micro_batches!r}; lend an integer >= 1 of the "
                "step's micro-batches"
            )


class LentGrads:
    """The gradient half of the train step compiled for a mesh of lent devices.

    Attributes:
      param_shardings: where the params go on the lent mesh (fully sharded over 'fsdp').
      batch_sharding: where the lent share of the batch goes.
      fn: ``fn(params, ref_params, share, version, offset) -> (grads, loss, sums)``, jitted
        (:meth:`~rljax.learner.gradients.Gradients.accumulate` on the lent mesh).
    """

    def __init__(self, gradients: Gradients, params: nnx.State, devices: Sequence[jax.Device]):
        mesh = make_mesh(devices, {"fsdp": len(devices), "tensor": 1})
        lent = gradients.on(mesh)
        self.param_shardings = state_shardings(params, mesh, lent.rules)
        grad_shardings = lent.trainable(self.param_shardings)
        self.batch_sharding: NamedSharding = lent.batch_sharding
        rep = lent.replicated
        self.fn: Callable[..., Any] = jax.jit(
            lent.accumulate, out_shardings=(grad_shardings, rep, rep)
        )


class LentSteps:
    """A learner's lent steps: the gradient half compiled once per set of lent devices
    (:class:`LentGrads`), and the gradient parts of an update that lends (the learner's own
    micro-batches and the lent share, moved back onto the learner's shardings).
    """

    def __init__(self, gradients: Gradients, grad_shardings: Any, replicated: NamedSharding):
        self.gradients = gradients
        self.grad_shardings = grad_shardings
        self.replicated = replicated
        self._compiled: dict[tuple[int, ...], LentGrads] = {}  # lent device ids -> their step
        self._own = jax.jit(
            gradients.accumulate, out_shardings=(grad_shardings, replicated, replicated)
        )

    def grads(self, params: nnx.State, devices: Sequence[jax.Device]) -> LentGrads:
        """The gradient half compiled on ``devices``, which must lie outside the learner's mesh."""
        overlap = set(devices) & set(self.gradients.mesh.devices.flat)
        if overlap:
            raise ValueError(
                f"GradLoan lends {len(overlap)} of the learner's own devices; lend only "
                "devices outside the learner mesh (the sampler's)"
            )
        key = tuple(d.id for d in devices)
        if key not in self._compiled:
            self._compiled[key] = LentGrads(self.gradients, params, list(devices))
        return self._compiled[key]

    def parts(
        self, params: Any, ref_params: Any, arrays: dict, version: jax.Array, loan: GradLoan
    ) -> tuple:
        """The (grads, loss, sums) of the learner's own micro-batches (none when all are lent)
        and of the last ``loan.micro_batches``, computed on the lent chips."""
        m, rows = arrays["tokens"].shape[:2]
        if loan.micro_batches > m:
            raise ValueError(
                f"GradLoan lends {loan.micro_batches} of {m} micro-batches; lend <= {m}"
            )
        # The most of the lent devices that divide a micro-batch's rows.
        n = max(d for d in range(1, len(loan.devices) + 1) if rows % d == 0)
        own, lent = m - loan.micro_batches, self.grads(params, loan.devices[:n])
        # The lent share starts first: it runs on other chips while the learner does its own.
        moved = [
            None if p is None else jax.device_put(p, lent.param_shardings)
            for p in (params, ref_params)
        ]
        share = jax.device_put({k: v[own:] for k, v in arrays.items()}, lent.batch_sharding)
        remote = lent.fn(*moved, share, version, jnp.int32(own))
        mine = {k: v[:own] for k, v in arrays.items()}
        parts = [self._own(params, ref_params, mine, version)] if own else []
        parts.append(jax.device_put(remote, (self.grad_shardings, *[self.replicated] * 2)))
        return tuple(parts)
