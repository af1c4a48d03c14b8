"""rljax.mesh.control.Channel against an in-memory stand-in for the coordination service's
key-value store: what a waiting process is told when another posts its failure."""

from __future__ import annotations

import pytest

from rljax.mesh import control


class _Store:
    """The four key-value calls Channel makes, on a dict."""

    def __init__(self):
        self.data: dict[str, bytes] = {}

    def key_value_set_bytes(self, key, value, allow_overwrite=False):
        if key in self.data and not allow_overwrite:
            raise RuntimeError(f"ALREADY_EXISTS: {key}")
        self.data[key] = value

    def key_value_try_get_bytes(self, key):
        if key not in self.data:
            raise RuntimeError(f"NOT_FOUND: {key}")
        return self.data[key]

    def key_value_dir_get_bytes(self, directory):
        return sorted((k, v) for k, v in self.data.items() if k.startswith(directory + "/"))

    def key_value_delete(self, key):
        self.data.pop(key, None)


@pytest.fixture
def channels(monkeypatch):
    store = _Store()
    monkeypatch.setattr(control, "_client", lambda: store)
    return [control.Channel(process_count=4) for _ in range(2)]


def test_nothing_posted_means_alive(channels):
    channels[0].check_alive()


def test_a_posted_failure_names_the_process_and_its_error(channels, monkeypatch):
    monkeypatch.setattr("jax.process_index", lambda: 2)
    channels[0].fail(ValueError("reward function not found\nsecond line"))
    with pytest.raises(control.ProcessLost) as e:
        channels[1].check_alive("tick 7")
    msg = str(e.value)
    assert "process 2 of 4 failed (ValueError: reward function not found)" in msg
    assert "tick 7" in msg and "fix that error" in msg and "\n" not in msg


def test_a_collective_that_lost_its_peer_points_at_the_dead_process_not_itself(
    channels, monkeypatch
):
    """gloo's error on a survivor of kill -9 is a symptom: the message must not tell the user
    to fix it, but say that another process died and JAX will name it."""
    monkeypatch.setattr("jax.process_index", lambda: 2)
    channels[0].fail(
        RuntimeError("UNKNOWN: Gloo AllGather failed: [pair.cc:547] Connection closed by peer")
    )
    with pytest.raises(control.ProcessLost) as e:
        channels[1].check_alive("a generate")
    msg = str(e.value)
    assert "process 2 of 4 lost a peer in a collective" in msg
    assert "another process of the pod died" in msg and "fix that error" not in msg
