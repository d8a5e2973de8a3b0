"""Elastic jobs: a worker role asked for as {min, max} runs with as many instances as fit,
and changes size the way torch elastic changes its worker group's: every instance stops
(saving its checkpoint on SIGTERM) and the group starts again at the new world size.

    start   the scheduler places it as soon as its minimum fits, with as many more as fit
            (placement.place_elastic), keeping where an attempt before ran;
    grow    a running one below its maximum whose size has held for the settle time
            (TRAINYARD_ELASTIC_SETTLE_SECONDS) grows when a scheduling pass ends with room
            free and no job waiting for it (`grow_into`);
    shrink  an instance's failure does not decide at once: an agent's death and its node's
            loss are judged seconds after the survivors' collectives fail, which is what the
            console hears first. The attempt regroups, and once every instance of it has
            ended (restarts.judge_regrouped) the earliest cause says what it was: a node's
            (the job goes on with what fits, not counted as a restart) or the job's own (its
            restart policy decides, as for any job).

A resize is neither a failure nor a restart of the policy: Job.resizes counts them, each
attempt notes its size and why it changed (JobAttempt.instances, .resize), and trainers see
TRAINYARD_RESIZE_COUNT beside TORCHELASTIC_RESTART_COUNT.

Every function here runs inside a transaction that holds the job's row lock, but `grow_into`,
which locks the job itself.
"""

from collections import Counter
from collections.abc import Sequence
from datetime import timedelta

from django.conf import settings
from django.db.models import F
from django.utils import timezone

from jobs.models import Job, JobAttempt, Replica
from jobs.services.lifecycle import restarts
from jobs.services.placement import Demand, Room


def regroup(job: Job, replica: Replica) -> None:
    """An instance of a running elastic attempt failed: stop the rest and judge the attempt
    once they have ended (restarts.judge_regrouped)."""
    node = replica.node.name if replica.node else ""
    why = f"{replica.tag} on {node or '?'}: {replica.reason or 'failed'}"
    restarts.begin(job, why, counts=False, judged=False)


def placed(job: Job, nodes: Sequence[str]) -> None:
    """The scheduler placed the job's current attempt's charged instances on `nodes` (one
    entry per instance): note its size, and for an elastic job whether, and why, it differs
    from the attempt before."""
    note = ""
    placed_count = len(nodes)
    if job.is_elastic:
        before = (
            JobAttempt.objects.filter(job=job, number__lt=job.attempt, instances__isnull=False)
            .order_by("-number")
            .first()
        )
        if before is not None and before.instances != placed_count:
            note = _size_change(job, before, nodes)
            Job.objects.filter(pk=job.pk).update(resizes=F("resizes") + 1)
            job.refresh_from_db(fields=["resizes"])
    JobAttempt.objects.filter(job=job, number=job.attempt).update(
        instances=placed_count, resize=note[:300]
    )


def _size_change(job: Job, before: JobAttempt, nodes: Sequence[str]) -> str:
    """ "grew to 4: room freed on node-1" (the nodes that run more of it than before), or
    "shrank to 3: node-2 lost: …" (why the attempt before ended)."""
    size = len(nodes)
    if size > (before.instances or 0):
        then = Counter(
            Replica.objects.filter(job=job, attempt=before.number, package__isnull=False)
            .exclude(node=None)
            .values_list("node__name", flat=True)
        )
        now = Counter(nodes)
        more = sorted(node for node in now if now[node] > then[node])
        return f"grew to {size}: room freed on {', '.join(more)}"
    why = before.reason.splitlines()[0] if before.reason else "less room"
    return f"shrank to {size}: {why}"


def settle() -> timedelta:
    return timedelta(seconds=settings.TRAINYARD_ELASTIC_SETTLE_SECONDS)


def may_grow() -> bool:
    """Whether some running elastic job is below its largest size (a scheduling pass then
    runs even with nothing waiting)."""
    return Job.objects.filter(
        state=Job.State.RUNNING, slurm_pool__isnull=True, min_size__lt=F("max_size")
    ).exists()


def grow_into(rooms: Sequence[Room]) -> list[int]:
    """Grow the running elastic jobs below their largest size that have held their size for the
    settle time, where `rooms` (what a scheduling pass left free, nobody waiting for it) hold
    at least one more instance; first come first served. Returns the ids begun to grow."""
    free = [Room(r.node, r.cpu, r.gpus, r.memory_gb) for r in rooms]
    since = timezone.now() - settle()
    grown = []
    for job in (
        Job.objects.select_for_update()
        .filter(state=Job.State.RUNNING, slurm_pool__isnull=True, min_size__lt=F("max_size"))
        .order_by("created", "id")
    ):
        attempt = JobAttempt.objects.filter(job=job, number=job.attempt).first()
        if attempt is None or attempt.started is None or attempt.started > since:
            continue
        size = attempt.instances or 0
        role = job.roles.filter(role="worker").select_related("package").first()
        if role is None or size >= job.max_size:
            continue
        one = Demand.of(("worker", -1), role.package, job.one_instance_per_node)
        if job.one_instance_per_node:
            mine = set(attempt.nodes)
            candidates = [r for r in free if r.fits(one) and r.node not in mine]
        else:
            candidates = [r for r in free if r.fits(one)]
        candidates = [r for r in candidates if r.node not in job.excluded_nodes]
        if not candidates:
            continue
        # What it may take is kept from the jobs after it in this pass; where its instances
        # go, and how many, the scheduler decides when it places the new attempt.
        more = 0
        for room in candidates:
            while room.fits(one) and size + more < job.max_size:
                room.take(one)
                more += 1
                if job.one_instance_per_node:
                    break
        where = ", ".join(sorted({r.node for r in candidates}))
        restarts.begin(
            job,
            f"room freed on {where}",
            counts=False,
            resize=f"growing from {size} instances: room freed on {where}",
        )
        grown.append(job.pk)
    return grown
