"""Orbax checkpoints of the full training state: learner params, optimiser state and run meta.

A checkpoint step holds three items: ``params`` and ``opt_state`` (sharded pytrees, written by
every host for its own shards) and ``meta`` (a JSON dict the runtime fills: version, rng
counters, data iterator state, buffer state, metrics cursor). Restores take *abstract* targets
whose leaves are ``jax.ShapeDtypeStruct``s carrying the target shardings, so arrays land
directly in the shape of the mesh being resumed on, which may differ from the one that saved.

Atomicity comes from orbax: a step is written under ``<step>.orbax-checkpoint-tmp*`` and renamed
on finalise (on object stores, which cannot rename, a ``commit_success.txt`` marks it instead).
Unfinalised steps are invisible to :meth:`Checkpointer.latest_step` and are deleted when a
Checkpointer opens the directory, so a kill mid-save leaves the previous step as the latest.
Two things orbax 0.12 does not guarantee are done here: a failed *async* write is only logged
by orbax, which still lists the step and still prunes older steps past ``keep``, so the last
good step could be deleted for a step that never landed. Checkpointer therefore prunes itself,
only once a newer step is confirmed on disk, and turns a failed write into a
:class:`CheckpointError` (at the next ``save``, ``wait`` or ``close``) after reopening the
directory, which forgets the partial step; the previous step stays the latest.
Bit rot and half-copied directories are not caught by that; :meth:`Checkpointer.restore` turns
any failure into a :class:`CheckpointError` that names the step directory, and with
``fallback=True`` moves such a step aside and resumes from the newest earlier step that loads.

Directories may be local paths or ``gs://`` URLs; both go to orbax through etils ``epath``
(``rljax.io``'s seam), and orbax writes array chunks through tensorstore's ``file`` or ``gcs``
kvstore. Other URLs are refused up front: orbax 0.12 builds a tensorstore spec for local paths
and ``gs://`` only, and fails on, e.g., ``s3://`` mid-save.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import time
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp
from etils import epath
from jax.sharding import Mesh, NamedSharding, PartitionSpec, Sharding
from orbax.checkpoint import checkpoint_managers as ocm

from rljax import io
from rljax.config import CheckpointConfig, ConfigError
from rljax.learner.optimizer import optimizer_shardings

log = logging.getLogger(__name__)

ITEMS = ("params", "opt_state", "meta")
# A step moved aside by restore(fallback=True); orbax parses only digit names as steps, so the
# suffix takes it out of latest_step(), pruning and the tmp-directory cleanup alike.
CORRUPT_SUFFIX = ".corrupt"


class CheckpointError(RuntimeError):
    """A checkpoint step could not be restored. The message names its directory and the fix."""


def abstract_like(tree: Any, shardings: Any = None) -> Any:
    """``jax.ShapeDtypeStruct`` leaves with shardings, as a restore target shaped like ``tree``.

    Args:
      tree: a pytree of arrays or ShapeDtypeStructs (``jax.eval_shape`` output works), e.g. an
        ``nnx.State`` of params or an optax state.
      shardings: where each restored leaf should live: a tree matching ``tree`` or a prefix of it
        (``state_shardings`` output, whose leaves stand for whole ``nnx.Variable`` nodes), one
        ``Sharding`` for every leaf, or None to keep each leaf's own ``.sharding``.

    Returns:
      A tree with the structure of ``tree`` whose leaves carry shape, dtype and sharding only.
    """
    if shardings is None:
        leaves = jax.tree.leaves(tree)
        missing = [i for i, x in enumerate(leaves) if getattr(x, "sharding", None) is None]
        if missing:
            raise ValueError(
                f"abstract_like: {len(missing)} leaves of the tree have no .sharding (first: leaf "
                f"{missing[0]}, {type(leaves[missing[0]]).__name__}); pass shardings= explicitly"
            )
        return jax.tree.map(
            lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), tree
        )
    if isinstance(shardings, Sharding):
        return jax.tree.map(
            lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=shardings), tree
        )
    try:
        full = jax.tree.broadcast(shardings, tree)
    except ValueError as e:
        raise ValueError(
            "abstract_like: shardings is not a prefix of the tree's structure; pass the "
            f"state_shardings(...) of the same model, or one Sharding ({e})"
        ) from None
    return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), tree, full)


def abstract_train_state(tx, params: Any, param_shardings: Any, mesh: Mesh) -> tuple[Any, Any]:
    """Restore targets for a Learner's ``(params, opt_state)`` without materialising either.

    ``params`` may be abstract (``nnx.eval_shape``) so a large model is never initialised just
    to be overwritten. Optimiser shardings come from the Learner's own rule (moments follow
    their parameter, step counts replicated), so the restored state matches what its compiled
    train step expects.
    """
    abstract_params = abstract_like(params, param_shardings)
    replicated = NamedSharding(mesh, PartitionSpec())
    opt_shardings = optimizer_shardings(tx, abstract_params, param_shardings, replicated)
    abstract_opt = abstract_like(jax.eval_shape(tx.init, abstract_params), opt_shardings)
    return abstract_params, abstract_opt


def _digest(meta: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(meta, sort_keys=True).encode()).hexdigest()


def _json_copy(meta: Any) -> dict[str, Any]:
    """A deep copy through JSON: checks the dict is JSON-safe and detaches it from the caller."""
    if not isinstance(meta, dict):
        raise TypeError(
            f"checkpoint meta must be a dict, got {type(meta).__name__}; wrap the values in a "
            "dict of JSON-safe entries"
        )
    try:
        return json.loads(json.dumps(meta, allow_nan=True))
    except (TypeError, ValueError) as e:
        raise TypeError(
            f"checkpoint meta is not JSON-serialisable ({e}); convert numpy scalars and arrays "
            "with int()/float()/.tolist() and objects with their state_dict()"
        ) from None


def _unwrap_meta(saved: Any) -> dict[str, Any]:
    """The meta dict inside the JSON item ``save`` wrote, after checking its digest."""
    if not (isinstance(saved, dict) and isinstance(saved.get("meta"), dict)):
        raise ValueError("the meta item is not the JSON object Checkpointer.save writes")
    if saved.get("sha256") != _digest(saved["meta"]):
        raise ValueError("the meta item does not match its sha256 digest")
    return saved["meta"]


def _brief(error: BaseException, limit: int = 200) -> str:
    """The error's type and first line, cut short: tensorstore messages run to pages."""
    text = str(error).splitlines()[0] if str(error) else ""
    text = text if len(text) <= limit else text[:limit] + "..."
    return f"{type(error).__name__}: {text}"


