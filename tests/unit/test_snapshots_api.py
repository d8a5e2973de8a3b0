"""Uploading code snapshots and running jobs from them, through the API (Django's test client;
Celery messages captured, the unit tests' real Redis)."""

import io
import os
import tarfile
import threading
from pathlib import Path
from typing import Any

import pytest
import redis
from django.contrib.auth.models import User
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import Client

from jobs.models import ApiToken, CodeSnapshot, CodeUpload, Job
from jobs.services import snapshots
from tests.snapshots import snapshot_of
from tests.unit.helpers import SentTasks, job_request
from workers import contract

pytestmark = pytest.mark.usefixtures("catalog", "code_root", "nodes", "redis_url", "sent_tasks")


def folder(root: Path, version: str = "1") -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "train.py").write_text(f"print('version {version}')\n")
    (root / "lib.py").write_text("X = 1\n")
    return root


def packed(root: Path) -> bytes:
    """As a user's tar would pack it: with times and owners (the console packs it again)."""
    data = io.BytesIO()
    with tarfile.open(fileobj=data, mode="w:gz") as tar:
        tar.add(root, arcname=".")
    return data.getvalue()


def upload(client: Client, user: User, archive: bytes, name: str = "") -> Any:
    return client.post(
        "/api/v1/snapshots",
        {"archive": SimpleUploadedFile("code.tar.gz", archive), "name": name},
        HTTP_AUTHORIZATION=f"Token {ApiToken.issue(user)}",
    )


def submit(client: Client, user: User, program: dict[str, Any]) -> Any:
    return client.post(
        "/api/v1/jobs",
        job_request(instances=2, program=program),
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Token {ApiToken.issue(user)}",
    )


def test_it_stores_an_upload_once_by_its_files_hash(
    client: Client, alice: User, bob: User, tmp_path: Path
) -> None:
    root = folder(tmp_path / "proj")
    first = upload(client, alice, packed(root), name="mlp")
    assert first.status_code == 201, first.content
    sha = snapshot_of(root).sha256
    assert first.json() | {"uploaded": "-"} == {
        "sha256": sha,
        "name": "mlp",
        "size": len(snapshot_of(root).archive),
        "unpacked_size": len("print('version 1')\n") + len("X = 1\n"),
        "file_count": 2,
        "uploaded": "-",
        "new": True,
    }
    # The same files again, packed another way, by alice and then by bob: stored once.
    (root / "train.py").touch()
    again = upload(client, alice, packed(root))
    assert (again.status_code, again.json()["sha256"], again.json()["new"]) == (200, sha, False)
    assert again.json()["name"] == "mlp"  # an upload without a name keeps the one it had
    by_bob = upload(client, bob, packed(root), name="bob's copy")
    assert (by_bob.status_code, by_bob.json()["new"]) == (201, True)  # new to him
    assert CodeSnapshot.objects.count() == 1
    assert sorted(CodeUpload.objects.values_list("owner__username", "name")) == [
        ("alice", "mlp"),
        ("bob", "bob's copy"),
    ]
    listed = client.get(
        "/api/v1/snapshots", HTTP_AUTHORIZATION=f"Token {ApiToken.issue(alice)}"
    ).json()
    assert [(s["sha256"], s["name"]) for s in listed["snapshots"]] == [(sha, "mlp")]
    detail = client.get(
        f"/api/v1/snapshots/{sha}", HTTP_AUTHORIZATION=f"Token {ApiToken.issue(alice)}"
    ).json()
    assert detail["files"] == ["lib.py", "train.py"]


def test_it_does_not_tell_that_someone_else_uploaded_the_same_files(
    client: Client, alice: User, bob: User, tmp_path: Path
) -> None:
    root = folder(tmp_path / "proj")
    # What alice's first upload answers on a console that holds nothing...
    first_ever = upload(client, alice, packed(root), name="proj")
    assert first_ever.status_code == 201, first_ever.content
    CodeUpload.objects.all().delete()
    CodeSnapshot.objects.all().delete()
    # ...is what it answers when bob has uploaded the same files.
    by_bob = upload(client, bob, packed(root), name="bobs")
    assert by_bob.status_code == 201, by_bob.content
    by_alice = upload(client, alice, packed(root), name="proj")
    assert by_alice.status_code == 201
    assert by_alice.json() | {"uploaded": "-"} == first_ever.json() | {"uploaded": "-"}
    assert by_alice.json()["new"] is True
    assert CodeSnapshot.objects.count() == 1  # still stored once


