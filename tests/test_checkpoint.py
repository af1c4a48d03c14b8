"""Checkpointer: bitwise learner round trip and resume, resharded restore, keep/interval, async
saves, interrupted saves (a SIGKILLed writer) and damaged steps."""

import asyncio
import logging
import os
import signal
import subprocess
import sys
import threading
from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest
from jax.sharding import NamedSharding, PartitionSpec, SingleDeviceSharding
from orbax.checkpoint._src.path import atomicity

from rljax import io
from rljax.checkpoint import Checkpointer, CheckpointError, abstract_like, abstract_train_state
from rljax.config import CheckpointConfig, ConfigError, LearnerConfig
from rljax.learner.batch import TrainSequence, pack_batch
from rljax.learner.learner import Learner
from rljax.models.sharding import LEARNER_RULES, make_mesh, state_shardings
from rljax.models.transformer import init_sharded
from rljax.policy.staleness import StalenessBuffer
from rljax.testing import TINY_MODEL
from rljax.testing.filesystems import gcs_workdir

# When one shard read fails, orbax abandons the sibling read coroutines; Python reports them
# at garbage collection, in whichever test is running then.
pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")


def _cfg(**kw) -> CheckpointConfig:
    return CheckpointConfig(**{"enabled": True, "every_steps": 1, "keep": 3, **kw})


