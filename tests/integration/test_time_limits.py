"""A job past its time limit, over the real stack: the console worker's reconciliation stops
its trainers (SIGTERM, then SIGKILL after the grace) and fails it with the reason."""

from datetime import datetime, timedelta

import pytest

from tests.conftest import RunningStack, pytorch_request, signal_file

pytestmark = pytest.mark.integration


def test_a_job_that_runs_past_its_time_limit_is_stopped_and_fails_saying_so(
    stack: RunningStack,
) -> None:
    user = stack.create_user(
        "time-limit-runner",
        "time-limit-password",
        quota={"cpu": 4, "gpus": 0, "memory_gb": 16, "running_jobs": 2},
    )
    release = signal_file()  # never created while the test holds: it would run on for ever
    try:
        job = user.submit(
            {
                **pytorch_request("overruns", "hold.py", 2, args=["--release", str(release)]),
                "time_limit": "15s",
            }
        )
        assert job["time_limit"] == 15
        finished = user.wait_finished(job["id"])
    finally:
        release.touch()  # should the limit not be enforced, the job still ends
    assert (finished["state"], finished["reason"]) == ("failed", "time limit of 15 s reached")
    assert finished["attempts"][0]["reason"] == "time limit of 15 s reached"
    assert finished["restarts_used"] == 0
    assert {r["state"] for r in finished["replicas"]} == {"stopped"}
    ran = datetime.fromisoformat(finished["finished"]) - datetime.fromisoformat(job["created"])
    assert ran >= timedelta(seconds=15)  # counted from placement, which came after submission
