"""scripts/gcp/ job on the VM (setup.sh, launch.sh, status.sh, stop.sh), against a fake
gcloud that runs the remote scripts in fake worker homes.
"""

import subprocess
import textwrap

import pytest

from tests.scripts.gcp.fake_gcloud import (
    BASE,
    FAKE_UV,
    LOC,
    STUBBORN_LAUNCHER,
    VM_DESCRIBE,
    alive,
    dry_run_commands,
)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--config=configs/tiny.py"], "missing --workdir=gs://BUCKET/PATH (or --bucket=BUCKET"),
        (
            ["--config=configs/tiny.py", "--workdir=/tmp/run"],
            "--workdir='/tmp/run' must be a gs://",
        ),
        (["--config=configs/tiny.py", "--bucket=Bad Bucket"], "is not a bucket name"),
        (["--bucket=b"], "missing --config (or RLJAX_CONFIG)"),
        (["--config=/abs/x.py", "--bucket=bkt"], "must be a config file relative to the repo root"),
        (["--config=configs/tiny.py", "--bucket=bkt", "--env=oops"], "is not KEY=VALUE"),
    ],
)
def test_launch_rejects_bad_input(fake, args, message):
    result = fake.run("launch.sh", *BASE, *args)
    assert result.returncode == 2
    assert message in result.stderr
    assert fake.calls() == []


def test_launch_dry_run_sends_config_and_gs_workdir_to_all_workers(fake):
    result = fake.run(
        "launch.sh",
        *BASE,
        "--config=configs/tiny.py:small",
        "--bucket=gs://bkt",
        "--config.buffer.max_staleness=2",
        "--dry-run",
    )
    assert result.returncode == 0, result.stderr
    describe_cmd, ssh_cmd = dry_run_commands(result.stdout)
    assert describe_cmd == ["gcloud", *VM_DESCRIBE]
    command = ssh_cmd.pop()
    assert ssh_cmd == [
        "gcloud",
        "compute",
        "tpus",
        "tpu-vm",
        "ssh",
        "rljax-test",
        *LOC,
        "--worker=all",
    ]
    first_line = command.removeprefix("--command=").splitlines()[0]
    assert first_line == (
        "LAUNCH_ARGS=( --config=configs/tiny.py:small "
        "--config.buffer.max_staleness=2 --workdir=gs://bkt/rljax/tiny-small )"
    )
    assert "setsid nohup" in command
    assert fake.calls() == []


def test_launch_refuses_missing_tpu_vm(fake):
    result = fake.run(
        "launch.sh", *BASE, "--config=configs/tiny.py", "--bucket=bkt", FAKE_TPU_STATE=""
    )
    assert result.returncode == 2
    message = "TPU VM 'rljax-test' not found in my-project/us-east5-b; create it first"
    assert message in result.stderr
    assert fake.calls() == [VM_DESCRIBE]


def test_launch_status_stop_cycle_on_two_workers(fake):
    homes = fake.workers(2)
    launch = [
        *BASE,
        "--config=configs/tiny.py",
        "--workdir=gs://bkt/runs/a/",
        "--config.learner.lr=1e-6",
        "--env=LIBTPU_INIT_ARGS=--xla_x=1 --xla_y=2",
        "--",
        "--alsologtostderr",
    ]
    result = fake.run("launch.sh", *launch)
    assert result.returncode == 0, result.stderr
    ssh = fake.calls()[-1]
    assert ssh[:8] == ["compute", "tpus", "tpu-vm", "ssh", "rljax-test", *LOC, "--worker=all"]
    pids = []
    for home in homes:
        pid = int((home / "rljax_logs" / "rljax.pid").read_text())
        assert alive(pid)
        pids.append(pid)
        args_file = home / "launcher_args"
        for _ in range(100):
            if args_file.exists() and args_file.read_text():
                break
            subprocess.run(["sleep", "0.05"])
        assert args_file.read_text().splitlines() == [
            "--config=configs/tiny.py",
            "--config.learner.lr=1e-6",
            "--workdir=gs://bkt/runs/a",
            "--alsologtostderr",
        ]
        assert (home / "launcher_env").read_text() == "--xla_x=1 --xla_y=2\n"
    assert result.stdout.count("launched rljax (pid") == 2

    again = fake.run("launch.sh", *launch)
    assert again.returncode == 0
    assert again.stdout.count("already running") == 2
    assert [int((h / "rljax_logs" / "rljax.pid").read_text()) for h in homes] == pids

    status = fake.run(
        "status.sh",
        *BASE,
        "--lines=5",
        "--workdir=gs://bkt/runs/a",
        FAKE_METRICS='{"step": 1}\n{"step": 2}\n',
    )
    assert status.returncode == 0, status.stderr
    assert "TPU VM rljax-test: READY (health HEALTHY)" in status.stdout
    assert status.stdout.count(": RUNNING (pid") == 2
    assert "launch: rljax --config=configs/tiny.py" in status.stdout
    assert status.stdout.rstrip().endswith('{"step": 1}\n{"step": 2}')
    assert fake.calls()[-1] == ["storage", "cat", "gs://bkt/runs/a/metrics.jsonl"]

    stop = fake.run("stop.sh", *BASE, "--grace-seconds=30")
    assert stop.returncode == 0, stop.stderr
    assert stop.stdout.count("sent SIGTERM") == 2
    assert stop.stdout.count("rljax stopped after") == 2
    for home, pid in zip(homes, pids):
        assert not alive(pid)
        assert not (home / "rljax_logs" / "rljax.pid").exists()
        assert "checkpoint saved" in (home / "rljax_logs" / "rljax.log").read_text()

    assert fake.run("stop.sh", *BASE).stdout.count("no rljax job running") == 2
    assert fake.run("status.sh", *BASE).stdout.count(": NOT RUNNING") == 2


