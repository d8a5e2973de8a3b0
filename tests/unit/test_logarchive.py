"""The log keeper and the readers over the database and Redis together (real Redis)."""

from datetime import timedelta
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from django.contrib.auth.models import User
from django.test import AsyncClient, Client
from django.utils import timezone

from jobs import logstream
from jobs.models import ApiToken, Job, LogAck, LogChunk
from jobs.redis_client import get_redis
from jobs.services import logarchive
from jobs.services.lifecycle import reports
from jobs.services.submission import check_job_request, submit_job
from tests.unit.helpers import append_lines, job_request, stream_entries
from workers import contract
from workers.logsink import GAP, LogBatch, LogSink

pytestmark = pytest.mark.usefixtures("catalog", "code_root", "nodes", "redis_url", "sent_tasks")


@pytest.fixture
def job(alice: User) -> Job:
    return submit_job(alice, check_job_request(job_request(instances=2)))


def write_log(job: Job, batches: int = 4, per_batch: int = 25) -> list[str]:
    """Lines from two instances, stdout and stderr; returns every text in cursor order."""
    sink = LogSink(get_redis())
    texts = []
    for b in range(batches):
        role, index, node = ("master", 0, "node-1") if b % 2 == 0 else ("worker", 1, "node-2")
        stream = contract.STREAM_STDERR if b == 3 else contract.STREAM_STDOUT
        lines = [f"{role}-{b}-{i}" for i in range(per_batch)]
        append_lines(sink, job.pk, role, index, node, lines, stream, ts=float(b))
        texts.extend(lines)
    return texts


def archive_all() -> None:
    while logarchive.archive_once(get_redis(), block_ms=10):
        pass


def every_line(job: Job) -> list[dict[str, Any]]:
    lines: list[dict[str, Any]] = []
    after = 0
    while True:
        page = logstream.read_page(job.pk, after, 30)
        lines.extend(page.lines)
        if page.complete or page.next == after:
            return lines
        after = page.next


def test_it_archives_every_line_and_the_end_and_serves_them_without_redis(job: Job) -> None:
    texts = write_log(job)
    LogSink(get_redis()).append_end(job.pk, "job succeeded")
    archive_all()
    job.refresh_from_db()
    assert job.log_archived
    assert LogChunk.objects.filter(job=job).count() == 5
    get_redis().flushdb()  # Redis is gone (or restarted empty): the database has it all
    lines = every_line(job)
    assert [x["text"] for x in lines] == texts
    assert [x["cursor"] for x in lines] == list(range(1, 101))
    assert logstream.read_page(job.pk, 100, 10).complete


def test_reads_join_the_archive_and_the_newer_lines_still_in_redis(job: Job) -> None:
    texts = write_log(job, batches=2)
    archive_all()
    texts += write_log(job, batches=2)  # not archived yet
    assert LogChunk.objects.filter(job=job).count() == 2
    assert [x["text"] for x in every_line(job)] == texts
    assert logstream.line_counts(job.pk)["total"] == 100


def test_it_records_lines_trimmed_before_they_were_archived_as_a_gap(job: Job) -> None:
    write_log(job)
    get_redis().xtrim(contract.log_stream_key(job.pk), maxlen=1, approximate=False)
    archive_all()
    chunks = list(LogChunk.objects.filter(job=job).order_by("last_cursor"))
    assert [(c.kind, c.first_cursor, c.last_cursor) for c in chunks] == [
        ("gap", 1, 75),
        ("lines", 76, 100),
    ]


def test_it_closes_a_finished_jobs_log_whose_end_marker_never_reached_redis(job: Job) -> None:
    write_log(job, batches=1)
    # The job finished while Redis was away: the console could not append the end marker.
    Job.objects.filter(pk=job.pk).update(state=Job.State.SUCCEEDED, reason="", log_complete=True)
    archive_all()
    archive_all()
    end = LogChunk.objects.get(job=job, kind="end")
    assert (end.first_cursor, end.text) == (26, "job succeeded")
    job.refresh_from_db()
    assert job.log_archived


