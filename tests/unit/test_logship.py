"""Pipe reading and log shipping against a real Redis (no Django involved)."""

import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from jobs.logstream import parse_entry
from tests.conftest import wait_until
from tests.tmpfs import fill, small_tmpfs
from tests.unit.helpers import stream_entries
from workers import contract
from workers.logquota import LogLimits
from workers.logship import CONTINUED, LogShipper, ReplicaKey, Spool, _Chunk, pump_pipe
from workers.logsink import GAP, LogBatch, LogSink


class Collected:
    """What pump_pipe emitted: every line, and when each read happened."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.reads: list[tuple[float, list[str]]] = []

    def __call__(self, ts: float, lines: list[str]) -> None:
        self.reads.append((ts, lines))
        self.lines.extend(lines)


def lines_of(data: bytes, max_line_chars: int = 1024) -> list[str]:
    read_fd, write_fd = os.pipe()
    got = Collected()
    reader = threading.Thread(
        target=pump_pipe, args=(os.fdopen(read_fd, "rb"), got, max_line_chars)
    )
    reader.start()
    with os.fdopen(write_fd, "wb") as w:
        w.write(data)
    reader.join(5)
    return got.lines


def test_it_keeps_a_line_whole_when_text_and_newline_arrive_apart() -> None:
    script = (
        "import sys\n"
        "for i in range(50):\n"
        "    sys.stdout.write(f'line {i}'); sys.stdout.flush()\n"
        "    sys.stdout.write('\\n'); sys.stdout.flush()\n"
    )
    proc = subprocess.Popen([sys.executable, "-u", "-c", script], stdout=subprocess.PIPE)
    got = Collected()
    assert proc.stdout is not None
    pump_pipe(proc.stdout, got)
    proc.wait()
    assert got.lines == [f"line {i}" for i in range(50)]


def test_it_gives_a_last_line_without_newline_and_strips_crlf() -> None:
    assert lines_of(b"a\r\nb\n\nlast") == ["a", "b", "", "last"]


def test_it_replaces_invalid_utf8() -> None:
    assert lines_of(b"ok \xff\xfe bytes\n") == ["ok \ufffd\ufffd bytes"]


def test_it_keeps_ansi_and_html_as_they_are() -> None:
    # Rendering them safely is the viewer's job; the log keeps what the trainer printed.
    assert lines_of(b"\x1b[31mred\x1b[0m <b>x</b>\n") == ["\x1b[31mred\x1b[0m <b>x</b>"]


def test_it_cuts_very_long_lines_into_marked_pieces() -> None:
    got = lines_of(b"x" * 2500 + b"\nshort\n", max_line_chars=1000)
    assert got == ["x" * 1000 + CONTINUED, "x" * 1000 + CONTINUED, "x" * 500, "short"]


def test_it_never_cuts_inside_a_character() -> None:
    # A long line with no newline yet is cut at a byte budget; "é" is two bytes.
    got = lines_of("é".encode() * 3000, max_line_chars=1001)
    assert "\ufffd" not in "".join(got)
    assert "".join(p.removesuffix(CONTINUED) for p in got) == "é" * 3000


def test_it_sends_a_partial_line_after_the_pipe_was_quiet() -> None:
    read_fd, write_fd = os.pipe()
    got = Collected()
    reader = threading.Thread(
        target=pump_pipe,
        args=(os.fdopen(read_fd, "rb"), got),
        kwargs={"partial_flush_seconds": 0.1},
    )
    reader.start()
    with os.fdopen(write_fd, "wb") as w:
        w.write(b"Password: ")
        w.flush()
        # The reader gives it up on its own, with the pipe still open.
        wait_until("the reader to send the partial line", lambda: got.lines)
        assert got.lines == ["Password: "]
        w.write(b"rest\n")
    reader.join(5)
    assert got.lines == ["Password: ", "rest"]


@pytest.fixture
def client(redis_server: str) -> Iterator[redis.Redis]:
    c = redis.Redis.from_url(redis_server, decode_responses=True)
    c.flushdb()
    yield c


def all_lines(client: redis.Redis, job_id: int) -> list[tuple[int, str, str]]:
    """(cursor, tag, text) of every line in the stream, in stream order."""
    out: list[tuple[int, str, str]] = []
    for entry_id, fields in stream_entries(client, job_id):
        batch = parse_entry(entry_id, fields)
        out.extend((batch.first + k, batch.tag, t) for k, t in enumerate(batch.lines))
    return out


def test_it_ships_in_order_with_cursors_that_only_grow(client: redis.Redis, tmp_path: Path) -> None:
    shipper = LogShipper(client, tmp_path / "spool")
    a, b = ReplicaKey(7, "master", 0, "n1"), ReplicaKey(7, "worker", 1, "n2")
    for i in range(1000):
        shipper.put(a if i % 3 else b, "o", time.time(), [f"line {i}"])
    assert shipper.flush(10)
    shipper.close()
    lines = all_lines(client, 7)
    assert [c for c, _, _ in lines] == list(range(1, 1001))
    assert [t for _, tag, t in lines if tag == "master"] == [
        f"line {i}" for i in range(1000) if i % 3
    ]
    assert len(stream_entries(client, 7)) < 1000  # batched


def test_the_sink_ignores_a_batch_sent_twice(client: redis.Redis) -> None:
    sink = LogSink(client)
    batch = LogBatch(9, "master", 0, "n1", "o", 1.0, ["once"], "writer-a", 1)
    other = LogBatch(9, "master", 0, "n1", "o", 1.0, ["other writer"], "writer-b", 1)
    assert sink.append([batch, batch, other]) == [1, -1, 2]
    assert sink.append_end(9, "job succeeded") == 3
    assert sink.append_end(9, "job succeeded") == -1  # the end marker is appended once
    assert [t for _, _, t in all_lines(client, 9)] == ["once", "other writer"]


def script_checks(client: redis.Redis) -> int:
    stats = client.info("commandstats")
    return int(stats.get("cmdstat_script|exists", {}).get("calls", 0))


def test_the_sink_appends_in_one_round_trip_and_after_redis_forgot_its_script(
    client: redis.Redis,
) -> None:
    sink = LogSink(client)
    checks = script_checks(client)
    assert sink.append([LogBatch(12, "master", 0, "n1", "o", 1.0, ["a"], "w", 1)]) == [1]
    assert sink.append([LogBatch(12, "master", 0, "n1", "o", 1.0, ["b", "c"], "w", 2)]) == [3]
    assert script_checks(client) == checks  # no SCRIPT EXISTS before each pipeline
    client.script_flush()  # as a restarted Redis has no scripts
    batches = [
        LogBatch(12, "master", 0, "n1", "o", 1.0, [t], "w", n) for n, t in [(3, "d"), (4, "e")]
    ]
    assert sink.append(batches) == [4, 5]
    assert sink.append(batches) == [-1, -1]
    assert [t for _, _, t in all_lines(client, 12)] == ["a", "b", "c", "d", "e"]


def test_a_batch_whose_writers_earlier_lines_redis_lost_is_refused_whole(
    client: redis.Redis,
) -> None:
    sink = LogSink(client)
    first = LogBatch(8, "master", 0, "n1", "o", 1.0, ["a", "b"], "f:x:output0", 40, start=0)
    second = LogBatch(8, "master", 0, "n1", "o", 1.0, ["c"], "f:x:output0", 60, start=40)
    assert sink.append([first]) == [2]
    # Redis lost the first batch (a crash under appendfsync everysec): the second is a gap.
    client.hdel(contract.log_seen_key(8), "f:x:output0")
    assert sink.append([second]) == [GAP]
    assert sink.append([first, second]) == [4, 5]  # sent again from the file, in order
    assert [t for _, _, t in all_lines(client, 8)] == ["a", "b", "a", "b", "c"]
    # A batch with no start (not read from a file) is never checked.
    loose = LogBatch(8, "master", 0, "n1", "e", 1.0, ["note"], "agent", 7)
    assert sink.append([loose]) == [6]


def test_a_gap_answer_makes_the_writers_file_be_read_again_once_per_reading(
    client: redis.Redis, tmp_path: Path
) -> None:
    shipper = LogShipper(client, tmp_path / "spool")
    asked: list[int] = []
    shipper.watch("f:y:output0", asked.append)
    key = ReplicaKey(3, "master", 0, "n1")
    shipper.put(key, "o", 1.0, ["one"], source=("f:y:output0", 10), start=0)
    assert shipper.flush(5)
    client.hdel(contract.log_seen_key(3), "f:y:output0")  # Redis lost it
    shipper.put(key, "o", 2.0, ["two"], source=("f:y:output0", 20), start=10, generation=0)
    assert shipper.flush(5)
    shipper.close()
    assert asked == [0]
    assert [t for _, _, t in all_lines(client, 3)] == ["one"]


def test_it_tells_where_a_file_writers_last_shipped_lines_end_not_counting_dropped_ones(
    client: redis.Redis, tmp_path: Path
) -> None:
    shipper = LogShipper(client, tmp_path / "spool")
    key = ReplicaKey(4, "master", 0, "n1")
    writer = "f:z:output0"
    assert shipper.last_seq(writer) == -1
    shipper.limit(key, LogLimits(max_bytes=5))
    shipper.put(key, "o", 1.0, ["abc"], source=(writer, 10), start=0)
    shipper.put(key, "o", 2.0, ["over the budget"], source=(writer, 30), start=10)
    # The end of the lines that went (the agent waits for the database to have them), not of
    # the file: the dropped ones never reach Redis.
    assert shipper.last_seq(writer) == 10
    shipper.forget(writer)
    assert shipper.last_seq(writer) == -1
    shipper.close()


def test_lines_dropped_over_the_budget_are_no_gap_and_count_as_acknowledged(
    client: redis.Redis, tmp_path: Path
) -> None:
    """A file's lines that the budget drops never reach the stream, but Redis is told the
    writer's lines went past them: the next lines are appended (not answered as a gap, which
    would make the file be read again, and the same lines dropped again, forever), and the
    acknowledgement moves past them once the database has the lines before them."""
    shipper = LogShipper(client, tmp_path / "spool")
    asked: list[int] = []
    writer = "f:d:output0"
    shipper.watch(writer, asked.append)
    key = ReplicaKey(5, "master", 0, "n1")
    shipper.limit(key, LogLimits(lines_per_second=1))  # a burst of 5 lines, then 1 a second
    shipper.put(key, "o", 1.0, [f"kept {i}" for i in range(5)], source=(writer, 50), start=0)
    shipper.put(key, "o", 1.0, ["dropped 0", "dropped 1"], source=(writer, 70), start=50)
    shipper.put(key, "o", 1.0, ["dropped 2"], source=(writer, 80), start=70)
    assert shipper.flush(5)
    sink = LogSink(client)
    assert sink.seen(5, writer) == 80 and sink.acked(5, writer) == -1
    assert shipper.last_seq(writer) == 50  # what the database must have
    # Once the database has everything before them, dropped lines are acknowledged at once
    # (the log keeper's side: tests/unit/test_logarchive.py).
    client.hset(contract.log_ack_key(5), writer, 80)
    shipper.put(key, "o", 1.0, ["dropped 3"], source=(writer, 90), start=80)
    assert shipper.flush(5)
    assert sink.seen(5, writer) == sink.acked(5, writer) == 90
    shipper.close()
    assert asked == []
    texts = [t for _, _, t in all_lines(client, 5)]
    assert [t for t in texts if not t.startswith("[trainyard]")] == [f"kept {i}" for i in range(5)]


def test_a_skip_and_the_lines_around_it_share_batches(client: redis.Redis, tmp_path: Path) -> None:
    """The shipper's batches: a skip after lines ends their batch further on; lines after a
    skip start their batch at the skip's start."""
    shipper = LogShipper(client, tmp_path / "spool")
    key = ReplicaKey(6, "master", 0, "n1")
    w = "f:e:output0"
    chunks = [
        _Chunk(key, "o", 1.0, ["a"], writer=w, seq=10, start=0),
        _Chunk(key, "o", 1.0, [], writer=w, seq=20, start=10),
        _Chunk(key, "e", 1.0, [], writer=w, seq=30, start=20),
        _Chunk(key, "e", 2.0, ["b"], writer=w, seq=40, start=30),
    ]

    def packed(chunks: list[_Chunk]) -> list[tuple[list[str], int, int]]:
        return [(list(b.lines), b.start, b.seq) for b in shipper._pack(chunks)]

    assert packed(chunks) == [(["a"], 0, 30), (["b"], 30, 40)]  # two pipes: two batches
    assert packed(chunks[1:]) == [(["b"], 10, 40)]
    assert packed(chunks[1:3]) == [([], 10, 30)]  # a skip of its own
    shipper.close()


