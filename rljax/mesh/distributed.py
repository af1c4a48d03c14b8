"""Joining the hosts of a pod into one JAX program (``jax.distributed``), or not.

A multi-host run is one multi-controller program (option (a) of ``docs/multihost.md``): every
host runs the same launcher, and :func:`maybe_initialize` joins them before any device is
touched. How the world is found, in order:

1. **Explicit**: ``JAX_COORDINATOR_ADDRESS=host:port`` together with ``JAX_NUM_PROCESSES`` and
   ``JAX_PROCESS_ID`` (all three, as on a local test or a custom cluster). On the CPU backend
   the cross-process collectives are switched to gloo, since the default has none.
2. **TPU pod**: a TPU VM whose ``TPU_WORKER_HOSTNAMES`` (or ``TPU_PROCESS_ADDRESSES``) lists
   more than one host, or a multislice job (``MEGASCALE_COORDINATOR_ADDRESS``). JAX's own
   cluster detection then finds the coordinator, the process count and this host's id.
3. **Single host**: anything else. Nothing is initialised; process 0 of 1.

``RLJAX_DISTRIBUTED=0`` turns the whole thing off (a single-host debug run on one worker of a
pod). :func:`detect` is the pure part (environment in, plan out) and is what the tests check.

Once joined, :func:`allgather_objects` exchanges small host-side values (a process's prompts,
its rewards, its data-iterator state) so that every process can feed the same inputs to the
global-mesh programs.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from collections.abc import Mapping
from typing import Any

import numpy as np

# How long a finished process waits at exit for the others (JAX's default, 300 s, keeps a
# process that failed alive for minutes).
SHUTDOWN_TIMEOUT_S = 60
_EXPLICIT_KEYS = ("JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID")
_TPU_HOST_KEYS = ("TPU_PROCESS_ADDRESSES", "TPU_WORKER_HOSTNAMES")


class DistributedConfigError(ValueError):
    """The environment asks for a multi-host run but does not describe it completely."""


@dataclasses.dataclass(frozen=True)
class DistributedPlan:
    """How to join the world: ``mode`` is 'single', 'explicit' or 'tpu_pod'.

    ``coordinator``, ``num_processes`` and ``process_id`` are set only in 'explicit' mode; on a
    pod JAX's cluster detection supplies them.
    """

    mode: str
    coordinator: str | None = None
    num_processes: int | None = None
    process_id: int | None = None


@dataclasses.dataclass(frozen=True)
class ProcessInfo:
    """This process's place in the world after :func:`maybe_initialize`."""

    index: int
    count: int
    mode: str

    @property
    def is_primary(self) -> bool:
        """True on process 0, the only one that writes metrics and prints summaries."""
        return self.index == 0


def _int_env(env: Mapping[str, str], key: str) -> int:
    raw = env[key]
    try:
        return int(raw)
    except ValueError:
        raise DistributedConfigError(
            f"environment variable {key}={raw!r} is not an integer; set it to e.g. 0"
        ) from None


def detect(env: Mapping[str, str] | None = None) -> DistributedPlan:
    """Reads ``env`` (default ``os.environ``) and says how this process should start."""
    env = os.environ if env is None else env
    if env.get("RLJAX_DISTRIBUTED", "").strip().lower() in ("0", "false", "off"):
        return DistributedPlan("single")
    present = [k for k in _EXPLICIT_KEYS if env.get(k)]
    if present:
        missing = [k for k in _EXPLICIT_KEYS if not env.get(k)]
        if missing:
            raise DistributedConfigError(
                f"{present[0]} is set but {', '.join(missing)} is not; set all of "
                f"{', '.join(_EXPLICIT_KEYS)} for a multi-process run, or unset {present[0]}"
            )
        count = _int_env(env, "JAX_NUM_PROCESSES")
        pid = _int_env(env, "JAX_PROCESS_ID")
        if count < 1 or not 0 <= pid < count:
            raise DistributedConfigError(
                f"JAX_PROCESS_ID={pid} with JAX_NUM_PROCESSES={count} is invalid; the id must be "
                f"in [0, {count})"
            )
        address = env["JAX_COORDINATOR_ADDRESS"]
        if ":" not in address:
            raise DistributedConfigError(
                f"JAX_COORDINATOR_ADDRESS={address!r} has no port; use host:port, "
                "e.g. 127.0.0.1:12355"
            )
        if count == 1:
            return DistributedPlan("single")
        return DistributedPlan("explicit", address, count, pid)
    if env.get("MEGASCALE_COORDINATOR_ADDRESS"):
        return DistributedPlan("tpu_pod")
    for key in _TPU_HOST_KEYS:
        hosts = [h for h in env.get(key, "").split(",") if h.strip()]
        if len(hosts) > 1:
            return DistributedPlan("tpu_pod")
    return DistributedPlan("single")


