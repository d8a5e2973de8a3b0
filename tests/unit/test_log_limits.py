"""A job's log limits on the console side: taken from the image or lowered by the user (never
raised), sent to every instance as its share, counted from the agents' markers exactly once,
held again by the log keeper, and trimmed from Redis once archived (real Redis)."""

from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client

from jobs import logstream
from jobs.models import FrameworkImage, Job, LogChunk, MetricPoint
from jobs.redis_client import get_redis
from jobs.services import logarchive
from jobs.services.logceiling import KeptBytes
from jobs.services.submission import check_job_request, submit_job
from tests.unit.helpers import SentTasks, append_lines, job_request, stream_entries
from tests.unit.helpers import api_submit as submit
from workers import contract
from workers.logsink import LogBatch, LogSink

pytestmark = pytest.mark.usefixtures("catalog", "code_root", "nodes", "redis_url", "sent_tasks")


def test_a_job_takes_its_images_limits(client: Client, alice: User) -> None:
    FrameworkImage.objects.filter(name="pytorch:2.13-cpu").update(
        log_lines_per_second=300, log_max_mb=20, metric_points_per_second=40
    )
    response = submit(client, alice)
    assert response.status_code == 201, response.content
    assert response.json()["log_limits"] == {
        "lines_per_second": 300,
        "max_mb": 20,
        "metric_points_per_second": 40,
    }
    assert response.json()["log_dropped"] == {"lines": 0, "metric_points": 0}


def test_a_user_may_set_lower_limits(client: Client, alice: User) -> None:
    response = submit(client, alice, log_limits={"lines_per_second": 10, "max_mb": 1})
    assert response.status_code == 201, response.content
    job = Job.objects.get()
    assert (job.log_lines_per_second, job.log_max_mb, job.metric_points_per_second) == (10, 1, 500)


def test_it_refuses_limits_above_the_images_and_changes_nothing(
    client: Client, alice: User
) -> None:
    response = submit(client, alice, log_limits={"lines_per_second": 10**6, "max_mb": 0})
    assert response.status_code == 400
    errors = response.json()["errors"]
    assert errors["log_limits.max_mb"] == ["Give a whole number of megabytes, at least 1."]
    response = submit(client, alice, log_limits={"lines_per_second": 10**6})
    assert response.json()["errors"] == {
        "log_limits.lines_per_second": ["At most 2,000 lines per second on pytorch:2.13-cpu."]
    }
    assert not Job.objects.exists()


def test_every_instance_gets_the_rates_and_a_share_of_the_bytes(
    client: Client,
    alice: User,
    sent_tasks: SentTasks,
    django_capture_on_commit_callbacks: Any,
) -> None:
    with django_capture_on_commit_callbacks(execute=True):
        response = submit(client, alice, log_limits={"lines_per_second": 50, "max_mb": 10})
    assert response.status_code == 201, response.content
    specs = [kw["spec"] for _, kw, _ in sent_tasks.named(contract.TASK_START_REPLICA)]
    assert [s["log_limits"] for s in specs] == [
        {
            "lines_per_second": 50,
            "max_bytes": 5 * 10**6,
            "job_max_bytes": 10**7,
            "metric_points_per_second": 500,
        }
    ] * 2


@pytest.fixture
def job(alice: User) -> Job:
    return submit_job(alice, check_job_request(job_request(instances=2)))


def archive_all(kept: KeptBytes | None = None) -> None:
    kept = kept or KeptBytes()
    while logarchive.archive_once(get_redis(), block_ms=10, kept=kept):
        pass


def marker(job: Job, seq: int, lines: int, points: int = 0) -> LogBatch:
    text = f"[trainyard] {lines} lines dropped: over the job's log limit of 5 lines/s"
    return LogBatch(job.pk, "master", 0, "node-1", "e", 1.0, [text], "agent", seq, 0, lines, points)


def test_the_keeper_adds_up_the_markers_once_each(job: Job) -> None:
    sink = LogSink(get_redis())
    sink.append([marker(job, 1, 1000, 7), marker(job, 2, 234)])
    archive_all()
    # A second keeper (or one restarted after a crash) reads the same entries again.
    first = LogChunk.objects.filter(job=job).order_by("last_cursor").first()
    assert first is not None
    logarchive._save(
        get_redis(),
        job.pk,
        0,
        [(f"{first.last_cursor}-0", marker(job, 1, 1000, 7).fields())],
        10**9,
        KeptBytes(),
    )
    job.refresh_from_db()
    assert (job.log_dropped_lines, job.log_dropped_points) == (1234, 7)
    texts = [line["text"] for line in logstream.read_page(job.pk, 0, 10).lines]
    assert texts[0].startswith("[trainyard] 1000 lines dropped")


def test_the_keeper_holds_the_jobs_total_when_an_agent_does_not(job: Job) -> None:
    Job.objects.filter(pk=job.pk).update(log_max_mb=1)
    sink = LogSink(get_redis())
    line = "x" * 999
    for _ in range(30):  # 3 MB from an agent that ignores its budget
        append_lines(sink, job.pk, "master", 0, "node-1", [line] * 100)
    append_lines(
        sink, job.pk, "master", 0, "node-1", ['{"name": "loss", "value": 1, "ts": 1}'], "m"
    )
    archive_all()
    kept = LogChunk.objects.filter(job=job, kind=LogChunk.Kind.LINES).exclude(stream="metric")
    assert sum(len(c.text) for c in kept) <= 10**6 + logarchive_slack()
    gaps = LogChunk.objects.filter(job=job, kind=LogChunk.Kind.GAP)
    assert gaps.exists()
    assert gaps.first().text.endswith("over the job's log limit of 1 MB")  # type: ignore[union-attr]
    job.refresh_from_db()
    assert job.log_dropped_lines == 3000 - sum(c.last_cursor - c.first_cursor + 1 for c in kept)
    assert job.log_dropped_points == 1 and not MetricPoint.objects.filter(job=job).exists()


def logarchive_slack() -> int:
    from jobs.services.logceiling import SLACK_BYTES, SLACK_FRACTION

    return SLACK_BYTES + int(10**6 * SLACK_FRACTION)


def test_redis_keeps_only_what_is_not_archived_and_readers_still_see_everything(
    job: Job,
) -> None:
    sink = LogSink(get_redis())
    for b in range(300):
        append_lines(sink, job.pk, "master", 0, "node-1", [f"line {b}-{i}" for i in range(10)])
    assert len(stream_entries(get_redis(), job.pk)) == 300
    archive_all()
    # Approximate trimming frees whole nodes of the stream (100 entries each) only.
    assert len(stream_entries(get_redis(), job.pk)) < 100
    append_lines(sink, job.pk, "master", 0, "node-1", ["not archived yet"])
    texts: list[str] = []
    after = 0
    while page := logstream.read_page(job.pk, after, 500):
        texts.extend(line["text"] for line in page.lines)
        if page.next == after:
            break
        after = page.next
    assert texts == [f"line {b}-{i}" for b in range(300) for i in range(10)] + ["not archived yet"]
