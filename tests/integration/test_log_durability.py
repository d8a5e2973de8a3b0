"""The log path keeps every line through volume and restarts, over real parts: trainers, node
agents, Redis, the log keeper, the ASGI server and websocket clients."""

import asyncio
import json
import signal
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pytest
import redis
import websockets

from tests.conftest import (
    RunningStack,
    frame_lines,
    pytorch_request,
    run_async,
    running_stack,
    signal_file,
    unlimited_image,
    wait_until,
)

pytestmark = pytest.mark.integration

SPOOLING = "spooling log lines"  # what the agent logs when Redis cannot take a line


def numbered(
    name: str, instances: int, lines: int, rate: float = 0.0, hold: tuple[int, Path] | None = None
) -> dict[str, Any]:
    """numbered.py; `hold` = (K, path): every process stops after line K-1 until path exists."""
    args = ["--lines", str(lines)] + (["--rate", str(rate)] if rate else [])
    if hold is not None:
        args += ["--hold-at", str(hold[0]), "--release", str(hold[1])]
    return pytorch_request(name, "numbered.py", instances, args=args)


def check_every_line_in_order(lines: list[dict[str, Any]], instances: int, each: int) -> None:
    """Every process's stdout and stderr arrived whole, in order, once; cursors only grow."""
    cursors = [x["cursor"] for x in lines]
    assert cursors == sorted(set(cursors)), "cursors grow and never repeat"
    seen: dict[tuple[str, str], list[int]] = defaultdict(list)
    for x in lines:
        tag, number = x["text"].split(" ")
        assert tag == (f"{x['role']}-{x['index']}"), "a line keeps its origin"
        seen[(tag, x["stream"])].append(int(number))
    tags = ["master-0"] + [f"worker-{i}" for i in range(1, instances)]
    for tag in tags:
        assert seen[(tag, "stderr")] == [i for i in range(each) if i % 10 == 9], tag
        assert seen[(tag, "stdout")] == [i for i in range(each) if i % 10 != 9], tag
    assert len(lines) == instances * each


def test_a_200k_line_job_is_fully_retrievable_over_http(stack: RunningStack) -> None:
    admin = stack.admin
    request = numbered("chatty", 2, 100_000)
    request["image"] = unlimited_image(stack)  # every line must arrive: no log limit
    job = admin.submit(request)
    finished = admin.wait_finished(job["id"])
    assert finished["state"] == "succeeded", finished["reason"]
    lines = admin.logs(job["id"], limit=10_000)
    check_every_line_in_order(lines, 2, 100_000)
    counts = admin.http.get(f"/api/v1/jobs/{job['id']}/logs/counts").json()
    assert counts["total"] == 200_000
    assert {(r["tag"], r["stdout"], r["stderr"]) for r in counts["replicas"]} == {
        ("master", 90_000, 10_000),
        ("worker-1", 90_000, 10_000),
    }
    with admin.http.stream("GET", f"/api/v1/jobs/{job['id']}/logs.txt") as response:
        text_lines = sum(chunk.count("\n") for chunk in response.iter_text())
    assert text_lines == 200_000 + 1  # and the "log complete" line


# --- restarts: a stack of its own, so the others never see them --------------------------------


@pytest.fixture(scope="module")
def own_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningStack]:
    with running_stack(tmp_path_factory.mktemp("restarts"), nodes=1) as running:
        yield running


def test_a_redis_restart_mid_job_loses_no_line_and_keeps_order(
    own_stack: RunningStack, tmp_path: Path
) -> None:
    admin = own_stack.admin
    release = signal_file()
    job = admin.submit(numbered("through a restart", 2, 4000, rate=400, hold=(500, release)))
    # Both processes printed their first 500 lines and wait: the job is certainly still running.
    wait_until("the 1,000 lines before the hold", lambda: len(admin.logs(job["id"])) == 1000)
    agent_log = own_stack.stack.var_dir / "logs" / "node-1.log"
    spooled_before = agent_log.read_text().count(SPOOLING)

    def outage() -> None:
        # Redis is down; now both processes print their other 3,500 lines each, and the agent
        # must spool them to disk (and send them once Redis is back).
        release.touch()
        wait_until(
            "the agent to spool lines while Redis is down",
            lambda: agent_log.read_text().count(SPOOLING) > spooled_before,
        )

    own_stack.stack.restart("redis", outage)
    finished = admin.wait_finished(job["id"])
    assert finished["state"] == "succeeded", finished["reason"]
    check_every_line_in_order(admin.logs(job["id"]), 2, 4000)


