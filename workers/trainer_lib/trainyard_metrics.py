"""Report training metrics to Trainyard from a Python trainer. No dependencies; safe anywhere.

The protocol, for trainers in any language: append one JSON object per line to the file named by
the environment variable TRAINYARD_METRICS_FILE (the node agent reads it as it grows).

    {"name": "loss", "value": 0.25, "step": 120}              one metric
    {"step": 120, "epoch": 1.5, "loss": 0.25, "lr": 0.05}     several at once
    {"total_steps": 4000}                                     the run's length, for progress/ETA

Names the console charts on their own: loss, lr, eval_accuracy, eval_loss, samples_per_sec (this
process's throughput; the console adds the processes up). Any other name is charted as a custom
metric. Values are numbers, or one of the strings "nan", "inf" and "-inf" for a value that is not
finite (a loss gone NaN is worth knowing: a health rule can stop the job); the file stays strict
JSON, so never the bare NaN / Infinity some encoders write. A bad line is reported in the job's
log and skipped.

    {"name": "loss", "value": "nan", "step": 130}             a loss that went NaN

From Python (the node agent puts this module on every trainer's PYTHONPATH):

    import trainyard_metrics as metrics
    metrics.declare(total_steps=4000)
    metrics.report(step=120, loss=0.25, lr=0.05, samples_per_sec=1830.0)

Outside Trainyard (no TRAINYARD_METRICS_FILE) both calls do nothing.
"""

import json
import math
import os
import threading
import time
from typing import IO

ENV = "TRAINYARD_METRICS_FILE"  # the same name as workers.contract.TRAINYARD_METRICS_FILE

_lock = threading.Lock()
_file: IO[str] | None = None
_opened_path: str | None = None


def _channel() -> IO[str] | None:
    global _file, _opened_path
    path = os.environ.get(ENV)
    if not path:
        return None
    if _file is None or _opened_path != path:
        # Line-buffered append: every report is one whole line, written at once.
        _file = open(path, "a", buffering=1, encoding="utf-8")
        _opened_path = path
    return _file


def _write(record: dict[str, object]) -> None:
    with _lock:
        channel = _channel()
        if channel is not None:
            channel.write(json.dumps(record, allow_nan=False) + "\n")


def _value(value: float) -> float | str:
    """A metric value as the protocol writes it: a number, or "nan" / "inf" / "-inf"."""
    number = float(value)
    if math.isnan(number):
        return "nan"
    if math.isinf(number):
        return "inf" if number > 0 else "-inf"
    return number


def report(step: int | None = None, epoch: float | None = None, **values: float) -> None:
    """Record metric values at a step (and/or epoch). A value that is not finite (NaN, ±inf)
    is written as the string "nan", "inf" or "-inf", so that the console sees it."""
    record: dict[str, object] = {"ts": time.time()}
    if step is not None:
        record["step"] = int(step)
    if epoch is not None:
        record["epoch"] = float(epoch)
    if values:
        _write(record | {k: _value(v) for k, v in values.items()})


def declare(total_steps: int | None = None, total_epochs: float | None = None) -> None:
    """Say how long the run is, so the console can show progress and an ETA."""
    record: dict[str, object] = {}
    if total_steps is not None:
        record["total_steps"] = int(total_steps)
    if total_epochs is not None:
        record["total_epochs"] = float(total_epochs)
    if record:
        _write(record)