def test_it_closes_a_finished_jobs_log_only_once_the_database_has_every_writers_last_lines(
    job: Job,
) -> None:
    """Redis lost a replica's last lines and the end marker after the replica ended: the log
    stays open until the agent has sent them again from its file."""
    sink = LogSink(get_redis())
    writer = "f:abc:output0"

    def from_file(lines: list[str], start: int, end: int) -> LogBatch:
        return LogBatch(job.pk, "master", 0, "node-1", "o", 1.0, lines, writer, end, start=start)

    assert sink.append([from_file(["a0", "a1"], 0, 100)]) == [2]
    archive_all()
    # The replica ended after lines up to offset 200 (its exit report says so); Redis lost
    # them, and the marker, before the keeper had them.
    reports.record_log_goals(job, {writer: 200, "f:bad": -3, "f:" + "x" * 200: 5})
    assert {a.writer: (a.seq, a.goal) for a in LogAck.objects.filter(job=job)} == {
        writer: (100, 200)
    }
    Job.objects.filter(pk=job.pk).update(state=Job.State.SUCCEEDED, reason="", log_complete=True)
    archive_all()
    assert not LogChunk.objects.filter(job=job, kind="end").exists(), "lines are still owed"
    assert sink.append([from_file(["b0", "b1"], 100, 200)]) == [4]  # sent again
    archive_all()
    archive_all()
    job.refresh_from_db()
    assert job.log_archived
    assert [x["text"] for x in every_line(job)] == ["a0", "a1", "b0", "b1"]
    assert LogChunk.objects.get(job=job, kind="end").first_cursor == 5


def test_a_log_whose_owed_lines_never_come_is_closed_after_the_wait(job: Job) -> None:
    reports.record_log_goals(job, {"f:abc:output0": 200})
    long_ago = timezone.now() - timedelta(seconds=logarchive.LOG_GOAL_WAIT_SECONDS + 1)
    Job.objects.filter(pk=job.pk).update(
        state=Job.State.SUCCEEDED, reason="", log_complete=True, finished=long_ago
    )
    archive_all()
    archive_all()
    assert LogChunk.objects.filter(job=job, kind="end").exists()


def test_pages_go_backwards_and_filter(job: Job) -> None:
    write_log(job)
    archive_all()
    before = logstream.read_page_before(job.pk, before=60, limit=20)
    assert [x["cursor"] for x in before.lines] == list(range(40, 60)) and before.more_before
    assert not logstream.read_page_before(job.pk, before=10, limit=20).more_before
    where = logstream.LineFilter(node="node-2", stream="stderr")
    assert {x["text"] for x in logstream.read_page(job.pk, 0, 100, where).lines} == {
        f"worker-3-{i}" for i in range(25)
    }
    found = logstream.read_page(job.pk, 0, 5, logstream.LineFilter(text="MASTER-2-1"))
    assert [x["text"] for x in found.lines] == ["master-2-1"] + [f"master-2-1{i}" for i in range(4)]


def test_it_finds_the_first_error(job: Job) -> None:
    sink = LogSink(get_redis())
    append_lines(sink, job.pk, "master", 0, "node-1", ["epoch 1 error_rate=0.1", "fine"])
    append_lines(
        sink, job.pk, "worker", 1, "node-2",
        ["Traceback (most recent call last):", '  File "x.py"', "ValueError: bad"], "e",
    )  # fmt: skip
    page = logstream.read_page(job.pk, 0, 1, logstream.LineFilter(errors=True))
    assert [(x["cursor"], x["text"]) for x in page.lines] == [
        (3, "Traceback (most recent call last):")
    ]


def test_the_api_serves_counts_and_the_whole_text(job: Job, alice: User) -> None:
    write_log(job, batches=3)
    archive_all()
    write_log(job, batches=1)
    LogSink(get_redis()).append_end(job.pk, "job failed: worker-1 exited with code 3")
    client = Client(headers={"Authorization": f"Token {ApiToken.issue(alice)}"})
    counts = client.get(f"/api/v1/jobs/{job.pk}/logs/counts").json()
    assert counts["total"] == 100
    assert counts["by_node"] == {"node-1": 75, "node-2": 25}
    assert {(r["tag"], r["stdout"], r["stderr"]) for r in counts["replicas"]} == {
        ("master", 75, 0),
        ("worker-1", 25, 0),
    }
    page = client.get(f"/api/v1/jobs/{job.pk}/logs?before=30&limit=5&role=worker").json()
    assert [x["cursor"] for x in page["lines"]] == [26, 27, 28, 29]
    assert client.get(f"/api/v1/jobs/{job.pk}/logs?stream=both").status_code == 400


