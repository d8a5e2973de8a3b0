"""A replica's log budget (workers/logquota.py): what passes, what is dropped, and the markers
that count the drops. The clock is passed in: no test here waits."""

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from tests.conftest import wait_until
from tests.unit.helpers import stream_entries
from workers import contract
from workers.logquota import MARKER_SECONDS, LogBudget, LogLimits, human_bytes
from workers.logship import LogShipper, ReplicaKey
from workers.logsink import LogBatch


def lines(n: int, width: int = 9) -> list[str]:
    return [f"{i:0{width}d}" for i in range(n)]


def test_it_lets_a_burst_through_then_the_rate() -> None:
    budget = LogBudget(LogLimits(lines_per_second=100), now=0.0)
    kept, marker = budget.admit_lines(lines(500), now=0.0)  # 5 s of burst
    assert len(kept) == 500 and marker is None
    kept, marker = budget.admit_lines(lines(300), now=1.0)  # one more second: 100 more
    assert kept == lines(100)
    assert marker is not None
    assert marker.text == "[trainyard] 200 lines dropped: over the job's log limit of 100 lines/s"
    assert marker.dropped_lines == 200 and budget.dropped_lines == 200


def test_markers_count_every_drop_once_and_no_more_often_than_every_few_seconds() -> None:
    budget = LogBudget(LogLimits(lines_per_second=10), now=0.0)
    budget.admit_lines(lines(50), now=0.0)  # the burst
    told = 0
    markers = 0
    now = 0.0
    for _ in range(200):  # 20 s of a flood, 1000 lines every 0.1 s
        now += 0.1
        _, marker = budget.admit_lines(lines(1000), now)
        if marker is not None:
            markers += 1
            told += marker.dropped_lines
    final = budget.final_marker()
    assert final is not None
    told += final.dropped_lines
    assert told == budget.dropped_lines == 200 * 1000 - 200  # 10 lines/s for 20 s passed
    assert markers <= 20 / MARKER_SECONDS + 1
    assert budget.final_marker() is None  # told already


def test_the_end_of_a_drop_episode_is_told_at_once() -> None:
    budget = LogBudget(LogLimits(lines_per_second=1), now=0.0)
    budget.admit_lines(lines(5), now=0.0)
    _, first = budget.admit_lines(lines(3), now=0.1)
    assert first is not None and first.dropped_lines == 3
    _, held = budget.admit_lines(lines(2), now=0.2)
    assert held is None  # gathering
    kept, told = budget.admit_lines(lines(1), now=2.0)  # lines pass again
    assert kept == lines(1) and told is not None and told.dropped_lines == 2


def test_once_the_bytes_are_spent_every_later_line_is_dropped() -> None:
    budget = LogBudget(LogLimits(max_bytes=100, job_max_bytes=400), now=0.0)
    kept, marker = budget.admit_lines(lines(25), now=0.0)  # 10 bytes a line with its newline
    assert kept == lines(10)  # the last that fits whole
    assert marker is not None
    assert marker.text == (
        "[trainyard] 15 lines dropped: over this instance's share (100 bytes) of the job's "
        "log limit of 400 bytes"
    )
    kept, _ = budget.admit_lines(["x"], now=100.0)
    assert kept == [] and budget.dropped_lines == 16


def test_a_single_instance_marker_names_the_job_limit() -> None:
    budget = LogBudget(LogLimits(max_bytes=2000, job_max_bytes=2000), now=0.0)
    _, marker = budget.admit_lines(["x" * 2000, "y"], now=0.0)
    assert marker is not None
    assert marker.text == "[trainyard] 2 lines dropped: over the job's log limit of 2 kB"


def test_metric_points_have_a_rate_of_their_own() -> None:
    budget = LogBudget(LogLimits(lines_per_second=1, metric_points_per_second=2), now=0.0)
    allowed, marker = budget.admit_points(25, now=0.0)
    assert allowed == 10
    assert marker is not None and marker.dropped_points == 15 and marker.dropped_lines == 0
    assert "15 metric points dropped: over the job's limit of 2 points/s" in marker.text


