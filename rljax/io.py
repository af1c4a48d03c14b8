"""The one filesystem seam: every file a run reads or writes goes through this module.

A path is a local path or a URL that ``etils.epath`` routes: local paths go to the ``os``
module, ``gs://`` (and ``s3://``) URLs to fsspec (gcsfs, s3fs). Orbax takes the same epath
paths, so metrics, the trace, TensorBoard event files, plots, checkpoints, Hugging Face
directories, tokenizer and task files all live wherever the workdir or the model path points.

Object stores differ from disks in two ways that callers should not have to know about:

* an object cannot be appended to, so :class:`AppendFile` mirrors a remote file in memory and
  uploads it whole (at most every ``upload_every_s`` seconds, and on every ``flush``);
* libraries that memory-map a local file (safetensors' ``safe_open``, gguf's reader) get a
  local copy from :func:`local_copy`; everything else is read through the seam as bytes.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import shutil
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from typing import BinaryIO

from etils import epath

from rljax.config import ConfigError

PathLike = str | os.PathLike
# Chunk size of remote-to-local copies: large enough for few requests, small enough for memory.
_COPY_CHUNK = 64 << 20


def path(p: PathLike) -> epath.Path:
    """``p`` as an ``epath.Path`` (a local path, or a ``gs://``-style URL)."""
    return p if isinstance(p, epath.Path) else epath.Path(p)


def is_local(p: PathLike) -> bool:
    """Whether ``p`` is on the local filesystem (not a URL such as ``gs://bucket/x``)."""
    return "://" not in os.fspath(p)


def join(base: PathLike, *parts: str) -> epath.Path:
    """``base / part / ...`` as an ``epath.Path``; URLs keep their scheme."""
    return path(base).joinpath(*parts)


def exists(p: PathLike) -> bool:
    return path(p).exists()


def is_file(p: PathLike) -> bool:
    return path(p).is_file()


def is_dir(p: PathLike) -> bool:
    return path(p).is_dir()


def listdir(p: PathLike) -> list[str]:
    """The names of the entries of directory ``p``, sorted."""
    return sorted(child.name for child in path(p).iterdir())


def makedirs(p: PathLike) -> epath.Path:
    """Creates directory ``p`` and its parents (a no-op on object stores); returns it."""
    d = path(p)
    d.mkdir(parents=True, exist_ok=True)
    return d


def read_bytes(p: PathLike) -> bytes:
    return path(p).read_bytes()


def read_text(p: PathLike, encoding: str = "utf-8") -> str:
    return path(p).read_text(encoding=encoding)


def write_bytes(p: PathLike, data: bytes) -> None:
    """Writes ``data`` to ``p`` whole, creating its parent directory."""
    target = path(p)
    makedirs(target.parent)
    target.write_bytes(data)


def write_text(p: PathLike, text: str, encoding: str = "utf-8") -> None:
    """Writes ``text`` to ``p`` whole, creating its parent directory."""
    write_bytes(p, text.encode(encoding))


def open_file(p: PathLike, mode: str = "rb"):
    """A file object for ``p`` (a context manager), as the builtin ``open`` returns.

    Remote files support read (with seek) and whole-object write; use :class:`AppendFile`
    to append.
    """
    if "a" in mode and not is_local(p):
        raise ValueError(f"{p}: object stores cannot append; use rljax.io.AppendFile")
    return path(p).open(mode)


def _brief(error: BaseException, limit: int = 160) -> str:
    text = str(error).splitlines()[0] if str(error) else type(error).__name__
    return text if len(text) <= limit else text[:limit] + "..."


def ensure_writable_dir(p: PathLike, *, flag: str = "--workdir") -> epath.Path:
    """Creates directory ``p`` and proves it writable by writing and deleting a probe file.

    Raises :class:`rljax.config.ConfigError` with a one-line message naming ``flag``, the
    path and the fix when it is not (a read-only disk, a missing bucket, no credentials, or
    the fsspec backend for the URL's scheme not installed).
    """
    d = path(p)
    probe = d / f".write_probe-{uuid.uuid4().hex}"
    try:
        d.mkdir(parents=True, exist_ok=True)
        probe.write_bytes(b"")
        probe.unlink()
    except ImportError as e:
        raise ConfigError(
            f"{flag}={os.fspath(p)!r} needs a filesystem backend that is not installed "
            f"({_brief(e)}); pip install gcsfs for gs:// or s3fs for s3://"
        ) from None
    except OSError as e:
        if e.errno in (errno.ENOSPC, errno.EDQUOT):
            raise ConfigError(
                f"{flag}={os.fspath(p)!r} is on a full disk ({_brief(e)}); free some space or "
                "pass a directory on another disk"
            ) from None
        raise ConfigError(_not_writable(flag, p, e)) from None
    except Exception as e:  # gcsfs and s3fs raise their own types
        raise ConfigError(_not_writable(flag, p, e)) from None
    return d


def _not_writable(flag: str, p: PathLike, e: BaseException) -> str:
    return (
        f"{flag}={os.fspath(p)!r} is not writable ({type(e).__name__}: {_brief(e)}); pass "
        "a directory or bucket path you can write to"
    )


@contextlib.contextmanager
def input_error(key: str, value: object) -> Iterator[None]:
    """Turns a failure to read the file(s) named by config key ``key`` into a one-line
    :class:`ConfigError` that starts with the key, so the launcher prints it without a
    traceback; the loader's own message (which names the file and the fix) follows."""
    try:
        yield
    except (OSError, ValueError, ImportError) as e:
        message = re.sub(r"\s*\n\s*", " ", str(e).strip()) or type(e).__name__
        if message.startswith(f"config key '{key}'"):
            raise ConfigError(message) from e
        raise ConfigError(f"config key '{key}' = {value!r}: {message}") from e


def download(p: PathLike, local: str) -> str:
    """Copies ``p`` (any filesystem) to the local file ``local``, in chunks; returns ``local``."""
    with path(p).open("rb") as src, open(local, "wb") as dst:
        shutil.copyfileobj(src, dst, _COPY_CHUNK)
    return local


@contextlib.contextmanager
def local_copy(p: PathLike) -> Iterator[str]:
    """A local filename holding ``p``'s bytes, for libraries that insist on one.

    A local ``p`` is yielded as is. A remote one is copied to a temporary file, in chunks,
    which is deleted on exit; a memory map opened inside stays valid after that on POSIX.
    """
    if is_local(p):
        yield os.fspath(p)
        return
    folder = tempfile.mkdtemp(prefix="rljax-io-")
    try:
        yield download(p, os.path.join(folder, path(p).name))
    finally:
        shutil.rmtree(folder, ignore_errors=True)


class AppendFile:
    """A byte file that grows by appends and can be cut back, on any filesystem of the seam.

    Local files are real append handles, flushed after every write. Object stores cannot
    append, so a remote file is mirrored in memory (its existing bytes are read on open) and
    uploaded whole by :meth:`flush`, and by :meth:`write` once ``upload_every_s`` seconds have
    passed since the last upload (None: only on ``flush``/``close``). A kill loses at most
    the writes of that interval; :meth:`tell` after :meth:`flush` is a durable cursor.

    Args:
      p: the file; its parent directory is created.
      fresh: start empty (truncate) instead of appending to existing bytes.
      upload_every_s: the most seconds a remote write waits for an upload.
    """

    def __init__(self, p: PathLike, *, fresh: bool = False, upload_every_s: float | None = 10.0):
        self.path = path(p)
        self.upload_every_s = upload_every_s
        self._lock = threading.Lock()
        self._closed = False
        makedirs(self.path.parent)
        if is_local(self.path):
            self._local: BinaryIO | None = open(self.path, "wb" if fresh else "ab")  # noqa: SIM115
            self._mirror = bytearray()  # unused: a local file takes the writes itself
        else:
            self._local = None
            existing = b"" if fresh or not self.path.exists() else self.path.read_bytes()
            self._mirror = bytearray(existing)
            self._dirty = fresh
            self._uploaded_at = time.monotonic()
            if fresh:
                self._upload()

    def write(self, data: bytes) -> int:
        with self._lock:
            self._check_open()
            if self._local is not None:
                n = self._local.write(data)
                self._local.flush()
                return n
            self._mirror.extend(data)
            self._dirty = True
            every = self.upload_every_s
            if every is not None and time.monotonic() - self._uploaded_at >= every:
                self._upload()
            return len(data)

    def tell(self) -> int:
        """Bytes in the file (written so far, uploaded or not)."""
        with self._lock:
            if self._local is not None:
                return self._local.tell()
            return len(self._mirror)

    def getvalue(self) -> bytes:
        """The file's whole content as this writer sees it."""
        with self._lock:
            if self._local is not None:
                self._local.flush()
                return self.path.read_bytes()
            return bytes(self._mirror)

    def truncate(self, size: int) -> None:
        """Cuts the file back to its first ``size`` bytes, durably (uploads a remote file)."""
        with self._lock:
            self._check_open()
            if self._local is not None:
                self._local.truncate(size)
                self._local.seek(size)
                return
            del self._mirror[size:]
            self._upload()

    def flush(self) -> None:
        """Makes every write so far durable (uploads a remote file if it changed)."""
        with self._lock:
            if self._closed:
                return
            if self._local is not None:
                self._local.flush()
            elif self._dirty:
                self._upload()

    def close(self) -> None:
        self.flush()
        with self._lock:
            if self._local is not None and not self._closed:
                self._local.close()
            self._closed = True

    def _upload(self) -> None:
        self.path.write_bytes(bytes(self._mirror))
        self._dirty = False
        self._uploaded_at = time.monotonic()

    def _check_open(self) -> None:
        if self._closed:
            raise ValueError(f"{self.path} is closed; open a new AppendFile to write")

    def __enter__(self) -> AppendFile:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
