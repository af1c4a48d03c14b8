"""Run a model's Python program in a bounded subprocess: the ``python`` tool.

:func:`run_python` starts ``python -I -S -B`` (isolated: no user site, no ``PYTHON*``
variables, no site-packages, so the standard library only; no bytecode written) on
:mod:`rljax.envs.sandbox_guard`, which lowers the child's resource limits, installs an audit
hook and runs the program. The child gets

- a private temporary directory as its cwd, ``HOME`` and ``TMPDIR``, deleted afterwards;
- an environment of ``PATH``, ``LANG``, ``HOME`` and ``TMPDIR`` only: nothing the parent holds
  (API keys, tokens) is inherited;
- stdin from ``/dev/null``, and its own session and process group;
- rlimits: CPU seconds (``RLIMIT_CPU``), address space (``RLIMIT_AS``), file size
  (``RLIMIT_FSIZE``), open files (``RLIMIT_NOFILE``), no core files, and, if asked,
  processes (``RLIMIT_NPROC``: counted per user, and not enforced for root);
- a wall-clock timeout, and output read up to a cap; past either, and in any case when the
  program ends, the whole process group is killed, so no process it started survives it.

The audit hook refuses the network (``socket.*``), new processes (``subprocess``, ``os.fork``,
``os.exec*``, ``os.posix_spawn``, ``os.system``), signals, ctypes, raising the limits, and
writes, renames, deletions and mode changes outside the temporary directory; a refused
operation ends the program (kind ``"refused"``).

What this does *not* give: a security boundary. Audit hooks guard against accidents and naive
programs; code written to escape can get around them (a bug in CPython, a C extension, the
many objects the hook never sees), and reads anywhere the parent's user can read are allowed.
The rlimits, the timeout and the process-group kill hold whatever the program does; a process
that starts a new session escapes the kill only if it could create a process at all. For
hostile code, run the tool in a container or a syscall sandbox (gVisor, nsjail, firejail).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import selectors
import signal
import subprocess
import sys
import tempfile
import time
from typing import Any

from rljax.envs import sandbox_guard
from rljax.envs.tool_calls import ToolError

KINDS = ("timeout", "cpu", "memory", "output", "refused", "error", "killed")
TIMEOUT_S = 5.0
CPU_S = 2
MEMORY_BYTES = 256 * 2**20
OUTPUT_BYTES = 16 * 2**10
FILE_BYTES = 1 * 2**20
MAX_OPEN_FILES = 64
_GUARD = os.path.abspath(sandbox_guard.__file__)
_DRAIN_S = 1.0  # after the kill, how long to wait for the pipes to close


@dataclasses.dataclass(frozen=True)
class SandboxResult:
    """How a sandboxed program ended.

    Attributes:
      ok: it exited with status 0 within every limit.
      stdout, stderr: what it printed (each cut at the output limit), decoded as UTF-8.
      kind: None if ok; else why not, one of :data:`KINDS`: ``timeout`` (the wall clock),
        ``cpu`` (CPU seconds), ``memory`` (address space), ``output`` (printed past the
        limit), ``refused`` (the audit hook stopped an operation), ``error`` (a
        non-zero exit, e.g. an uncaught exception), ``killed`` (another signal).
    """

    ok: bool
    stdout: str
    stderr: str
    kind: str | None


def _kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):  # the group is gone already
        os.killpg(pgid, signal.SIGKILL)


def _read_capped(
    proc: subprocess.Popen, deadline: float, cap: int
) -> tuple[bytes, bytes, str | None]:
    """stdout and stderr of ``proc``, each up to ``cap`` bytes, and "timeout"/"output" if it
    was killed for running past ``deadline`` or printing past ``cap``, else None.

    The process group is killed as soon as the program exits (its children with it), on the
    deadline or on the cap; reading then stops once the pipes close, or after ``_DRAIN_S``.
    """
    assert proc.stdout is not None and proc.stderr is not None
    chunks: dict[int, bytearray] = {proc.stdout.fileno(): bytearray()}
    chunks[proc.stderr.fileno()] = bytearray()
    kind: str | None = None
    killed_at: float | None = None
    with selectors.DefaultSelector() as selector:
        for fd in chunks:
            selector.register(fd, selectors.EVENT_READ)
        # Until the program exits, not until its pipes close: it may close them and run on
        # (select on no pipes just waits).
        while True:
            now = time.monotonic()
            if killed_at is None and now >= deadline:
                kind = "timeout"  # the program, or a process it left holding a pipe
                _kill_group(proc.pid)
                killed_at = now
            elif killed_at is None and proc.poll() is not None:
                _kill_group(proc.pid)  # what it started dies with it
                killed_at = now
            if killed_at is not None and (not selector.get_map() or now - killed_at > _DRAIN_S):
                break  # after _DRAIN_S, a process outside the group holds a pipe: stop listening
            wait_s = deadline - now if killed_at is None else _DRAIN_S
            for key, _ in selector.select(timeout=min(max(wait_s, 0.0), 0.05)):
                data = os.read(key.fd, 65536)
                if not data:
                    selector.unregister(key.fd)
                    continue
                buf = chunks[key.fd]
                room = cap - len(buf)
                buf += data[: max(room, 0)]
                if len(data) > room and killed_at is None:
                    kind = "output"
                    _kill_group(proc.pid)
                    killed_at = time.monotonic()
    _kill_group(proc.pid)
    return bytes(chunks[proc.stdout.fileno()]), bytes(chunks[proc.stderr.fileno()]), kind


def _kind(returncode: int) -> str | None:
    if returncode == 0:
        return None
    if returncode == sandbox_guard.REFUSED_EXIT:
        return "refused"
    if returncode == sandbox_guard.MEMORY_EXIT:
        return "memory"
    if returncode == -signal.SIGXCPU:
        return "cpu"
    return "killed" if returncode < 0 else "error"


def run_python(
    code: str,
    *,
    timeout_s: float = TIMEOUT_S,
    cpu_s: int = CPU_S,
    memory_bytes: int = MEMORY_BYTES,
    output_bytes: int = OUTPUT_BYTES,
    file_bytes: int = FILE_BYTES,
    max_open_files: int = MAX_OPEN_FILES,
    max_processes: int | None = None,
) -> SandboxResult:
    """Run the Python program ``code`` in a bounded subprocess (the module docstring says how,
    and what it does not protect against).

    Args:
      timeout_s: wall-clock limit; past it the process group is killed (kind ``timeout``).
      cpu_s: CPU seconds (``RLIMIT_CPU``; kind ``cpu``).
      memory_bytes: address space (``RLIMIT_AS``; an uncaught MemoryError is kind ``memory``).
      output_bytes: bytes kept of stdout and of stderr; printing more kills it (``output``).
      file_bytes: largest file it may write (``RLIMIT_FSIZE``); a write past it fails with
        ``OSError: File too large`` (Python ignores SIGXFSZ), kind ``error`` if uncaught.
      max_open_files: ``RLIMIT_NOFILE``.
      max_processes: ``RLIMIT_NPROC`` if given. It counts every process of the user, not just
        the sandbox's, and root is exempt: the audit hook and the group kill are what stop
        forks. Leave None unless the tool runs as its own user.
    """
    limits = {
        "RLIMIT_CPU": int(cpu_s),
        "RLIMIT_AS": int(memory_bytes),
        "RLIMIT_FSIZE": int(file_bytes),
        "RLIMIT_NOFILE": int(max_open_files),
        "RLIMIT_CORE": 0,
    }
    if max_processes is not None:
        limits["RLIMIT_NPROC"] = int(max_processes)
    with tempfile.TemporaryDirectory(
        prefix="rljax-sandbox-", ignore_cleanup_errors=True
    ) as scratch:
        root = os.path.realpath(scratch)
        program = os.path.join(root, "main.py")
        with open(program, "w", encoding="utf-8") as f:
            f.write(code)
        env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": root, "TMPDIR": root}
        argv = [sys.executable, "-I", "-S", "-B", "-X", "utf8", _GUARD, json.dumps(limits)]
        proc = subprocess.Popen(
            [*argv, root, program],
            cwd=root,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,  # its own process group, killed whole
            close_fds=True,
        )
        with proc:
            deadline = time.monotonic() + timeout_s
            out, err, kind = _read_capped(proc, deadline, output_bytes)
            returncode = proc.wait()
    kind = kind or _kind(returncode)
    return SandboxResult(
        ok=kind is None,
        stdout=out.decode("utf-8", errors="replace"),
        stderr=err.decode("utf-8", errors="replace"),
        kind=kind,
    )


def _last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1][:300] if lines else ""


def python_tool(
    code: str,
    *,
    timeout_s: float = TIMEOUT_S,
    cpu_s: int = CPU_S,
    memory_bytes: int = MEMORY_BYTES,
    output_bytes: int = OUTPUT_BYTES,
    **limits: Any,
) -> str:
    """The ``python`` tool: run ``code`` with :func:`run_python` (the same limits, defaults
    included) and return what it printed; a ToolError naming the kind and why (the limit, or
    the program's last error line, e.g. its exception) if it did not end well.

    Other limits make another tool: ``dataclasses.replace(PYTHON, fn=functools.partial(
    python_tool, timeout_s=30))``.
    """
    if not isinstance(code, str):
        raise ToolError(f"code must be a string, got {type(code).__name__}")
    result = run_python(
        code,
        timeout_s=timeout_s,
        cpu_s=cpu_s,
        memory_bytes=memory_bytes,
        output_bytes=output_bytes,
        **limits,
    )
    if result.ok:
        return result.stdout
    explained = {
        "timeout": f"the program ran past the {timeout_s:g} s time limit",
        "cpu": f"the program used more than {cpu_s} s of CPU",
        "memory": f"the program used more than {memory_bytes / 2**20:g} MiB of memory",
        "output": f"the program printed more than {output_bytes / 2**10:g} KiB",
        "killed": "the program was killed by a signal",
    }
    assert result.kind is not None
    detail = explained.get(result.kind) or _last_line(result.stderr) or "it exited non-zero"
    raise ToolError(f"{result.kind}: {detail}")
