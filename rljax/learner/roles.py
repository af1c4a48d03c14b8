"""The models beside the policy on the learner's mesh, and what they score a batch with.

``learner.advantage`` decides which exist: gae's critic (:mod:`rljax.learner.critic`: trained
every update; its params and optimiser state ride in the learner's ``opt_state["critic"]``, so
every path that carries the learner's state carries it) and opd's teacher (frozen; its params
are owned here and placed like the policy's). :class:`Roles` builds them on a learner's
mesh, places the teacher, and gives the critic state's shardings, its update and the
per-token scoring (:class:`~rljax.learner.scoring.BatchScoring`) the learner compiles.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
from flax import nnx
from jax.sharding import NamedSharding

from rljax.config import CriticConfig, LearnerConfig
from rljax.learner.critic import Critic, critic_optimizer
from rljax.learner.gradients import Gradients
from rljax.learner.loss_names import TOKEN_ADVANTAGES
from rljax.learner.scoring import BatchScoring
from rljax.models.sharding import state_shardings

Teacher = tuple[nnx.GraphDef, nnx.State]  # a teacher's graph and params


class Roles:
    """The critic (a spec: its state is the learner's), the teacher and its params, and the
    scoring of the per-token estimators, for the learner whose forward is ``gradients``.

    Attributes:
      critic: gae's value model, or None.
      teacher: opd's teacher forward (its own graph; no LoRA, no routes), or None.
      teacher_params: its params on the learner's mesh (None when released or absent).
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
        self.teacher = None
        self.teacher_params = None
        if teacher is not None:
            self.teacher = dataclasses.replace(
                gradients, graphdef=teacher[0], lora=False, router=None
            )
            if place:
                self.place_teacher(teacher[1])
        self.scoring = None
        if cfg.advantage in TOKEN_ADVANTAGES:
            self.scoring = BatchScoring(cfg, gradients, self.critic, self.teacher)

    def place_teacher(self, params: nnx.State) -> None:
        """The teacher's params, copied onto this learner's mesh."""
        g = self.gradients
        shardings = state_shardings(params, g.mesh, g.rules)
        self.teacher_params = jax.device_put(params, shardings, may_alias=False)

    def teacher_arg(self) -> Teacher | None:
        """The teacher as a learner's constructor takes it, or None."""
        if self.teacher is None or self.teacher_params is None:
            return None
        return self.teacher.graphdef, self.teacher_params

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
