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
from collections.abc import Callable, Iterable
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
        self.send_many([(group, message)])

    def send_many(self, events: list[tuple[str, dict[str, Any]]]) -> None:
        """Queue several events with one wake-up of the sender's loop, not one each."""
        self._loop.call_soon_threadsafe(self._put_all, events)

    def _put_all(self, events: list[tuple[str, dict[str, Any]]]) -> None:
        for event in events:
            self._queue.put_nowait(event)


_sender: _Sender | None = None
_sender_lock = threading.Lock()


def _get_sender() -> _Sender:
    global _sender
    with _sender_lock:
        if _sender is None:
            _sender = _Sender()
        return _sender


Payloads = Callable[[list[int]], Iterable[tuple[int, dict[str, Any]]]]


class _StateEvents:
    """Sends the state of every job the transaction changed, as each is once it has
    committed: one hook per transaction, whose payloads are built together (a scheduling pass
    that gives 10,000 waiting jobs a new reason builds them in a few queries, not 10,000
    times a few)."""

    def __init__(self, payloads: Payloads) -> None:
        self.payloads = payloads
        self.job_ids: dict[int, None] = {}  # ordered: events leave in the order of the changes
        self.sent = False

    def __call__(self) -> None:
        self.sent = True
        batch: list[tuple[str, dict[str, Any]]] = []
        for job_id, job in self.payloads(list(self.job_ids)):
            message = {"type": "job.event", "payload": {"type": "state", "job": job}}
            batch.append((job_group(job_id), message))
            if len(batch) >= _EVENTS_PER_WAKE_UP:
                _get_sender().send_many(batch)
                batch = []
        if batch:
            _get_sender().send_many(batch)


_EVENTS_PER_WAKE_UP = 500


# What builds the state payloads of several jobs at once: the read model's
# (jobs.services.views.presenters.states_of), registered when the app starts (jobs.apps), so that
# the writers of job state, which call state_changed_on_commit, do not import the read model.
_payloads: Payloads | None = None


def use_payloads(payloads: Payloads) -> None:
    global _payloads
    _payloads = payloads


def state_changed_on_commit(job_id: int) -> None:
    """Tell the job's clients its state once this transaction commits, once per job.

    The payload is built at commit, not now, so it shows every write the transaction made
    (a state change and the replicas stopped after it), and several changes to one job in
    one transaction become one event, built with the others by the registered payloads.
    """
    if _payloads is None:
        raise RuntimeError("no state payloads registered (jobs.apps.JobsConfig.ready)")
    connection = transaction.get_connection()
    hooks = connection.run_on_commit
    # Django replaces its list of hooks on every commit, rollback and savepoint rolled back
    # (and only appends to it otherwise): while the list is the one the batch was added to,
    # the batch is in it. A batch kept across a savepoint rolled back may name a job whose
    # change was undone: its clients are told its state as it is, which is harmless.
    found: tuple[list[Any], _StateEvents] | None = getattr(connection, "_trainyard_events", None)
    if found is not None and found[0] is hooks and not found[1].sent:
        found[1].job_ids.setdefault(job_id, None)
        return
    batch = _StateEvents(_payloads)
    batch.job_ids[job_id] = None
    transaction.on_commit(batch, robust=True)
    connection._trainyard_events = (connection.run_on_commit, batch)
