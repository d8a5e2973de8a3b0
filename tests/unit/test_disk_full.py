"""A console disk that fills: uploads and job submissions answer 507 with a clear message,
never a 500, and leave no row behind; once there is room, the same requests succeed.

The database's failure is injected midway through the transaction (after the first row of the
request is written), as SQLite reports a full disk; the upload spool is filled for real:
Django's temporary upload folder on a 1 MB tmpfs.
"""

import contextlib
import errno
import os
import tarfile
from collections.abc import Iterator
from io import BytesIO
from typing import Any
from unittest import mock

import pytest
from django.contrib.auth.models import User
from django.core.files.uploadedfile import SimpleUploadedFile
from django.db import DatabaseError, OperationalError
from django.http import HttpResponse
from django.test import Client
from django.utils.html import escape

from jobs.disk_full import MESSAGE, DiskFullMiddleware, is_disk_full
from jobs.models import ApiToken, CodeSnapshot, CodeUpload, Job, JobAttempt
from tests.tmpfs import small_tmpfs
from tests.unit.helpers import job_request

pytestmark = pytest.mark.usefixtures("catalog", "code_root", "nodes", "redis_url", "sent_tasks")


FULL = OperationalError("database or disk is full")  # SQLite's words for SQLITE_FULL


@contextlib.contextmanager
def database_full(monkeypatch: pytest.MonkeyPatch, model: Any, method: str) -> Iterator[None]:
    """`model.objects.<method>` fails as SQLite does on a full disk: a write midway through a
    transaction, after the first rows were written."""
    with monkeypatch.context() as patched:
        patched.setattr(model.objects, method, mock.Mock(side_effect=FULL))
        yield


def token(user: User) -> dict[str, str]:
    return {"Authorization": f"Token {ApiToken.issue(user)}"}


def archive_of(files: dict[str, bytes]) -> bytes:
    data = BytesIO()
    with tarfile.open(fileobj=data, mode="w:gz") as tar:
        for name, content in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(content)
            tar.addfile(info, BytesIO(content))
    return data.getvalue()


def upload(client: Client, auth: dict[str, str], archive: bytes) -> Any:
    return client.post(
        "/api/v1/snapshots",
        {"archive": SimpleUploadedFile("code.tar.gz", archive), "name": "mlp"},
        headers=auth,
    )


def submit(client: Client, auth: dict[str, str]) -> Any:
    return client.post(
        "/api/v1/jobs", job_request(instances=2), content_type="application/json", headers=auth
    )


def test_it_refuses_a_job_with_507_while_the_database_is_full(
    client: Client, alice: User, monkeypatch: pytest.MonkeyPatch
) -> None:
    auth = token(alice)
    with database_full(monkeypatch, JobAttempt, "create"):
        answer = submit(client, auth)
    assert answer.status_code == 507
    assert answer.json() == {"errors": {"storage": [MESSAGE]}}
    assert not Job.objects.exists()
    again = submit(client, auth)
    assert again.status_code == 201, again.content
    assert Job.objects.count() == 1


def test_it_refuses_an_upload_with_507_while_the_database_is_full(
    client: Client, alice: User, monkeypatch: pytest.MonkeyPatch
) -> None:
    auth = token(alice)
    archive = archive_of({"train.py": b"print('hi')\n" * 2000})
    with database_full(monkeypatch, CodeUpload, "select_for_update"):
        answer = upload(client, auth, archive)
    assert answer.status_code == 507
    assert answer.json()["errors"]["storage"] == [MESSAGE]
    # Neither the snapshot nor the upload: no snapshot that nobody uploaded.
    assert not CodeSnapshot.objects.exists() and not CodeUpload.objects.exists()
    assert upload(client, auth, archive).status_code == 201
    assert CodeUpload.objects.filter(owner=alice).count() == 1


def test_the_new_job_page_says_the_disk_is_full(
    client: Client, alice: User, monkeypatch: pytest.MonkeyPatch
) -> None:
    client.force_login(alice)
    form = {"name": "digits", "image": "pytorch:2.13-cpu", "script": "digits-ddp",
            "script_path": "", "args": "", "package": "cpu-1", "instances": "2"}  # fmt: skip
    with database_full(monkeypatch, JobAttempt, "create"):
        answer = client.post("/jobs/new/", form)
    assert answer.status_code == 507
    assert escape(MESSAGE) in answer.content.decode()
    assert not Job.objects.exists()


def test_an_upload_the_upload_folder_has_no_room_for_is_refused_with_507(
    client: Client, alice: User, settings: Any
) -> None:
    auth = token(alice)
    # Random bytes do not compress: the archive is larger than the 1 MB tmpfs.
    archive = archive_of({"weights.bin": os.urandom(1536 * 1024)})
    with small_tmpfs("1m") as spool:
        settings.FILE_UPLOAD_TEMP_DIR = str(spool)
        settings.FILE_UPLOAD_MAX_MEMORY_SIZE = 64 * 1024  # to disk, as large uploads go
        answer = upload(client, auth, archive)
        assert answer.status_code == 507, answer.content
        assert answer.json()["errors"]["storage"] == [MESSAGE]
        assert not CodeSnapshot.objects.exists() and not CodeUpload.objects.exists()
        assert list(spool.iterdir()) == []  # Django removed its partial temporary file
    settings.FILE_UPLOAD_TEMP_DIR = None
    assert upload(client, auth, archive).status_code == 201


@pytest.mark.parametrize(
    ("exc", "full"),
    [
        (OSError(errno.ENOSPC, "No space left on device"), True),
        (OSError(errno.EDQUOT, "Disk quota exceeded"), True),
        (OperationalError("database or disk is full"), True),
        (OperationalError('could not extend file "base/1/2": No space left on device'), True),
        (OSError(errno.EACCES, "Permission denied"), False),
        (OperationalError("database is locked"), False),
        (DatabaseError("no such table: jobs_job"), False),
        (ValueError("No space left on device"), False),
    ],
)
def test_it_tells_a_full_disk_from_other_errors(exc: BaseException, full: bool) -> None:
    assert is_disk_full(exc) is full


def test_other_errors_are_left_to_django(rf: Any) -> None:
    middleware = DiskFullMiddleware(lambda request: HttpResponse())
    request = rf.post("/api/v1/jobs")
    assert middleware.process_exception(request, OperationalError("database is locked")) is None
