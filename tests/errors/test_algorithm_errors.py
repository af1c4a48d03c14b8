"""Bad algorithm configs (docs/errors.md, Algorithms): the estimator's roles must exist exactly
when it reads them, and a teacher must read the policy's token ids. One line, nothing written."""

import pytest

CASES = [
    ("A01", ["--config.learner.advantage=gae"], "set critic.enabled=True"),
    ("A02", ["--config.critic.enabled=True"], "only gae reads a critic's values"),
    ("A03", ["--config.learner.advantage=opd"], "set teacher.init to a run's workdir"),
    (
        "A04",
        ["--config.learner.advantage=opd", "--config.teacher.init=smollm2"],
        "pick a teacher trained with the policy's tokenizer",
    ),
    ("A05", ["--config.learner.kl_reward=0.1"], "only reinforce_plus_plus puts the KL"),
]


@pytest.mark.parametrize("row_id, args, fix", CASES, ids=[c[0] for c in CASES])
def test_bad_algorithm_config(launch_error, check_row, row_id, args, fix):
    check_row(row_id, launch_error(*args), fix)
