"""Training metrics over real parts: trainers report through the metrics channel or print lines
that regex definitions read, agents sample the process trees, the keeper archives, and the
console computes speedup, efficiency, cost and the curve verdict."""

import re
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import RunningStack, StackClient, pytorch_request, signal_file, wait_until

pytestmark = pytest.mark.integration


def archived(client: StackClient, job_id: int) -> dict[str, Any]:
    client.wait(job_id, lambda j: j["state"] == "succeeded" and j["log_archived"])
    return client.job(job_id)


@pytest.fixture(scope="module")
def digits_one_and_two(stack: RunningStack) -> dict[int, dict[str, Any]]:
    """digits-ddp on 1 and on 2 workers, and on 1 again, one after the other so they never
    share the cores."""
    admin = stack.admin
    runs = {}
    for key, workers in ((1, 1), (2, 2), (0, 1)):
        job = admin.submit(pytorch_request(f"digits on {workers}", "digits-ddp", workers))
        runs[key] = archived(admin, job["id"])
    return runs


def test_a_2_trainer_run_shows_speedup_and_efficiency_against_its_1_trainer_baseline(
    stack: RunningStack, digits_one_and_two: dict[int, dict[str, Any]]
) -> None:
    admin = stack.admin
    one, two = digits_one_and_two[1]["id"], digits_one_and_two[2]["id"]
    response = admin.http.post(f"/api/v1/jobs/{two}/baseline", json={"baseline": one})
    assert response.status_code == 200, response.text
    summary = response.json()
    tp = summary["throughput"]
    assert tp["workers_reporting"] == 2 and tp["global_sps"] > 0
    speed = summary["baseline"]["speedup"]
    base_sps = speed["baseline_sps"]
    assert speed["speedup"] == pytest.approx(tp["per_worker_sps"] / base_sps)
    assert speed["global_speedup"] == pytest.approx(tp["global_sps"] / base_sps)
    assert speed["efficiency"] == pytest.approx(speed["global_speedup"] / 2)
    verdict = summary["baseline"]["verdict"]
    assert verdict["axis"] == "epoch" and verdict["final_eval_accuracy"] > 0.9
    # Both end at the same accuracy; per epoch, 2 trainers take half the steps (a global batch
    # twice as large), so their loss curve runs above the baseline's early on. That is by
    # design: the verdict judges the final accuracy, times both runs to it, and shows the loss
    # distance without judging it.
    accuracy_reason, time_reason, loss_reason = verdict["reasons"]
    assert "within" in accuracy_reason, verdict["reasons"]
    assert verdict["matches"] is True and verdict["curves_judged"] is False
    assert "differ by design" in verdict["note"] and "1 trainer" in verdict["note"]
    target = verdict["target_eval_accuracy"]
    assert target == pytest.approx(verdict["baseline_eval_accuracy"] - 0.01)
    assert verdict["seconds_to_target"] > 0 and verdict["baseline_seconds_to_target"] > 0
    assert time_reason.startswith(f"reached eval accuracy {target:.4f} in "), time_reason
    early_two, early_one = (early_loss(admin, job) for job in (two, one))
    assert early_two > early_one, (early_two, early_one)
    distance = verdict["loss_distance"]
    assert distance > 0
    said = re.fullmatch(
        r"loss curves (\d+\.\d)% apart by epoch \(not judged: see the note\)", loss_reason
    )
    assert said, loss_reason
    assert float(said.group(1)) == pytest.approx(distance * 100, abs=0.051)
    assert summary["cost_so_far"] > 0 and summary["samples_per_dollar"] > 0
    assert summary["progress"]["fraction"] == pytest.approx(1.0)
    print(
        f"\ndigits-ddp: 1 worker {base_sps:.0f} samples/s; 2 workers {tp['global_sps']:.0f} "
        f"samples/s global, {tp['per_worker_sps']:.0f} per worker; speedup "
        f"{speed['speedup']:.2f}, global {speed['global_speedup']:.2f}x, efficiency "
        f"{speed['efficiency']:.0%}; verdict: {'; '.join(verdict['reasons'])}"
    )


