"""A SIGTERM while a run closes (after its last step, its last checkpoint perhaps still being
committed) does not kill the process: chaos.py's ppo_async_resize caught one at exit -15."""

from __future__ import annotations

import importlib
import signal
from typing import Any

# The module (rljax.runtime re-exports its function of the same name).
run_module = importlib.import_module("rljax.runtime.run")


class _FinishedRun:
    """A run whose training is over; SIGTERM arrives while it closes."""

    made: list[_FinishedRun] = []

    def __init__(self, *_: Any, **__: Any) -> None:
        self.closed = False
        _FinishedRun.made.append(self)

    def train(self) -> dict[str, Any]:
        return {"final_accuracy": 1.0}

    def close(self) -> None:
        signal.raise_signal(signal.SIGTERM)
        self.closed = True


def test_a_sigterm_while_closing_lets_the_run_close_and_return(monkeypatch):
    received: list[int] = []
    outer = signal.signal(signal.SIGTERM, lambda signum, _: received.append(signum))
    try:
        monkeypatch.setattr(run_module, "Run", _FinishedRun)
        monkeypatch.setattr(_FinishedRun, "made", [])
        summary = run_module.run(None, "/unused")  # type: ignore[arg-type]
        assert summary == {"final_accuracy": 1.0}
        [made] = _FinishedRun.made
        assert made.closed, "the run was not closed (its close, with its SIGTERM, never ran)"
        assert received == [], "the SIGTERM during close reached the handler outside the run"
        # The handler outside the run is back once it returns.
        signal.raise_signal(signal.SIGTERM)
        assert received == [signal.SIGTERM]
    finally:
        signal.signal(signal.SIGTERM, outer)