def test_an_entry_has_an_attempt_field_only_after_a_restart(
    client: redis.Redis, tmp_path: Path
) -> None:
    shipper = LogShipper(client, tmp_path / "spool")
    shipper.put(ReplicaKey(4, "worker", 1, "n1"), "o", 1.0, ["first run"])
    shipper.put(ReplicaKey(4, "worker", 1, "n1", attempt=1), "o", 2.0, ["after a restart"])
    assert shipper.flush(5)
    shipper.close()
    (first_id, first), (second_id, second) = stream_entries(client, 4)
    # A first attempt's entry is what it was before restarts existed: no attempt field (the
    # append script adds the batch's writer and sequence number, for the log keeper).
    writer = first.pop(contract.FIELD_WRITER)
    assert first.pop(contract.FIELD_SEQ) == "1" and second[contract.FIELD_WRITER] == writer
    assert first == {
        contract.FIELD_ROLE: "worker",
        contract.FIELD_INDEX: "1",
        contract.FIELD_NODE: "n1",
        contract.FIELD_STREAM: "o",
        contract.FIELD_TS: "1.0",
        contract.FIELD_LINES: "first run",
    }
    assert second[contract.FIELD_ATTEMPT] == "1"
    assert (parse_entry(first_id, first).attempt, parse_entry(second_id, second).attempt) == (0, 1)


