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
