"""What clients are shown of a job's state: read-only views over the models."""

from typing import Any

from django.db.models import Q

from jobs.models import Job, Replica


def state_of(job_id: int) -> dict[str, Any] | None:
    job = Job.objects.filter(pk=job_id).first()
    return job_state_payload(job) if job is not None else None


def job_state_payload(job: Job) -> dict[str, Any]:
    """What websocket clients are told when a job or one of its replicas changes."""
    return {
        "id": job.pk,
        "state": job.state,
        "reason": job.reason,
        "queue_position": queue_position(job),
        "started": job.started.isoformat() if job.started else None,
        "finished": job.finished.isoformat() if job.finished else None,
        "replicas": [
            {
                "role": r.role,
                "index": r.index,
                "tag": r.tag,
                "node": r.node.name if r.node else None,
                "state": r.state,
                "exit_code": r.exit_code,
                "reason": r.reason,
            }
            for r in job.replicas.filter(attempt=job.attempt).select_related("node").order_by("id")
        ],
        "attempt": job.attempt,
        "restarts_used": job.restarts_used,
        "max_restarts": job.max_restarts,
        "restart_at": job.restart_at.isoformat()
        if job.state == Job.State.RESTARTING and job.restart_at
        else None,
        "attempts": [
            {
                "number": a.number + 1,
                "started": a.started.isoformat() if a.started else None,
                "finished": a.finished.isoformat() if a.finished else None,
                "nodes": a.nodes,
                "reason": a.reason,
                "counted": a.counted,
            }
            for a in job.attempts.order_by("number")
        ],
        "health_events": [
            {
                "at": e.at.isoformat(),
                "attempt": e.attempt + 1,
                "rule": e.rule,
                "action": e.action,
                "instance": Replica(role=e.role, index=e.index).tag,
                "node": e.node,
                "value": e.value,
                "message": e.message,
                "outcome": e.outcome,
            }
            for e in job.health_events.order_by("at", "id")
        ],
    }


def queue_position(job: Job) -> int | None:
    """1 for the first job waiting for room, 2 for the next...; None when not waiting."""
    if (
        job.state != Job.State.QUEUED
        or not job.replicas.filter(attempt=job.attempt, state=Replica.State.PENDING).exists()
    ):
        return None
    unplaced = Replica.objects.filter(state=Replica.State.PENDING).values("job_id")
    ahead = Job.objects.filter(state=Job.State.QUEUED, pk__in=unplaced).filter(
        Q(created__lt=job.created) | Q(created=job.created, pk__lt=job.pk)
    )
    return ahead.count() + 1


def log_end_reason(job: Job) -> str:
    """What the log's end marker says: how the job ended, and why."""
    return f"job {job.state}" + (f": {job.reason.splitlines()[0]}" if job.reason else "")