def test_the_spool_keeps_the_attempt_and_reads_lines_written_before_attempts(
    tmp_path: Path,
) -> None:
    old = '[5, "worker", 1, "n1", "e", 1.0, ["old"], "dead-agent", 1]'
    first_run = LogBatch(5, "worker", 1, "n1", "e", 1.0, ["old"], "dead-agent", 1)
    assert first_run.to_json() == old  # attempt 0 writes the spool line it always wrote
    assert LogBatch.from_json(old) == first_run and first_run.attempt == 0
    restarted = LogBatch(5, "worker", 1, "n1", "e", 2.0, ["new"], "agent", 1, attempt=2)
    assert LogBatch.from_json(restarted.to_json()) == restarted
    # A segment an agent from before restarts left behind, then one of today's.
    spool_dir = tmp_path / "spool"
    spool_dir.mkdir()
    (spool_dir / f"{1:020d}-1.spool").write_text(old + "\n")
    spool = Spool(spool_dir)
    spool.append([restarted])
    read: list[tuple[list[str], int]] = []
    while batches := spool.peek(10):  # a segment at a time
        read.extend((list(b.lines), b.attempt) for b in batches)
        spool.consume(len(batches))
    assert read == [(["old"], 0), (["new"], 2)]


def test_it_spools_to_disk_while_redis_is_away_and_sends_in_order_after(
    client: redis.Redis, tmp_path: Path
) -> None:
    broken = redis.Redis.from_url("redis://127.0.0.1:1/0", socket_connect_timeout=0.1)
    spool = tmp_path / "spool"
    shipper = LogShipper(broken, spool, retry_seconds=0.05)
    key = ReplicaKey(8, "master", 0, "n1")
    for i in range(50):
        shipper.put(key, "o", time.time(), [f"kept {i}"])
    assert not shipper.flush(0.5)  # not delivered, and not dropped either: on disk
    assert list(spool.glob("*.spool")) and shipper.spooling
    # Redis answers again (here: the same shipper pointed at a working one).
    shipper._sink = LogSink(client)
    shipper.put(key, "o", time.time(), ["after the outage"])
    assert shipper.flush(5)
    texts = [t for _, _, t in all_lines(client, 8)]
    assert texts == [f"kept {i}" for i in range(50)] + ["after the outage"]
    assert not list(spool.glob("*.spool"))  # sent, so gone
    shipper.close()


