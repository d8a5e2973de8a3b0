"""GET /api/v1/jobs/ID/artifacts and …/artifacts/PATH (jobs/api_artifacts.py, jobs/services/
artifacts.py): the console asks a live node the job ran on, through Celery and a reply list in
the real test Redis. Here the Celery message is handed to the agent's own handler
(workers.artifacts.serve) instead of a broker, which answers into Redis as an agent does; the
integration test (tests/integration/test_artifacts.py) does the same with real agents."""

import asyncio
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.utils import timezone

from console.celery import app
from jobs.models import ApiToken, Job, SlurmPool
from jobs.redis_client import get_redis
from jobs.services import artifacts as artifact_service
from jobs.services.submission import check_job_request, submit_job
from tests.conftest import make_stale, set_quota
from tests.unit.helpers import SentTasks, job_request
from workers import agentreply, artifacts, contract, sandbox

pytestmark = pytest.mark.usefixtures("catalog", "nodes", "redis_url")

OTHER_UID = 1_900_000_008


class Agents:
    """Stands in for the node agents' Celery workers: an artifact request sent to a node's
    queue is served by the agent's handler at once, with the checkpoint root given; every
    other message is recorded. `silent` nodes answer nothing."""

    def __init__(self, root: Path, recorded: SentTasks) -> None:
        self.root = root
        self.recorded = recorded
        self.silent: set[str] = set()
        self.asked: list[str] = []

    def __call__(self, name: str, kwargs: dict[str, Any] | None = None, **options: Any) -> None:
        if name not in (contract.TASK_LIST_ARTIFACTS, contract.TASK_READ_ARTIFACT):
            self.recorded(name, kwargs, **options)
            return
        node = options["queue"].removeprefix("node.")
        self.asked.append(node)
        if node in self.silent:
            return
        assert options["expires"] == artifact_service.ANSWER_SECONDS
        artifacts.serve(
            (kwargs or {})["request"],
            client=get_redis(),
            node=node,
            checkpoint_root=self.root,
            sandbox=sandbox.Sandbox(sandbox.Isolation.NONE),  # files are the agent's uid's
        )


@pytest.fixture
def agents(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sent_tasks: SentTasks) -> Agents:
    serving = Agents(tmp_path, sent_tasks)
    monkeypatch.setattr(app, "send_task", serving)
    return serving


def auth(user: User) -> dict[str, Any]:
    return {"HTTP_AUTHORIZATION": f"Token {ApiToken.issue(user)}"}


@pytest.fixture
def placed_job(django_capture_on_commit_callbacks: Any) -> Callable[[User], Job]:
    """Submits a job of a user's and places it on a node (its schedule request runs at
    commit, as the console worker would run it)."""

    def place(user: User) -> Job:
        set_quota(user)
        with django_capture_on_commit_callbacks(execute=True):
            job = submit_job(user, check_job_request(job_request(instances=1)))
        assert job.replicas.filter(node__isnull=False).exists()
        return job

    return place


def saved(root: Path, job: Job, path: str, data: bytes) -> Path:
    top, _, rest = path.partition("/")
    folder = artifacts.JobFolders(root, job.pk, job.checkpoint_key, os.geteuid()).folder(top)
    target = folder / rest
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(data)
    return target


def streamed(response: Any) -> bytes:
    """The body of a download, chunk by chunk as the ASGI server would send it."""

    async def collect() -> bytes:
        return b"".join([chunk async for chunk in response.streaming_content])

    return asyncio.run(collect())


def test_it_lists_the_jobs_checkpoints_and_outputs(
    client: Client, placed_job: Callable[[User], Job], alice: User, agents: Agents
) -> None:
    job = placed_job(alice)
    saved(agents.root, job, "checkpoints/latest.pt", b"weights")
    saved(agents.root, job, "outputs/eval/predictions.csv", b"a,b\n")
    response = client.get(f"/api/v1/jobs/{job.pk}/artifacts", **auth(alice))
    assert response.status_code == 200, response.content
    listing = response.json()
    assert listing["node"] == agents.asked[0]
    assert [(f["path"], f["kind"], f["size"]) for f in listing["files"]] == [
        ("checkpoints/latest.pt", "checkpoint", 7),
        ("outputs/eval/predictions.csv", "output", 4),
    ]
    assert listing["refused"] == [] and listing["notes"] == []
    # Nothing is left in Redis: the answer was taken, the reply list is gone.
    assert get_redis().keys("trainyard:reply:*") == []


