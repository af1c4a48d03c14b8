"""Trainer-on-RollPool's half of a train step: a step's last micro-batches lent to chips
outside the learner mesh (the sampler's), their gradients computed there with the current
params (:meth:`rljax.learner.learner.Learner.step` with a :class:`GradLoan`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING

import jax

from rljax.models.sharding import make_mesh, state_shardings

if TYPE_CHECKING:
    from rljax.learner.learner import Learner


@dataclasses.dataclass(frozen=True)
class GradLoan:
    """Lend a step's last ``micro_batches`` micro-batches to ``devices`` (Trainer-on-RollPool).

    ``devices`` are chips outside the learner mesh (the sampler's); the lent gradients are
    computed there on a mesh of as many of them as divide a micro-batch's rows.
    """

    devices: tuple[jax.Device, ...]
    micro_batches: int

    def __post_init__(self):
        if not self.devices:
            raise ValueError("GradLoan.devices is empty; lend at least one device")
        if not (isinstance(self.micro_batches, int) and self.micro_batches >= 1):
            raise ValueError(
                f"GradLoan.micro_batches={self.micro_batches!r}; lend an integer >= 1 of the "
                "step's micro-batches"
            )


class LentGrads:
    """The gradient half of the train step compiled for a mesh of lent devices."""

    def __init__(self, learner: Learner, devices: Sequence[jax.Device]):
        mesh = make_mesh(devices, {"fsdp": len(devices), "tensor": 1})
        worker = type(learner).__new__(type(learner))
        args = (learner.graphdef, mesh, learner.rules, learner.loss, None, learner.temperature)
        worker._configure(learner.cfg, *args)
        worker.kernel_impl = learner.kernel_impl
        worker.lora, worker.seed = learner.lora, learner.seed
        self.param_shardings = state_shardings(learner.params, mesh, learner.rules)
        grad_shardings = learner.trainable(self.param_shardings)
        self.batch_sharding, rep = worker._batch_sharding, worker._replicated
        self.fn = jax.jit(worker._accumulate, out_shardings=(grad_shardings, rep, rep))