def appendonly_tail(data_dir: Path) -> Path:
    """The file Redis appends its writes to: the incremental part of Redis 7's multi-part AOF,
    or the one file of an older Redis."""
    parts = sorted((data_dir / "appendonlydir").glob("*.incr.aof"))
    return parts[-1] if parts else data_dir / "appendonly.aof"


def test_a_redis_that_comes_back_without_its_last_writes_loses_no_line_and_repeats_none(
    own_stack: RunningStack,
) -> None:
    """Redis killed -9 mid-stream under appendfsync everysec, and it comes back without its
    last writes, as after a crash of its host: lines the database already had and lines only
    Redis had are both gone from it. The agents send again from what the database and Redis
    hold, and the log keeper keeps each line once."""
    stack = own_stack.stack
    admin = own_stack.admin
    broker = redis.Redis.from_url(stack.redis_url, decode_responses=True)
    release = signal_file()
    # Slow enough (15 s to the hold) that each step below comes long before the next line
    # count it waits for, however loaded the machine.
    job = admin.submit(numbered("redis loses writes", 2, 3000, rate=100, hold=(1500, release)))
    seen_key = f"trainyard:{{job:{job['id']}}}:seen"
    acked_key = f"trainyard:{{job:{job['id']}}}:acked"

    def output_marks(key: str) -> dict[str, int]:
        marks = cast(dict[str, str], broker.hgetall(key))
        return {w: int(v) for w, v in marks.items() if w.startswith("f:") and ":output" in w}

    # Redis's state to go back to: some lines of each instance in.
    wait_until("lines of each instance", lambda: len(output_marks(seen_key)) == 2)
    aof = appendonly_tail(stack.var_dir / "redis")
    back_to, seen_then = aof.stat().st_size, output_marks(seen_key)
    # The database gets lines past that state; then the log keeper stops archiving, so Redis
    # alone has the rest of the 3,000 lines before the hold.
    wait_until(
        "the database to have lines past that state",
        lambda: all(output_marks(acked_key).get(w, -1) > seq for w, seq in seen_then.items()),
    )
    stack.kill("log-keeper", signal.SIGSTOP)
    try:
        wait_until("the 3,000 lines before the hold", lambda: len(admin.logs(job["id"])) == 3000)
        before = output_marks(seen_key)
        stack.restart("redis", lambda: aof.write_bytes(aof.read_bytes()[:back_to]), signal.SIGKILL)
        after = output_marks(seen_key)
        assert all(after[w] < before[w] for w in before), "Redis came back without its last writes"
        release.touch()
    finally:
        stack.kill("log-keeper", signal.SIGCONT)
    finished = admin.wait_finished(job["id"])
    assert finished["state"] == "succeeded", finished["reason"]
    wait_until("the keeper to archive the log", lambda: admin.job(job["id"])["log_archived"])
    check_every_line_in_order(admin.logs(job["id"]), 2, 3000)
    agent_log = (stack.var_dir / "logs" / "node-1.log").read_text()
    assert "reading them again" in agent_log, "the agents sent lost lines again from their files"


