"""Deleting a job (admins, in /admin/): its rows go, and so do its checkpoints, which only the
agents can reach (the checkpoint root is theirs): each node the job ran on is asked, after
commit, to remove the job's folder (workers/checkpoint_retention.py). The folder is shared, so
one answer suffices; asking each copes with a node that has its own root. Its code snapshot, if
nothing else names it, goes at the next retention pass.
"""

from django.db import transaction

from console.celery import app
from jobs.models import Job, Replica
from workers import contract


class JobStillActive(Exception):
    """A job that may still run is cancelled first: its processes would outlive its rows."""


def delete_job(job_id: int) -> list[str]:
    """Delete an ended job and ask its nodes to remove its checkpoints; the nodes asked."""
    with transaction.atomic():
        job = Job.objects.select_for_update().filter(pk=job_id).first()
        if job is None:
            return []
        if job.is_active:
            raise JobStillActive(f"job {job_id} is {job.state}: cancel it first")
        nodes = sorted(
            set(
                Replica.objects.filter(job=job, node__isnull=False).values_list(
                    "node__name", flat=True
                )
            )
        )
        key = job.checkpoint_key
        job.delete()
        transaction.on_commit(lambda: _ask_nodes(job_id, key, nodes), robust=True)
    return nodes


def _ask_nodes(job_id: int, checkpoint_key: str, nodes: list[str]) -> None:
    for node in nodes:
        app.send_task(
            contract.TASK_REMOVE_CHECKPOINTS,
            kwargs={"job_id": job_id, "checkpoint_key": checkpoint_key},
            queue=contract.node_queue(node),
        )
