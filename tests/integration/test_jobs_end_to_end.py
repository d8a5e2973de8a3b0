"""The whole path over real parts: HTTP API -> quota -> placement -> Celery -> node agents ->
torch.distributed processes -> Redis streams -> HTTP and websocket clients."""

import asyncio
import json
import re
import time
from typing import Any

import psutil
import pytest
import websockets

from tests.conftest import (
    RunningStack,
    StackClient,
    frame_lines,
    job_processes,
    pytorch_request,
    run_async,
    wait_until,
)

pytestmark = pytest.mark.integration

ACCURACY = re.compile(r"final eval_accuracy=([0-9.]+)")


def final_accuracy(lines: list[dict[str, Any]]) -> float:
    found = [ACCURACY.search(x["text"]) for x in lines if x["role"] == "master"]
    values = [float(m.group(1)) for m in found if m]
    assert len(values) == 1, "the master prints its final accuracy exactly once"
    return values[0]


@pytest.fixture(scope="module")
def digits_runs(stack: RunningStack) -> dict[int, dict[str, Any]]:
    """A 3-instance and a 1-instance digits job, run side by side."""
    admin = stack.admin
    started = time.monotonic()
    jobs = {n: admin.submit(pytorch_request(f"digits x{n}", "digits-ddp", n)) for n in (3, 1)}
    results = {}
    for n, job in jobs.items():
        finished = admin.wait_finished(job["id"])
        results[n] = {"job": finished, "lines": admin.logs(job["id"])}
    print(f"\ndigits x3 and x1 side by side: {time.monotonic() - started:.1f} s wall time")
    return results


def test_a_3_instance_digits_job_succeeds_on_two_nodes(digits_runs: dict[int, Any]) -> None:
    job = digits_runs[3]["job"]
    assert job["state"] == "succeeded", job["reason"]
    assert [(r["tag"], r["state"], r["exit_code"]) for r in job["replicas"]] == [
        ("master", "succeeded", 0),
        ("worker-1", "succeeded", 0),
        ("worker-2", "succeeded", 0),
    ]
    assert {r["node"] for r in job["replicas"]} <= {"node-1", "node-2"}


def test_every_instance_logs_and_every_line_keeps_its_origin(digits_runs: dict[int, Any]) -> None:
    lines = digits_runs[3]["lines"]
    nodes = {r["tag"]: r["node"] for r in digits_runs[3]["job"]["replicas"]}
    tags = {("master" if x["role"] == "master" else f"worker-{x['index']}") for x in lines}
    assert tags == {"master", "worker-1", "worker-2"}
    for x in lines:
        tag = "master" if x["role"] == "master" else f"worker-{x['index']}"
        assert x["node"] == nodes[tag] and x["stream"] in {"stdout", "stderr"}
    cursors = [x["cursor"] for x in lines]
    assert cursors == sorted(set(cursors)), "cursors only grow and never repeat"
    epochs = [x for x in lines if x["role"] == "master" and x["text"].startswith("epoch=")]
    assert epochs and all(
        re.search(r"loss=\S+ lr=\S+ samples_per_sec=\S+ eval_accuracy=\S+", x["text"])
        for x in epochs
    )


def test_three_instances_reach_the_accuracy_of_one(digits_runs: dict[int, Any]) -> None:
    assert digits_runs[1]["job"]["state"] == "succeeded"
    three, one = final_accuracy(digits_runs[3]["lines"]), final_accuracy(digits_runs[1]["lines"])
    print(f"\neval accuracy: 1 instance {one:.4f}, 3 instances {three:.4f}")
    assert one >= 0.95
    assert three >= one - 0.02


def test_a_failing_script_fails_the_job_with_its_exit_code_and_stderr(
    stack: RunningStack,
) -> None:
    job = stack.admin.submit(pytorch_request("fails", "fail.py", 2))
    job = stack.admin.wait_finished(job["id"])
    assert job["state"] == "failed"
    assert "exited with code 3" in job["reason"]
    assert "RuntimeError: simulated failure in step 3" in job["reason"]
    assert {r["state"] for r in job["replicas"]} <= {"failed", "stopped"}


def test_every_instance_of_a_job_with_a_bad_argument_names_the_argument(
    stack: RunningStack,
) -> None:
    """All three instances fail of the same argparse error at about the same moment: the first
    to be heard from fails the job, and the others, whether they ended before the stop came or
    of its SIGTERM while exiting, still name their own error, not only the first's failure."""
    job = stack.admin.submit(
        pytorch_request("bad-arg", "numbered.py", 3, args=["--lines", "3", "--steps", "5"])
    )
    job = stack.admin.wait_finished(job["id"])
    assert job["state"] == "failed"
    assert "numbered.py: error: unrecognized arguments: --steps 5" in job["reason"], job["reason"]
    lines = stack.admin.logs(job["id"])
    for replica in job["replicas"]:
        said = [
            x["text"]
            for x in lines
            if (x["role"], x["index"]) == (replica["role"], replica["index"])
            and "error: unrecognized arguments" in x["text"]
        ]
        if replica["state"] == "failed" or said:
            # It printed the error before it ended, whoever's failure came first.
            assert "error: unrecognized arguments: --steps 5" in replica["reason"], replica
        if replica["state"] == "stopped" and said:
            assert "; its own stderr ended with: numbered.py: error:" in replica["reason"]
    assert any(r["state"] == "failed" for r in job["replicas"])


