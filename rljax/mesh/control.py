"""The pod's control plane: small host messages between processes, with failure detection.

A pod run (``rljax.runtime.pod``) takes each decision once, on the sampler leader, and every
other process carries it out in the same order. The decisions travel as JSON through the
key-value store of ``jax.distributed``'s coordination service, not through a device collective:
a collective would queue behind whatever the learner's chips are computing, and the sampler
would wait for every learner step (the synchronous schedule this exists to avoid).

Waiting is bounded in what it can miss: every second a waiting process asks the coordination
service which processes are alive, and a dead one raises :class:`ProcessLost` naming it. JAX
itself also stops every survivor once a process has missed heartbeats for
``RLJAX_HEARTBEAT_TIMEOUT_S`` seconds (see ``rljax.mesh.distributed``).
"""

from __future__ import annotations

import json
import time
from typing import Any

# How often a waiting process checks that every process is still alive.
LIVENESS_EVERY_S = 1.0


class ProcessLost(RuntimeError):
    """A process of the pod died; the message names it and says how to resume."""


def _client():
    from jax._src import distributed as jax_distributed

    client = jax_distributed.global_state.client
    if client is None:
        raise RuntimeError(
            "the pod control channel needs jax.distributed; start every process through "
            "rljax.launch (or call rljax.mesh.distributed.maybe_initialize first)"
        )
    return client


class Channel:
    """JSON messages under ``prefix`` in the coordination service's key-value store."""

    def __init__(self, prefix: str = "rljax/", *, process_count: int | None = None):
        import jax

        self.prefix = prefix
        self.count = jax.process_count() if process_count is None else process_count
        self._client = _client()

    def post(self, key: str, value: Any) -> None:
        data = json.dumps(value, separators=(",", ":"), allow_nan=True).encode()
        self._client.key_value_set_bytes(self.prefix + key, data)

    def try_get(self, key: str) -> Any | None:
        """The value under ``key``, or None if nobody posted it yet."""
        try:
            data = self._client.key_value_try_get_bytes(self.prefix + key)
        except Exception:  # noqa: BLE001 - NOT_FOUND surfaces as a generic XLA error
            return None
        return json.loads(data)

    def keys(self, directory: str) -> list[str]:
        """The keys posted under ``directory/``, sorted."""
        rows = self._client.key_value_dir_get_bytes(self.prefix + directory)
        return sorted(k[len(self.prefix) :] for k, _ in rows)

    def delete(self, key: str) -> None:
        self._client.key_value_delete(self.prefix + key)

    def get(self, key: str, *, waiting_for: str = "the pod") -> Any:
        """Waits for ``key``; raises :class:`ProcessLost` if a process dies meanwhile."""
        while True:
            try:
                data = self._client.blocking_key_value_get_bytes(
                    self.prefix + key, int(LIVENESS_EVERY_S * 1000)
                )
                return json.loads(data)
            except Exception as e:  # noqa: BLE001 - a timeout is DEADLINE_EXCEEDED
                if "DEADLINE_EXCEEDED" not in str(e) and "timed out" not in str(e).lower():
                    raise
            self.check_alive(waiting_for)

    def check_alive(self, waiting_for: str = "the pod") -> None:
        try:
            live = set(self._client.get_live_nodes(list(range(self.count))))
        except Exception as e:  # noqa: BLE001 - the coordinator itself (process 0) is gone
            raise ProcessLost(
                f"lost the coordination service on process 0 while waiting for {waiting_for} "
                f"({str(e).splitlines()[0][:120]}); relaunch every process to resume from the "
                "last checkpoint"
            ) from None
        missing = sorted(set(range(self.count)) - live)
        if missing:
            raise ProcessLost(
                f"process {missing[0]} of {self.count} stopped (no heartbeat) while this one "
                f"waited for {waiting_for}; relaunch every process to resume from the last "
                "checkpoint"
            )


def wait_s(start: float) -> float:
    return time.perf_counter() - start
