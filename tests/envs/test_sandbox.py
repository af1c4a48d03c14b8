"""The python sandbox: each way a program can misbehave is stopped and reported by kind, and
leaves nothing behind (no file outside its directory, no process, no secret seen).

Limits are small (1-2 s) so the suite stays fast; a timeout firing is the only timing these
tests rely on, and a limit that fails to hold makes its test fail on the kind it reports.
"""

import concurrent.futures
import json
import os
import socket
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from rljax.envs.sandbox import _read_capped, python_tool, run_python
from rljax.envs.tool_calls import ToolError

REPO = Path(__file__).resolve().parents[2]


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, killed but not reaped by init, counts as gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rpartition(")")[2].split()[0] not in ("Z", "X")


def _none_alive(pids: list[int]) -> bool:
    # SIGKILL is delivered asynchronously: give the kernel a moment to finish the processes.
    deadline = time.monotonic() + 5.0
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.01)
    return not any(_alive(p) for p in pids)


def test_runs_a_program():
    result = run_python("print(sum(range(10)))")
    assert result.ok and result.kind is None
    assert result.stdout == "45\n" and result.stderr == ""


def test_socket_is_refused():
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        result = run_python(
            f"import socket\ns = socket.create_connection(('127.0.0.1', {port}))\n"
            "s.sendall(b'escaped')\nprint('connected')"
        )
        server.setblocking(False)
        with pytest.raises(BlockingIOError):
            server.accept()  # nobody connected
    assert not result.ok and result.kind == "refused"
    assert "sandbox: refused socket." in result.stderr and "connected" not in result.stdout


def _escapes(target: Path) -> dict[str, str]:
    """Programs that try to change ``target`` (outside the sandbox) or files beside it."""
    victim = target.with_name(target.name + ".victim")
    return {
        "open w": f"open({str(target)!r}, 'w').write('x')",
        "open a": f"open({str(target)!r}, 'a').write('x')",
        "os.open": f"import os\nos.close(os.open({str(target)!r}, os.O_WRONLY | os.O_CREAT))",
        "mkdir": f"import os\nos.mkdir({str(target)!r})",
        "symlink then write": f"import os\nos.symlink({str(target)!r}, 'link')\n"
        "open('link', 'w').write('x')",
        "remove": f"import os\nos.remove({str(victim)!r})",
        "rename": f"import os\nos.rename({str(victim)!r}, {str(target)!r})",
        "chmod": f"import os\nos.chmod({str(victim)!r}, 0o777)",
        "truncate": f"import os\nos.truncate({str(victim)!r}, 0)",
        "copy": f"import shutil\nshutil.copy({str(victim)!r}, {str(target)!r})",
    }


@pytest.mark.parametrize("where", ["tmp", "repo", "relative"])
@pytest.mark.parametrize("how", sorted(_escapes(Path("x"))))
def test_writes_outside_are_refused(where, how, tmp_path):
    name = f"rljax_escape_{uuid.uuid4().hex}"
    target = {"tmp": tmp_path / name, "repo": REPO / name, "relative": Path("/tmp") / name}[where]
    victim = target.with_name(target.name + ".victim")
    victim.write_text("keep")
    victim.chmod(0o644)
    code = _escapes(target)[how]
    if where == "relative":  # the sandbox's cwd is /tmp/rljax-sandbox-*: "../" leaves it
        code = code.replace(str(target), f"../{name}").replace(str(victim), f"../{name}.victim")
    try:
        result = run_python(code)
        assert not result.ok and result.kind == "refused", result
        assert not os.path.lexists(target)
        assert victim.read_text() == "keep" and victim.stat().st_mode & 0o777 == 0o644
    finally:
        for p in (target, victim):
            if p.is_dir():
                p.rmdir()
            elif os.path.lexists(p):
                p.unlink()


def test_writes_inside_its_directory_work():
    result = run_python(
        "import os, shutil\nos.makedirs('a/b')\nopen('a/b/c.txt', 'w').write('hi')\n"
        "shutil.copy('a/b/c.txt', 'd.txt')\nos.rename('d.txt', 'e.txt')\n"
        "print(open('e.txt').read())\nshutil.rmtree('a')\nos.remove('e.txt')\n"
        "print(sorted(os.listdir('.')), os.environ['HOME'] == os.getcwd())\n"
        "import tempfile\nwith tempfile.NamedTemporaryFile('w') as f: f.write('x')"
    )
    assert result.ok, result
    assert result.stdout == "hi\n['main.py'] True\n"


def test_its_directory_is_removed():
    result = run_python("import os\nopen('left.txt', 'w').write('x')\nprint(os.getcwd())")
    assert result.ok
    assert not os.path.exists(result.stdout.strip())


