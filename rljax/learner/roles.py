"""The models beside the policy on the learner's mesh, and what they score a batch with.

``learner.advantage`` decides which exist: gae's critic (:mod:`rljax.learner.critic`: trained
every update; its params and optimiser state ride in the learner's ``opt_state["critic"]``, so
every path that carries the learner's state carries it) and opd's teacher (frozen; its params
are owned here and placed like the policy's, or on a mesh of its own: ``teacher.devices``,
:class:`~rljax.learner.scoring.TeacherMesh`). :class:`Roles` builds them on a learner's
mesh, places the teacher, and gives the critic state's shardings, its update and the
per-token scoring (:class:`~rljax.learner.scoring.BatchScoring`) the learner compiles.
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import jax
from flax import nnx
from jax.sharding import Mesh, NamedSharding

from rljax.config import CriticConfig, LearnerConfig
from rljax.learner.critic import Critic, critic_optimizer
from rljax.learner.gradients import Gradients
from rljax.learner.loss_names import TOKEN_ADVANTAGES
from rljax.learner.scoring import TEACHER_LOGPROBS, BatchScoring, TeacherMesh
from rljax.models.sharding import state_shardings


class Teacher(NamedTuple):
    """opd's teacher as a learner takes it (a plain (graphdef, params) pair: on its mesh)."""

    graphdef: nnx.GraphDef
    params: nnx.State
    mesh: Mesh | None = None  # its own mesh (teacher.devices); None: the learner's


class Roles:
    """The critic (a spec: its state is the learner's), the teacher and its params, and the
    scoring of the per-token estimators, for the learner whose forward is ``gradients``.

    Attributes:
      critic: gae's value model, or None.
      teacher: opd's teacher forward (its own graph; no LoRA, no routes), or None.
      teacher_mesh: its forward on a mesh of its own (``teacher.devices``), or None.
      teacher_params: its params on the learner's mesh or its own (None when released or
        absent).
      scoring: the per-token estimator's scoring, or None for an outcome estimator.
    """

    def __init__(
        self,
        cfg: LearnerConfig,
        gradients: Gradients,
        *,
        critic: CriticConfig | None,
        hidden_size: int,
        teacher: Teacher | None,
        place: bool = True,
    ):
        self.gradients = gradients
        self.critic = None
        if critic is not None:
            self.critic = Critic(critic, gradients, critic_optimizer(critic, cfg), hidden_size)
        self.teacher = self.teacher_mesh = None
        self.teacher_params = None
        if teacher is not None:
            teacher = Teacher(*teacher)
            self.teacher = dataclasses.replace(
                gradients, graphdef=teacher.graphdef, lora=False, router=None
            )
            if teacher.mesh is not None:
                self.teacher_mesh = TeacherMesh(self.teacher, teacher.mesh)
            if place:
                self.place_teacher(teacher.params)
        self.scoring = None
        if cfg.advantage in TOKEN_ADVANTAGES:
            self.scoring = BatchScoring(cfg, gradients, self.critic, self.teacher)

    def place_teacher(self, params: nnx.State) -> None:
        """The teacher's params, copied onto this learner's mesh, or onto the teacher's own
        (where they already are: frozen and never donated, so learners on other meshes, a
        resize's, share one copy)."""
        own = self.teacher_mesh
        if own is not None:
            self.teacher_params = jax.device_put(params, own.param_shardings(params))
            return
        g = self.gradients
        shardings = state_shardings(params, g.mesh, g.rules)
        self.teacher_params = jax.device_put(params, shardings, may_alias=False)

    def teacher_arg(self) -> Teacher | None:
        """The teacher as a learner's constructor takes it, or None."""
        if self.teacher is None or self.teacher_params is None:
            return None
        mesh = None if self.teacher_mesh is None else self.teacher_mesh.mesh
        return Teacher(self.teacher.graphdef, self.teacher_params, mesh)

    def scoring_args(self, arrays: dict[str, jax.Array]) -> tuple[Any, dict[str, jax.Array]]:
        """The teacher's part of the scoring's arguments, and the batch: its params on this
        mesh, or (on its own mesh) None and the batch with the teacher's log-probs, computed
        there and copied back (:class:`~rljax.learner.scoring.TeacherMesh`)."""
        if self.teacher_mesh is None or self.teacher_params is None:
            return self.teacher_params, arrays
        logp = self.teacher_mesh(self.teacher_params, arrays)
        return None, dict(arrays, **{TEACHER_LOGPROBS: logp})

    # The learner's optimiser state is the policy's alone, or with a critic
    # {"policy": the policy's, "critic": the critic's params and optimiser state}.

    def opt_shardings(
        self, policy: Any, params: Any, shardings: Any, replicated: NamedSharding
    ) -> Any:
        """The learner's optimiser state's shardings, from the policy's part's (``policy``)
        and the policy's ``params`` (or their shapes) on ``shardings``."""
        if self.critic is None:
            return policy
        return {"policy": policy, "critic": self.critic_shardings(params, shardings, replicated)}

    def critic_shardings(self, params: Any, shardings: Any, replicated: NamedSharding) -> Any:
        """Where the critic's state lives, beside a policy of ``params`` on ``shardings``."""
        assert self.critic is not None
        return self.critic.state_shardings(params, shardings, replicated)

    def with_critic(self, policy: Any, critic: Any) -> Any:
        """The learner's optimiser state from the policy's part and a critic state (or its
        shapes; ignored without a critic)."""
        return policy if self.critic is None else {"policy": policy, "critic": critic}

    def policy_opt(self, opt_state: Any) -> Any:
        """The policy's part of the learner's optimiser state."""
        return opt_state if self.critic is None else opt_state["policy"]

    def critic_update(self, params: Any, opt_state: Any, batch: Any) -> tuple[Any, dict]:
        """``opt_state`` with its critic updated once on a scored ``batch``, and its metrics."""
        assert self.critic is not None
        critic_state, metrics = self.critic.update(opt_state["critic"], params, batch)
        return dict(opt_state, critic=critic_state), metrics
