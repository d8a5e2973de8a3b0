"""What clients are shown of a job's state: read-only views over the models."""

import signal
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from django.db.models import Model, QuerySet

from jobs.models import HealthEvent, Job, JobAttempt, Replica
from jobs.services.scheduler import queue
from jobs.services.views import efficiency
from jobs.services.views.durations import format_duration


def states_of(job_ids: list[int]) -> Iterator[tuple[int, dict[str, Any]]]:
    """The state payloads of these jobs, in their order (one that is gone is left out): a
    few queries per hundreds of jobs, and the
    queue's order read once for all of them (a scheduling pass may give 10,000 waiting jobs a
    new reason at once)."""
    positions: dict[int, int] | None = None
    for start in range(0, len(job_ids), _JOBS_PER_READ):
        chunk = job_ids[start : start + _JOBS_PER_READ]
        jobs = _with_rows(chunk)
        if positions is None and any(job.state == Job.State.QUEUED for job in jobs.values()):
            positions = queue_positions(jobs.values())
        for job_id in chunk:
            if job_id in jobs:
                yield job_id, job_state_payload(jobs[job_id], positions or {})


# Jobs read at once (bounded: one query's IN list, and memory).
_JOBS_PER_READ = 500


# What job_state_payload reads of a job itself (not its program, variables and rules).
_STATE_FIELDS = (
    "id", "state", "reason", "started", "finished", "attempt", "restarts_used", "max_restarts",
    "restart_at", "borrowed", "resizes",
)  # fmt: skip


def _with_rows(job_ids: list[int]) -> dict[int, Job]:
    """These jobs with their replicas, attempts and health events, by id: one query each,
    grouped here into what `related` reads. Django's prefetch_related does the same but builds
    three querysets per job on the way, which cost more than the rows themselves."""
    jobs = {job.pk: job for job in Job.objects.filter(pk__in=job_ids).only(*_STATE_FIELDS)}
    rows: dict[int, dict[str, list[Any]]] = {
        pk: {"replicas": [], "attempts": [], "health_events": []} for pk in jobs
    }
    for name, query in (
        ("replicas", Replica.objects.select_related("node").order_by("id")),
        ("attempts", JobAttempt.objects.all()),
        ("health_events", HealthEvent.objects.all()),
    ):
        for row in query.filter(job_id__in=list(jobs)):
            rows[row.job_id][name].append(row)
    for pk, job in jobs.items():
        job._prefetched_objects_cache = rows[pk]  # type: ignore[attr-defined]
    return jobs


def related(job: Job, name: str, query: Callable[[], Iterable[Any]]) -> list[Any]:
    """The job's `name` rows: the prefetched ones where a list fetched them up front (see
    jobs.api.job_list), else what `query()` returns. A callable, not a queryset: building a
    queryset costs about as much as reading a prefetched job, and a list of 200 jobs built
    four per job for nothing."""
    cache = getattr(job, "_prefetched_objects_cache", {})
    return list(cache[name]) if name in cache else list(query())


def job_state_payload(job: Job, queue_positions: dict[int, int] | None = None) -> dict[str, Any]:
    """What websocket clients are told when a job or one of its replicas changes.

    `queue_positions` (from queue_positions()) stands in for one query per job in a list."""
    replicas = _current_replicas(job)
    if job.slurm_pool_id is not None:
        position = slurm_place(job)
    elif queue_positions is None:
        position = queue_position(job)
    else:
        position = listed_queue_position(job, queue_positions)
    return {
        "id": job.pk,
        "state": job.state,
        "state_order": state_order(job),
        "reason": job.reason,
        "queue_position": position,
        "started": job.started.isoformat() if job.started else None,
        "finished": job.finished.isoformat() if job.finished else None,
        "replicas": [
            {
                "role": r.role,
                "index": r.index,
                "tag": r.tag,
                "node": r.node.name if r.node else (r.slurm_node or None),
                "state": r.state,
                "exit_code": r.exit_code,
                "signal": signal_name(r.exit_code),
                "reason": r.reason,
            }
            for r in replicas
        ],
        "attempt": job.attempt,
        "restarts_used": job.restarts_used,
        "max_restarts": job.max_restarts,
        "restart_at": job.restart_at.isoformat()
        if job.state == Job.State.RESTARTING and job.restart_at
        else None,
        "borrowed": job.borrowed,
        "resizes": job.resizes,
        "attempts": [
            {
                "number": a.number + 1,
                "started": a.started.isoformat() if a.started else None,
                "finished": a.finished.isoformat() if a.finished else None,
                "nodes": a.nodes,
                "args": job.args_of_attempt(a.number),
                "reason": a.reason,
                "counted": a.counted,
                "instances": a.instances,
                "resize": a.resize,
                "slurm": a.slurm_accounting or None,
                "slurm_job_id": a.slurm_job_id,
            }
            for a in sorted(related(job, "attempts", job.attempts.all), key=_number)
        ],
        "health_events": [
            {
                "at": e.at.isoformat(),
                "attempt": e.attempt + 1,
                "rule": e.rule,
                "action": e.action,
                # A rule switched off before any line (refused when read): the whole job.
                "instance": Replica(role=e.role, index=e.index).tag if e.role else "",
                "node": e.node,
                "value": e.value,
                "message": e.message,
                "outcome": e.outcome,
            }
            for e in sorted(related(job, "health_events", job.health_events.all), key=_at)
        ],
    }


