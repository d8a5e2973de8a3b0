"""Issue 23, item 1: a job's regexes cannot hurt another user's job.

On the real stack, a job whose metric regex and log-pattern rule are `(a+)+$` (which Python's re
took 2**30 steps on a line "a"*30 + "b": the node's heartbeat stopped for 77 s and the log
keeper for 73 s) runs beside another user's jobs on the same node. The node stays live, the
other user's job succeeds, and their own stop rule fires. Patterns that are costly even for RE2
are switched off on the hostile job alone, and its page says why."""

import threading
import uuid
from datetime import datetime
from typing import Any

import pytest

from tests.conftest import RunningStack, StackClient, pytorch_request, signal_file, wait_until

pytestmark = pytest.mark.integration

BACKTRACKING = "(a+)+$"
# Linear on RE2, but tens of milliseconds a 16,000-character line (workers/userregex.py).
COSTLY = "((?:(?:a|b){0,30}){0,30})x"
QUOTA = {"cpu": 4, "gpus": 0, "memory_gb": 16, "running_jobs": 4}


def texts(client: StackClient, job_id: int) -> list[str]:
    return [line["text"] for line in client.logs(job_id)]


class HeartbeatWatcher(threading.Thread):
    """Polls the nodes page and keeps the longest gap between two heartbeats of `node` it saw:
    a figure for the report, not an assertion (the console's own verdict, "lost", is)."""

    def __init__(self, admin: StackClient, node: str) -> None:
        super().__init__(daemon=True)
        self.admin, self.node = admin, node
        self.stop = threading.Event()
        self.longest_gap = 0.0
        self.seen: list[datetime] = []

    def run(self) -> None:
        while not self.stop.wait(0.5):
            nodes = self.admin.http.get("/api/v1/nodes").json()["nodes"]
            (row,) = [n for n in nodes if n["name"] == self.node]
            if row["last_heartbeat"]:
                beat = datetime.fromisoformat(row["last_heartbeat"])
                if self.seen and beat > self.seen[-1]:
                    gap = (beat - self.seen[-1]).total_seconds()
                    self.longest_gap = max(self.longest_gap, gap)
                if not self.seen or beat > self.seen[-1]:
                    self.seen.append(beat)


def test_a_runaway_regex_hurts_no_other_users_job(stack: RunningStack) -> None:
    suffix = uuid.uuid4().hex[:8]
    mallory = stack.create_user(f"mallory-{suffix}", f"pw-{suffix}-m", QUOTA)
    victor = stack.create_user(f"victor-{suffix}", f"pw-{suffix}-v", QUOTA)
    admin = stack.admin
    hostile_release, victim_release = signal_file("hostile"), signal_file("victim")
    bait = ["--backtracking", "200", "--costly", "60", "--release", str(hostile_release)]
    hostile = mallory.submit(
        {
            **pytorch_request("runaway regex", "regex_bait.py", 1, args=bait),
            "metrics": [
                {"name": "backtracking", "regex": BACKTRACKING},
                {"name": "costly", "regex": COSTLY},
            ],
            "health_rules": [
                {"kind": "log-pattern", "pattern": BACKTRACKING, "action": "warn"},
                {"kind": "log-pattern", "pattern": COSTLY, "action": "warn", "name": "costly"},
            ],
        }
    )
    running = mallory.wait(hostile["id"], lambda j: j["state"] == "running")
    (node,) = {r["node"] for r in running["replicas"]}
    # Only the nodes that take work: another test's node, retired (drained) and gone, must not
    # be returned to service at the end.
    ready = [
        n["name"] for n in admin.http.get("/api/v1/nodes").json()["nodes"] if n["status"] == "ready"
    ]
    drained = [n for n in ready if n != node]
    watcher = HeartbeatWatcher(admin, node)
    watcher.start()
    try:
        for name in drained:  # the other user's jobs go where the hostile one runs
            assert admin.http.post(f"/api/v1/nodes/{name}/drain").status_code == 200
        bystander = victor.submit(
            pytorch_request(
                "bystander", "regex_bait.py", 1, args=["--release", str(victim_release)]
            )
        )
        wait_until("the bait is laid", lambda: "bait laid" in texts(mallory, hostile["id"]))
        guarded = victor.submit(
            {
                **pytorch_request("guarded", "oom.py", 1),
                "health_rules": [
                    {"kind": "log-pattern", "pattern": "CUDA out of memory", "action": "stop"}
                ],
            }
        )
        # The other user's stop rule fires (the keeper is not stuck on the hostile job).
        stopped = victor.wait_finished(guarded["id"])
        (event,) = stopped["health_events"]
        assert event["action"] == "stop" and stopped["state"] == "failed"
        assert "health rule" in stopped["reason"] and "lost" not in stopped["reason"]
        assert {r["node"] for r in stopped["replicas"]} == {node}
        oom_line = next(x for x in victor.logs(guarded["id"]) if "CUDA out of" in x["text"])
        delay = datetime.fromisoformat(event["at"]).timestamp() - oom_line["ts"]

        # The costly patterns are switched off on the hostile job, which says why.
        def switched_off() -> Any:
            job = mallory.job(hostile["id"])
            events = [e for e in job["health_events"] if e["action"] == "switched-off"]
            lines = [t for t in texts(mallory, hostile["id"]) if "switched off" in t]
            return (events, lines) if events and lines else None

        events, lines = wait_until("the costly patterns switched off", switched_off)
        assert [e["rule"] for e in events] == ["costly"]
        assert "over the job's budget" in events[0]["message"]
        assert any(t.startswith("[trainyard] metric 'costly' switched off") for t in lines)

        victim_release.touch()
        finished = victor.wait_finished(bystander["id"])
        assert finished["state"] == "succeeded", finished["reason"]
        assert {r["node"] for r in finished["replicas"]} == {node}
        hostile_release.touch()
        done = mallory.wait_finished(hostile["id"])
        assert done["state"] == "succeeded", done["reason"]
        (row,) = [n for n in admin.http.get("/api/v1/nodes").json()["nodes"] if n["name"] == node]
        assert row["status"] == "ready", row
    finally:
        victim_release.touch()
        hostile_release.touch()
        for name in drained:
            admin.http.post(f"/api/v1/nodes/{name}/ready")
        watcher.stop.set()
        watcher.join()
    print(
        f"\nFIGURES runaway regex: longest heartbeat gap of {node} seen: "
        f"{watcher.longest_gap:.1f} s over {len(watcher.seen)} heartbeats; the other user's "
        f"stop rule fired {delay:.2f} s after its line was printed"
    )
