"""Deleting a job (admins, in /admin/): its rows go, and so do its checkpoints and its working
folder, which only the agents can reach (the checkpoint root is theirs): each node the job ran
on is asked, after commit, to remove both (jobs/services/agent_folders.py,
workers/checkpoint_retention.py, workers/workfolder.py). Its code snapshot, if nothing else
names it, goes at the next retention pass.
"""

from django.db import transaction

from jobs.models import Job
from jobs.services.agent_folders import ask_to_remove, nodes_that_ran
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
        nodes = nodes_that_ran(job)
        key = job.checkpoint_key
        job.delete()
        # The agent removes the working folder with the checkpoints (one task for both).
        transaction.on_commit(
            lambda: ask_to_remove(contract.TASK_REMOVE_CHECKPOINTS, job_id, key, nodes),
            robust=True,
        )
    return nodes