# A job's states in the order one attempt goes through them; an ended job is past them all.
_ORDER_IN_ATTEMPT = {
    Job.State.PENDING: 0,
    Job.State.RESTARTING: 1,
    Job.State.QUEUED: 2,
    Job.State.RUNNING: 3,
}


def state_order(job: Job) -> list[int]:
    """[ended, attempt, step]: grows with every change of state (Job.TRANSITIONS), so a client
    can drop a state that reaches it after a newer one (events of one job are sent by several
    processes, and an HTTP answer may cross a websocket frame): `running → queued → running`
    for a job that never left its first attempt. Ended outranks all (a restart found to have
    succeeded before its stop ends at its earlier attempt); equal orders are the same state,
    the later one newer."""
    ended = job.state in Job.TERMINAL_STATES
    return [int(ended), job.attempt, 0 if ended else _ORDER_IN_ATTEMPT[Job.State(job.state)]]


def slurm_place(job: Job) -> int | None:
    """A Slurm pool's waiting job: its place in Slurm's queue of its partition, as the Slurm
    pass last saw it (jobs.services.slurm.slurm_pass); None when it is not waiting there."""
    if job.state != Job.State.QUEUED:
        return None
    return (
        JobAttempt.objects.filter(job_id=job.pk, number=job.attempt)
        .values_list("slurm_place", flat=True)
        .first()
    )


def listed_queue_position(job: Job, queue_positions: dict[int, int]) -> int | None:
    """A listed job's place in the queue, from queue_positions() of its page: what its own
    page says (job_state_payload), without a query per job."""
    return queue_positions.get(job.pk) if _waiting(job, _current_replicas(job)) else None


def _current_replicas(job: Job) -> list[Replica]:
    return [
        r for r in related(job, "replicas", lambda: _replicas_of(job)) if r.attempt == job.attempt
    ]


def signal_name(exit_code: int | None) -> str | None:
    """ "SIGTERM" for a process killed by a signal (a negative exit code, as the agent reports
    it), never "-15"; None for a process that exited."""
    if exit_code is None or exit_code >= 0:
        return None
    try:
        return signal.Signals(-exit_code).name
    except ValueError:
        return f"signal {-exit_code}"


def _replicas_of(job: Job) -> QuerySet[Replica]:
    return job.replicas.filter(attempt=job.attempt).select_related("node", "package").order_by("id")


def usage(job: Job) -> dict[str, Any] | None:
    """What the current attempt's ended instances used of what they held (efficiency.py), as
    the API and the page show it; None where nothing was measured."""
    use = efficiency.of_replicas(_current_replicas(job))
    return use.to_dict() if use is not None else None


def usage_rows(use: efficiency.JobUse) -> list[dict[str, Any]]:
    """The job page's use table, one row per instance, its numbers already written out: the
    templates format no number by hand (tests/unit/test_one_voice.py)."""
    return [
        {
            "tag": i.tag,
            "node": i.node,
            "package": i.package,
            "cores_asked": i.cores_asked,
            "cores_used": f"{i.cores_used:.2f}",
            "cpu_efficiency": f"{i.cpu_efficiency * 100:.0f} %",
            "memory": f"{i.memory_peak_gb:.2f} / {i.memory_asked_gb:g} GB",
            "ran": format_duration(i.seconds),
        }
        for i in use.instances
    ]


def why_unmeasured(job: Job) -> str | None:
    """Why the job's use is missing, where that is known, for the job page to say rather than
    leave users wondering: every node its ended instances ran on holds no instance to its
    package (no cgroup, so no counters). Slurm instances (no node of ours) and instances still
    running are no reason, and an ended instance on a node with limits means something else
    went wrong, which this does not claim to know."""
    ended = [r for r in _current_replicas(job) if r.finished is not None]
    nodes = [r.node for r in ended if r.node is not None]
    if not nodes or len(nodes) < len(ended):
        return None
    if not any(node.limits_enforced for node in nodes):
        return "limits not enforced on its nodes"
    return None


def _number(attempt: Any) -> int:
    return int(attempt.number)


def _at(event: Any) -> tuple[Any, int]:
    return (event.at, event.pk)


def _waiting(job: Job, replicas: list[Replica]) -> bool:
    return job.state == Job.State.QUEUED and any(r.state == Replica.State.PENDING for r in replicas)


def queue_positions(jobs: Iterable[Model]) -> dict[int, int]:
    """Every waiting job's place in the queue, in one query (see queue_position): for a list
    of jobs, whatever its length."""
    if not any(getattr(job, "state", None) == Job.State.QUEUED for job in jobs):
        return {}  # nobody listed waits: no need to rank every waiting job
    return {job_id: place for place, job_id in enumerate(queue.ranking(), 1)}


def queue_position(job: Job) -> int | None:
    """1 for the first job waiting for room, 2 for the next...; None when not waiting."""
    if (
        job.state != Job.State.QUEUED
        or not job.replicas.filter(attempt=job.attempt, state=Replica.State.PENDING).exists()
    ):
        return None
    # The queue's own order, not a copy of it: a job's place is where the queue page shows it.
    return queue_positions([job]).get(job.pk)
