"""The built-in losses by name (``rljax.learner.losses.LOSSES``), and what each needs of the
rest of the run config.

Kept apart from ``rljax.learner.losses`` (which needs JAX) so that the config names them
without importing JAX; tests/config/test_registries.py checks that the two list the same
losses. No built-in loss needs another key's value today: DAPO's dynamic sampling, for one, is
the buffer's own switch. A loss registered at run time (``rljax.LOSSES``) declares nothing.
"""

from rljax.needs import NOTHING, Needs

LOSS_NEEDS: dict[str, Needs] = {
    "grpo": NOTHING,
    "dapo": NOTHING,
    "dr_grpo": NOTHING,
    "gspo": NOTHING,
    "decoupled_ppo": NOTHING,
    "sft": NOTHING,
}

# The advantage estimators by name (``learner.advantage``): the outcome ones, one number per
# response on the host (rljax.learner.advantages.outcome_advantages), then the per-token ones
# the learner computes at step time (rljax.learner.token_advantages).
OUTCOME_ADVANTAGES = ("grpo", "rloo", "reinforce_plus_plus_baseline")
TOKEN_ADVANTAGES = ("reinforce_plus_plus", "gae", "opd")
ADVANTAGE_NAMES = OUTCOME_ADVANTAGES + TOKEN_ADVANTAGES
