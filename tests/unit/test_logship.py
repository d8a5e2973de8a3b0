"""Pipe reading and log shipping against a real Redis (no Django involved)."""

import os
import subprocess
import sys
import threading
from collections.abc import Iterator

import pytest
import redis

from jobs.logstream import parse_entry
from tests.unit.helpers import stream_entries
from workers.logship import LogShipper, ReplicaKey, pump_pipe


def lines_of(data: bytes, max_line_bytes: int = 1024) -> list[str]:
    read_fd, write_fd = os.pipe()
    got: list[str] = []
    reader = threading.Thread(
        target=pump_pipe, args=(os.fdopen(read_fd, "rb"), got.append, max_line_bytes)
    )
    reader.start()
    with os.fdopen(write_fd, "wb") as w:
        w.write(data)
    reader.join(5)
    return got


def test_it_keeps_a_line_whole_when_text_and_newline_arrive_apart() -> None:
    script = (
        "import sys\n"
        "for i in range(50):\n"
        "    sys.stdout.write(f'line {i}'); sys.stdout.flush()\n"
        "    sys.stdout.write('\\n'); sys.stdout.flush()\n"
    )
    proc = subprocess.Popen([sys.executable, "-u", "-c", script], stdout=subprocess.PIPE)
    got: list[str] = []
    assert proc.stdout is not None
    pump_pipe(proc.stdout, got.append)
    proc.wait()
    assert got == [f"line {i}" for i in range(50)]


def test_it_gives_a_last_line_without_newline_and_strips_crlf() -> None:
    assert lines_of(b"a\r\nb\n\nlast") == ["a", "b", "", "last"]


def test_it_replaces_invalid_utf8() -> None:
    assert lines_of(b"ok \xff\xfe bytes\n") == ["ok \ufffd\ufffd bytes"]


def test_it_cuts_very_long_lines_into_pieces() -> None:
    got = lines_of(b"x" * 2500 + b"\n", max_line_bytes=1000)
    assert [len(p) for p in got] == [1000, 1000, 500]


@pytest.fixture
def client(redis_server: str) -> Iterator[redis.Redis]:
    c = redis.Redis.from_url(redis_server, decode_responses=True)
    c.flushdb()
    yield c


def test_it_ships_in_order_with_cursors_that_only_grow(client: redis.Redis) -> None:
    shipper = LogShipper(client)
    a, b = ReplicaKey(7, "master", 0, "n1"), ReplicaKey(7, "worker", 1, "n2")
    for i in range(1000):
        shipper.put(a if i % 3 else b, "o", f"line {i}")
    assert shipper.flush(10)
    shipper.close()
    entries = [parse_entry(i, f) for i, f in stream_entries(client, 7)]
    lines = [line for e in entries for line in e.lines]
    assert [line.cursor for line in lines] == list(range(1, 1001))
    by_master = [line.text for line in lines if line.role == "master"]
    assert by_master == [f"line {i}" for i in range(1000) if i % 3]
    assert len(entries) < 1000  # batched


def test_it_keeps_lines_while_redis_is_away(client: redis.Redis) -> None:
    broken = redis.Redis.from_url("redis://127.0.0.1:1/0", socket_connect_timeout=0.1)
    shipper = LogShipper(broken, retry_seconds=0.05)
    shipper.put(ReplicaKey(8, "master", 0, "n1"), "o", "kept")
    assert not shipper.flush(0.5)  # not delivered, and not dropped either
    # Point the same shipper at a working Redis: the held line goes out.
    shipper._sink = type(shipper._sink)(client)
    assert shipper.flush(5)
    entry = parse_entry(*stream_entries(client, 8)[0])
    assert [line.text for line in entry.lines] == ["kept"]