@pytest.mark.django_db(transaction=True)
async def test_the_download_is_streamed_page_by_page(job: Job, alice: User) -> None:
    await sync_to_async(write_log)(job, batches=250, per_batch=200)
    await sync_to_async(archive_all)()
    await sync_to_async(write_log)(job, batches=1)
    LogSink(get_redis()).append_end(job.pk, "job failed: worker-1 exited with code 3")
    client = AsyncClient()
    await client.aforce_login(alice)
    response = await client.get(f"/api/v1/jobs/{job.pk}/logs.txt")
    assert response.status_code == 200 and response.streaming, response.content
    assert response["Content-Disposition"].startswith("attachment;")
    parts = [part async for part in response.streaming_content]  # type: ignore[attr-defined]
    assert len(parts) > 1  # written as it is read, not built whole first
    lines = b"".join(parts).decode().splitlines()
    assert lines[0] == "[master] master-0-0" and lines[200] == "[worker-1] worker-1-0"
    assert len(lines) == 50_026 and lines[-1].startswith("--- log complete: job failed")


def test_search_matches_the_text_as_shown_without_colour_codes(job: Job) -> None:
    sink = LogSink(get_redis())
    append_lines(sink, job.pk, "master", 0, "node-1", ["\x1b[31mRuntime\x1b[0mError: boom", "ok"])
    found = logstream.read_page(job.pk, 0, 5, logstream.LineFilter(text="runtimeerror"))
    assert [x["cursor"] for x in found.lines] == [1]
    errors = logstream.read_page(job.pk, 0, 5, logstream.LineFilter(errors=True))
    assert [x["cursor"] for x in errors.lines] == [1]


def test_a_restarted_jobs_lines_keep_their_attempt_in_redis_the_database_and_the_api(
    job: Job,
) -> None:
    sink = LogSink(get_redis())
    append_lines(sink, job.pk, "master", 0, "node-1", ["first run"])
    restarted = LogBatch(job.pk, "master", 0, "node-1", "o", 2.0, ["again", "and"], "w2", 1, 1)
    sink.append([restarted])
    (first_id, first), (second_id, second) = stream_entries(get_redis(), job.pk)
    assert contract.FIELD_ATTEMPT not in first and second[contract.FIELD_ATTEMPT] == "1"
    live = logstream.parse_entry(second_id, second)
    assert live.attempt == 1 and live.wire()["attempt"] == 1
    assert live.after(2).attempt == 1 and live.before(3).attempt == 1
    assert logstream.chunk_from_entry(job.pk, second_id, second).attempt == 1
    assert logstream.parse_entry(first_id, first).attempt == 0
    shown = [("first run", 0), ("again", 1), ("and", 1)]
    assert [(x["text"], x["attempt"]) for x in every_line(job)] == shown  # from Redis

    archive_all()  # the keeper stores the attempt with the lines
    chunks = LogChunk.objects.filter(job=job).order_by("last_cursor")
    assert [(c.first_cursor, c.last_cursor, c.attempt) for c in chunks] == [(1, 1, 0), (2, 3, 1)]
    get_redis().flushdb()  # from the database alone now
    saved = logstream.from_chunk(chunks[1])
    assert saved.attempt == 1 and logstream.to_chunk(job.pk, saved).attempt == 1
    assert saved.line_dict(1) == {
        "cursor": 3,
        "role": "master",
        "index": 0,
        "attempt": 1,
        "node": "node-1",
        "stream": "stdout",
        "ts": 2.0,
        "text": "and",
    }
    assert [(x["text"], x["attempt"]) for x in every_line(job)] == shown
    before = logstream.read_page_before(job.pk, before=3, limit=5)
    assert [(x["text"], x["attempt"]) for x in before.lines] == shown[:2]
    text, _, _ = logstream._text_after(job.pk, 0)
    assert text.splitlines() == ["[master] first run", "[master · attempt 2] again",
                                 "[master · attempt 2] and"]  # fmt: skip