def test_cancel_leaves_no_process_behind(stack: RunningStack) -> None:
    admin = stack.admin
    job = admin.submit(pytorch_request("sleeps", "sleep_tree.py", 3))
    admin.wait(job["id"], lambda j: j["state"] == "running")

    def sleepers() -> list[psutil.Process] | None:
        printed = [x for x in admin.logs(job["id"]) if "child=" in x["text"]]
        found = [p for p in job_processes(job["id"]) if "time.sleep" in " ".join(p.cmdline())]
        return found if len(printed) == 3 and len(found) == 3 else None

    children = wait_until("the 3 processes to start their 3 children", sleepers)
    trainers = [p for p in job_processes(job["id"]) if "sleep_tree.py" in " ".join(p.cmdline())]
    assert trainers and all(p.is_running() for p in children)
    response = admin.http.post(f"/api/v1/jobs/{job['id']}/cancel")
    assert response.status_code == 200 and response.json()["state"] == "cancelled"
    job = admin.wait_finished(job["id"])
    assert {r["state"] for r in job["replicas"]} == {"stopped"}
    assert not job_processes(job["id"])


def test_lines_written_in_pieces_by_several_ranks_never_glue(stack: RunningStack) -> None:
    job = stack.admin.submit(pytorch_request("markup", "markup.py", 3))
    stack.admin.wait_finished(job["id"])
    lines = stack.admin.logs(job["id"])
    assert len(lines) == 3 * 21
    pattern = re.compile(
        r"rank (\d) (line \d+ <b>not bold</b> <script>window.pwned=1</script>|done)"
    )
    for x in lines:
        match = pattern.fullmatch(x["text"])
        assert match, x["text"]
        assert int(match.group(1)) == (0 if x["role"] == "master" else x["index"])


def test_other_users_see_neither_the_job_nor_its_stream(stack: RunningStack) -> None:
    job = stack.admin.submit(pytorch_request("private", "markup.py", 1))
    mallory = stack.create_user("mallory", "mallory-password-1")
    assert mallory.http.get(f"/api/v1/jobs/{job['id']}").status_code == 404
    assert mallory.http.get(f"/api/v1/jobs/{job['id']}/logs").status_code == 404
    assert mallory.http.post(f"/api/v1/jobs/{job['id']}/cancel").status_code == 404
    assert all(j["id"] != job["id"] for j in mallory.http.get("/api/v1/jobs").json()["jobs"])

    async def try_socket() -> int | None:
        url = stack.url.replace("http", "ws") + f"/ws/jobs/{job['id']}/"
        async with websockets.connect(
            url, additional_headers={"Authorization": f"Token {mallory.token}"}
        ) as ws:
            try:
                await asyncio.wait_for(ws.recv(), 10)
            except websockets.ConnectionClosed as closed:
                return closed.rcvd.code if closed.rcvd else None
        return None

    try:
        code = run_async(try_socket())
    except websockets.InvalidStatus as refused:
        code = refused.response.status_code
    assert code in (4404, 403)
    stack.admin.wait_finished(job["id"])


async def _read(ws: Any, frames: list[dict[str, Any]], stop_after_lines: int | None) -> None:
    lines = 0
    while True:
        frame = json.loads(await asyncio.wait_for(ws.recv(), 120))
        frames.append(frame)
        if frame["type"] == "log":
            lines += len(frame_lines(frame))
            if stop_after_lines is not None and lines >= stop_after_lines:
                return
        if frame["type"] == "end":
            return


def test_websocket_reconnect_with_after_has_no_gap_and_no_duplicate(
    stack: RunningStack,
) -> None:
    admin: StackClient = stack.admin
    job = admin.submit(pytorch_request("resume", "digits-ddp", 2, args=["--epochs", "12"]))
    url = stack.url.replace("http", "ws") + f"/ws/jobs/{job['id']}/"
    headers = {"Authorization": f"Token {admin.token}"}

    async def session() -> list[dict[str, Any]]:
        frames: list[dict[str, Any]] = []
        async with websockets.connect(f"{url}?after=0", additional_headers=headers) as ws:
            await _read(ws, frames, stop_after_lines=3)
        cursor = max(x["cursor"] for f in frames for x in frame_lines(f))
        # Away until the job has printed more (a condition, not a pause of some length).
        await asyncio.to_thread(
            wait_until,
            "lines printed while the client was away",
            lambda: any(x["cursor"] > cursor for x in admin.logs(job["id"])),
        )
        async with websockets.connect(f"{url}?after={cursor}", additional_headers=headers) as ws:
            await _read(ws, frames, stop_after_lines=None)
        return frames

    frames = run_async(session())
    assert frames[-1]["type"] == "end" and "succeeded" in frames[-1]["reason"]
    received = [x["cursor"] for f in frames for x in frame_lines(f)]
    everything = [x["cursor"] for x in admin.logs(job["id"])]
    assert len(received) == len(set(received)), "no line twice"
    assert received == everything, "no line missing, in order"
    # Metric points share the cursor sequence: lines and points together leave no hole.
    points = [p["cursor"] for f in frames if f["type"] == "metric" for p in f["points"]]
    assert sorted(received + points) == list(range(1, len(received) + len(points) + 1))
