"""Workdirs that cannot take a run: refused up front, before anything is written."""

import errno
import os

import pytest

from rljax import io
from rljax.checkpoint import Checkpointer
from rljax.config import CheckpointConfig, ConfigError


def test_workdir_is_a_file(launch_error, check_row, tmp_path):
    target = tmp_path / "run"
    target.write_text("not a directory\n")
    message = launch_error(f"--workdir={target}", target=tmp_path)
    check_row("W01", message, "pass a directory or bucket path you can write to")
    assert target.read_text() == "not a directory\n"


def test_workdir_on_a_read_only_filesystem(launch_error, check_row, tmp_path):
    message = launch_error("--workdir=/proc/rljax_cannot_write_here", target=tmp_path)
    check_row("W02", message, "pass a directory or bucket path you can write to")


def test_workdir_on_a_full_disk(launch_error, check_row, workdir, monkeypatch):
    """A full disk, faked: every write under the workdir fails with ENOSPC."""
    path_type = type(io.path(workdir))
    real_write = path_type.write_bytes

    def write_bytes(self, data):
        if str(self).startswith(str(workdir)):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(self))
        return real_write(self, data)

    monkeypatch.setattr(path_type, "write_bytes", write_bytes)
    check_row("W03", launch_error(), "free some space or pass a directory on another disk")


def test_checkpoints_on_an_unsupported_store(check_row):
    with pytest.raises(ConfigError) as info:
        Checkpointer("s3://bucket/run/checkpoints", CheckpointConfig(enabled=True))
    check_row("W04", str(info.value), "put the workdir on one of those")