def early_loss(client: StackClient, job_id: int) -> float:
    """The mean of the loss a run reported during its first epoch, over every process."""
    points = client.http.get(f"/api/v1/jobs/{job_id}/metrics?name=loss").json()["points"]
    early = [p["value"] for p in points if p.get("epoch") is not None and p["epoch"] <= 1.0]
    assert early, points[:5]
    return sum(early) / len(early)


def test_a_rerun_of_the_same_program_matches_its_baseline_curves(
    stack: RunningStack, digits_one_and_two: dict[int, dict[str, Any]]
) -> None:
    one, again = digits_one_and_two[1]["id"], digits_one_and_two[0]["id"]
    summary = stack.admin.http.post(f"/api/v1/jobs/{again}/baseline", json={"baseline": one})
    verdict = summary.json()["baseline"]["verdict"]
    assert verdict["matches"] is True, verdict["reasons"]
    print(f"\nrerun vs baseline: {'; '.join(verdict['reasons'])}")


def test_every_instance_reports_training_and_system_metrics(
    stack: RunningStack, digits_one_and_two: dict[int, dict[str, Any]]
) -> None:
    job_id = digits_one_and_two[2]["id"]
    points = stack.admin.http.get(f"/api/v1/jobs/{job_id}/metrics").json()["points"]
    names: dict[str, set[str]] = {}
    for p in points:
        tag = p["role"] if p["role"] == "master" else f"{p['role']}-{p['index']}"
        names.setdefault(p["name"], set()).add(tag)
    assert names["samples_per_sec"] == {"master", "worker-1"}
    assert names["loss"] == {"master", "worker-1"} and "lr" in names
    assert names["eval_accuracy"] == {"master"}
    assert {"total_steps", "total_epochs"} <= set(names)
    assert "gpu_util_percent" not in names  # no GPU: no GPU points, never zeros
    csv_text = stack.admin.http.get(f"/api/v1/jobs/{job_id}/metrics.csv").text
    assert csv_text.count("\n") == len(points) + 1


def test_the_agent_samples_cpu_and_memory_of_a_running_instance(
    stack: RunningStack, tmp_path: Path
) -> None:
    admin = stack.admin
    stop = signal_file("stop")
    job = admin.submit(pytorch_request("sampled", "ticker.py", 1, args=["--stop", str(stop)]))

    def sampled() -> list[dict[str, Any]] | None:
        points = admin.http.get(f"/api/v1/jobs/{job['id']}/metrics").json()["points"]
        return points if {"cpu_percent", "memory_mb"} <= {p["name"] for p in points} else None

    try:
        # Held open by the test until the agent has sampled it: however slow the machine.
        points = wait_until("the agent's CPU and memory samples of the running job", sampled)
        assert admin.job(job["id"])["state"] == "running"
    finally:
        stop.touch()
    assert admin.wait_finished(job["id"])["state"] == "succeeded"
    memory = [p["value"] for p in points if p["name"] == "memory_mb"]
    assert all(m > 1 for m in memory)  # the process tree's resident memory, in MB
    cpu = [p["value"] for p in points if p["name"] == "cpu_percent"]
    assert all(c >= 0 for c in cpu)


def test_regex_definitions_chart_a_script_that_only_prints(stack: RunningStack) -> None:
    admin = stack.admin
    request = pytorch_request("printed", "numbered.py", 1, args=["--lines", "50"])
    request["metrics"] = [{"name": "line_no", "regex": r"^master-0 (?P<value>(?P<step>\d+))$"}]
    job = admin.submit(request)
    admin.wait_finished(job["id"])
    points = admin.http.get(f"/api/v1/jobs/{job['id']}/metrics?name=line_no").json()["points"]
    # numbered.py prints every tenth line on stderr; definitions read both streams (whose
    # lines arrive on separate pipes, so in no fixed order between the two).
    assert sorted((p["step"], p["value"]) for p in points) == [(i, float(i)) for i in range(50)]