def maybe_initialize(env: Mapping[str, str] | None = None) -> ProcessInfo:
    """Calls ``jax.distributed.initialize`` when :func:`detect` finds a multi-host world.

    Call it once per process, before anything touches a device (building meshes, creating
    arrays). A second call, or a call after someone else initialised, only reports the world.
    """
    import jax

    plan = detect(env)
    if plan.mode != "single" and not jax.distributed.is_initialized():
        if plan.mode == "explicit":
            # The CPU client has no cross-process collectives unless one is chosen; the flag
            # touches only the CPU client, so it is harmless next to an accelerator.
            jax.config.update("jax_cpu_collectives_implementation", "gloo")
            jax.distributed.initialize(
                coordinator_address=plan.coordinator,
                num_processes=plan.num_processes,
                process_id=plan.process_id,
                heartbeat_timeout_seconds=heartbeat_timeout_s(),
                shutdown_timeout_seconds=SHUTDOWN_TIMEOUT_S,
            )
        else:
            jax.distributed.initialize(
                heartbeat_timeout_seconds=heartbeat_timeout_s(),
                shutdown_timeout_seconds=SHUTDOWN_TIMEOUT_S,
            )
    return ProcessInfo(index=jax.process_index(), count=jax.process_count(), mode=plan.mode)


def heartbeat_timeout_s(env: Mapping[str, str] | None = None) -> int:
    """Seconds without a heartbeat after which JAX stops every other process, naming the lost
    one (``RLJAX_HEARTBEAT_TIMEOUT_S``, default 20; JAX's own default, 100, lets a pod hang for
    minutes after a host died)."""
    env = os.environ if env is None else env
    raw = env.get("RLJAX_HEARTBEAT_TIMEOUT_S", "20")
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value < 1:
        raise DistributedConfigError(
            f"RLJAX_HEARTBEAT_TIMEOUT_S={raw!r} is invalid; set it to whole seconds >= 1"
        )
    return value


def process_index() -> int:
    """This process's index (0 on a single host)."""
    import jax

    return jax.process_index()


def process_count() -> int:
    """How many processes form the program (1 on a single host)."""
    import jax

    return jax.process_count()


def data_shard() -> tuple[int, int]:
    """``(shard_index, shard_count)`` for the prompt stream: one shard per process."""
    return process_index(), process_count()


def allgather_objects(obj: Any) -> list[Any]:
    """Every process's ``obj``, in process order, on every process.

    A collective: every process must call it, in the same order as its other collectives.
    ``obj`` must be JSON-serialisable (example dicts, lists of floats, iterator states); it is
    JSON-encoded to bytes, padded to the longest process's length and exchanged with
    ``multihost_utils.process_allgather``. One process takes the same encode/decode path
    without touching a device, so what comes back (a tuple as a list, say) never depends on
    how many processes there are. Meant for small control data, not arrays.
    """
    from jax.experimental import multihost_utils

    try:
        text = json.dumps(obj, allow_nan=True, separators=(",", ":"))
    except (TypeError, ValueError) as e:
        raise TypeError(
            f"allgather_objects: the value is not JSON-serialisable ({e}); convert numpy scalars "
            "and arrays to Python numbers and lists"
        ) from None
    data = np.frombuffer(text.encode(), np.uint8)
    lengths = np.asarray(multihost_utils.process_allgather(np.int32(data.size))).reshape(-1)
    padded = np.zeros(int(lengths.max()), np.uint8)
    padded[: data.size] = data
    rows = np.asarray(multihost_utils.process_allgather(padded))
    return [json.loads(row[:n].tobytes()) for row, n in zip(rows, lengths.tolist(), strict=True)]


def check_same_config(cfg: Any) -> None:
    """Refuse, on every process, a run whose processes were launched with different configs.

    A collective. Each process hashes its validated config; the hashes are all-gathered, so
    every process sees the same list and raises the same one-line error, instead of the hosts
    taking different decisions and hanging in their next collective.
    """
    from rljax.config import ConfigError, to_config_dict

    text = json.dumps(to_config_dict(cfg).to_dict(), sort_keys=True, default=str)
    digests = allgather_objects(hashlib.sha256(text.encode()).hexdigest()[:16])
    odd = [i for i, d in enumerate(digests) if d != digests[0]]
    if odd:
        raise ConfigError(
            f"process {odd[0]} runs a different config than process 0 (config hash "
            f"{digests[odd[0]]} vs {digests[0]}); launch every process with the same --config "
            "file and the same --config.* overrides"
        )
