"""Telling websocket clients that a job changed, once the change is committed.

Sent on commit, never before: a client that is told about a state must be able to read it.
"""

from typing import Any

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.db import transaction


def job_group(job_id: int) -> str:
    return f"job.{job_id}"


def send_on_commit(job_id: int, payload: dict[str, Any]) -> None:
    def send() -> None:
        layer = get_channel_layer()
        if layer is not None:
            async_to_sync(layer.group_send)(
                job_group(job_id), {"type": "job.event", "payload": payload}
            )

    transaction.on_commit(send)