def test_it_tells_the_user_they_had_uploaded_the_files_before(
    client: Client, alice: User, bob: User, tmp_path: Path
) -> None:
    root = folder(tmp_path / "proj")
    upload(client, alice, packed(root))
    assert upload(client, bob, packed(root)).status_code == 201
    again = upload(client, bob, packed(root))
    assert again.status_code == 200
    assert again.json()["new"] is False


def test_a_forgotten_upload_is_new_again(client: Client, bob: User, tmp_path: Path) -> None:
    root = folder(tmp_path / "proj")
    sha = upload(client, bob, packed(root)).json()["sha256"]
    forgot = client.delete(
        f"/api/v1/snapshots/{sha}", HTTP_AUTHORIZATION=f"Token {ApiToken.issue(bob)}"
    )
    assert forgot.status_code == 204
    again = upload(client, bob, packed(root))
    assert (again.status_code, again.json()["new"]) == (201, True)


@pytest.mark.parametrize(
    ("name", "why"),
    [("../evil.py", "contains '..'"), ("/abs.py", "an absolute path")],
)
def test_an_escaping_member_is_refused_and_nothing_is_stored(
    client: Client, alice: User, name: str, why: str
) -> None:
    data = io.BytesIO()
    with tarfile.open(fileobj=data, mode="w:gz") as tar:
        info = tarfile.TarInfo(name)
        info.size = 1
        tar.addfile(info, io.BytesIO(b"x"))
    response = upload(client, alice, data.getvalue())
    assert response.status_code == 400
    [message] = response.json()["errors"]["archive"]
    assert message.startswith(f"The archive is refused: {name!r}: {why}")
    assert CodeSnapshot.objects.count() == 0 and CodeUpload.objects.count() == 0


def test_an_archive_over_the_limit_gets_413(
    client: Client, alice: User, settings: Any, tmp_path: Path
) -> None:
    settings.TRAINYARD_SNAPSHOT_MAX_BYTES = 4096
    root = folder(tmp_path / "proj")
    (root / "weights.bin").write_bytes(os.urandom(16 * 1024))  # does not compress
    response = upload(client, alice, packed(root))
    assert response.status_code == 413
    assert response.json() == {
        "errors": {
            "archive": [
                "The archive is larger than 0 MB (TRAINYARD_SNAPSHOT_MAX_MB); leave data sets "
                "and checkpoints out of it."
            ]
        }
    }
    assert CodeSnapshot.objects.count() == 0


def test_a_job_runs_a_snapshot_and_keeps_it_after_a_new_upload(
    client: Client,
    alice: User,
    tmp_path: Path,
    sent_tasks: SentTasks,
    django_capture_on_commit_callbacks: Any,
    settings: Any,
) -> None:
    root = folder(tmp_path / "proj", version="1")
    v1 = upload(client, alice, packed(root)).json()["sha256"]
    with django_capture_on_commit_callbacks(execute=True):
        response = submit(client, alice, {"script": "./train.py", "args": [], "snapshot": v1})
    assert response.status_code == 201, response.content
    assert response.json()["program"] == {"script": "train.py", "args": [], "snapshot": v1}
    job = Job.objects.get(pk=response.json()["id"])
    assert job.snapshot is not None and job.snapshot.sha256 == v1
    # Placed and started: the archive is in Redis for the agents, byte for byte.
    starts = [
        kwargs["spec"] for name, kwargs, _ in sent_tasks.sent if name == contract.TASK_START_REPLICA
    ]
    assert [s["program"] for s in starts] == [{"path": "train.py", "snapshot": v1}] * 2
    stored = CodeSnapshot.objects.get(sha256=v1)
    raw = redis.Redis.from_url(settings.REDIS_URL)  # the console's client decodes to str
    assert raw.get(contract.snapshot_key(v1)) == bytes(stored.archive)

    # A new version is uploaded: the job still names the files it was submitted with.
    folder(root, version="2")
    v2 = upload(client, alice, packed(root)).json()["sha256"]
    assert v2 != v1
    job.refresh_from_db()
    assert job.program == {"path": "train.py", "snapshot": v1}


