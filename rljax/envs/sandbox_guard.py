"""What the sandbox's child process runs first: its limits, an audit hook, then the program.

Run by :func:`rljax.envs.sandbox.run_python` as
``python -I -S -B sandbox_guard.py LIMITS_JSON ROOT PROGRAM``; standalone (it imports nothing
from rljax, whose site-packages the child does not see). It

1. lowers its own resource limits (soft = hard, so they cannot be raised again; lowering needs
   no privilege and, unlike ``preexec_fn``, is safe when the parent has threads);
2. installs an audit hook (PEP 578) that refuses the network, process creation and signals,
   ctypes, raising limits, and writes outside ``ROOT``: a refused event flushes the output,
   writes ``sandbox: refused <event> ...`` to stderr and ends the process at once with exit
   code :data:`REFUSED_EXIT` (the program cannot catch it);
3. runs ``PROGRAM`` as ``__main__``; a MemoryError it does not catch exits with
   :data:`MEMORY_EXIT`, another exception prints its traceback and exits with status 1.

The hook is a guard against accidents and naive programs, not a security boundary: code that
sets out to escape can (through objects the hook never sees, a C extension, or a bug in
CPython). The limits, the wall timeout and the kill of the process group are the real bounds.
"""

import contextlib
import json
import os
import resource
import sys

REFUSED_EXIT = 113
MEMORY_EXIT = 114

# Events refused whatever their arguments: the network, new processes and signals, native
# code, raising the limits set below. (os.fork covers multiprocessing's default start method;
# the others reach _posixsubprocess directly, hence its import is refused too.)
_REFUSED_PREFIXES = ("socket.", "ctypes.", "_posixsubprocess.", "os.exec", "os.spawn")
_REFUSED = frozenset(
    {
        "subprocess.Popen",
        "os.system",
        "os.fork",
        "os.forkpty",
        "os.posix_spawn",
        "os.kill",
        "os.killpg",
        "signal.pthread_kill",
        "resource.setrlimit",
        "resource.prlimit",
        "sys.addaudithook",
        "sqlite3.enable_load_extension",
    }
)
_REFUSED_IMPORTS = frozenset({"ctypes", "_ctypes", "_posixsubprocess"})

# Events that change the filesystem, and which of their arguments are paths (with the index of
# the dir_fd each is relative to, or None). os.symlink's target may point anywhere: writing
# through the link is then checked where it resolves.
_PATH_EVENTS: dict[str, tuple[tuple[int, int | None], ...]] = {
    "os.chmod": ((0, 2),),
    "os.chown": ((0, 3),),
    "os.chflags": ((0, None),),
    "os.lchflags": ((0, None),),
    "os.link": ((0, 2), (1, 3)),
    "os.mkdir": ((0, 2),),
    "os.remove": ((0, 1),),
    "os.rename": ((0, 2), (1, 3)),
    "os.rmdir": ((0, 1),),
    "os.symlink": ((1, 2),),
    "os.truncate": ((0, None),),
    "os.utime": ((0, 3),),
    "os.setxattr": ((0, None),),
    "os.removexattr": ((0, None),),
    "shutil.rmtree": ((0, 1),),
}
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
_WRITABLE_ANYWHERE = frozenset({"/dev/null"})


def _set_limits(limits: dict) -> None:
    for name, value in limits.items():
        # CPU: SIGXCPU at the soft limit (a kind of its own for the parent), SIGKILL a second
        # later at the hard one; with the two equal the kernel sends SIGKILL straight away.
        hard = value + 1 if name == "RLIMIT_CPU" else value
        resource.setrlimit(getattr(resource, name), (value, hard))


def _resolve(path: object, dir_fd: object) -> str | None:
    """The real absolute path ``path`` (relative to ``dir_fd``, else the cwd) names; None if
    it cannot be told (the caller then refuses)."""
    if isinstance(path, int):  # an open file descriptor
        path, dir_fd = f"/proc/self/fd/{path}", None
    if not isinstance(path, str | bytes):
        return None
    path = os.fsdecode(path)
    if not os.path.isabs(path):
        if isinstance(dir_fd, int) and dir_fd >= 0:
            base = os.readlink(f"/proc/self/fd/{dir_fd}")
        else:
            base = os.getcwd()
        path = os.path.join(base, path)
    return os.path.realpath(path)


def _refuse(event: str, args: tuple) -> None:
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):  # the program may have closed or replaced it
            stream.flush()
    detail = repr(args)[:200]
    os.write(2, f"\nsandbox: refused {event} {detail}\n".encode(errors="replace"))
    os._exit(REFUSED_EXIT)


def _install_hook(root: str) -> None:
    inside = root.rstrip(os.sep) + os.sep

    def outside(path: object, dir_fd: object = None) -> bool:
        try:
            real = _resolve(path, dir_fd)
        except OSError:
            return True
        return real is None or not (real + os.sep).startswith(inside)

    def hook(event: str, args: tuple) -> None:
        if event in _REFUSED or event.startswith(_REFUSED_PREFIXES):
            _refuse(event, args)
        elif event == "import":
            if args[0].partition(".")[0] in _REFUSED_IMPORTS:
                _refuse(event, args[:1])
        elif event == "open" and not isinstance(args[0], int):  # an fd is open already
            path, mode, flags = args
            writes = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (
                isinstance(flags, int) and flags & _WRITE_FLAGS
            )
            # A directory opened outside could serve as another call's dir_fd, which the
            # "open" event does not report: refuse that as a write.
            if outside(path) and (
                (writes and path not in _WRITABLE_ANYWHERE) or os.path.isdir(path)
            ):
                _refuse(event, args)
        elif event in _PATH_EVENTS:
            for index, fd_index in _PATH_EVENTS[event]:
                dir_fd = args[fd_index] if fd_index is not None else None
                if outside(args[index], dir_fd):
                    _refuse(event, args)

    sys.addaudithook(hook)


def main() -> None:
    limits_json, root, program = sys.argv[1:4]
    with open(program, encoding="utf-8") as f:
        source = f.read()
    code = compile(source, program, "exec")
    _set_limits(json.loads(limits_json))
    _install_hook(root)
    sys.argv = [program]
    try:
        exec(code, {"__name__": "__main__", "__file__": program, "__builtins__": __builtins__})
    except MemoryError:
        os.write(2, b"\nsandbox: MemoryError (the memory limit)\n")
        os._exit(MEMORY_EXIT)
    except SystemExit:
        raise
    except BaseException as e:
        # The traceback the program would print run directly: without this file's frame.
        import traceback

        traceback.print_exception(e.with_traceback(e.__traceback__ and e.__traceback__.tb_next))
        sys.exit(1)


if __name__ == "__main__":
    main()
