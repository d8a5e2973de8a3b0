"""Asking agents to remove a job's folders on the shared checkpoint root: its checkpoint folder
(when the job is deleted) and its working folder (then, or when its retention ends). Only the
agents can reach that root; the folders are shared, so one node's answer suffices, and each
node the job ran on is asked so that a node with a root of its own is covered too."""

from console.celery import app
from jobs.models import Job, Replica
from workers import contract


def nodes_that_ran(job: Job) -> list[str]:
    """The names of the nodes any replica of the job was placed on."""
    return sorted(
        set(
            Replica.objects.filter(job=job, node__isnull=False).values_list("node__name", flat=True)
        )
    )


def ask_to_remove(task: str, job_id: int, checkpoint_key: str, nodes: list[str]) -> None:
    """Send `task` (TASK_REMOVE_CHECKPOINTS or TASK_REMOVE_WORKING_FOLDER) to each node; call
    after commit, once the rows say the folder is no longer wanted."""
    for node in nodes:
        app.send_task(
            task,
            kwargs={"job_id": job_id, "checkpoint_key": checkpoint_key},
            queue=contract.node_queue(node),
        )
