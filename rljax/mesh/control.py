"""The pod's control plane: small host messages between processes, with failure detection.

A pod run (``rljax.runtime.pod``) takes each decision once, on the sampler leader, and every
other process carries it out in the same order. The decisions travel as JSON through the
key-value store of ``jax.distributed``'s coordination service, not through a device collective:
a collective would queue behind whatever the learner's chips are computing, and the sampler
would wait for every learner step (the synchronous schedule this exists to avoid).

A process that fails posts its error (:meth:`Channel.fail`); every second a waiting process
looks for such posts and raises :class:`ProcessLost` naming the failed process. A process that
dies without a word (``kill -9``, a lost host) stops sending heartbeats: JAX then stops every
survivor after ``RLJAX_HEARTBEAT_TIMEOUT_S`` seconds with a message naming it (see
``rljax.mesh.distributed``), either as the heartbeat timeout itself or as the shutdown barrier
failing on it. A survivor that was in a collective with the dead process fails first, with
gloo's "Connection closed by peer"; the others are told that process lost a peer, not asked to
fix its error. (``get_live_nodes`` is no liveness probe here: it waits for every live process
to call it.)
"""

from __future__ import annotations

import contextlib
import json
import threading
from typing import Any

# How often a waiting process checks that every process is still alive.
LIVENESS_EVERY_S = 1.0

# What a collective raises when the process at the other end died (gloo over TCP): a process
# that posts one of these failed only because another died first.
LOST_PEER = ("Connection closed by peer", "Connection reset by peer", "Broken pipe")


class PodProtocolError(RuntimeError):
    """A message this process cannot follow (a tick it cannot replay, an answer out of order):
    the pod fails at once rather than hang."""


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

    def post(self, key: str, value: Any, *, overwrite: bool = False) -> None:
        data = json.dumps(value, separators=(",", ":"), allow_nan=True).encode()
        self._client.key_value_set_bytes(self.prefix + key, data, allow_overwrite=overwrite)

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

    def fail(self, error: BaseException) -> None:
        """Tell every other process that this one failed, and why (one line)."""
        import jax

        line = f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
        # The coordinator may be gone too; the error itself still propagates.
        with contextlib.suppress(Exception):
            self.post(f"failed/{jax.process_index()}", line[:500])

    def barrier(self, name: str) -> None:
        """Wait until every process got here (or one failed: :class:`ProcessLost`).

        Before a pod's first collective: a collective's first use sets up its context with a
        30 s deadline, and processes finish building at different times.
        """
        import jax

        self.post(f"{name}/{jax.process_index()}", True)
        for p in range(self.count):
            self.get(f"{name}/{p}", waiting_for=f"process {p} to reach '{name}'")

    def check_alive(self, waiting_for: str = "the pod") -> None:
        """Raises :class:`ProcessLost` if a process posted a failure."""
        failed = self.keys("failed")
        if not failed:
            return
        pid, error = failed[0].rsplit("/", 1)[1], self.try_get(failed[0])
        if any(s in str(error) for s in LOST_PEER):  # a symptom, not the cause
            raise ProcessLost(
                f"process {pid} of {self.count} lost a peer in a collective ({error}) while this "
                f"one waited for {waiting_for}: another process of the pod died, and JAX names it "
                "once its heartbeats time out; relaunch every process to resume from the last "
                "checkpoint"
            )
        raise ProcessLost(
            f"process {pid} of {self.count} failed ({error}) while this one "
            f"waited for {waiting_for}; fix that error, then relaunch every process"
        )


def host_key(kind: str, epoch: int, host: int, n: int) -> str:
    """The key of a build's ``n``-th message of ``kind`` to or from ``host``; the epoch (the
    pod's resize count) keeps a rebuilt pod from meeting an earlier build's keys."""
    return f"{kind}/{epoch}/{host}/{n}"


class ChannelThread:
    """A daemon thread that serves the pod through a :class:`Channel` (a subclass's
    ``_serve``), started by :meth:`start`. An error it meets fails the pod at once
    (:meth:`Channel.fail`: a process may be waiting for what this thread posts), and
    :meth:`join` re-raises it."""

    def __init__(self, channel: Channel, name: str):
        self.channel = channel
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _serve(self) -> None:
        raise NotImplementedError

    def _run(self) -> None:
        try:
            self._serve()
        except BaseException as e:
            self.error = e
            self.channel.fail(e)

    def join(self) -> None:
        """Wait for the thread to end (the leader tells it when); re-raise its failure."""
        self._thread.join()
        if self.error is not None:
            raise self.error
