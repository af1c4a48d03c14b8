"""Run metrics: a JSONL file in the workdir, a progress bar, and a phase timeline.

Only process 0 writes (multi-host runs log once). Each JSONL line is one record with a
``step`` and a ``phase`` ('sft', 'eval', 'train', ...). The timeline records named spans per
thread and writes them as Chrome trace JSON, which Perfetto (ui.perfetto.dev) opens.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from typing import Any

import jax


class Timeline:
    """Named spans per track (thread), written as Chrome trace events."""

    def __init__(self):
        self._t0 = time.perf_counter()
        self._events: list[dict[str, Any]] = []
        self._lock = threading.Lock()

    @contextlib.contextmanager
    def span(self, name: str, track: str | None = None, **args: Any):
        start = time.perf_counter()
        try:
            yield
        finally:
            self.add(name, start, time.perf_counter(), track=track, **args)

    def add(self, name: str, start: float, end: float, *, track: str | None = None, **args):
        event = {
            "name": name,
            "ph": "X",
            "ts": (start - self._t0) * 1e6,
            "dur": (end - start) * 1e6,
            "pid": 0,
            "tid": track or threading.current_thread().name,
            "args": args,
        }
        with self._lock:
            self._events.append(event)

    def totals(self) -> dict[str, float]:
        """Seconds spent in each span name so far."""
        out: dict[str, float] = {}
        with self._lock:
            for e in self._events:
                out[e["name"]] = out.get(e["name"], 0.0) + e["dur"] / 1e6
        return out

    def write(self, path: str) -> None:
        with self._lock:
            events = list(self._events)
        with open(path, "w") as f:
            json.dump({"traceEvents": events, "displayTimeUnit": "ms"}, f)


class MetricsWriter:
    """Appends records to ``<workdir>/metrics.jsonl`` and shows a progress bar."""

    def __init__(self, workdir: str, *, total_steps: int = 0, progress_bar: bool = True):
        self.is_writer = jax.process_index() == 0
        self.path = os.path.join(workdir, "metrics.jsonl")
        self._file = open(self.path, "a") if self.is_writer else None  # noqa: SIM115
        self._bar = None
        if progress_bar and self.is_writer and total_steps:
            from tqdm.auto import tqdm

            self._bar = tqdm(total=total_steps, desc="rl", unit="step", dynamic_ncols=True)

    def write(self, step: int, phase: str, metrics: dict[str, Any]) -> None:
        if not self.is_writer:
            return
        record = {"step": step, "phase": phase, "time": time.time(), **_plain(metrics)}
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()

    def offset(self) -> int | None:
        """The metrics file's length: saved in checkpoints as the metrics cursor."""
        return None if self._file is None else self._file.tell()

    def rewind(self, offset: int | None) -> None:
        """Drop records written after ``offset`` (steps a killed run logged past its checkpoint)."""
        if self._file is not None and offset is not None and offset <= self._file.tell():
            self._file.truncate(offset)
            self._file.seek(offset)

    def progress(self, n: int = 1, **postfix: float) -> None:
        if self._bar is not None:
            self._bar.update(n)
            self._bar.set_postfix({k: f"{v:.3g}" for k, v in postfix.items()}, refresh=False)

    def print(self, message: str) -> None:
        if not self.is_writer:
            return
        if self._bar is not None:
            self._bar.write(message)
        else:
            print(message, flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
        if self._file is not None:
            self._file.close()


def _plain(metrics: dict[str, Any]) -> dict[str, Any]:
    out = {}
    for k, v in metrics.items():
        if hasattr(v, "item") and getattr(v, "size", 1) == 1:
            v = v.item()
        elif isinstance(v, dict):
            v = _plain(v)
        out[k] = v
    return out