def assert_bitwise(got, want):
    """Same tree structure, dtypes and bytes, leaf by leaf."""
    assert jax.tree.structure(got) == jax.tree.structure(want)
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        g, w = np.asarray(g), np.asarray(w)
        assert g.dtype == w.dtype and g.shape == w.shape
        assert g.tobytes() == w.tobytes()


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A tiny Learner on 8 devices (fsdp=8) after one SFT step, saved once as step 1."""
    mesh = make_mesh(jax.devices()[:8], {"fsdp": 8, "tensor": 1})
    graphdef, params = init_sharded(TINY_MODEL, mesh, LEARNER_RULES, 0)
    learner = Learner(
        LearnerConfig(group_size=2, batch_groups=4, learning_rate=1e-2),
        graphdef,
        params,
        mesh,
        loss="sft",
    )
    seqs = [TrainSequence([1, 3, 5, 7, 9, 11], 2), TrainSequence([1, 4, 8, 12], 1)] * 4
    batch = pack_batch(seqs, row_len=16, micro_batches=1, row_multiple=learner.dp)
    learner.step(batch)  # non-zero Adam moments and count
    directory = tmp_path_factory.mktemp("trained")
    with Checkpointer(directory, _cfg(async_save=False)) as ckpt:
        assert ckpt.save(1, params=learner.params, opt_state=learner.opt_state, meta={"v": 1})
    host = jax.device_get((learner.params, learner.opt_state))
    return SimpleNamespace(learner=learner, batch=batch, dir=directory, params=host[0], opt=host[1])


def _small(value: float = 0.0, device_count: int = 8):
    mesh = make_mesh(jax.devices()[:device_count], {"fsdp": device_count})
    w = jnp.arange(32 * 4, dtype=jnp.float32).reshape(32, 4) + value
    return {
        "w": jax.device_put(w, NamedSharding(mesh, PartitionSpec("fsdp"))),
        "count": jax.device_put(jnp.int32(value), NamedSharding(mesh, PartitionSpec())),
    }


def _restore_small(ckpt, step=None, **kw):
    target = abstract_like(_small())
    return ckpt.restore(step, abstract_params=target, abstract_opt_state=target, **kw)


def test_learner_round_trip_is_bitwise_and_resumes_without_recompiling(trained, tmp_path):
    learner = trained.learner
    buffer = StalenessBuffer(batch_groups=2, max_staleness=1)
    buffer.reserve("p0", 0)
    buffer.occupy("p0", {"rewards": [1.0, 0.0], "tokens": [[1, 2], [3]]}, 0)
    meta = {
        "version": learner.version,
        "rng": {"sampler": 17, "reward": 3},
        "data": {"next_index": 40, "epoch": 0},
        "buffer": buffer.state_dict(),
        "metrics_cursor": 12,
    }
    saved = jax.device_get((learner.params, learner.opt_state))
    with Checkpointer(tmp_path, _cfg(async_save=True)) as ckpt:
        assert ckpt.save(
            learner.version, params=learner.params, opt_state=learner.opt_state, meta=meta
        )
        meta["version"] = -1  # the checkpointer keeps its own copy
        learner.step(trained.batch)  # donates the saved buffers while the write may be in flight
        after = jax.device_get((learner.params, learner.opt_state))
        ckpt.wait()
        assert ckpt.latest_step() == 1
        params, opt_state, got = ckpt.restore(
            abstract_params=abstract_like(learner.params),
            abstract_opt_state=abstract_like(learner.opt_state),
        )
    assert got["version"] == 1 and got["rng"] == {"sampler": 17, "reward": 3}
    assert StalenessBuffer.from_state_dict(got["buffer"]).state_dict() == buffer.state_dict()
    assert_bitwise((params, opt_state), saved)
    for r, live in zip(
        jax.tree.leaves((params, opt_state)), jax.tree.leaves((learner.params, learner.opt_state))
    ):
        assert r.sharding == live.sharding

    # Resuming from the checkpoint replays the same update, in the already-compiled step.
    compiled = learner._step_fn._cache_size()
    learner.params, learner.opt_state, learner.version = params, opt_state, got["version"]
    learner.step(trained.batch)
    assert_bitwise(jax.device_get((learner.params, learner.opt_state)), after)
    assert learner._step_fn._cache_size() == compiled


@pytest.mark.parametrize(
    "devices,axes", [(4, {"fsdp": 2, "tensor": 2}), (1, {"fsdp": 1, "tensor": 1})]
)
def test_restore_onto_a_different_mesh(trained, devices, axes):
    mesh = make_mesh(jax.devices()[:devices], axes)
    shardings = state_shardings(trained.params, mesh, LEARNER_RULES)
    abstract_params, abstract_opt = abstract_train_state(
        trained.learner.tx, trained.params, shardings, mesh
    )
    with Checkpointer(trained.dir, _cfg()) as ckpt:
        params, opt_state, meta = ckpt.restore(
            abstract_params=abstract_params, abstract_opt_state=abstract_opt
        )
    assert meta == {"v": 1}
    assert_bitwise((params, opt_state), (trained.params, trained.opt))
    for leaf, target in zip(jax.tree.leaves(params), jax.tree.leaves(abstract_params)):
        assert leaf.sharding == target.sharding
        assert set(leaf.sharding.device_set) == set(mesh.devices.flat)
    if devices == 4:  # the embedding really is split 2x2 on the new mesh
        assert params["embed"][...].sharding.spec == PartitionSpec("tensor", "fsdp")


def test_interval_keep_force_and_disabled(tmp_path):
    with Checkpointer(tmp_path / "a", _cfg(every_steps=3, keep=2, async_save=False)) as ckpt:
        tree = _small()
        saved = [ckpt.save(s, params=tree, opt_state=tree, meta={"s": s}) for s in range(1, 11)]
        assert saved == [s % 3 == 0 for s in range(1, 11)]
        assert ckpt.all_steps() == [6, 9]  # keep=2 pruned step 3
        assert ckpt.should_save(12) and not ckpt.should_save(11) and not ckpt.should_save(9)
        assert ckpt.should_save(11, force=True) and not ckpt.should_save(9, force=True)
        # Meta is built and checked only on steps that save (callers gate on should_save).
        assert not ckpt.save(11, params=tree, opt_state=tree, meta={"n": np.int64(1)})
        assert ckpt.save(10, params=tree, opt_state=tree, meta={"s": 10}, force=True)
        assert not ckpt.save(10, params=tree, opt_state=tree, meta={}, force=True)  # no overwrite
        assert ckpt.all_steps() == [9, 10] and ckpt.latest_step() == 10
        assert _restore_small(ckpt, 9)[2] == {"s": 9}
    with Checkpointer(tmp_path / "b", _cfg(enabled=False)) as ckpt:
        assert not ckpt.save(5, params=tree, opt_state=tree, meta={}, force=True)
        assert ckpt.latest_step() is None and ckpt.all_steps() == []


def test_async_save_returns_before_the_write_is_finalised(tmp_path, monkeypatch):
    release = threading.Event()
    finalize = atomicity.AtomicRenameTemporaryPath.finalize

    async def held_finalize(self):
        await asyncio.to_thread(release.wait, 30)
        await finalize(self)

    monkeypatch.setattr(atomicity.AtomicRenameTemporaryPath, "finalize", held_finalize)
    with Checkpointer(tmp_path, _cfg(async_save=True)) as ckpt:
        tree = _small(5.0)
        want = jax.device_get(tree)
        try:
            assert ckpt.save(4, params=tree, opt_state=tree, meta={"s": 4})
            # The write is still held open, so save() did not wait for it, and the
            # half-written step is invisible; the caller may already free (donate) the arrays.
            assert ckpt.latest_step() is None and ckpt.all_steps() == []
            assert [p.name for p in tmp_path.iterdir()] == ["4.orbax-checkpoint-tmp"]
            jax.tree.map(lambda x: x.delete(), tree)
        finally:
            release.set()
        ckpt.wait()
        assert ckpt.latest_step() == 4
        params, opt_state, meta = _restore_small(ckpt)
    assert meta == {"s": 4}
    assert_bitwise((params, opt_state), (want, want))


_KILLED_WRITER = """
import os, signal, sys
import jax, jax.numpy as jnp
import orbax.checkpoint as ocp
from orbax.checkpoint._src.path import atomicity
from rljax.checkpoint import Checkpointer
from rljax.config import CheckpointConfig

