"""A pod on localhost: N processes x D CPU devices joined by ``jax.distributed`` (gloo).

Tests and scripts use it to stand in for a multi-host TPU slice: every process runs the same
command with ``JAX_COORDINATOR_ADDRESS``, ``JAX_NUM_PROCESSES`` and ``JAX_PROCESS_ID`` set,
which :func:`rljax.mesh.distributed.maybe_initialize` reads. ``{pid}`` in an argument is
replaced by the process index (per-process work directories, log names).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_env(devices: int) -> dict[str, str]:
    """This process's environment for a child with ``devices`` CPU devices.

    A forced device count in ``XLA_FLAGS`` (tests/conftest.py sets one) would override
    ``JAX_NUM_CPU_DEVICES``, so it is dropped; every other XLA flag (the suite's LLVM ``-O0``)
    is inherited.
    """
    env = dict(os.environ)
    xla = [f for f in env.get("XLA_FLAGS", "").split() if "host_platform_device_count" not in f]
    env.update(JAX_PLATFORMS="cpu", JAX_NUM_CPU_DEVICES=str(devices), XLA_FLAGS=" ".join(xla))
    return env


def pod_env(pid: int, processes: int, devices: int, port: int, **extra: str) -> dict[str, str]:
    env = cpu_env(devices)
    env.update(
        JAX_COORDINATOR_ADDRESS=f"127.0.0.1:{port}",
        JAX_NUM_PROCESSES=str(processes),
        JAX_PROCESS_ID=str(pid),
        PYTHONUNBUFFERED="1",
    )
    env.update(extra)
    return env


def start(
    argv: list[str], *, processes: int, devices: int, logdir: Path, name: str = "p", **env: str
) -> list[subprocess.Popen]:
    """Starts the pod; process i logs to ``logdir/<name><i>.txt``."""
    port = free_port()
    procs = []
    for pid in range(processes):
        cmd = [sys.executable, *[a.replace("{pid}", str(pid)) for a in argv]]
        log = open(Path(logdir) / f"{name}{pid}.txt", "w")  # noqa: SIM115 - closed by the child's exit
        procs.append(
            subprocess.Popen(
                cmd,
                cwd=REPO,
                env=pod_env(pid, processes, devices, port, **env),
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        )
        log.close()
    return procs


def run(
    argv: list[str],
    *,
    processes: int,
    devices: int,
    logdir: Path,
    name: str = "p",
    timeout: float = 600,
    **env: str,
) -> tuple[list[int], list[str]]:
    """Runs the pod to the end; returns (exit codes, logs)."""
    procs = start(argv, processes=processes, devices=devices, logdir=logdir, name=name, **env)
    try:
        for p in procs:
            p.wait(timeout=timeout)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    logs = [(Path(logdir) / f"{name}{i}.txt").read_text() for i in range(processes)]
    return [p.returncode for p in procs], logs


def result(log: str) -> Any:
    """The JSON object a pod process printed after ``RESULT `` in its log.

    Parsed with ``raw_decode``: gloo's C++ logging can land on the same line, right after it.
    """
    return json.JSONDecoder().raw_decode(log.split("RESULT ", 1)[1])[0]


class MemoryChannel:
    """The coordination service's key-value store, in memory: enough of Channel for threads."""

    def __init__(self, *, blocking: bool = True, count: int = 1):
        # blocking=False: a get of a key nobody posted raises at once (single-threaded tests)
        self.blocking, self.count = blocking, count
        self.store: dict[str, object] = {}
        self.cond = threading.Condition()
        self.failed: BaseException | None = None

    def post(self, key, value, *, overwrite=False):
        with self.cond:
            assert overwrite or key not in self.store, f"{key} posted twice"
            self.store[key] = value
            self.cond.notify_all()

    def get(self, key, *, waiting_for="the pod"):
        with self.cond:
            while key not in self.store:
                if self.failed is not None:
                    raise RuntimeError(f"lost while waiting for {waiting_for}")
                if not self.blocking:
                    raise LookupError(f"nothing posted under {key!r} ({waiting_for})")
                self.cond.wait()
            return self.store[key]

    def try_get(self, key):
        with self.cond:
            return self.store.get(key)

    def keys(self, directory):
        with self.cond:
            return [k for k in self.store if k.startswith(f"{directory}/")]

    def delete(self, key):
        with self.cond:
            self.store.pop(key, None)

    def fail(self, error):
        with self.cond:
            self.failed = error
            self.cond.notify_all()
