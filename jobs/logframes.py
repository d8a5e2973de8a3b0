"""The job websocket's log frames (jobs/consumers.py documents them) from a run of batches.

Pure: the same batches after the same cursor give the same frames, so a web process that
relays one job to many viewers encodes a run once for every viewer that stands at the same
cursor (jobs/logfanout.py), instead of once per viewer.
"""

import itertools
import json
from typing import Any

from jobs.logstream import Batch
from jobs.models import LogChunk


def frames(batches: list[Batch], position: int) -> tuple[list[dict[str, Any]], int]:
    """The frames that carry `batches` (none of them the end marker) to a viewer that has read
    up to cursor `position`, and the cursor it has read up to after them.

    Gaps, log lines and metric points go in stream order, each run of one kind a frame, so that
    a frame's `next` never passes something not yet sent. A gap may come anywhere in a page
    read from the archive, not only first."""
    out: list[dict[str, Any]] = []
    for kind, run in itertools.groupby(batches, key=_frame_kind):
        same = list(run)
        if kind == "gap":
            for hole in same:
                out.append(
                    {"type": "gap", "after": position, "next": hole.last, "reason": hole.reason}
                )
                position = hole.last
            continue
        position = same[-1].last
        if kind == "metric":
            # A value that was not finite is null: no chart takes it (the health rules read
            # it from the stream themselves).
            points = [p for b in same for p in b.points() if p["value"] is not None]
            out.append({"type": "metric", "points": points, "next": position})
        else:
            out.append({"type": "log", "batches": [b.wire() for b in same], "next": position})
    return out, position


def encoded(batches: list[Batch], position: int) -> tuple[list[str], int]:
    """`frames`, each as the JSON text the consumer sends (as AsyncJsonWebsocketConsumer
    encodes it)."""
    made, position = frames(batches, position)
    return [json.dumps(frame) for frame in made], position


def _frame_kind(batch: Batch) -> str:
    if batch.kind == LogChunk.Kind.GAP:
        return "gap"
    return "metric" if batch.is_metrics else "log"
