"""rljax.io: the filesystem seam, on local disk and on a GCS emulator (a gs:// URL)."""

import os
import pathlib

import pytest

from rljax import io
from rljax.config import ConfigError
from rljax.testing.filesystems import gcs_workdir


@pytest.fixture
def gcs():
    with gcs_workdir() as workdir:
        yield workdir


def test_append_file_local(tmp_path):
    target = tmp_path / "sub" / "log.jsonl"
    with io.AppendFile(target) as f:
        f.write(b"a\n")
        f.write(b"bb\n")
        assert f.tell() == 5
        f.truncate(2)
        f.write(b"c\n")
    assert target.read_bytes() == b"a\nc\n"
    with io.AppendFile(target) as f:  # reopening appends
        assert f.tell() == 4
        f.write(b"d\n")
    assert target.read_bytes() == b"a\nc\nd\n"
    with io.AppendFile(target, fresh=True) as f:
        f.write(b"new\n")
    assert target.read_bytes() == b"new\n"


def test_append_file_remote_uploads_on_flush(gcs):
    target = io.join(gcs, "log.jsonl")
    f = io.AppendFile(target, upload_every_s=None)
    f.write(b"a\n")
    assert not io.exists(target)  # object stores cannot append: nothing is sent before flush
    f.flush()
    assert io.read_bytes(target) == b"a\n"
    f.write(b"bb\n")
    assert io.read_bytes(target) == b"a\n"
    f.truncate(2)  # durable at once: the cursor a checkpoint saves must match the object
    assert io.read_bytes(target) == b"a\n"
    f.write(b"c\n")
    f.close()
    assert io.read_bytes(target) == b"a\nc\n"
    with io.AppendFile(target, upload_every_s=0) as f:  # reopening appends to the object
        assert f.tell() == 4
        f.write(b"d\n")
        assert io.read_bytes(target) == b"a\nc\nd\n"  # upload_every_s=0: every write uploads


def test_remote_read_write_list(gcs):
    io.write_text(io.join(gcs, "a", "x.json"), '{"k": 1}')
    io.write_bytes(io.join(gcs, "a", "y.bin"), b"\x00\x01")
    assert io.read_text(io.join(gcs, "a", "x.json")) == '{"k": 1}'
    assert io.listdir(io.join(gcs, "a")) == ["x.json", "y.bin"]
    assert io.is_dir(io.join(gcs, "a")) and io.is_file(io.join(gcs, "a", "y.bin"))
    assert not io.is_local(gcs) and io.is_local("/tmp/x")
    with pytest.raises(ValueError, match="AppendFile"):
        io.open_file(io.join(gcs, "a", "x.json"), "a")


def test_local_copy(gcs, tmp_path):
    remote = io.join(gcs, "model.bin")
    io.write_bytes(remote, b"weights" * 1000)
    with io.local_copy(remote) as local:
        assert pathlib.Path(local).read_bytes() == b"weights" * 1000
    assert not os.path.exists(local)
    with io.local_copy(tmp_path / "here.bin") as local:  # a local path is used in place
        assert local == str(tmp_path / "here.bin")


def test_ensure_writable_dir_local(tmp_path):
    made = io.ensure_writable_dir(tmp_path / "a" / "b")
    assert made.is_dir() and list(made.iterdir()) == []  # the probe is gone
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(ConfigError, match=r"--workdir='.*file/run' is not writable"):
        io.ensure_writable_dir(blocker / "run")


def test_ensure_writable_dir_remote(gcs):
    assert str(io.ensure_writable_dir(gcs)) == gcs
    assert not io.exists(gcs)  # the probe is gone (object stores hold no empty folders)
    with pytest.raises(ConfigError, match="gs://no-such-bucket/run.*not writable"):
        io.ensure_writable_dir("gs://no-such-bucket/run")


def test_emulator_reads_carry_the_generation_a_conditional_write_needs(gcs):
    """tensorstore (orbax's array store) rewrites OCDBT's manifest with a write conditioned on
    the generation it read; the emulator must send that generation, as GCS does (without it
    the write failed with "Malformed StorageGeneration", an intermittent CI failure)."""
    ts = pytest.importorskip("tensorstore")
    bucket, prefix = gcs.removeprefix("gs://").split("/", 1)
    spec = {"driver": "gcs", "bucket": bucket, "path": f"{prefix}/"}
    ts.KvStore.open(spec).result().write("manifest", b"one").result()
    store = ts.KvStore.open(spec).result()  # a fresh store: it reads from the server
    read = store.read("manifest").result()
    assert read.value == b"one" and read.stamp.generation != b"\x00" * 9
    store.write("manifest", b"two", if_equal=read.stamp.generation).result()
    assert store.read("manifest").result().value == b"two"
