"""Telling websocket clients that a job changed, once the change is committed.

Sent on commit, never before: a client that is told about a state must be able to read it.

Events are best effort (a client also gets the current state whenever it connects), so they
leave through one long-lived sender thread per process instead of blocking the caller:
`async_to_sync` would make a new event loop, and with it a new Redis connection, per event,
which made every state change cost ~25 ms inside admission and scheduling.
"""

import asyncio
import logging
import threading
from collections.abc import Callable
from typing import Any

from channels.layers import get_channel_layer
from django.db import transaction

log = logging.getLogger(__name__)


def job_group(job_id: int) -> str:
    return f"job.{job_id}"


class _Sender:
    """One event loop in a daemon thread; one task sends queued events in order."""

    def __init__(self) -> None:
        self._loop = asyncio.new_event_loop()
        self._queue: asyncio.Queue[tuple[str, dict[str, Any]]] = asyncio.Queue()
        self._thread = threading.Thread(target=self._run, name="job-events", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_until_complete(self._drain())

    async def _drain(self) -> None:
        while True:
            group, message = await self._queue.get()
            try:
                layer = get_channel_layer()
                if layer is not None:
                    await layer.group_send(group, message)
            except Exception:
                log.warning("could not send a job event to %s", group, exc_info=True)

    def send(self, group: str, message: dict[str, Any]) -> None:
        self._loop.call_soon_threadsafe(self._queue.put_nowait, (group, message))


_sender: _Sender | None = None
_sender_lock = threading.Lock()


def _get_sender() -> _Sender:
    global _sender
    with _sender_lock:
        if _sender is None:
            _sender = _Sender()
        return _sender


class _StateEvent:
    """Sends a job's state as it is once the transaction has committed."""

    def __init__(self, job_id: int, payload: Callable[[int], dict[str, Any] | None]) -> None:
        self.job_id = job_id
        self._payload = payload
        self.sent = False

    def __call__(self) -> None:
        self.sent = True
        job = self._payload(self.job_id)
        if job is not None:
            message = {"type": "job.event", "payload": {"type": "state", "job": job}}
            _get_sender().send(job_group(self.job_id), message)


def state_changed_on_commit(job_id: int, payload: Callable[[int], dict[str, Any] | None]) -> None:
    """Tell the job's clients its state once this transaction commits, once per job.

    The payload is built at commit, not now, so it shows every write the transaction made
    (a state change and the replicas stopped after it), and several changes to one job in
    one transaction become one event.
    """
    pending = transaction.get_connection().run_on_commit
    if any(
        isinstance(hook, _StateEvent) and hook.job_id == job_id and not hook.sent
        for _, hook, _ in pending
    ):
        return
    transaction.on_commit(_StateEvent(job_id, payload), robust=True)
