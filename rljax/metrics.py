"""Run metrics: a JSONL file and TensorBoard event files in the workdir, a progress bar, and a
phase timeline.

Only process 0 writes (multi-host runs log once). Each JSONL line is one record with a
``step`` and a ``phase`` ('sft', 'eval', 'train', ...); every numeric field of a record also
goes to TensorBoard as the scalar ``<phase>/<key>`` (nested dicts join their keys with '/'),
one TensorBoard run per phase under ``<workdir>/tensorboard/<phase>``. The timeline records
named spans per thread and writes them as Chrome trace JSON, which Perfetto
(ui.perfetto.dev) opens. Every file goes through :mod:`rljax.io`, so the workdir may be a
``gs://`` URL.
"""

from __future__ import annotations

import collections
import contextlib
import json
import threading
import time
from typing import Any

import jax

from rljax import io

METRICS_FILE = "metrics.jsonl"
TENSORBOARD_DIR = "tensorboard"
# Record fields that locate a record rather than measure anything.
_RECORD_KEYS = ("step", "phase", "time")
# Spans a Timeline keeps for its trace: the driver adds one per generate call, so a long run
# would otherwise grow host memory without bound; totals() still counts every span.
MAX_TRACE_EVENTS = 100_000


class Timeline:
    """Named spans per track (thread), written as Chrome trace events (the newest
    ``max_events``; ``totals`` counts them all)."""

    def __init__(self, max_events: int = MAX_TRACE_EVENTS):
        self._t0 = time.perf_counter()
        self.max_events = max_events
        self._events: collections.deque[dict[str, Any]] = collections.deque(maxlen=max_events)
        self._totals: dict[str, float] = {}
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
            self._totals[name] = self._totals.get(name, 0.0) + (end - start)

    @property
    def num_events(self) -> int:
        """Spans held for the trace (at most ``max_events``)."""
        return len(self._events)

    def totals(self) -> dict[str, float]:
        """Seconds spent in each span name so far."""
        with self._lock:
            return dict(self._totals)

    def write(self, path: io.PathLike) -> None:
        """Writes the spans so far to ``path`` (local or remote) as Chrome trace JSON."""
        with self._lock:
            events = list(self._events)
        io.write_text(path, json.dumps({"traceEvents": events, "displayTimeUnit": "ms"}))


def scalars(record: dict[str, Any]) -> dict[str, float]:
    """The TensorBoard scalars of a metrics record: ``{'<phase>/<key>': value}``.

    Every int, float or bool field except step/phase/time counts; nested dicts join their
    keys with '/'; strings, lists and None are skipped.
    """
    phase = record.get("phase", "metrics")
    out: dict[str, float] = {}

    def visit(prefix: str, value: Any) -> None:
        if isinstance(value, dict):
            for k, v in value.items():
                visit(f"{prefix}/{k}", v)
        elif isinstance(value, bool | int | float):
            out[prefix] = float(value)

    for key, value in record.items():
        if key not in _RECORD_KEYS:
            visit(f"{phase}/{key}", value)
    return out


class _SeamRecordWriterFactory:
    """tensorboardX's hook for a URL scheme: event files written through :mod:`rljax.io`.

    tensorboardX's own ``gs://`` writer talks to google-cloud-storage directly, past the seam
    and its credentials; this one uploads the whole file on each of the writer's flushes.
    """

    def open(self, path: str) -> io.AppendFile:
        return io.AppendFile(path, fresh=True, upload_every_s=None)

    def directory_check(self, path: str) -> None:
        io.makedirs(path)


class TensorBoardWriter:
    """Scalar metrics as TensorBoard event files, one run (sub-folder) per phase.

    ``purge_steps`` maps a phase to the step from which TensorBoard should drop what earlier
    event files hold (``purge_step`` of the phase's first new event file): the steps a killed
    run logged past the checkpoint it resumes from.
    """

    def __init__(self, logdir: io.PathLike, *, flush_secs: int = 30):
        from tensorboardX import SummaryWriter, record_writer

        self.logdir = io.path(logdir)
        self.flush_secs = flush_secs
        self._summary_writer = SummaryWriter
        if not io.is_local(self.logdir):
            scheme = str(self.logdir).split("://", 1)[0]
            record_writer.register_writer_factory(scheme, _SeamRecordWriterFactory())
        self._writers: dict[str, Any] = {}
        self._purge: dict[str, int] = {}

    def write(self, record: dict[str, Any]) -> None:
        phase = str(record.get("phase", "metrics"))
        values = scalars(record)
        if not values:
            return
        writer = self._writer(phase)
        for tag, value in values.items():
            writer.add_scalar(
                tag, value, global_step=record.get("step"), walltime=record.get("time")
            )

    def restart(self, purge_steps: dict[str, int]) -> None:
        """Closes the event files; each phase's next file purges from ``purge_steps[phase]``."""
        self.close()
        self._purge = dict(purge_steps)

    def flush(self) -> None:
        for writer in self._writers.values():
            writer.flush()

    def close(self) -> None:
        for writer in self._writers.values():
            writer.close()
        self._writers = {}

    def _writer(self, phase: str):
        if phase not in self._writers:
            self._writers[phase] = self._summary_writer(
                logdir=str(self.logdir / phase),
                purge_step=self._purge.pop(phase, None),
                flush_secs=self.flush_secs,
                # tensorboardX names files by the second; a resume within it must not clobber.
                filename_suffix=f".{time.time_ns()}",
            )
        return self._writers[phase]


