"""A job's artifacts (what its trainers saved in its checkpoint folder and wrote in its working
folder), listed and downloaded through a node agent: only the agents reach the checkpoint root.

The console asks one node the job ran on whose agent is alive (the root is shared, so any of
them sees the same files), by a Celery task on that node's queue naming a fresh reply list,
and waits for the answer there with BLPOP (workers/agentreply.py). A download asks chunk by
chunk (workers/artifacts.CHUNK_BYTES), so neither side ever holds a whole checkpoint; the
first chunk is fetched before the answer starts, so that a missing or refused file is a clear
refusal, not a broken download. A file that changes between chunks (the trainer saved again)
breaks the download rather than mixing two saves.

What the user is told instead of files: the job never ran on a node; every node it ran on is
lost (by name); the node asked did not answer (by name, within ANSWER_SECONDS); its
working folder went with its log at the end of its retention (checkpoints stay until the job
is deleted, which removes the job itself).
"""

import logging
import secrets
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import redis
from asgiref.sync import sync_to_async
from django.utils import timezone

from console.celery import app
from jobs.models import Job, Node
from jobs.redis_client import get_blocking_redis
from jobs.services.agent_folders import nodes_that_ran
from workers import agentreply, artifacts, contract

log = logging.getLogger(__name__)

# How long the console waits for a node's answer to one request (a listing, one chunk).
ANSWER_SECONDS = 15.0


class ArtifactsUnavailable(Exception):
    """Why the files cannot be listed or read now, for the user; `status` is the HTTP status
    the API answers with and `field` the key of its error."""

    def __init__(self, status: int, message: str, field: str = "artifacts") -> None:
        super().__init__(message)
        self.status = status
        self.field = field


@dataclass
class Download:
    """One file on its way: its name and size, and its bytes as an iterator of chunks."""

    name: str
    size: int
    node: str
    chunks: AsyncIterator[bytes]


def check_path(path: str) -> str:
    """The path as the agents take it, or a 400 that says what is wrong with it."""
    try:
        artifacts.check_path(path)
    except artifacts.BadPath as exc:
        raise ArtifactsUnavailable(400, str(exc), field="path") from None
    return path


def list_files(job: Job) -> dict[str, Any]:
    """{"node", "files": [{path, kind, size, modified}], "refused": [{path, reason}],
    "truncated", "notes": [words for the user]}."""
    with _Asker(job) as asker:
        found = asker.ask(contract.TASK_LIST_ARTIFACTS, {})
    files = [
        {
            "path": f["path"],
            "kind": f["kind"],
            "size": f["size"],
            "modified": datetime.fromtimestamp(f["mtime"], tz=UTC),
        }
        for f in found.get("files", [])
    ]
    notes = []
    if job.logs_pruned is not None:
        notes.append(_pruned_words(job))
    elif artifacts.OUTPUTS in found.get("missing", []) and artifacts.CHECKPOINTS in found.get(
        "missing", []
    ):
        notes.append("The job has written no files yet.")
    if found.get("truncated"):
        notes.append(
            f"Only the first {artifacts.MAX_ENTRIES} entries (and {artifacts.MAX_DEPTH} "
            "folders deep) are listed."
        )
    return {
        "node": asker.node,
        "files": files,
        "refused": list(found.get("refused", [])),
        "truncated": bool(found.get("truncated")),
        "notes": notes,
    }


def download(job: Job, path: str) -> Download:
    """The file at `path` (as list_files names it): its first chunk read already, the rest as
    the caller iterates. ArtifactsUnavailable with 400, 404, 409, 410 or 503."""
    top, _ = artifacts.check_path(check_path(path))
    if top == artifacts.OUTPUTS and job.logs_pruned is not None:
        raise ArtifactsUnavailable(410, _pruned_words(job), field="path")
    asker = _Asker(job)
    try:
        first = asker.read(path, 0)
    except BaseException:
        asker.close()
        raise
    size, version = first.header["size"], first.header["version"]
    return Download(
        name=path.rsplit("/", 1)[-1],
        size=size,
        node=asker.node,
        chunks=_rest(asker, path, first.data, size, version),
    )


async def _rest(
    asker: "_Asker", path: str, data: bytes, size: int, version: str
) -> AsyncIterator[bytes]:
    """The chunks of a download, the first already read; closes the asker at the end. An
    async iterator: the ASGI server sends each chunk as it comes (a sync one Django would
    read whole into memory first), and each wait for a chunk holds a thread of its own."""
    read = sync_to_async(asker.read, thread_sensitive=False)
    try:
        offset = len(data)
        if data:
            yield data
        while offset < size:
            chunk = await read(path, offset)
            if chunk.header["version"] != version:
                raise ArtifactsUnavailable(
                    409, f"{path} changed during the download (saved again): download it again"
                )
            if not chunk.data:
                raise ArtifactsUnavailable(409, f"{path} became shorter during the download")
            offset += len(chunk.data)
            yield chunk.data
    except ArtifactsUnavailable as exc:
        # Headers are gone already: the download ends short of its length, which clients see.
        log.warning("download of job %s's %s broke: %s", asker.job.pk, path, exc)
        raise
    finally:
        asker.close()


