"""Code snapshots on the console: taking uploads, finding a user's, publishing them to agents.

The database keeps every snapshot a job may still need (CodeSnapshot, by SHA-256); Redis
carries a copy to the agents, put there (again, if it expired or Redis lost it) whenever start
messages for a job that runs one are sent. The format and its checks are workers/snapshot.py's.
"""

import contextlib
import logging
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import IO

from django.conf import settings
from django.contrib.auth.models import User
from django.db import IntegrityError, transaction
from django.db.models import ProtectedError
from django.utils import timezone

from jobs.models import CodeSnapshot, CodeUpload
from jobs.redis_client import get_redis
from workers import contract, snapshot
from workers.snapshot import SnapshotError

log = logging.getLogger(__name__)

MAX_NAME_LENGTH = 200
# How long a published archive stays in Redis after the last start message that needed it.
PUBLISHED_SECONDS = 7 * 24 * 3600


@dataclass(frozen=True)
class Stored:
    upload: CodeUpload
    # The owner had not uploaded these files before (or had forgotten them). Whether anyone
    # else holds them is no business of theirs: the answer must not depend on it.
    new: bool


class UploadsBusy(Exception):
    """Other uploads have been checked for as long as this one may wait; try again."""


# How many uploads this process checks at once (TRAINYARD_SNAPSHOT_CHECKS_AT_ONCE).
_CHECKING = threading.BoundedSemaphore(settings.TRAINYARD_SNAPSHOT_CHECKS_AT_ONCE)


@contextlib.contextmanager
def _turn_to_check() -> Iterator[None]:
    """Wait (in this request's own thread) until fewer uploads than the limit are checked."""
    checking = _CHECKING
    if not checking.acquire(timeout=settings.TRAINYARD_SNAPSHOT_CHECK_WAIT_SECONDS):
        raise UploadsBusy()
    try:
        yield
    finally:
        checking.release()


def store_upload(owner: User, archive: IO[bytes], name: str = "") -> Stored:
    """Check an uploaded .tar.gz, store its canonical form (once per content) and record
    that `owner` uploaded it. SnapshotError says what is wrong with it; UploadsBusy, that
    too many other uploads are being checked in this process right now."""
    name = name.strip()
    if len(name) > MAX_NAME_LENGTH:
        raise SnapshotError(f"the name is {len(name)} characters; at most {MAX_NAME_LENGTH}")
    with _turn_to_check():
        packed = snapshot.canonical(archive, settings.TRAINYARD_SNAPSHOT_MAX_UNPACKED_BYTES)
    if not packed.files:
        raise SnapshotError("the archive holds no files")
    if len(packed.archive) > settings.TRAINYARD_SNAPSHOT_MAX_BYTES:
        raise SnapshotError(
            f"packed, it is {len(packed.archive) / 2**20:,.1f} MB; at most "
            f"{settings.TRAINYARD_SNAPSHOT_MAX_BYTES / 2**20:,.0f} MB"
        )
    try:
        return _record_upload(owner, packed, name)
    except IntegrityError:
        # forget_upload removed the last upload of these files, and them, in between: store
        # them again.
        return _record_upload(owner, packed, name)


def _record_upload(owner: User, packed: snapshot.Packed, name: str) -> Stored:
    # One transaction for both rows: a failure between them (a full disk) leaves neither, not
    # a snapshot that nobody uploaded.
    with transaction.atomic():
        stored = _snapshot_row(packed)
        upload, new = CodeUpload.objects.select_for_update().get_or_create(
            owner=owner, snapshot=stored, defaults={"name": name}
        )
        upload.uploaded = timezone.now()
        if name:
            upload.name = name
        upload.save(update_fields=["uploaded", "name"])
    return Stored(upload, new)


def _snapshot_row(packed: snapshot.Packed) -> CodeSnapshot:
    """The stored snapshot of these files, stored now if it was not. Whether it was is never
    told to the uploader: it would say that someone else had uploaded the same files."""
    existing = CodeSnapshot.objects.defer("archive").filter(sha256=packed.sha256).first()
    if existing is not None:
        return existing
    try:
        with transaction.atomic():
            row = CodeSnapshot.objects.create(
                sha256=packed.sha256,
                archive=packed.archive,
                size=len(packed.archive),
                unpacked_size=packed.unpacked_size,
                files=[m.path for m in packed.files],
            )
        return row
    except IntegrityError:  # the same files, uploaded at the same moment by someone else
        return CodeSnapshot.objects.defer("archive").get(sha256=packed.sha256)


def uploads_of(owner: User) -> list[CodeUpload]:
    return list(
        CodeUpload.objects.filter(owner=owner).select_related("snapshot").defer("snapshot__archive")
    )


def upload_of(owner: User, sha256: str) -> CodeUpload | None:
    """The owner's upload of that snapshot; None when they never uploaded it (whoever else
    did: a user runs only what they uploaded)."""
    return (
        CodeUpload.objects.filter(owner=owner, snapshot__sha256=sha256)
        .select_related("snapshot")
        .defer("snapshot__archive")
        .first()
    )


def forget_upload(owner: User, sha256: str) -> bool:
    """Remove the owner's upload of a snapshot: it leaves their list, and new jobs can no
    longer name it. Jobs that ran it keep it; the stored files go with the last upload of
    them that no job ran. False when the owner has no such upload."""
    with transaction.atomic():
        upload = (
            CodeUpload.objects.select_for_update()
            .filter(owner=owner, snapshot__sha256=sha256)
            .first()
        )
        if upload is None:
            return False
        snapshot_id = upload.snapshot_id
        upload.delete()
    try:
        with transaction.atomic():
            CodeSnapshot.objects.filter(
                pk=snapshot_id, uploads__isnull=True, jobs__isnull=True
            ).delete()
    except (IntegrityError, ProtectedError):
        pass  # uploaded again, or named by a job, at this very moment: it stays
    return True


def publish(sha256: str) -> None:
    """Make sure agents can read the archive from Redis (and keep it there a week more)."""
    client = get_redis()
    key = contract.snapshot_key(sha256)
    if client.expire(key, PUBLISHED_SECONDS):
        return
    archive = CodeSnapshot.objects.filter(sha256=sha256).values_list("archive", flat=True).first()
    if archive is None:
        log.error("code snapshot %s is not in the database; agents cannot fetch it", sha256)
        return
    client.set(key, bytes(archive), ex=PUBLISHED_SECONDS)
