"""Heartbeats that arrive close together are written in one transaction (issue 24: 1,000 nodes
every 5 s are 200 heartbeats a second; one transaction each, with its commit, was more than the
console worker could write).

The console worker's task (jobs.tasks.node_heartbeat) refuses a heartbeat too large to check
(jobs/services/heartbeat_limits.py), then hands it to `submit()`. The first thread to find no
write under way becomes the writer: it waits TRAINYARD_HEARTBEAT_BATCH_SECONDS for more to
arrive, takes all that did (at most MAX_BATCH), checks their signatures with one query for the
nodes' keys (agent_access.authentic_many; that query, one per heartbeat, had become most of a
heartbeat's cost once the writes were batched), then their rate (heartbeat_limits.too_soon,
after the signature as before, in the order they arrived), and writes those taken with
jobs.services.nodes.node_heartbeats (one query locks the nodes, each node is written once, one
commit); then it goes on while more have arrived meanwhile. Every other thread adds its
heartbeat and returns at once, so a Celery thread is never held waiting for a write it does
not do, and the batch grows with the load.
The writer runs inside its own task, so Django's per-task connection handling holds for it,
and a warm shutdown of the worker waits for it to write what it holds.

What is lost: a heartbeat is acknowledged to the broker once it is handed over, so the few
held in memory (one window's worth and the batch being written) are lost if the console worker
is killed outright (kill -9, the machine fails). That is accepted: a heartbeat is neither an
accepted job nor a log line, and each agent sends the next within TRAINYARD_HEARTBEAT_SECONDS,
well within the time a node may stay silent before it counts as lost. A batch that fails is
logged and written again one node at a time (nodes.node_heartbeats); nothing raises out of the
writer, so no thread is left believing a write is under way.

Should heartbeats arrive faster than the writer writes them, a thread that finds MAX_PENDING
waiting waits for the writer to take a batch before it adds its own: the rest stay on the
broker's queue, where nothing is lost, instead of in memory.

With TRAINYARD_HEARTBEAT_BATCH_SECONDS at 0 there is no batching: each heartbeat is checked and
written in its own transaction within its own task, as before batching.
"""

import logging
import threading
import time
from typing import Any

from django.conf import settings

from jobs.services import agent_access, heartbeat_limits, nodes
from workers import contract

log = logging.getLogger(__name__)

# At most this many heartbeats in one transaction: a backlog is written in several, each short
# enough not to hold the nodes' locks (or SQLite's write lock) for long.
MAX_BATCH = 500
# At most this many waiting in memory: past it, Celery threads wait (see above).
MAX_PENDING = 4 * MAX_BATCH


class Batcher:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._taken = threading.Condition(self._lock)  # the writer took a batch, or stopped
        self._pending: list[dict[str, Any]] = []
        self._writing = False

    def submit(self, payload: dict[str, Any]) -> None:
        """Hand a heartbeat over (its size checked); returns once it is written (this thread
        wrote the batch) or held for the thread that is writing."""
        with self._lock:
            while self._writing and len(self._pending) >= MAX_PENDING:
                self._taken.wait()
            self._pending.append(payload)
            if self._writing:
                return
            self._writing = True
        try:
            self._write_while_pending()
        except BaseException:  # interrupted (the worker stopping): let a later thread write
            with self._lock:
                self._writing = False
                self._taken.notify_all()
            raise

    def _write_while_pending(self) -> None:
        window = settings.TRAINYARD_HEARTBEAT_BATCH_SECONDS
        while True:
            with self._lock:
                full = len(self._pending) >= MAX_BATCH
            if not full:
                time.sleep(window)  # what arrives meanwhile joins this batch
            with self._lock:
                batch = self._pending[:MAX_BATCH]
                del self._pending[:MAX_BATCH]
                self._taken.notify_all()
            write(batch)
            with self._lock:
                if not self._pending:
                    # Cleared here, under the lock that submit() takes: a heartbeat added after
                    # this finds no writer and becomes one.
                    self._writing = False
                    self._taken.notify_all()
                    return


def write(batch: list[dict[str, Any]]) -> None:
    """Check these heartbeats (each no larger than heartbeat_limits allows) and write those that
    pass, in one transaction; never raises. The one way in for a batch, whether the Celery
    tasks gathered it (Batcher) or the drain took it off its Redis list (heartbeat_drain)."""
    try:
        nodes.node_heartbeats(checked(batch))
    except Exception:  # node_heartbeats logs and carries on; this is a last resort
        log.exception("lost a batch of %d heartbeats", len(batch))


def checked(payloads: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Those of the heartbeats signed by the node they name and not too soon after the last one
    taken from its agent (each refusal is logged by the check that refuses it)."""
    believed = agent_access.authentic_many(contract.TASK_NODE_HEARTBEAT, payloads)
    return [
        payload
        for payload, signed in zip(payloads, believed, strict=True)
        if signed and not heartbeat_limits.too_soon(payload)
    ]


_batcher = Batcher()


def submit(payload: dict[str, Any]) -> None:
    """Check and write this heartbeat (not too large: the task saw to that), batched with those
    arriving close to it (see above)."""
    if settings.TRAINYARD_HEARTBEAT_BATCH_SECONDS <= 0:
        if agent_access.authentic(contract.TASK_NODE_HEARTBEAT, payload) and not (
            heartbeat_limits.too_soon(payload)
        ):
            nodes.node_heartbeat(payload)
    else:
        _batcher.submit(payload)