def test_lines_redis_loses_after_the_replicas_ended_are_sent_again_before_the_log_closes(
    own_stack: RunningStack,
) -> None:
    """Redis killed -9 right after a short job's replicas ended, and back without its last
    writes (the replicas' last lines and the end marker, which the log keeper never got): the
    agent kept the files until the database had their lines, sends the lost ones again, and the
    log is closed only after them."""
    stack = own_stack.stack
    admin = own_stack.admin
    broker = redis.Redis.from_url(stack.redis_url, decode_responses=True)
    release = signal_file()
    job = admin.submit(numbered("redis loses the last lines", 2, 400, hold=(200, release)))
    seen_key = f"trainyard:{{job:{job['id']}}}:seen"
    acked_key = f"trainyard:{{job:{job['id']}}}:acked"
    stream_key = f"trainyard:{{job:{job['id']}}}:log"

    def output_marks(key: str) -> dict[str, int]:
        marks = cast(dict[str, str], broker.hgetall(key))
        return {w: int(v) for w, v in marks.items() if w.startswith("f:") and ":output" in w}

    def ended_in_redis() -> bool:
        last = cast(list[tuple[str, dict[str, str]]], broker.xrevrange(stream_key, count=1))
        return bool(last) and "end" in last[0][1]

    # Both processes wait at the hold, and the database has every line before it.
    wait_until("the 400 lines before the hold", lambda: len(admin.logs(job["id"])) == 400)
    wait_until(
        "the database to have them",
        lambda: (
            len(output_marks(seen_key)) == 2 and output_marks(acked_key) == output_marks(seen_key)
        ),
    )
    aof = appendonly_tail(stack.var_dir / "redis")
    back_to, seen_then = aof.stat().st_size, output_marks(seen_key)
    stack.kill("log-keeper", signal.SIGSTOP)
    try:
        release.touch()
        finished = admin.wait_finished(job["id"])
        assert finished["state"] == "succeeded", finished["reason"]
        wait_until("the end marker in Redis", ended_in_redis)
        before = output_marks(seen_key)
        assert all(before[w] > seen_then[w] for w in seen_then), "the last lines reached Redis"
        stack.restart("redis", lambda: aof.write_bytes(aof.read_bytes()[:back_to]), signal.SIGKILL)
        # Only the frozen keeper could append the marker again.
        assert not ended_in_redis(), "Redis came back without its last writes"
    finally:
        stack.kill("log-keeper", signal.SIGCONT)
    wait_until("the keeper to archive the log", lambda: admin.job(job["id"])["log_archived"])
    check_every_line_in_order(admin.logs(job["id"]), 2, 400)
    agent_log = (stack.var_dir / "logs" / "node-1.log").read_text()
    assert "after the replica ended: reading them again" in agent_log


def test_a_web_server_restart_mid_stream_resumes_the_client_without_gap(
    own_stack: RunningStack,
) -> None:
    admin = own_stack.admin
    job = admin.submit(numbered("watched through a restart", 1, 3000, rate=500))
    url = own_stack.url.replace("http", "ws") + f"/ws/jobs/{job['id']}/"
    headers = {"Authorization": f"Token {admin.token}"}

    async def watch() -> tuple[list[dict[str, Any]], int]:
        lines: list[dict[str, Any]] = []
        cursor, connections, restarted = 0, 0, False
        deadline = time.monotonic() + 180  # hang guard only
        while time.monotonic() < deadline:
            try:
                async with websockets.connect(
                    f"{url}?after={cursor}", additional_headers=headers, max_size=None
                ) as ws:
                    connections += 1
                    async for message in ws:
                        frame = json.loads(message)
                        lines.extend(frame_lines(frame))
                        if frame["type"] in ("log", "end", "heartbeat"):
                            cursor = frame["next"]
                        if frame["type"] == "end":
                            return lines, connections
                        if not restarted and len(lines) >= 300:
                            restarted = True
                            await asyncio.to_thread(own_stack.stack.restart, "web")
            except (OSError, websockets.ConnectionClosed, websockets.InvalidStatus):
                pass
            await asyncio.sleep(0.2)  # the server is coming back; try again from the cursor
        raise AssertionError("the job's log never ended")

    lines, connections = run_async(watch())
    assert connections >= 2, "the restart did cut the connection"
    everything = admin.logs(job["id"])
    assert [x["cursor"] for x in lines] == [x["cursor"] for x in everything]
    check_every_line_in_order(lines, 1, 3000)


def test_the_log_of_a_finished_job_outlives_redis(own_stack: RunningStack) -> None:
    admin = own_stack.admin
    job = admin.submit(numbered("archived", 1, 2000))
    admin.wait_finished(job["id"])
    wait_until("the keeper to archive the log", lambda: admin.job(job["id"])["log_archived"])
    # Redis loses everything (a FLUSHALL, or a restart without its data).
    redis.Redis.from_url(own_stack.stack.redis_url).flushall()
    check_every_line_in_order(admin.logs(job["id"]), 1, 2000)
    page = admin.http.get(
        f"/api/v1/jobs/{job['id']}/logs", params={"after": 0, "stream": "stdout"}
    ).json()
    assert page["lines"][0]["text"] == "master-0 0"  # stdout and stderr come on two pipes