def test_after_redis_lost_writes_it_realigns_the_stream_and_keeps_each_line_once(
    job: Job,
) -> None:
    client = get_redis()
    sink = LogSink(client)
    writer = "f:abc:output0"

    def from_file(lines: list[str], start: int, end: int) -> LogBatch:
        return LogBatch(job.pk, "master", 0, "node-1", "o", 1.0, lines, writer, end, start=start)

    first = from_file([f"a{i}" for i in range(10)], 0, 100)
    second = from_file([f"b{i}" for i in range(10)], 100, 200)
    third = from_file([f"c{i}" for i in range(10)], 200, 300)
    assert sink.append([first, second]) == [10, 20]
    archive_all()
    assert client.hget(contract.log_ack_key(job.pk), writer) == "200"
    # Redis comes back as it was after the first batch (its last writes lost): the database
    # has cursors it hands out again, and the run the keeper knew is another.
    client.set(contract.LOG_KEEPER_REDIS_RUN_KEY, "an earlier run")
    client.delete(contract.log_stream_key(job.pk))  # (what it had was archived and trimmed)
    client.set(contract.log_cursor_key(job.pk), 10)
    client.hset(contract.log_seen_key(job.pk), writer, 100)
    client.delete(contract.log_ack_key(job.pk))
    epoch = client.get(contract.log_epoch_key(job.pk))
    # Meanwhile: an agent's own note takes a cursor the database has, and the file's next
    # batch is refused (its previous one is gone).
    note = LogBatch(job.pk, "master", 0, "node-1", "e", 2.0, ["note"], "agent-1", 1)
    assert sink.append([note, third]) == [11, GAP]

    assert logarchive.realign_if_redis_restarted(client)
    assert not logarchive.realign_if_redis_restarted(client)  # once per Redis run
    assert client.get(contract.log_epoch_key(job.pk)) != epoch
    # What the database has counts as in Redis: a batch sent again from before is dropped,
    # the rest follows the database's last cursor.
    assert sink.acked(job.pk, writer) == sink.seen(job.pk, writer) == 200
    assert sink.append([second, third]) == [-1, 31]
    sink.append_end(job.pk, "job succeeded")
    archive_all()
    lines = every_line(job)
    assert [x["text"] for x in lines] == [
        *first.lines, *second.lines, "note", *third.lines,
    ]  # fmt: skip
    assert [x["cursor"] for x in lines] == list(range(1, 32))


def test_lines_an_agent_dropped_over_its_budget_are_acknowledged_with_the_lines_before(
    job: Job,
) -> None:
    """A skip (lines dropped over the budget, never in the stream) is acknowledged once the
    keeper has the writer's lines before it, so the agent frees them and its exit's goal is
    met; lines the keeper itself drops over the job's limit are acknowledged as it drops them."""
    client = get_redis()
    sink = LogSink(client)
    writer = "f:abc:output0"

    def from_file(lines: list[str], start: int, end: int) -> LogBatch:
        return LogBatch(job.pk, "master", 0, "node-1", "o", 1.0, lines, writer, end, start=start)

    assert sink.append([from_file(["a0", "a1"], 0, 100), from_file([], 100, 300)]) == [2, -1]
    assert sink.acked(job.pk, writer) == -1  # the lines before the skip are not archived yet
    assert sink.append([from_file([], 300, 400)]) == [-1]  # one skip with the one before
    archive_all()
    assert sink.acked(job.pk, writer) == 400
    assert LogAck.objects.get(job=job, writer=writer).seq == 100  # what the database has
    assert client.hlen(contract.log_skip_key(job.pk)) == 0
    assert sink.append([from_file(["b0"], 400, 450)]) == [3]
    archive_all()
    assert sink.acked(job.pk, writer) == 450
    assert [x["text"] for x in every_line(job)] == ["a0", "a1", "b0"]
    # Over the job's limit, the keeper keeps a gap row instead of the lines: acknowledged too.
    Job.objects.filter(pk=job.pk).update(log_max_mb=1)
    assert sink.append([from_file(["x" * 3_000_000], 450, 500)]) == [4]
    archive_all()
    assert sink.acked(job.pk, writer) == 500
    assert LogChunk.objects.filter(job=job, kind="gap").exists()