def test_only_your_own_snapshots_and_their_files_can_be_run(
    client: Client, alice: User, bob: User, tmp_path: Path
) -> None:
    sha = upload(client, alice, packed(folder(tmp_path / "proj"))).json()["sha256"]
    by_bob = submit(client, bob, {"script": "train.py", "args": [], "snapshot": sha})
    assert by_bob.status_code == 400
    assert by_bob.json()["errors"]["program.snapshot"] == [
        f"No code snapshot {sha!r} of yours: upload it first (POST /api/v1/snapshots)."
    ]
    assert client.get(
        f"/api/v1/snapshots/{sha}", HTTP_AUTHORIZATION=f"Token {ApiToken.issue(bob)}"
    ).json() == {"errors": {"snapshot": ["No such code snapshot of yours."]}}
    missing = submit(client, alice, {"script": "eval.py", "args": [], "snapshot": sha})
    assert missing.json()["errors"]["program.script"] == [
        f"No file 'eval.py' in code snapshot {sha[:12]} (its Python files: lib.py, train.py)."
    ]
    assert Job.objects.count() == 0


def forget(client: Client, user: User, sha256: str) -> Any:
    return client.delete(
        f"/api/v1/snapshots/{sha256}", HTTP_AUTHORIZATION=f"Token {ApiToken.issue(user)}"
    )


def test_forgetting_an_upload_removes_it_from_its_owner_only_and_jobs_keep_their_code(
    client: Client, alice: User, bob: User, tmp_path: Path
) -> None:
    shared = upload(client, alice, packed(folder(tmp_path / "a"))).json()["sha256"]
    upload(client, bob, packed(folder(tmp_path / "b")))  # the same files: one snapshot
    assert forget(client, bob, "0" * 64).status_code == 404  # not his
    assert forget(client, bob, "not-a-hash").status_code == 404
    assert forget(client, bob, shared).status_code == 204
    assert forget(client, bob, shared).status_code == 404  # already gone
    assert CodeSnapshot.objects.filter(sha256=shared).exists()  # alice still has it
    assert CodeUpload.objects.filter(owner=alice).count() == 1

    ran = submit(client, alice, {"script": "train.py", "snapshot": shared})
    assert ran.status_code == 201, ran.content
    assert forget(client, alice, shared).status_code == 204
    assert not CodeUpload.objects.exists()
    kept = Job.objects.get().snapshot
    assert kept is not None and kept.sha256 == shared  # a job that ran it keeps it
    again = submit(client, alice, {"script": "train.py", "snapshot": shared})
    assert again.status_code == 400  # no longer hers to name


def test_the_last_upload_forgotten_takes_its_files_with_it(
    client: Client, alice: User, tmp_path: Path
) -> None:
    sha = upload(client, alice, packed(folder(tmp_path / "a", version="2"))).json()["sha256"]
    assert forget(client, alice, sha).status_code == 204
    assert not CodeSnapshot.objects.filter(sha256=sha).exists()
    # Uploaded again, the same files are stored again under the same name.
    assert upload(client, alice, packed(folder(tmp_path / "a", version="2"))).status_code == 201


def test_an_upload_waits_its_turn_and_gets_503_when_it_does_not_come(
    client: Client, alice: User, tmp_path: Path, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Checks are CPU work under the GIL: a web process checks a few at once, not every one."""
    busy = threading.BoundedSemaphore(1)
    busy.acquire()  # another upload is being checked
    monkeypatch.setattr(snapshots, "_CHECKING", busy)
    settings.TRAINYARD_SNAPSHOT_CHECK_WAIT_SECONDS = 0
    response = upload(client, alice, packed(folder(tmp_path / "proj")))
    assert response.status_code == 503
    assert "try again" in response.json()["errors"]["archive"][0]
    assert not CodeUpload.objects.exists()
    busy.release()  # its turn comes
    assert upload(client, alice, packed(folder(tmp_path / "proj"))).status_code == 201