def test_it_downloads_a_file_in_chunks_with_its_length_and_name(
    client: Client,
    placed_job: Callable[[User], Job],
    alice: User,
    agents: Agents,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(artifacts, "CHUNK_BYTES", 1000)
    job = placed_job(alice)
    data = os.urandom(2500)
    saved(agents.root, job, "checkpoints/epoch 1/latest.pt", data)
    response = client.get(
        f"/api/v1/jobs/{job.pk}/artifacts/checkpoints/epoch%201/latest.pt", **auth(alice)
    )
    assert response.status_code == 200
    assert response["Content-Length"] == "2500"
    assert response["Content-Disposition"] == 'attachment; filename="latest.pt"'
    assert response["Content-Type"] == "application/octet-stream"
    assert streamed(response) == data
    assert len(agents.asked) == 3  # three chunks


def test_another_user_gets_404_and_no_node_is_asked(
    client: Client, placed_job: Callable[[User], Job], alice: User, bob: User, agents: Agents
) -> None:
    job = placed_job(alice)
    saved(agents.root, job, "checkpoints/latest.pt", b"weights")
    for path in ("artifacts", "artifacts/checkpoints/latest.pt"):
        response = client.get(f"/api/v1/jobs/{job.pk}/{path}", **auth(bob))
        assert response.status_code == 404
        assert response.json() == {"errors": {"job": ["No such job."]}}
    assert agents.asked == []


def test_staff_may_download_any_jobs_file(
    client: Client,
    placed_job: Callable[[User], Job],
    alice: User,
    charlie_admin: User,
    agents: Agents,
) -> None:
    job = placed_job(alice)
    saved(agents.root, job, "checkpoints/latest.pt", b"weights")
    response = client.get(
        f"/api/v1/jobs/{job.pk}/artifacts/checkpoints/latest.pt", **auth(charlie_admin)
    )
    assert response.status_code == 200 and streamed(response) == b"weights"


@pytest.mark.parametrize(
    "path, words",
    [
        ("checkpoints/../../etc/shadow", "'..'"),
        ("checkpoints/%2E%2E/x", "'..'"),
        ("outputs/.code/train.py", "the platform's"),
        ("etc/shadow", "must start with checkpoints/ or outputs/"),
        ("checkpoints/a%00b", "NUL"),
    ],
)
def test_a_bad_path_is_a_clear_400_and_no_node_is_asked(
    client: Client,
    placed_job: Callable[[User], Job],
    alice: User,
    agents: Agents,
    path: str,
    words: str,
) -> None:
    job = placed_job(alice)
    response = client.get(f"/api/v1/jobs/{job.pk}/artifacts/{path}", **auth(alice))
    assert response.status_code == 400, response.content
    assert words in response.json()["errors"]["path"][0]
    assert agents.asked == []


def test_a_missing_file_is_404_with_its_name(
    client: Client, placed_job: Callable[[User], Job], alice: User, agents: Agents
) -> None:
    job = placed_job(alice)
    response = client.get(f"/api/v1/jobs/{job.pk}/artifacts/checkpoints/gone.pt", **auth(alice))
    assert response.status_code == 404
    assert response.json()["errors"]["path"] == ["No such file: checkpoints/gone.pt."]


def test_a_link_the_job_planted_is_refused_and_nothing_it_names_is_sent(
    client: Client, placed_job: Callable[[User], Job], alice: User, agents: Agents, tmp_path: Path
) -> None:
    job = placed_job(alice)
    shadow = tmp_path / "shadow"
    shadow.write_text("root:SECRET-HASH:19000::::::\n")
    shadow.chmod(0o600)
    checkpoint = saved(agents.root, job, "checkpoints/model.pt", b"")
    checkpoint.unlink()
    checkpoint.symlink_to(shadow)
    response = client.get(f"/api/v1/jobs/{job.pk}/artifacts/checkpoints/model.pt", **auth(alice))
    assert response.status_code == 409
    assert response.json()["errors"]["path"] == ["Not served: model.pt is a symbolic link."]
    assert b"SECRET" not in response.content
    listing = client.get(f"/api/v1/jobs/{job.pk}/artifacts", **auth(alice)).json()
    assert listing["files"] == []
    assert listing["refused"] == [
        {"path": "checkpoints/model.pt", "reason": "model.pt is a symbolic link"}
    ]


def test_a_file_of_another_owner_is_refused(
    client: Client, placed_job: Callable[[User], Job], alice: User, agents: Agents
) -> None:
    job = placed_job(alice)
    os.chown(saved(agents.root, job, "outputs/theirs.txt", b"not yours"), OTHER_UID, OTHER_UID)
    response = client.get(f"/api/v1/jobs/{job.pk}/artifacts/outputs/theirs.txt", **auth(alice))
    assert response.status_code == 409
    assert "belongs to uid" in response.json()["errors"]["path"][0]


def test_a_job_that_never_ran_on_a_node_says_so(
    client: Client, placed_job: Callable[[User], Job], alice: User, agents: Agents
) -> None:
    job = placed_job(alice)
    job.replicas.update(node=None)
    response = client.get(f"/api/v1/jobs/{job.pk}/artifacts", **auth(alice))
    assert response.status_code == 409
    assert response.json()["errors"]["artifacts"] == [
        f"Job {job.pk} has not run on a node yet: it has no files to list."
    ]


def test_lost_nodes_are_named_and_not_asked(
    client: Client, placed_job: Callable[[User], Job], alice: User, agents: Agents
) -> None:
    job = placed_job(alice)
    node = job.replicas.get().node
    assert node is not None
    make_stale(node)
    response = client.get(f"/api/v1/jobs/{job.pk}/artifacts", **auth(alice))
    assert response.status_code == 503
    [message] = response.json()["errors"]["artifacts"]
    assert f"{node.name} is lost (last heard from " in message
    assert agents.asked == []


def test_a_node_that_does_not_answer_is_named(
    client: Client,
    placed_job: Callable[[User], Job],
    alice: User,
    agents: Agents,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The wait is the behaviour under test: a short one, not a sleep.
    monkeypatch.setattr(artifact_service, "ANSWER_SECONDS", 0.3)
    job = placed_job(alice)
    placed_on = job.replicas.get().node
    assert placed_on is not None
    node = placed_on.name
    agents.silent.add(node)
    response = client.get(f"/api/v1/jobs/{job.pk}/artifacts", **auth(alice))
    assert response.status_code == 503
    assert response.json()["errors"]["artifacts"][0].startswith(f"{node} did not answer within 0 s")


def test_outputs_removed_by_retention_are_said_and_checkpoints_still_listed(
    client: Client, placed_job: Callable[[User], Job], alice: User, agents: Agents
) -> None:
    job = placed_job(alice)
    saved(agents.root, job, "checkpoints/latest.pt", b"weights")
    Job.objects.filter(pk=job.pk).update(logs_pruned=timezone.now())
    listing = client.get(f"/api/v1/jobs/{job.pk}/artifacts", **auth(alice)).json()
    assert [f["path"] for f in listing["files"]] == ["checkpoints/latest.pt"]
    assert "removed with its log by retention" in listing["notes"][0]
    response = client.get(f"/api/v1/jobs/{job.pk}/artifacts/outputs/x.txt", **auth(alice))
    assert response.status_code == 410
    assert "its checkpoints stay" in response.json()["errors"]["path"][0]


def test_a_reply_list_of_another_node_is_never_answered_on() -> None:
    assert not contract.is_reply_key(contract.reply_key("node-2", "abc123"), "node-1")
    assert not contract.is_reply_key("trainyard:reply:node-1:a:b", "node-1")
    assert contract.is_reply_key(contract.reply_key("node-1", "abc123"), "node-1")
    assert not agentreply.answer(
        get_redis(), "node-1", contract.reply_key("node-2", "abc"), {"ok": True}
    )
    assert get_redis().keys("trainyard:reply:*") == []


def test_a_name_the_job_chose_stays_inside_its_header(
    client: Client, placed_job: Callable[[User], Job], alice: User, agents: Agents
) -> None:
    job = placed_job(alice)
    saved(agents.root, job, 'outputs/a"b; filename=evil.exe é.txt', b"text")
    response = client.get(
        f"/api/v1/jobs/{job.pk}/artifacts/outputs/a%22b%3B%20filename%3Devil.exe%20%C3%A9.txt",
        **auth(alice),
    )
    assert response.status_code == 200
    assert response["Content-Disposition"] == (
        "attachment; filename*=utf-8''a%22b%3B%20filename%3Devil.exe%20%C3%A9.txt"
    )
    assert streamed(response) == b"text"


def test_a_slurm_job_says_its_files_are_not_served_here(
    client: Client, placed_job: Callable[[User], Job], alice: User, agents: Agents
) -> None:
    job = placed_job(alice)
    pool = SlurmPool.objects.create(name="hpc", partition="cpu")
    Job.objects.filter(pk=job.pk).update(slurm_pool=pool)
    response = client.get(f"/api/v1/jobs/{job.pk}/artifacts", **auth(alice))
    assert response.status_code == 409
    assert "ran in a Slurm pool" in response.json()["errors"]["artifacts"][0]
    assert agents.asked == []