def _minute(moment: datetime) -> str:
    """A moment in the console's zone, to the minute, as these refusals say it."""
    return timezone.localtime(moment).strftime("%Y-%m-%d %H:%M")


def _pruned_words(job: Job) -> str:
    assert job.logs_pruned is not None
    when = _minute(job.logs_pruned)
    return (
        f"Its working folder (outputs/) was removed with its log by retention on {when}; "
        "its checkpoints stay until the job is deleted."
    )


@dataclass
class _Answer:
    header: dict[str, Any]
    data: bytes


class _Asker:
    """Asks one live node the job ran on, and waits for its answers."""

    def __init__(self, job: Job) -> None:
        self.job = job
        self.node = _node_to_ask(job)
        self._client: redis.Redis | None = None

    def __enter__(self) -> "_Asker":
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None

    def read(self, path: str, offset: int) -> _Answer:
        return self._ask(contract.TASK_READ_ARTIFACT, {"path": path, "offset": offset})

    def ask(self, task: str, extra: dict[str, Any]) -> dict[str, Any]:
        return self._ask(task, extra).header

    def _ask(self, task: str, extra: dict[str, Any]) -> _Answer:
        if self._client is None:
            self._client = get_blocking_redis(ANSWER_SECONDS, "artifacts")
        reply_to = contract.reply_key(self.node, secrets.token_hex(16))
        request = {
            "job_id": self.job.pk,
            "checkpoint_key": self.job.checkpoint_key,
            "owner": self.job.owner_id,
            # What the job's trainers wrote belongs to the identity they ran as.
            "uid": self.job.run_uid if self.job.run_uid is not None else -1,
            "gid": self.job.run_gid if self.job.run_gid is not None else -1,
            "container": bool(self.job.container_image),
            "reply_to": reply_to,
            **extra,
        }
        # Expires with the wait: an agent that comes to it later drops it, answering no one.
        app.send_task(
            task,
            kwargs={"request": request},
            queue=contract.node_queue(self.node),
            expires=ANSWER_SECONDS,
        )
        try:
            popped = self._client.blpop([reply_to], timeout=ANSWER_SECONDS)
        finally:
            self._client.delete(reply_to)  # an answer that came too late goes too
        if popped is None:
            raise ArtifactsUnavailable(
                503,
                f"{self.node} did not answer within {ANSWER_SECONDS:.0f} s (its agent may be "
                "busy, or older than artifact downloads); try again.",
            )
        try:
            message = popped[1]
            assert isinstance(message, bytes)  # the blocking client answers bytes
            header, data = agentreply.decode(message)
        except ValueError as exc:
            raise ArtifactsUnavailable(503, f"{self.node} answered garbled: {exc}") from None
        _raise_refusal(header, self.node)
        return _Answer(header, data)


def _raise_refusal(header: dict[str, Any], node: str) -> None:
    error = header.get("error")
    if error is None:
        return
    message = str(header.get("message", ""))
    if error == "bad-path":
        raise ArtifactsUnavailable(400, message, field="path")
    if error == "not-found":
        raise ArtifactsUnavailable(404, message[:1].upper() + message[1:] + ".", field="path")
    if error == "refused":
        raise ArtifactsUnavailable(409, message[:1].upper() + message[1:] + ".", field="path")
    raise ArtifactsUnavailable(503, message)


def _node_to_ask(job: Job) -> str:
    """The first node (by name) the job ran on whose agent is alive; else a refusal that
    names each node and when it was last heard from."""
    if job.slurm_pool_id is not None:
        raise ArtifactsUnavailable(
            409,
            f"Job {job.pk} ran in a Slurm pool: its files are in the pool's shared folder, "
            "which the console does not list or serve yet.",
        )
    names = nodes_that_ran(job)
    if not names:
        raise ArtifactsUnavailable(
            409, f"Job {job.pk} has not run on a node yet: it has no files to list."
        )
    now = timezone.now()
    why_not = []
    for node in Node.objects.filter(name__in=names).order_by("name"):
        if not node.is_lost(now):
            return node.name
        heard = _minute(node.last_heartbeat) if node.last_heartbeat else "never"
        why_not.append(f"{node.name} is lost (last heard from {heard})")
    raise ArtifactsUnavailable(
        503,
        f"No node that job {job.pk} ran on can reach its files now: {'; '.join(why_not)}.",
    )