def _check_step(step: Any) -> None:
    if not isinstance(step, int) or isinstance(step, bool) or step < 0:
        raise ValueError(f"checkpoint step={step!r} is invalid: use an int >= 0")


class Checkpointer:
    """Saves and restores the learner state and run meta under ``directory``, one step a dir.

    ``save`` writes when ``step`` is a multiple of ``cfg.every_steps`` (or ``force``), keeps the
    newest ``cfg.keep`` steps, and with ``cfg.async_save`` returns once the arrays are copied
    off the devices, writing in a background thread: the caller may then donate or delete them.
    With ``cfg.enabled`` False nothing is ever written; restoring still works.
    """

    def __init__(self, directory: str | epath.PathLike, cfg: CheckpointConfig):
        self.cfg = cfg
        self.directory = io.path(directory)
        if not io.is_local(self.directory) and not str(self.directory).startswith("gs://"):
            raise ConfigError(
                f"checkpoint directory {str(self.directory)!r}: orbax writes checkpoints only to "
                "local paths and gs:// URLs; put the workdir on one of those"
            )
        self._name_format = ocp.path.step.standard_name_format()
        self._in_flight: int | None = None  # the step of the last async save, until confirmed
        self._manager = self._open()

    def _open(self, *, cleanup: bool = True) -> ocp.CheckpointManager:
        cfg = self.cfg
        policy = ocm.AnySavePolicy(
            [ocm.FixedIntervalPolicy(cfg.every_steps), ocm.PreemptionCheckpointingPolicy()]
        )
        options = ocp.CheckpointManagerOptions(
            # Pruned by _prune, only after a newer step is confirmed on disk: orbax prunes when
            # a save *starts* and deletes even when the new step's async write then fails.
            max_to_keep=None,
            enable_async_checkpointing=cfg.async_save,
            save_decision_policy=policy,
            # Leftovers of a save killed (or failed) before finalising; they never restore.
            cleanup_tmp_directories=cleanup,
            create=True,
        )
        return ocp.CheckpointManager(self.directory, options=options, item_names=ITEMS)

    # -- saving ----------------------------------------------------------------------------

    def should_save(self, step: int, *, force: bool = False) -> bool:
        """Whether ``step`` is due: a multiple of ``cfg.every_steps``, a preemption notice, or
        ``force``, and not saved yet (cheap; no device work). The one save decision."""
        return self._writable(step) and (force or self._manager.should_save(step))

    def _writable(self, step: int) -> bool:
        """Checkpoints are on and ``step`` is not on disk yet (a step is never overwritten)."""
        return self.cfg.enabled and step not in self._manager.all_steps()

    def save(self, step: int, *, params: Any, opt_state: Any, meta: dict, force: bool = False):
        """Saves the state as ``step`` if due; returns whether a save started.

        Due means ``step % cfg.every_steps == 0`` (or a preemption notice on multi-host TPUs),
        or ``force``, and ``step`` not saved yet: :meth:`should_save` decides, then
        :meth:`write` writes. Building ``meta`` (buffer contents) can be costly, so callers
        gate it on :meth:`should_save` and then call :meth:`write`; ``meta`` is only checked on
        steps that save.
        """
        _check_step(step)
        if not self.should_save(step, force=force):
            return False
        return self.write(step, params=params, opt_state=opt_state, meta=meta)

    def write(self, step: int, *, params: Any, opt_state: Any, meta: dict) -> bool:
        """Writes the state as ``step``, which the caller found due (:meth:`should_save`);
        returns whether a save started (not when ``step`` is on disk already, or checkpoints
        are off).

        ``meta`` must be JSON-safe (dict keys come back as strings); it is copied, so the
        caller may mutate it afterwards. A previous async save is waited for first.
        """
        _check_step(step)
        if not self._writable(step):
            return False
        meta = _json_copy(meta)
        self._settle()  # the previous async save must have landed before this one starts
        args = ocp.args.Composite(
            params=ocp.args.StandardSave(params),
            opt_state=ocp.args.StandardSave(opt_state),
            # The digest makes a flipped digit in the JSON (still valid JSON) fail loudly; array
            # chunks need no such guard, tensorstore checksums them.
            meta=ocp.args.JsonSave({"sha256": _digest(meta), "meta": meta}),
        )
        try:
            started = bool(self._manager.save(step, args=args, force=True))
        except Exception as e:  # noqa: BLE001 - any failure mid-write; the partial step is dropped
            self._failed(step, _brief(e), e)
        if started and self.cfg.async_save:
            self._in_flight = step
        elif started:
            self._confirm(step)
        return started

    def _settle(self) -> None:
        """Waits for the in-flight async save and confirms it landed (or raises)."""
        try:
            self._manager.wait_until_finished()
        except Exception as e:  # noqa: BLE001 - the background write failed
            step, self._in_flight = self._in_flight, None
            self._failed(step, _brief(e), e)
        if self._in_flight is not None:
            step, self._in_flight = self._in_flight, None
            self._confirm(step)

    def _confirm(self, step: int) -> None:
        """Raises unless ``step`` is finalised on disk; then prunes steps beyond ``keep``."""
        self._manager.reload()  # orbax lists a step from the moment its save starts
        if step not in self._manager.all_steps():
            self._failed(step, "the write did not finalise (orbax logged the cause above)")
        steps = sorted(self._manager.all_steps())
        for old in steps[: -self.cfg.keep]:
            self._manager.delete(old)

    def _failed(self, step: int | None, cause: str, error: BaseException | None = None):
        """Reopens the directory (forgetting the partial step) and raises CheckpointError.

        The partial ``<step>.orbax-checkpoint-tmp`` stays: the failed write's threads may still
        be writing into it, and deleting under them fails. It never restores, and the next
        Checkpointer to open the directory (the resumed run's) deletes it.
        """
        with contextlib.suppress(Exception):  # the failed manager may fail again on close
            self._manager.close()
        self._manager = self._open(cleanup=False)
        latest = self.latest_step()
        kept = f"step {latest} is still the latest" if latest is not None else "no step is saved"
        raise CheckpointError(
            f"checkpoint step {step} in {self.directory} failed to save ({cause}); {kept}: fix "
            "the cause (disk space, permissions, the bucket) and the next save writes again"
        ) from error

    def wait(self) -> None:
        """Blocks until every pending async save is finalised; CheckpointError if one failed."""
        self._settle()

    def close(self) -> None:
        """Waits for pending saves (raising CheckpointError if one failed); releases threads."""
        try:
            self._settle()
        finally:
            self._manager.close()

    def __enter__(self) -> Checkpointer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- restoring -------------------------------------------------------------------------

    def all_steps(self) -> list[int]:
        """Every finalised step in the directory, oldest first."""
        steps = sorted(self._manager.all_steps())
        # Orbax lists an async save from the moment it starts, and still lists it if its
        # write failed; it counts once _settle has confirmed it on disk.
        if self._in_flight in steps:
            steps.remove(self._in_flight)
        return steps

    def latest_step(self) -> int | None:
        """The newest finalised step, or None; in-flight and interrupted saves do not count."""
        steps = self.all_steps()
        return steps[-1] if steps else None

    def step_dir(self, step: int) -> epath.Path:
        """The directory that holds ``step``."""
        return self.directory / self._name_format.build_name(step)

    def restore(
        self,
        step: int | None = None,
        *,
        abstract_params: Any,
        abstract_opt_state: Any,
        fallback: bool = False,
    ) -> tuple[Any, Any, dict]:
        """Loads ``(params, opt_state, meta)`` from ``step`` (default: the latest).

        The abstract trees (see :func:`abstract_like`) give each leaf's target sharding, so a
        state saved from one mesh restores onto another. A step that fails to load raises
        :class:`CheckpointError`; with ``fallback=True`` earlier steps are tried in turn, with a
        warning for each failure, and once one loads the failed newer steps are renamed
        ``<step>.corrupt`` (kept for inspection, out of the way of later saves). Dtypes are
        cast to the target's, as orbax does; shapes and tree structure must match.
        """
        self.wait()
        steps = self.all_steps()
        if not steps:
            raise CheckpointError(
                f"no finalised checkpoint in {self.directory}; start from scratch or point the "
                "run at the directory that holds its checkpoints"
            )
        if step is None:
            step = steps[-1]
        elif step not in steps:
            raise CheckpointError(
                f"checkpoint step {step} is not in {self.directory} (finalised steps: {steps}); "
                "pass one of those, or step=None for the latest"
            )
        candidates = [s for s in reversed(steps) if s <= step] if fallback else [step]
        failed: list[int] = []
        for s in candidates:
            try:
                restored = self._restore_step(s, abstract_params, abstract_opt_state)
            except Exception as e:  # orbax/tensorstore raise many types for a damaged step
                error = e
                failed.append(s)
                if fallback:
                    log.warning(
                        "checkpoint step %d at %s failed to restore (%s); trying an earlier step",
                        s,
                        self.step_dir(s),
                        _brief(e),
                    )
                    continue
                break
            # Only once an earlier step loads: a wrong restore target fails on every step, and
            # must not move good checkpoints aside.
            for bad in failed:
                self._quarantine(bad)
            return restored
        first = failed[0]
        earlier = [s for s in steps if s < first]
        if fallback:
            hint = (
                f"no earlier step restored either (tried {failed}); if it is damaged, move "
                f"{self.directory} aside (or use a new workdir) to start afresh, else restore "
                "with the model and optimiser config of the saved run"
            )
        elif earlier:
            hint = f"delete it or restore an earlier step ({earlier[-1]}), or pass fallback=True"
        else:
            hint = (
                "delete it and start afresh, or check that abstract_params/abstract_opt_state come "
                "from the same model and optimiser config as the saved run"
            )
        raise CheckpointError(
            f"could not restore checkpoint step {first} at {self.step_dir(first)} "
            f"({_brief(error)}); it may be damaged or saved from a different model: {hint}"
        ) from error

    def _restore_step(self, step: int, abstract_params: Any, abstract_opt_state: Any):
        out = self._manager.restore(
            step,
            args=ocp.args.Composite(
                params=ocp.args.StandardRestore(abstract_params),
                opt_state=ocp.args.StandardRestore(abstract_opt_state),
                meta=ocp.args.JsonRestore(),
            ),
        )
        return out.params, out.opt_state, _unwrap_meta(out.meta)

    def _pick(self, step: int | None, fix_if_none: str) -> int:
        """``step``, or the newest when None, once it is known to be a finalised step."""
        self.wait()
        steps = self.all_steps()
        if not steps:
            raise CheckpointError(f"no finalised checkpoint in {self.directory}; {fix_if_none}")
        if step is not None and step not in steps:
            shown = [str(s) for s in steps]
            if len(shown) > 8:
                shown = [*shown[:3], "...", *shown[-3:]]
            raise CheckpointError(
                f"no finalised checkpoint step {step} in {self.directory} (it holds steps "
                f"{', '.join(shown)}); pick one of those"
            )
        return steps[-1] if step is None else step

    def restore_params(self, abstract_params: Any, step: int | None = None) -> Any:
        """The params alone of ``step`` (default: the newest), onto ``abstract_params``'
        shardings: a frozen model made from a run (a teacher, an evaluation, an export).
        :class:`CheckpointError` when none restores, naming the steps there are."""
        step = self._pick(step, "point at a run's workdir that saved one")
        try:
            out = self._manager.restore(
                step,
                args=ocp.args.Composite(params=ocp.args.StandardRestore(abstract_params)),
            )
        except Exception as e:  # noqa: BLE001 - orbax raises many types for a damaged step
            raise CheckpointError(
                f"could not restore the params of checkpoint step {step} at "
                f"{self.step_dir(step)} ({_brief(e)}); it may be damaged or hold another "
                "model"
            ) from e
        return out.params

    def read_meta(self, step: int | None = None) -> dict[str, Any]:
        """The run meta of ``step`` (default: the latest) alone, without reading any array.

        Cheap enough to look before a restore (the run config a checkpoint was saved with, see
        ``rljax.runtime.resume``); raises :class:`CheckpointError` when it cannot be read.
        """
        step = self._pick(
            step, "start from scratch or point the run at the directory that holds its checkpoints"
        )
        try:
            out = self._manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))
            return _unwrap_meta(out.meta)
        except Exception as e:  # noqa: BLE001 - orbax raises many types for a damaged step
            raise CheckpointError(
                f"could not read the meta of checkpoint step {step} at {self.step_dir(step)} "
                f"({_brief(e)}); it may be damaged: delete it or restore an earlier step"
            ) from e

    def _quarantine(self, step: int) -> None:
        """Renames a step that failed to restore so later saves of that step number can land."""
        src = self.step_dir(step)
        if jax.process_index() == 0:
            dst = src.parent / f"{src.name}{CORRUPT_SUFFIX}"
            if dst.exists():
                dst = src.parent / f"{src.name}{CORRUPT_SUFFIX}-{time.time_ns()}"
            src.rename(dst)
            log.warning("moved checkpoint step %d aside to %s", step, dst)
        ocp.multihost.sync_global_processes(f"rljax_checkpoint_quarantine_{step}")
        self._manager.reload()


def save_shardings(tree, devices):
    """The checkpoint layout of ``tree``: over every device (one axis), each leaf split along
    its first dimension that the device count divides, else replicated."""
    mesh = Mesh(np.array(devices), ("all",))
    n = len(devices)

    def one(x):
        dims = [None] * len(x.shape)
        for i, size in enumerate(x.shape):
            if size % n == 0:
                dims[i] = "all"
                break
        return NamedSharding(mesh, PartitionSpec(*dims))

    return jax.tree.map(one, tree)


def use_orbax_distributed_barriers() -> None:
    """Orbax's barriers through the coordination service, not device collectives.

    A collective barrier from orbax's background save thread would interleave with the
    sampler's generate calls in a different order on each host and hang the pod.
    """
    from absl import flags

    holder = flags.FLAGS["experimental_orbax_use_distributed_barrier"]
    if not flags.FLAGS.is_parsed():
        flags.FLAGS.mark_as_parsed()
    holder.value = True