def _purge_steps(kept: bytes, dropped: bytes) -> dict[str, int]:
    """Per phase, the first step that a rewind to the end of ``kept`` takes back."""
    last: dict[str, int] = {}
    first_dropped: dict[str, int] = {}
    for chunk, into, pick in ((kept, last, max), (dropped, first_dropped, min)):
        for line in chunk.decode("utf-8", errors="replace").splitlines():
            try:
                record = json.loads(line)
                phase, step = str(record["phase"]), int(record["step"])
            except (ValueError, KeyError, TypeError):
                continue  # a torn last line of a killed run
            into[phase] = pick(into.get(phase, step), step)
    purge = {phase: step + 1 for phase, step in last.items()}
    for phase, step in first_dropped.items():
        purge.setdefault(phase, step)
    return purge


class MetricsWriter:
    """Appends records to ``<workdir>/metrics.jsonl`` and TensorBoard, shows a progress bar.

    On a remote workdir the JSONL object is uploaded at most every ``upload_every_s`` seconds
    and whenever :meth:`offset` is asked for, so a checkpoint's cursor is always durable.
    """

    def __init__(
        self,
        workdir: io.PathLike,
        *,
        total_steps: int = 0,
        progress_bar: bool = True,
        tensorboard: bool = True,
        upload_every_s: float | None = 10.0,
    ):
        self.is_writer = jax.process_index() == 0
        self.path = io.join(workdir, METRICS_FILE)
        self._file = (
            io.AppendFile(self.path, upload_every_s=upload_every_s) if self.is_writer else None
        )
        self.tensorboard = (
            TensorBoardWriter(io.join(workdir, TENSORBOARD_DIR))
            if tensorboard and self.is_writer
            else None
        )
        self._bar = None
        if progress_bar and self.is_writer and total_steps:
            from tqdm.auto import tqdm

            self._bar = tqdm(total=total_steps, desc="rl", unit="step", dynamic_ncols=True)

    def write(self, step: int, phase: str, metrics: dict[str, Any]) -> None:
        if self._file is None:  # not the writer
            return
        record = {"step": step, "phase": phase, "time": time.time(), **_plain(metrics)}
        self._file.write((json.dumps(record) + "\n").encode("utf-8"))
        if self.tensorboard is not None:
            self.tensorboard.write(record)

    def offset(self) -> int | None:
        """The metrics file's length, made durable: saved in checkpoints as the metrics cursor."""
        if self._file is None:
            return None
        self._file.flush()
        if self.tensorboard is not None:
            self.tensorboard.flush()
        return self._file.tell()

    def rewind(self, offset: int | None) -> None:
        """Drop records written after ``offset`` (steps a killed run logged past its checkpoint).

        TensorBoard cannot cut files back; each phase's next event file tells it to drop the
        events from the first step rewound.
        """
        if self._file is None or offset is None or offset > self._file.tell():
            return
        content = self._file.getvalue()
        self._file.truncate(offset)
        if self.tensorboard is not None:
            self.tensorboard.restart(_purge_steps(content[:offset], content[offset:]))

    def flush(self) -> None:
        """Makes every record so far durable (uploads a remote metrics file)."""
        if self._file is not None:
            self._file.flush()
        if self.tensorboard is not None:
            self.tensorboard.flush()

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
        if self.tensorboard is not None:
            self.tensorboard.close()


def _plain(metrics: dict[str, Any]) -> dict[str, Any]:
    out = {}
    for k, v in metrics.items():
        if hasattr(v, "item") and getattr(v, "size", 1) == 1:
            v = v.item()
        elif isinstance(v, dict):
            v = _plain(v)
        out[k] = v
    return out