def test_no_limits_drop_nothing() -> None:
    budget = LogBudget(LogLimits.from_dict({}), now=0.0)
    kept, marker = budget.admit_lines(lines(100_000), now=0.0)
    assert len(kept) == 100_000 and marker is None
    assert budget.admit_points(10**6, now=0.0) == (10**6, None)


def test_limits_travel_as_a_dict_and_ignore_what_they_do_not_know() -> None:
    limits = LogLimits(1, 2, 3, 4)
    assert LogLimits.from_dict({**limits.to_dict(), "later": 9}) == limits


def test_sizes_read_as_people_write_them() -> None:
    assert human_bytes(10**9) == "1 GB"
    assert human_bytes(250 * 10**6) == "250 MB"
    assert human_bytes(1_500_000) == "1.5 MB"
    assert human_bytes(12) == "12 bytes"


# --- at the shipper, against a real Redis -------------------------------------------------------


@pytest.fixture
def client(redis_server: str) -> Iterator[redis.Redis]:
    c = redis.Redis.from_url(redis_server, decode_responses=True)
    c.flushdb()
    yield c


def shipped(client: redis.Redis, job_id: int) -> list[tuple[str, int, list[str]]]:
    """(stream, lines dropped the entry accounts for, lines) of every entry."""
    return [
        (f[contract.FIELD_STREAM], int(f.get(contract.FIELD_DROPPED_LINES, 0)),
         f[contract.FIELD_LINES].split("\n"))
        for _, f in stream_entries(client, job_id)
    ]  # fmt: skip


def test_the_shipper_drops_over_the_budget_and_ships_a_counted_marker(
    client: redis.Redis, tmp_path: Path
) -> None:
    shipper = LogShipper(client, tmp_path / "spool")
    key = ReplicaKey(3, "master", 0, "n1")
    shipper.limit(key, LogLimits(lines_per_second=10))
    for i in range(100):
        shipper.put(key, contract.STREAM_STDOUT, time.time(), [f"line {i}"] * 10)
    shipper.put_system(key, time.time(), ["[trainyard] the agent's own note"])
    shipper.release(key)
    assert shipper.flush(10)
    shipper.close()
    entries = shipped(client, 3)
    kept = sum(len(lines) for stream, _, lines in entries if stream == contract.STREAM_STDOUT)
    dropped = sum(d for _, d, _ in entries)
    assert 50 <= kept < 1000 and kept + dropped == 1000
    markers = [lines[0] for _, d, lines in entries if d]
    assert markers[0].endswith("lines dropped: over the job's log limit of 10 lines/s")
    assert any(lines == ["[trainyard] the agent's own note"] for _, _, lines in entries)


def test_a_marker_survives_the_spool() -> None:
    batch = LogBatch(
        1, "master", 0, "n1", "e", 1.0, ["[trainyard] 5 lines dropped"], "w", 1, 0, 5, 2
    )
    assert LogBatch.from_json(batch.to_json()) == batch
    plain = LogBatch(1, "master", 0, "n1", "o", 1.0, ["x"], "w", 2)
    assert LogBatch.from_json(plain.to_json()) == plain


def test_lines_wait_in_the_spool_while_redis_is_full_and_none_is_lost(
    client: redis.Redis, tmp_path: Path
) -> None:
    shipper = LogShipper(client, tmp_path / "spool", retry_seconds=0.05)
    key = ReplicaKey(4, "master", 0, "n1")
    shipper.put(key, contract.STREAM_STDOUT, time.time(), ["before"])
    assert shipper.flush(10)
    old = str(client.config_get("maxmemory")["maxmemory"])
    client.config_set("maxmemory", 1)  # full: every write is refused (noeviction)
    try:
        client.config_set("maxmemory-policy", "noeviction")
        shipper.put(key, contract.STREAM_STDOUT, time.time(), ["while full"])
        wait_until("the line to be spooled", lambda: shipper.spooling)
    finally:
        client.config_set("maxmemory", old)
    assert shipper.flush(30)
    shipper.close()
    assert [lines for _, _, lines in shipped(client, 4)] == [["before"], ["while full"]]
