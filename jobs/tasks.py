"""Console-side Celery tasks: what agents report, and scheduling. Thin: each hands its payload
to a service.

Every task is safe to receive twice (Celery redelivers after a crash); the services ignore a
report that no longer applies. A report, or heartbeat, that is not signed by the node it names
is refused (jobs.services.agent_access.authentic). The console worker also runs the
reconciliation loop (jobs.services.reconcile) and the retention loop (jobs.services.retention),
started once the worker is ready.
"""

from typing import Any

from celery import shared_task
from celery.signals import worker_ready, worker_shutdown
from django.conf import settings

from jobs.services import agent_access, nodes, reconcile, reports, restarts, retention, scheduling
from workers import contract


@shared_task(name=contract.TASK_NODE_HEARTBEAT)
def node_heartbeat(payload: dict[str, Any]) -> None:
    if agent_access.authentic(contract.TASK_NODE_HEARTBEAT, payload):
        nodes.node_heartbeat(payload)


@shared_task(name=contract.TASK_REPLICA_STARTED)
def replica_started(payload: dict[str, Any]) -> None:
    if not agent_access.authentic(contract.TASK_REPLICA_STARTED, payload):
        return
    reports.replica_started(
        payload["job_id"],
        payload["role"],
        payload["index"],
        payload["node"],
        str(payload.get("incarnation", "")),
        attempt=int(payload.get("attempt", 0)),
    )


@shared_task(name=contract.TASK_REPLICA_EXITED)
def replica_exited(payload: dict[str, Any]) -> None:
    if not agent_access.authentic(contract.TASK_REPLICA_EXITED, payload):
        return
    reports.replica_exited(
        payload["job_id"],
        payload["role"],
        payload["index"],
        payload["node"],
        payload["state"],
        payload.get("exit_code"),
        payload.get("reason", ""),
        payload.get("stderr_tail", []),
        payload.get("ended_at"),
        attempt=int(payload.get("attempt", 0)),
    )


@shared_task(name=contract.TASK_SCHEDULE)
def schedule() -> None:
    scheduling.schedule()


@shared_task(name=contract.TASK_RESUME_RESTART)
def resume_restart(job_id: int) -> None:
    restarts.resume(job_id)


_loop: reconcile.ReconcileLoop | None = None


@worker_ready.connect
def start_reconciliation(**_: Any) -> None:
    global _loop
    if settings.TRAINYARD_RECONCILE_SECONDS > 0 and _loop is None:
        _loop = reconcile.ReconcileLoop(settings.TRAINYARD_RECONCILE_SECONDS)
        _loop.start()


@worker_shutdown.connect
def stop_reconciliation(**_: Any) -> None:
    if _loop is not None:
        _loop.stop()


# Retention runs beside reconciliation, on the same kind of timer thread: a pass is a few
# queries, and every console worker may run one (removals are re-checked under a lock).
_retention: retention.RetentionLoop | None = None


@worker_ready.connect
def start_retention(**_: Any) -> None:
    global _retention
    if settings.TRAINYARD_RETENTION_SECONDS > 0 and _retention is None:
        _retention = retention.RetentionLoop(settings.TRAINYARD_RETENTION_SECONDS)
        _retention.start()


@worker_shutdown.connect
def stop_retention(**_: Any) -> None:
    if _retention is not None:
        _retention.stop()