cfg = CheckpointConfig(enabled=True, every_steps=1, keep=1, async_save=True)
ckpt = Checkpointer(sys.argv[1], cfg)
tree = {"w": jnp.arange(32 * 4, dtype=jnp.float32).reshape(32, 4), "count": jnp.int32(0)}
ckpt.save(1, params=tree, opt_state=tree, meta={"s": 1})
ckpt.wait()

async def die(*args, **kwargs):
    os.kill(os.getpid(), signal.SIGKILL)

# arrays: before any array is written; meta: arrays written, the JSON meta not;
# finalize: every item written, the rename not yet done.
target = {
    "arrays": (ocp.StandardCheckpointHandler, "async_save"),
    "meta": (ocp.JsonCheckpointHandler, "_save_fn"),
    "finalize": (atomicity.AtomicRenameTemporaryPath, "finalize"),
}[sys.argv[2]]
setattr(*target, die)
tree = jax.tree.map(lambda x: x + 7, tree)
ckpt.save(2, params=tree, opt_state=tree, meta={"s": 2})
ckpt.wait()
"""


@pytest.mark.parametrize("point", ["arrays", "meta", "finalize"])
def test_save_killed_before_finalising_is_ignored(tmp_path, point):
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "JAX_NUM_CPU_DEVICES": "1", "XLA_FLAGS": ""}
    proc = subprocess.run(
        [sys.executable, "-c", _KILLED_WRITER, str(tmp_path), point],
        env=env,
        capture_output=True,
        timeout=120,
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()[-2000:]
    if point == "finalize":
        partial = [p for p in os.listdir(tmp_path) if p.startswith("2.orbax-checkpoint-tmp")]
        assert partial and os.listdir(tmp_path / partial[0])  # the killed save left its files
    with Checkpointer(tmp_path, _cfg(async_save=False)) as ckpt:
        assert ckpt.latest_step() == 1 and ckpt.all_steps() == [1]
        params, _, meta = _restore_small(ckpt)
        assert meta == {"s": 1}
        np.testing.assert_array_equal(params["w"], np.asarray(_small()["w"]))
        tree = _small(2.0)
        assert ckpt.save(2, params=tree, opt_state=tree, meta={"s": 2})
        # Orbax deletes the leftover in the background, finishing before any save starts.
        assert not [p for p in os.listdir(tmp_path) if "orbax-checkpoint-tmp" in p]
        assert _restore_small(ckpt)[2] == {"s": 2}


# Where a save can fail in-process: before any array is written (in the blocking part of an
# async save), while the JSON meta is written (a commit future: the background thread of an
# async save), and at the final rename.
_FAULTS = {
    "arrays": (ocp.StandardCheckpointHandler, "async_save"),
    "meta": (ocp.JsonCheckpointHandler, "_save_fn"),
    "finalize": (atomicity.AtomicRenameTemporaryPath, "finalize"),
}


@pytest.mark.parametrize("async_save", [False, True])
@pytest.mark.parametrize("point", list(_FAULTS))
def test_failed_save_never_replaces_the_last_good_step(tmp_path, monkeypatch, point, async_save):
    # keep=1: orbax alone would prune step 1 for a step 2 whose async write then failed.
    ckpt = Checkpointer(tmp_path, _cfg(keep=1, async_save=async_save))
    good = _small(1.0)
    assert ckpt.save(1, params=good, opt_state=good, meta={"s": 1})
    ckpt.wait()

    async def broken(*args, **kwargs):
        raise OSError(f"no space left on device ({point})")

    monkeypatch.setattr(*_FAULTS[point], broken)
    bad = _small(2.0)
    with pytest.raises(CheckpointError) as err:
        ckpt.save(2, params=bad, opt_state=bad, meta={"s": 2})
        ckpt.wait()  # an async write fails in the background; it surfaces here
    monkeypatch.undo()
    msg = str(err.value)
    assert "\n" not in msg
    assert f"checkpoint step 2 in {tmp_path} failed to save (" in msg
    assert "step 1 is still the latest: fix the cause" in msg
    assert ckpt.latest_step() == 1 and ckpt.all_steps() == [1]
    params, _, meta = _restore_small(ckpt)
    assert meta == {"s": 1}
    np.testing.assert_array_equal(params["w"], np.asarray(good["w"]))
    with Checkpointer(tmp_path, _cfg(async_save=False)) as fresh:
        assert fresh.all_steps() == [1] and _restore_small(fresh)[2] == {"s": 1}
    # The same Checkpointer saves the next step; only once it is on disk does keep=1 prune
    # step 1. (The failed write's threads may still be finishing in 2.orbax-checkpoint-tmp,
    # which a Checkpointer opening the directory later deletes; a run's next save is a later
    # step.)
    assert ckpt.save(3, params=bad, opt_state=bad, meta={"s": 3})
    ckpt.close()
    with Checkpointer(tmp_path, _cfg(async_save=False)) as fresh:
        assert fresh.all_steps() == [3] and _restore_small(fresh)[2] == {"s": 3}


def test_read_meta_reads_no_arrays(tmp_path):
    with _two_steps(tmp_path) as ckpt:
        assert ckpt.read_meta() == {"s": 2} and ckpt.read_meta(1) == {"s": 1}
        (tmp_path / "2" / "params" / "manifest.ocdbt").write_bytes(b"")  # arrays unreadable
        assert ckpt.read_meta(2) == {"s": 2}
        meta_file = tmp_path / "1" / "meta" / "metadata"
        meta_file.write_text(meta_file.read_text().replace('"s": 1', '"s": 5'))
        with pytest.raises(CheckpointError, match="could not read the meta of checkpoint step 1"):
            ckpt.read_meta(1)


def _two_steps(directory) -> Checkpointer:
    ckpt = Checkpointer(directory, _cfg(async_save=False))
    for s in (1, 2):
        tree = _small(float(s))
        ckpt.save(s, params=tree, opt_state=tree, meta={"s": s})
    return ckpt


def test_damaged_latest_step_names_it_and_falls_back(tmp_path, caplog):
    with _two_steps(tmp_path) as ckpt:
        manifest = tmp_path / "2" / "params" / "manifest.ocdbt"
        manifest.write_bytes(manifest.read_bytes()[:20])  # a truncated copy
        with pytest.raises(CheckpointError) as err:
            _restore_small(ckpt)
        msg = str(err.value)
        assert "\n" not in msg
        assert f"could not restore checkpoint step 2 at {tmp_path / '2'}" in msg
        assert "delete it or restore an earlier step (1), or pass fallback=True" in msg
        assert ckpt.latest_step() == 2  # nothing moved without fallback

        with caplog.at_level(logging.WARNING, logger="rljax.checkpoint"):
            params, opt_state, meta = _restore_small(ckpt, fallback=True)
        assert meta == {"s": 1}
        assert_bitwise((params, opt_state), jax.device_get((_small(1.0), _small(1.0))))
        assert "checkpoint step 2" in caplog.text and "trying an earlier step" in caplog.text
        assert ckpt.latest_step() == 1 and (tmp_path / "2.corrupt").is_dir()
        tree = _small(3.0)  # the run can save step 2 again
        assert ckpt.save(2, params=tree, opt_state=tree, meta={"s": 2})
        assert _restore_small(ckpt)[2] == {"s": 2}


def test_edited_meta_fails_its_digest(tmp_path):
    with _two_steps(tmp_path) as ckpt:
        meta_file = tmp_path / "2" / "meta" / "metadata"
        text = meta_file.read_text()
        assert '"s": 2' in text
        meta_file.write_text(text.replace('"s": 2', '"s": 3'))  # still valid JSON
        with pytest.raises(CheckpointError, match="does not match its sha256 digest"):
            _restore_small(ckpt)


def test_wrong_target_fails_every_step_and_moves_nothing(tmp_path):
    with _two_steps(tmp_path) as ckpt:
        dev = SingleDeviceSharding(jax.devices()[0])
        wrong = {
            "w": jax.ShapeDtypeStruct((32, 8), jnp.float32, sharding=dev),
            "count": jax.ShapeDtypeStruct((), jnp.int32, sharding=dev),
        }
        with pytest.raises(
            CheckpointError, match=r"no earlier step restored either \(tried \[2, 1\]\)"
        ):
            ckpt.restore(abstract_params=wrong, abstract_opt_state=wrong, fallback=True)
        assert ckpt.all_steps() == [1, 2]
        assert not (tmp_path / "2.corrupt").exists()


def test_bad_input_messages(tmp_path):
    tree = _small(device_count=1)
    with Checkpointer(tmp_path, _cfg(async_save=False)) as ckpt:
        with pytest.raises(
            CheckpointError, match="no finalised checkpoint in .*start from scratch"
        ):
            _restore_small(ckpt)
        with pytest.raises(TypeError, match=r"not JSON-serialisable .*int\(\)/float\(\)"):
            ckpt.save(1, params=tree, opt_state=tree, meta={"n": np.int64(3)})
        with pytest.raises(TypeError, match="meta must be a dict, got list"):
            ckpt.save(1, params=tree, opt_state=tree, meta=[1])
        with pytest.raises(ValueError, match="step=-1 is invalid: use an int >= 0"):
            ckpt.save(-1, params=tree, opt_state=tree, meta={})
        ckpt.save(1, params=tree, opt_state=tree, meta={})
        with pytest.raises(CheckpointError, match=r"step 7 is not in .*\(finalised steps: \[1\]\)"):
            _restore_small(ckpt, 7)
    with pytest.raises(ValueError, match="leaves of the tree have no .sharding.*pass shardings="):
        abstract_like({"w": np.zeros(3)})
    with pytest.raises(ValueError, match="shardings is not a prefix of the tree"):
        abstract_like({"w": np.zeros(3)}, {"v": SingleDeviceSharding(jax.devices()[0])})


@pytest.mark.slow
def test_save_resume_and_fall_back_on_gcs():
    """A gs:// checkpoint directory (GCS emulator on 127.0.0.1): orbax's metadata goes through
    gcsfs, its array chunks through tensorstore's gcs driver; a new Checkpointer resumes."""
    with gcs_workdir() as workdir:
        directory = f"{workdir}/checkpoints"
        with Checkpointer(directory, _cfg()) as ckpt:  # async saves
            for s in (1, 2):
                tree = _small(float(s))
                assert ckpt.save(s, params=tree, opt_state=tree, meta={"s": s})
        with Checkpointer(directory, _cfg()) as ckpt:
            assert ckpt.all_steps() == [1, 2]
            params, opt_state, meta = _restore_small(ckpt)
            assert meta == {"s": 2}
            assert_bitwise((params, opt_state), jax.device_get((_small(2.0), _small(2.0))))
            manifest = io.join(directory, "2", "params", "manifest.ocdbt")
            io.write_bytes(manifest, io.read_bytes(manifest)[:20])  # a truncated copy
            assert _restore_small(ckpt, fallback=True)[2] == {"s": 1}
            assert ckpt.latest_step() == 1 and io.is_dir(io.join(directory, "2.corrupt"))


def test_directory_orbax_cannot_write_is_refused():
    with pytest.raises(ConfigError, match="'s3://bucket/ckpt'.*only to local paths and gs://"):
        Checkpointer("s3://bucket/ckpt", _cfg())
