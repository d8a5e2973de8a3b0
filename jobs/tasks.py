"""Console-side Celery tasks: what agents report. Thin: each hands its payload to a service.

Every task is safe to receive twice (Celery redelivers after a crash); the services ignore a
report that no longer applies.
"""

from typing import Any

from celery import shared_task

from jobs.services import lifecycle
from workers import contract


@shared_task(name=contract.TASK_NODE_HEARTBEAT)
def node_heartbeat(payload: dict[str, Any]) -> None:
    lifecycle.node_heartbeat(payload)


@shared_task(name=contract.TASK_REPLICA_STARTED)
def replica_started(payload: dict[str, Any]) -> None:
    lifecycle.replica_started(payload["job_id"], payload["role"], payload["index"], payload["node"])


@shared_task(name=contract.TASK_REPLICA_EXITED)
def replica_exited(payload: dict[str, Any]) -> None:
    lifecycle.replica_exited(
        payload["job_id"],
        payload["role"],
        payload["index"],
        payload["node"],
        payload["state"],
        payload.get("exit_code"),
        payload.get("reason", ""),
        payload.get("stderr_tail", []),
    )