def test_launch_reports_config_missing_on_worker(fake):
    fake.workers(1)
    result = fake.run("launch.sh", *BASE, "--config=configs/absent.py", "--bucket=bkt")
    assert result.returncode == 3
    assert "config configs/absent.py not found in ~/rljax" in result.stderr


def test_stop_waits_for_grace_then_needs_force(fake):
    (home,) = fake.workers(1, launcher=STUBBORN_LAUNCHER)
    assert fake.run("launch.sh", *BASE, "--config=configs/tiny.py", "--bucket=bkt").returncode == 0
    pid = int((home / "rljax_logs" / "rljax.pid").read_text())
    stuck = fake.run("stop.sh", *BASE, "--grace-seconds=1")
    assert stuck.returncode == 4
    assert "still running after 1s; rerun stop.sh, or add --force" in stuck.stderr
    assert alive(pid)
    forced = fake.run("stop.sh", *BASE, "--grace-seconds=1", "--force")
    assert forced.returncode == 0, forced.stderr
    assert "sent SIGKILL" in forced.stdout
    for _ in range(100):
        if not alive(pid):
            break
        subprocess.run(["sleep", "0.05"])
    assert not alive(pid)


def test_stop_and_status_when_tpu_vm_is_gone(fake):
    stop = fake.run("stop.sh", *BASE, FAKE_TPU_STATE="")
    assert stop.returncode == 0
    assert "not found in my-project/us-east5-b; no job to stop" in stop.stderr
    status = fake.run("status.sh", *BASE, FAKE_TPU_STATE="", FAKE_QR_STATES="NOT_FOUND")
    assert status.returncode == 1
    assert "TPU VM rljax-test: not found" in status.stdout


def test_status_follow_dry_run(fake):
    result = fake.run("status.sh", *BASE, "--follow", "--dry-run")
    assert result.returncode == 0, result.stderr
    commands = dry_run_commands(result.stdout)
    assert [c[4] for c in commands] == ["describe", "describe", "ssh", "ssh"]
    assert commands[-1][-2:] == ["--worker=0", "--command=tail -n 0 -F ~/rljax_logs/rljax.log"]
    assert fake.calls() == []


def test_setup_ships_checkout_and_installs_on_every_worker(fake):
    homes = fake.workers(2)
    uv = fake.bin / "uv"
    uv.write_text(FAKE_UV)
    uv.chmod(0o755)
    result = fake.run("setup.sh", *BASE, "--extra-pip=tensorboard-plugin-profile")
    assert result.returncode == 0, result.stderr
    calls = fake.calls()
    assert calls[0] == VM_DESCRIBE
    scp = calls[1]
    assert scp[:4] == ["compute", "tpus", "tpu-vm", "scp"]
    assert scp[5:] == ["rljax-test:rljax-src.tar.gz", *LOC, "--worker=all"]
    assert calls[2][:8] == ["compute", "tpus", "tpu-vm", "ssh", "rljax-test", *LOC, "--worker=all"]
    assert result.stdout.count("rljax ready, jax 0.fake") == 2
    for home in homes:
        assert (home / "rljax" / "pyproject.toml").is_file()
        assert (home / "rljax" / "scripts" / "gcp" / "launch.sh").is_file()
        assert not (home / "rljax-src.tar.gz").exists()
        venv_call, install_call = (home / "uv_calls").read_text().splitlines()
        assert venv_call == f"venv --quiet --python 3.11 {home}/rljax-venv"
        assert install_call.startswith(
            f"pip install --quiet --python {home}/rljax-venv/bin/python -e {home}/rljax jax[tpu] "
            "tensorboard-plugin-profile --find-links "
        )


def test_setup_refuses_worker_with_running_job(fake):
    fake.workers(1)
    assert fake.run("launch.sh", *BASE, "--config=configs/tiny.py", "--bucket=bkt").returncode == 0
    result = fake.run("setup.sh", *BASE, "--repo-url=https://github.com/org/rljax.git")
    assert result.returncode == 3
    assert "stop it with stop.sh before setup" in result.stderr


def test_setup_dry_run_with_repo_url(fake):
    result = fake.run(
        "setup.sh",
        *BASE,
        "--repo-url=https://github.com/org/rljax.git",
        "--git-ref=v0.1",
        "--dry-run",
    )
    assert result.returncode == 0, result.stderr
    describe_cmd, ssh_cmd = dry_run_commands(result.stdout)
    assert ssh_cmd[:9] == [
        "gcloud",
        "compute",
        "tpus",
        "tpu-vm",
        "ssh",
        "rljax-test",
        *LOC,
        "--worker=all",
    ]
    assert ssh_cmd[-1].startswith(
        textwrap.dedent("""\
        --command=REPO_URL=https://github.com/org/rljax.git
        GIT_REF=v0.1
        TARBALL_NAME=''
        PYTHON_VERSION=3.11
        """)
    )
    assert fake.calls() == []
    bad = fake.run("setup.sh", *BASE, "--repo-url=github.com/org/rljax")
    assert bad.returncode == 2 and "is not a git URL" in bad.stderr