def test_a_new_agent_sends_what_a_crashed_one_left_in_its_spool(
    client: redis.Redis, tmp_path: Path
) -> None:
    spool_dir = tmp_path / "spool"
    left = Spool(spool_dir)
    batches = [
        LogBatch(5, "worker", 1, "n1", "e", 1.0, [f"old {i}"], "dead-agent", i + 1)
        for i in range(3)
    ]
    left.append(batches)
    LogSink(client).append(batches[:1])  # the dead agent got the first one out before it died
    shipper = LogShipper(client, spool_dir, retry_seconds=0.05)
    shipper.put(ReplicaKey(5, "worker", 1, "n1"), "e", 2.0, ["new"])
    assert shipper.flush(5)
    shipper.close()
    assert [t for _, _, t in all_lines(client, 5)] == ["old 0", "old 1", "old 2", "new"]


def spooled(spool_dir: Path) -> list[tuple[int, str, int, str, str]]:
    """(job, role, index, stream, text) of every line in the spool's segments, oldest first,
    read off the disk without taking them (a Spool would delete a segment it has read)."""
    out: list[tuple[int, str, int, str, str]] = []
    for segment in sorted(spool_dir.glob("*.spool")):
        # After the last newline: a record still being written, counted once it is whole.
        *whole, _ = segment.read_text().split("\n")
        for b in map(LogBatch.from_json, whole):
            out.extend((b.job_id, b.role, b.index, b.stream, t) for t in b.lines)
    return out


