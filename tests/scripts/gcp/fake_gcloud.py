"""A fake `gcloud` for the tests of scripts/gcp/, and what those tests share.

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
import signal
import subprocess
import sys

REPO = pathlib.Path(__file__).resolve().parents[3]
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
