"""Bad algorithm configs (docs/errors.md, Algorithms): the estimator's roles must exist exactly
when it reads them, and a teacher must read the policy's token ids. One line, nothing written."""

import jax
import pytest

from rljax.config import ConfigError

# opd with a teacher that is never read: the teacher's devices are checked first
OPD = ["--config.learner.advantage=opd", "--config.teacher.init=/no/teacher"]
SPLIT = [
    "--config.mesh.mode=split",
    "--config.mesh.sampler_devices=4",
    "--config.mesh.learner_devices=2",
]

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
    ("A06", ["--config.teacher.devices=(1,1)"], "or () for the learner mesh"),
    ("A07", ["--config.teacher.devices=(2,)"], "() without teacher.init"),
    (
        "A08",
        [*OPD, f"--config.teacher.devices=({len(jax.local_devices())},)"],
        f"use indices below {len(jax.local_devices())}",
    ),
    ("A09", [*OPD, *SPLIT, "--config.teacher.devices=(5,6)"], "pick devices neither mesh takes"),
]


@pytest.mark.parametrize("row_id, args, fix", CASES, ids=[c[0] for c in CASES])
def test_bad_algorithm_config(launch_error, check_row, row_id, args, fix):
    check_row(row_id, launch_error(*args), fix)


def _opd(devices=(0, 5), **mesh):
    from rljax.config import LearnerConfig, MeshConfig, RunConfig, TeacherConfig

    teacher = TeacherConfig(init="/no/teacher", devices=devices)
    return RunConfig(
        learner=LearnerConfig(advantage="opd"), teacher=teacher, mesh=MeshConfig(**mesh)
    )


def test_a_teacher_mesh_of_its_own_on_a_pod(check_row, monkeypatch):
    from rljax.runtime import teacher

    monkeypatch.setattr(teacher.jax, "process_count", lambda: 2)
    with pytest.raises(ConfigError) as e:
        teacher.check_teacher_devices(_opd(devices=(2,)))
    check_row("A10", str(e.value), "set teacher.devices=()")


def test_the_teachers_devices_may_be_shared_in_colocated_mode_and_free_ones_in_split():
    from rljax.runtime.teacher import check_teacher_devices

    check_teacher_devices(_opd())  # colocated: the teacher shares them with both roles
    split = dict(mode="split", sampler_devices=2, learner_devices=2)
    with pytest.raises(ConfigError, match="names local device 0, which"):
        check_teacher_devices(_opd(**split))
    check_teacher_devices(_opd(**split), jax.devices()[1:])  # the run's 4 start at device 1
    # a scheduled resize to 4/2 takes devices 0-5, device 5 included, at version 3
    with pytest.raises(ConfigError, match="the run's first 6 devices"):
        check_teacher_devices(_opd(**split, resize_schedule="3:4/2"), jax.devices()[1:])
