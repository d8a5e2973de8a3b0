"""A client following a job's log that goes away (`trainyard logs -f` at the log's end, a closed
tab) is normal: the web server's log holds no ERROR and no traceback for it.

Real parts: the shared stack's web server (uvicorn) and the `trainyard` command, which closes
its websocket as soon as it reads the end of the log, while the server is closing it too.
"""

import asyncio
import json
import subprocess
from pathlib import Path

import pytest
import redis
import websockets

from tests.conftest import RunningStack, pytorch_request, run_async, signal_file, wait_until
from tests.integration.test_cli import TRAINYARD, cli_env, logged_in

pytestmark = pytest.mark.integration


def followers_of(stack: RunningStack, job_id: int) -> int:
    """How many of the web server's log followers read this job's stream now (each names its
    Redis connection after the job: jobs.consumers)."""
    client = redis.Redis.from_url(stack.stack.redis_url, decode_responses=True)
    try:
        return sum(c["name"] == f"log-follower-job-{job_id}" for c in client.client_list())
    finally:
        client.close()


def test_followers_that_go_away_leave_no_error_in_the_web_log(
    stack: RunningStack, tmp_path: Path
) -> None:
    user = logged_in(stack, "follows-and-leaves", tmp_path)
    stop = signal_file("stop")
    job = user.submit(
        pytorch_request("followed", "ticker.py", 1, args=["--stop", str(stop), "--every", "0.005"])
    )
    web_log = stack.stack.var_dir / "logs" / "web.log"
    seen = web_log.stat().st_size
    url = stack.url.replace("http", "ws") + f"/ws/jobs/{job['id']}/?after=0"

    async def leave_while_lines_come() -> None:
        frames = 0
        async with websockets.connect(
            url, additional_headers={"Authorization": f"Token {user.token}"}
        ) as ws:
            while frames < 3:
                frames += json.loads(await asyncio.wait_for(ws.recv(), 120))["type"] == "log"

    try:
        for _ in range(3):
            run_async(leave_while_lines_come())
            wait_until("the follower to end", lambda: followers_of(stack, job["id"]) == 0)
    finally:
        stop.touch()
    user.wait_finished(job["id"])
    for _ in range(3):
        follow = subprocess.run(
            [str(TRAINYARD), "logs", str(job["id"]), "-f"],
            env=cli_env(tmp_path),
            capture_output=True,
            text=True,
            check=False,
            timeout=600,  # a hang guard only
        )
        assert follow.returncode == 0 and "stopped" in follow.stdout, follow.stderr
        wait_until("the follower to end", lambda: followers_of(stack, job["id"]) == 0)
    with web_log.open(errors="replace") as text:
        text.seek(seen)
        written = text.read()
    assert " ERROR " not in written and "Traceback" not in written, written