FORKS = {
    "os.fork": "import os, time\nfor _ in range(3):\n    pid = os.fork()\n"
    "    if pid == 0:\n        time.sleep(60)\n    print(pid, flush=True)\n",
    "subprocess": "import subprocess\nfor _ in range(3):\n"
    "    print(subprocess.Popen(['sleep', '60']).pid, flush=True)\n",
    "multiprocessing": "import multiprocessing as mp, time\nfor _ in range(3):\n"
    "    p = mp.Process(target=time.sleep, args=(60,))\n    p.start()\n"
    "    print(p.pid, flush=True)\n",
    "os.system": "import os\nos.system('sleep 60 &')\nprint(0)",
}


@pytest.mark.parametrize("how", sorted(FORKS))
def test_new_processes_are_refused(how):
    result = run_python(FORKS[how], timeout_s=2)
    assert not result.ok and result.kind == "refused", result
    assert _none_alive([int(p) for p in result.stdout.split() if int(p) > 0])


def test_no_process_of_the_group_survives_its_leader():
    """Whatever a program started in its process group dies with it, even when the program
    exits first (here a shell leaves a background sleep holding the output pipe)."""
    proc = subprocess.Popen(
        ["sh", "-c", "sleep 60 & echo $!"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    with proc:
        out, _, kind = _read_capped(proc, time.monotonic() + 10, 4096)
        proc.wait()
    assert kind is None  # the pipe closed when the group was killed, not at the deadline
    assert _none_alive([int(out)])


def test_ctypes_is_refused():
    result = run_python("import ctypes\nprint(ctypes.CDLL(None).getpid())")
    assert result.kind == "refused" and "ctypes" in result.stderr


def test_a_busy_loop_is_stopped_by_the_cpu_limit():
    result = run_python("while True:\n    pass", cpu_s=1, timeout_s=10)
    assert not result.ok and result.kind == "cpu"


def test_a_sleeping_program_is_stopped_by_the_timeout():
    # Wakes after 5 s, so that without the timeout it ends "ok" and the test fails.
    code = "import time\nprint('start', flush=True)\ntime.sleep(5)\nprint('woke')"
    result = run_python(code, timeout_s=1)
    assert not result.ok and result.kind == "timeout"
    assert result.stdout == "start\n"


def test_a_program_that_closes_its_output_is_still_timed_out():
    code = "import os, time\nos.close(1)\nos.close(2)\ntime.sleep(60)"
    result = run_python(code, timeout_s=1)
    assert not result.ok and result.kind == "timeout"


def test_unbounded_allocation_is_stopped_by_the_memory_limit():
    # Stops by itself at 1 GiB, so that without the limit it ends "ok" and the test fails.
    code = (
        "chunks = []\nfor _ in range(64):\n    chunks.append(bytearray(16 * 2**20))\nprint('done')"
    )
    result = run_python(code, memory_bytes=128 * 2**20)
    assert not result.ok and result.kind == "memory"
    assert "done" not in result.stdout


def test_unbounded_printing_is_cut_at_the_output_limit():
    result = run_python("while True:\n    print('x' * 1000)", output_bytes=4096, timeout_s=10)
    assert not result.ok and result.kind == "output"
    assert len(result.stdout) == 4096


def test_a_large_file_fails_at_the_file_limit():
    result = run_python("open('big', 'wb').write(b'x' * 2**21)", file_bytes=2**20)
    assert not result.ok and result.kind == "error"
    assert "File too large" in result.stderr


def test_secrets_in_the_environment_are_not_inherited(monkeypatch):
    monkeypatch.setenv("RLJAX_SECRET", "hunter2")
    result = run_python("import json, os\nprint(json.dumps(dict(os.environ)))")
    assert result.ok
    assert "hunter2" not in result.stdout
    assert set(json.loads(result.stdout)) == {"PATH", "LANG", "HOME", "TMPDIR"}


def test_an_exception_is_an_error_with_the_programs_own_traceback():
    result = run_python("def f():\n    raise ValueError('boom')\nf()")
    assert not result.ok and result.kind == "error"
    assert result.stderr.strip().endswith("ValueError: boom")
    assert "sandbox_guard" not in result.stderr


def test_runs_from_several_threads_at_once():
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda i: run_python(f"print({i} * 2)"), range(8)))
    assert [r.stdout for r in results] == [f"{i * 2}\n" for i in range(8)]


def test_python_tool_returns_output_or_raises_with_the_kind():
    assert python_tool("print(6 * 7)") == "42\n"
    with pytest.raises(ToolError, match=r"^error: ValueError: boom$"):
        python_tool("raise ValueError('boom')")
    with pytest.raises(ToolError, match=r"^refused: sandbox: refused socket\."):
        python_tool("import socket\nsocket.socket()")
    with pytest.raises(ToolError, match=r"^timeout: the program ran past the 0.5 s time limit$"):
        python_tool("import time\ntime.sleep(5)", timeout_s=0.5)
    with pytest.raises(ToolError, match=r"^output: the program printed more than 1 KiB$"):
        python_tool("print('x' * 2000)", output_bytes=1024)