def test_the_trainer_is_never_blocked_by_an_absent_redis(tmp_path: Path) -> None:
    broken = redis.Redis.from_url("redis://127.0.0.1:1/0", socket_connect_timeout=0.1)
    spool_dir = tmp_path / "spool"
    shipper = LogShipper(broken, spool_dir, retry_seconds=0.05)
    proc = subprocess.Popen(
        [sys.executable, "-c", "for i in range(20000): print('x' * 100, i)"],
        stdout=subprocess.PIPE,
    )
    assert proc.stdout is not None
    key = ReplicaKey(3, "master", 0, "n1")
    pump_pipe(proc.stdout, lambda ts, lines: shipper.put(key, contract.STREAM_STDOUT, ts, lines))
    # The trainer ran to its end although none of its lines could reach Redis.
    assert proc.wait() == 0
    # Nor were its lines dropped: every one waits on disk, in order, for Redis to come back.
    expected = [(3, "master", 0, contract.STREAM_STDOUT, f"{'x' * 100} {i}") for i in range(20000)]
    wait_until("every line in the spool", lambda: len(spooled(spool_dir)) >= len(expected))
    assert spooled(spool_dir) == expected
    shipper.close(timeout=0.5)
    assert spooled(spool_dir) == expected  # closing keeps them for the next agent


def test_a_full_disk_leaves_the_spool_whole_and_loses_no_line(
    client: redis.Redis, tmp_path: Path
) -> None:
    """Redis away and the spool's disk full at once: the lines wait in memory (no torn record
    on disk, the shipper goes on), reach the disk once there is room, and Redis once it is
    back, every one in order."""
    broken = redis.Redis.from_url("redis://127.0.0.1:1/0", socket_connect_timeout=0.1)
    key = ReplicaKey(9, "master", 0, "n1")
    with small_tmpfs("1m") as disk:
        spool_dir = disk / "spool"
        shipper = LogShipper(broken, spool_dir, retry_seconds=0.05)
        shipper.put(key, "o", time.time(), ["before the disk filled"])
        assert not shipper.flush(0.5)
        filler = fill(disk)
        for i in range(300):
            shipper.put(key, "o", time.time(), [f"while full {i} " + "x" * 1000])
        assert not shipper.flush(0.5)
        assert shipper._thread.is_alive()
        on_disk = [s.read_bytes() for s in spool_dir.glob("*.spool")]
        assert all(data.endswith(b"\n") for data in on_disk)  # no torn record
        assert [t for *_, t in spooled(spool_dir)] == ["before the disk filled"]
        filler.unlink()  # room again: the next append takes what memory held
        shipper.put(key, "o", time.time(), ["after room came back"])
        expected = (
            ["before the disk filled"]
            + [f"while full {i} " + "x" * 1000 for i in range(300)]
            + ["after room came back"]
        )
        wait_until("the held lines on disk", lambda: len(spooled(spool_dir)) == len(expected))
        assert [t for *_, t in spooled(spool_dir)] == expected
        shipper._sink = LogSink(client)  # Redis answers again
        assert shipper.flush(10)
        shipper.close()
        assert [t for _, _, t in all_lines(client, 9)] == expected
