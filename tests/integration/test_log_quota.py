"""Log limits over the real stack: a job that floods its log loses what is over its limit, says
so in the log and in its counters (API and page), Redis stays small while it floods, and another
user's job on the same node keeps every line."""

import re
import threading
from typing import Any

import redis

from tests.conftest import RunningStack, page_for, pytorch_request, signal_file, wait_until

SPEW_LINES = 200_000  # per instance, as fast as it can
QUIET_LINES = 3000  # per instance, at 500 lines/s: well within the default limits
LIMIT = 200  # lines/s per instance the flooding job asks for


def test_a_flooding_job_is_held_to_its_limit_and_its_neighbour_keeps_every_line(
    stack: RunningStack,
) -> None:
    quota = {"cpu": 8, "gpus": 0, "memory_gb": 32, "running_jobs": 2}
    bob = stack.create_user("lq-bob", "lq-bob-password", quota)
    alice = stack.create_user("lq-alice", "lq-alice-password", quota)
    go = signal_file("flood")
    flood_request = pytorch_request(
        "flood", "spew.py", 2, args=["--lines", str(SPEW_LINES), "--go", str(go)]
    )
    flood_request["log_limits"] = {"lines_per_second": LIMIT, "max_mb": 5}
    flood = bob.submit(flood_request)
    quiet_args = ["--lines", str(QUIET_LINES), "--rate", "500", "--hold-at", "0"]
    quiet = alice.submit(
        pytorch_request("quiet", "numbered.py", 2, args=[*quiet_args, "--release", str(go)])
    )
    for client, job in ((bob, flood), (alice, quiet)):
        client.wait(job["id"], lambda j: j["state"] == "running")
    nodes = {r["node"] for r in bob.job(flood["id"])["replicas"]}
    assert nodes & {r["node"] for r in alice.job(quiet["id"])["replicas"]}  # neighbours
    wait_until(
        "the flood to wait for go",
        lambda: len(bob.logs(flood["id"], q="waiting for go")) == 2,
    )

    # While it floods, read how big Redis and the flooding job's stream are.
    server = redis.Redis.from_url(stack.stack.redis_url, decode_responses=True)
    cap = int(str(server.config_get("maxmemory")["maxmemory"]))
    assert cap > 0 and server.config_get("maxmemory-policy")["maxmemory-policy"] == "noeviction"
    stream = f"trainyard:{{job:{flood['id']}}}:log"
    samples: list[tuple[int, int]] = []
    done = threading.Event()

    def sample() -> None:
        while not done.wait(0.05):
            samples.append((int(server.info("memory")["used_memory"]), int(server.xlen(stream))))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    go.touch()
    try:
        finished = bob.wait_finished(flood["id"])
        alice.wait_finished(quiet["id"])
    finally:
        done.set()
        sampler.join()
    assert finished["state"] == "succeeded", finished

    # Redis never came near its cap, and the stream held a few hundred entries at most.
    assert samples and max(memory for memory, _ in samples) < cap
    assert max(length for _, length in samples) < 1000

    # Every line of the flood is either in the log or counted as dropped: none is lost quietly.
    # The counter is the keeper's sum of the markers it has archived: read once the whole log
    # is in (`logs` pages until "complete"), not the moment the job ends.
    lines = bob.logs(flood["id"])
    printed = [line for line in lines if line["stream"] == "stdout"]
    dropped = bob.job(flood["id"])["log_dropped"]["lines"]
    assert dropped > 0
    assert len(printed) + dropped == 2 * (SPEW_LINES + 2)  # with "waiting for go", "spew done"
    # Each instance had a few seconds of burst and the rate after: far fewer lines than printed.
    assert len(printed) < SPEW_LINES / 10
    markers = [line["text"] for line in lines if line["text"].startswith("[trainyard]")]
    told = [re.match(r"\[trainyard\] ([\d,]+) lines dropped: (.*)", text) for text in markers]
    assert all(told), markers
    assert {m.group(2) for m in told if m} == {f"over the job's log limit of {LIMIT} lines/s"}
    assert sum(int(m.group(1).replace(",", "")) for m in told if m) == dropped
    assert {line["role"] for line in lines if line["text"] in markers} == {"master", "worker"}

    # The neighbour's job got every line from both of its instances, in order within each
    # stream (numbered.py prints every tenth line on stderr).
    got = alice.logs(quiet["id"])
    for tag in ("master-0", "worker-1"):
        for stream in ("stdout", "stderr"):
            on_stderr = stream == "stderr"
            wanted = [f"{tag} {i}" for i in range(QUIET_LINES) if (i % 10 == 9) == on_stderr]
            mine = [
                line["text"]
                for line in got
                if line["text"].startswith(f"{tag} ") and line["stream"] == stream
            ]
            assert mine == wanted
    assert alice.job(quiet["id"])["log_dropped"] == {"lines": 0, "metric_points": 0}

    # The job page shows the counter too.
    page = page_for(stack, "lq-bob", "lq-bob-password", f"/jobs/{flood['id']}/")
    assert f"{dropped:,} lines and 0 metric points dropped" in page
    expect_limits = f"{LIMIT} lines/s and 500 metric points/s per instance, 5 MB in all"
    assert expect_limits in page


def test_a_job_may_not_ask_for_more_than_its_image_allows(stack: RunningStack) -> None:
    request: dict[str, Any] = pytorch_request("greedy", "numbered.py", 1, args=["--lines", "1"])
    request["log_limits"] = {"max_mb": 10**9}
    answer = stack.admin.http.post("/api/v1/jobs", json=request)
    assert answer.status_code == 400
    assert "log_limits.max_mb" in answer.json()["errors"]
