"""A websocket client that stops reading is closed by the real server with 4408 instead of being
buffered for, and loses nothing when it comes back with ?after=<its cursor>.

Real parts only: a trainer floods lines, the node agent ships them, the ASGI server relays them
to a `websockets` client whose socket takes no more. The server gives up on a send after
TRAINYARD_WS_SEND_TIMEOUT_SECONDS (2 s on this stack of its own, 20 s by default).
"""

import asyncio
import json
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
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

SEND_TIMEOUT_SECONDS = 2
CLOSE_TOO_SLOW = 4408  # jobs.consumers.CLOSE_TOO_SLOW
# Far more than the buffers between the server and a client that reads nothing can hold: the
# server's transport (one frame of up to 100 batches of 1,000 lines, ~5 MB), its kernel send
# buffer (4 MB at most here), the client's small receive buffer and the one frame its
# websocket library queues (another ~5 MB): ~20 MB of lines of ~55 bytes.
FLOOD_LINES = 400_000
# The client's kernel receive buffer: set before connecting, so autotuning does not grow it.
CLIENT_RCVBUF = 16 * 1024


@pytest.fixture(scope="module")
def slow_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningStack]:
    """One node, and a send timeout of 2 s instead of 20 s."""
    env = {"TRAINYARD_WS_SEND_TIMEOUT_SECONDS": str(SEND_TIMEOUT_SECONDS)}
    with running_stack(tmp_path_factory.mktemp("slow-ws"), nodes=1, extra_env=env) as running:
        yield running


def gave_up_on(stack: RunningStack, job_id: int, since: int) -> bool:
    """True once the web server has said, in its log after byte `since`, that it closed the
    job's stream with 4408 (jobs.consumers): it was stuck in a send for longer than its
    timeout. Asked of its log, not of its Redis connections: the viewers of a job share one
    reader (jobs/logfanout.py), which reads on while one of them is stuck."""
    web_log = stack.stack.var_dir / "logs" / "web.log"
    with web_log.open("rb") as text:
        text.seek(since)
        return f"closing the log stream of job {job_id} with {CLOSE_TOO_SLOW}".encode() in (
            text.read()
        )


def line_key(line: dict[str, Any]) -> tuple[Any, ...]:
    return (line["cursor"], line["role"], line["index"], line["node"], line["stream"], line["text"])


def test_a_client_that_stops_reading_is_closed_with_4408_and_resumes_without_gap(
    slow_stack: RunningStack, tmp_path: Path
) -> None:
    admin = slow_stack.admin
    go = signal_file("go")
    request = pytorch_request(
        "flood", "spew.py", 1, args=["--lines", str(FLOOD_LINES), "--go", str(go)]
    )
    request["image"] = unlimited_image(slow_stack)  # every line must arrive: no log limit
    job = admin.submit(request)
    url = slow_stack.url.replace("http", "ws") + f"/ws/jobs/{job['id']}/"
    port = int(slow_stack.url.rsplit(":", 1)[1])
    headers = {"Authorization": f"Token {admin.token}"}
    seen = (slow_stack.stack.var_dir / "logs" / "web.log").stat().st_size

    async def stalled() -> tuple[list[dict[str, Any]], int, int | None, list[str]]:
        """Read until the job waits for go, read nothing while it floods, then read what the
        server had sent before it gave up, up to its close."""
        lines: list[dict[str, Any]] = []
        types: list[str] = []
        cursor = 0
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, CLIENT_RCVBUF)
        sock.connect(("127.0.0.1", port))
        sock.setblocking(False)

        def take(frame: dict[str, Any]) -> None:
            nonlocal cursor
            types.append(frame["type"])
            lines.extend(frame_lines(frame))
            if frame["type"] in ("log", "heartbeat", "gap", "end"):
                cursor = frame["next"]

        async with websockets.connect(
            f"{url}?after=0",
            sock=sock,
            additional_headers=headers,
            max_size=None,
            max_queue=1,  # the library stops reading the socket while a frame waits
            ping_interval=None,  # a ping of ours would wait behind the data and time out
            compression=None,
        ) as ws:
            while not any(line["text"] == "waiting for go" for line in lines):
                take(json.loads(await ws.recv()))
            go.touch()
            await asyncio.to_thread(
                wait_until,
                f"the server to give up after a send stuck for {SEND_TIMEOUT_SECONDS} s",
                lambda: gave_up_on(slow_stack, job["id"], seen),
            )
            code = None
            try:
                while True:
                    take(json.loads(await ws.recv()))
            except websockets.ConnectionClosed as closed:
                code = closed.rcvd.code if closed.rcvd else None
        return lines, cursor, code, types

    first, cursor, code, first_types = run_async(stalled())
    assert code == CLOSE_TOO_SLOW
    assert "end" not in first_types and "gap" not in first_types
    assert first and cursor == first[-1]["cursor"]

    async def resumed() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        frames: list[dict[str, Any]] = []
        async with websockets.connect(
            f"{url}?after={cursor}", additional_headers=headers, max_size=None
        ) as ws:
            while not frames or frames[-1]["type"] != "end":
                frames.append(json.loads(await ws.recv()))
        return [x for f in frames for x in frame_lines(f)], frames

    second, frames = run_async(resumed())
    assert [f["type"] for f in frames if f["type"] not in ("log", "state", "heartbeat")] == ["end"]
    # Every line after the cursor, once, in order: no gap, no duplicate.
    cursors = [x["cursor"] for x in second]
    assert cursors == list(range(cursor + 1, cursor + 1 + len(second)))

    finished = admin.wait_finished(job["id"])
    assert finished["state"] == "succeeded", finished["reason"]
    everything = admin.logs(job["id"], limit=10_000)
    assert [line_key(x) for x in first + second] == [line_key(x) for x in everything]
    texts = [x["text"] for x in everything]
    assert len(texts) == FLOOD_LINES + 2
    assert texts[0] == "waiting for go"
    assert texts[1] == "spew 00000 loss=0.000 lr=1e-3 samples/s=12345"
    assert texts[-2] == f"spew {FLOOD_LINES - 1:05d} loss=0.{(FLOOD_LINES - 1) % 997:03d} " + (
        "lr=1e-3 samples/s=12345"
    )
    assert texts[-1] == "spew done"
    assert frames[-1]["next"] == everything[-1]["cursor"] + 1  # the end marker's own cursor
