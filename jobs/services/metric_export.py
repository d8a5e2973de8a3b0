"""A job's metrics as files other tools read: CSV, and TensorBoard event files (so a run and its
baseline can be compared as `tensorboard --logdir run:PATH,baseline:PATH`)."""

import csv
import io
import tarfile
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from jobs import logstream
from workers.contract import tag_of
from workers.metricparse import is_system_metric

CSV_FIELDS = ("cursor", "role", "index", "node", "name", "step", "epoch", "value", "ts")


def csv_rows(job_id: int) -> Iterator[str]:
    points, _ = logstream.metric_points(job_id)
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, CSV_FIELDS, extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    for point in points:
        writer.writerow(point)
        if buffer.tell() > 64 * 1024:
            yield buffer.getvalue()
            buffer.seek(0)
            buffer.truncate()
    yield buffer.getvalue()


def _tag(point: dict[str, Any]) -> str:
    """TensorBoard tag: the metric, per process (`loss/worker-1`); the agent's samples under
    `system/`."""
    who = tag_of(point["role"], point["index"])
    group = "system/" if is_system_metric(point["name"]) else ""
    return f"{group}{point['name']}/{who}"


def write_tensorboard(job_id: int, directory: Path) -> int:
    """Write the job's metrics as event files under `directory`; returns the points written.

    A point's TensorBoard step is its step, else its epoch × 1000, else its order among the
    points of that tag, so that every curve has an x axis. Written with TensorBoard's own event
    writer (what torch's SummaryWriter wraps), so the console needs no torch.
    """
    # Heavy imports (protobuf): only when exporting.
    from tensorboard.compat.proto.event_pb2 import Event
    from tensorboard.compat.proto.summary_pb2 import Summary
    from tensorboard.summary.writer.event_file_writer import EventFileWriter

    points, _ = logstream.metric_points(job_id)
    counters: dict[str, int] = {}
    written = 0
    directory.mkdir(parents=True, exist_ok=True)
    writer = EventFileWriter(str(directory))
    try:
        for point in points:
            tag = _tag(point)
            if point.get("step") is not None:
                step = int(point["step"])
            elif point.get("epoch") is not None:
                step = round(float(point["epoch"]) * 1000)
            else:
                step = counters.get(tag, 0)
                counters[tag] = step + 1
            value = Summary.Value(tag=tag, simple_value=logstream.point_value(point))
            writer.add_event(
                Event(wall_time=point["ts"], step=step, summary=Summary(value=[value]))
            )
            written += 1
    finally:
        writer.close()
    return written


def tensorboard_archive(job_id: int) -> bytes:
    """A .tar.gz holding `job-ID/events.out.tfevents.…`: unpack it and point TensorBoard at it."""
    with tempfile.TemporaryDirectory() as folder:
        run_dir = Path(folder) / f"job-{job_id}"
        write_tensorboard(job_id, run_dir)
        data = io.BytesIO()
        with tarfile.open(fileobj=data, mode="w:gz") as archive:
            archive.add(run_dir, arcname=run_dir.name)
        return data.getvalue()
