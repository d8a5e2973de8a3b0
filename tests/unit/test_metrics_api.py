"""Metric points end to end inside the console: stream -> keeper -> API, CSV, TensorBoard, the
websocket's metric frames, and baselines."""

import csv
import io
import json
import tarfile
from pathlib import Path
from typing import Any

import pytest
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.contrib.auth.models import User
from django.test import Client

from console.asgi import application
from jobs.models import ApiToken, Job, MetricPoint
from jobs.redis_client import get_redis
from jobs.services import logarchive, metric_export
from jobs.services.submission import check_job_request, submit_job
from tests.unit.helpers import append_lines, job_request
from workers import contract
from workers.logsink import LogSink

pytestmark = pytest.mark.usefixtures("catalog", "code_root", "nodes", "redis_url", "sent_tasks")


def job_for(user: User, instances: int = 2, **overrides: Any) -> Job:
    return submit_job(user, check_job_request(job_request(instances=instances, **overrides)))


def report(job: Job, role: str, index: int, *points: dict[str, Any]) -> None:
    lines = [json.dumps({"ts": 100.0, **p}) for p in points]
    append_lines(LogSink(get_redis()), job.pk, role, index, "node-1", lines, contract.STREAM_METRIC)


def archive_all() -> None:
    while logarchive.archive_once(get_redis(), block_ms=10):
        pass


def api(user: User) -> Client:
    return Client(headers={"Authorization": f"Token {ApiToken.issue(user)}"})


@pytest.mark.parametrize("archived", [False, True], ids=["in-redis", "archived"])
def test_points_with_only_an_epoch_or_no_finite_value_are_served(
    alice: User, archived: bool
) -> None:
    """A regression: the typed API once answered 500 for a point without a step (a trainer
    reporting per epoch, or a system sample), beside one whose value was not finite."""
    job = job_for(alice)
    report(job, "master", 0, {"name": "eval_accuracy", "value": 0.9, "epoch": 1.0})
    report(job, "master", 0, {"name": "cpu_percent", "value": 80.0})
    report(job, "master", 0, {"name": "loss", "value": None, "nonfinite": "nan", "step": 3})
    if archived:
        archive_all()
    response = api(alice).get(f"/api/v1/jobs/{job.pk}/metrics?after=0")
    assert response.status_code == 200, response.content
    points = response.json()["points"]
    # The NaN is left out here, as charts take no such value (test_nonfinite_metrics).
    assert [(p["name"], p.get("step"), p.get("epoch"), p["value"]) for p in points] == [
        ("eval_accuracy", None, 1.0, 0.9), ("cpu_percent", None, None, 80.0),
    ]  # fmt: skip


def test_points_are_archived_and_served_with_their_origin(alice: User) -> None:
    job = job_for(alice)
    report(job, "master", 0, {"name": "loss", "value": 0.5, "step": 1})
    append_lines(LogSink(get_redis()), job.pk, "master", 0, "node-1", ["a log line"])
    report(job, "worker", 1, {"name": "loss", "value": 0.7, "step": 1, "epoch": 0.1})
    archive_all()
    assert MetricPoint.objects.filter(job=job).count() == 2
    report(job, "worker", 1, {"name": "lr", "value": 0.1, "step": 2})  # not archived yet
    body = api(alice).get(f"/api/v1/jobs/{job.pk}/metrics").json()
    assert [(p["name"], p["role"], p["index"], p["value"]) for p in body["points"]] == [
        ("loss", "master", 0, 0.5), ("loss", "worker", 1, 0.7), ("lr", "worker", 1, 0.1)
    ]  # fmt: skip
    assert body["points"][1]["epoch"] == 0.1 and body["points"][0]["cursor"] == 1
    only_lr = api(alice).get(f"/api/v1/jobs/{job.pk}/metrics?name=lr").json()["points"]
    assert [p["value"] for p in only_lr] == [0.1]
    # Points are not log lines.
    logs = api(alice).get(f"/api/v1/jobs/{job.pk}/logs").json()["lines"]
    assert [x["text"] for x in logs] == ["a log line"]


def test_others_cannot_read_a_jobs_metrics(alice: User, bob: User) -> None:
    job = job_for(alice)
    assert api(bob).get(f"/api/v1/jobs/{job.pk}/metrics").status_code == 404


@pytest.mark.parametrize("after", ["-1", "x", "1.5", str(2**63)])
def test_a_bad_cursor_is_refused_as_the_log_refuses_it(alice: User, after: str) -> None:
    job = job_for(alice)
    message = {"errors": {"after": ["after must be a whole number from 0 to 2**63-1."]}}
    for path in ("metrics", "logs"):
        response = api(alice).get(f"/api/v1/jobs/{job.pk}/{path}", {"after": after})
        assert (response.status_code, response.json()) == (400, message)


def test_csv_and_tensorboard_exports(alice: User, tmp_path: Path) -> None:
    job = job_for(alice)
    for step in range(5):
        report(job, "master", 0, {"name": "loss", "value": 1.0 / (step + 1), "step": step})
    report(job, "master", 0, {"name": "cpu_percent", "value": 99.0})
    archive_all()
    response = api(alice).get(f"/api/v1/jobs/{job.pk}/metrics.csv")
    rows = list(csv.DictReader(io.StringIO(b"".join(response.streaming_content).decode())))  # type: ignore[attr-defined]
    assert [(r["name"], r["step"], float(r["value"])) for r in rows][:2] == [
        ("loss", "0", 1.0), ("loss", "1", 0.5)
    ]  # fmt: skip
    archive = api(alice).get(f"/api/v1/jobs/{job.pk}/metrics.tensorboard.tar.gz")
    assert archive.status_code == 200
    with tarfile.open(fileobj=io.BytesIO(archive.content)) as tar:
        tar.extractall(tmp_path, filter="data")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(tmp_path / f"job-{job.pk}"))
    events.Reload()
    assert set(events.Tags()["scalars"]) == {"loss/master", "system/cpu_percent/master"}
    assert [(e.step, round(e.value, 3)) for e in events.Scalars("loss/master")] == [
        (0, 1.0), (1, 0.5), (2, 0.333), (3, 0.25), (4, 0.2)
    ]  # fmt: skip
    assert metric_export.write_tensorboard(job.pk, tmp_path / "again") == 6


def test_a_baseline_gives_speedup_cost_and_a_verdict(alice: User, bob: User) -> None:
    one = job_for(alice, instances=1)
    two = job_for(alice, instances=2)
    for step in range(3):
        report(one, "master", 0, {"name": "samples_per_sec", "value": 800.0, "step": step})
        for role, index in (("master", 0), ("worker", 1)):
            report(two, role, index, {"name": "samples_per_sec", "value": 600.0, "step": step})
    for job in (one, two):
        report(job, "master", 0, {"name": "loss", "value": 1.0, "epoch": 1.0},
               {"name": "loss", "value": 0.5, "epoch": 2.0},
               {"name": "eval_accuracy", "value": 0.97, "epoch": 2.0})  # fmt: skip
    archive_all()
    client = api(alice)
    assert (
        client.post(
            f"/api/v1/jobs/{two.pk}/baseline", {"baseline": 99999}, content_type="application/json"
        ).status_code
        == 400
    )
    summary = client.post(
        f"/api/v1/jobs/{two.pk}/baseline", {"baseline": one.pk}, content_type="application/json"
    ).json()
    assert summary["throughput"] == {"global_sps": 1200.0, "per_worker_sps": 600.0,
                                     "workers_reporting": 2}  # fmt: skip
    speed = summary["baseline"]["speedup"]
    assert speed["speedup"] == pytest.approx(0.75)  # per card: 600 / 800
    assert speed["global_speedup"] == pytest.approx(1.5)
    assert speed["efficiency"] == pytest.approx(0.75)
    # cpu-1 costs the same per instance: twice the price for 1.5x the samples.
    assert speed["samples_per_dollar_ratio"] == pytest.approx(0.75)
    # A 1-trainer baseline draws other curves by design (another global batch): the verdict
    # judges the final accuracy, and a note (not a failure) says why the curves are not judged.
    verdict = summary["baseline"]["verdict"]
    assert verdict["matches"] is True and verdict["curves_judged"] is False
    assert verdict["note"].startswith(
        "The baseline's curves differ by design: it ran 1 trainer and this job 2 trainers,"
    )
    assert summary["gpu"] == "none"
    rows = summary["scaling"]["rows"]
    assert [(r["workers"], r["global_sps"]) for r in rows] == [(1, 800.0), (2, 1200.0)]
    # Another user's job is not a baseline anyone else can pick.
    bobs = job_for(bob, instances=1)
    assert (
        client.post(
            f"/api/v1/jobs/{two.pk}/baseline",
            {"baseline": bobs.pk},
            content_type="application/json",
        ).status_code
        == 400
    )


def test_a_baseline_on_as_many_trainers_is_judged_on_its_curves_too(alice: User) -> None:
    first, again = job_for(alice, instances=2), job_for(alice, instances=2)
    for job, loss in ((first, 1.0), (again, 2.0)):
        report(job, "master", 0, {"name": "loss", "value": loss, "epoch": 1.0},
               {"name": "loss", "value": loss / 2, "epoch": 2.0},
               {"name": "eval_accuracy", "value": 0.97, "epoch": 2.0})  # fmt: skip
    archive_all()
    summary = (
        api(alice)
        .post(
            f"/api/v1/jobs/{again.pk}/baseline", {"baseline": first.pk},
            content_type="application/json",
        )
        .json()
    )  # fmt: skip
    verdict = summary["baseline"]["verdict"]
    assert verdict["curves_judged"] is True and verdict["note"] is None
    assert verdict["matches"] is False  # the same accuracy, but a loss curve twice as high
    assert verdict["reasons"][1] == "loss curves 100.0% apart by epoch (over 10%)"


def test_a_baseline_of_another_program_gives_no_speedup_and_says_why(alice: User) -> None:
    one = job_for(alice, instances=1, program={"script": "digits-ddp", "args": []})
    two = job_for(alice, instances=2, program={"script": "synthetic-ddp", "args": []})
    summary = (
        api(alice)
        .post(
            f"/api/v1/jobs/{two.pk}/baseline", {"baseline": one.pk}, content_type="application/json"
        )
        .json()
    )
    assert summary["baseline"]["speedup"] is None
    assert "not the same image, program and package" in summary["baseline"]["why_no_speedup"]


def test_the_console_launches_a_single_worker_baseline(alice: User) -> None:
    job = job_for(alice, instances=3)
    response = api(alice).post(f"/api/v1/jobs/{job.pk}/baseline-run")
    assert response.status_code == 201, response.content
    baseline = response.json()
    assert baseline["roles"] == {"master": {"package": "cpu-1", "instances": 1}}
    assert baseline["program"] == {"script": "digits-ddp", "args": ["--epochs", "2"]}
    job.refresh_from_db()
    assert job.baseline_id == baseline["id"]


def test_an_admins_baseline_run_of_anothers_job_copies_no_masked_value(
    alice: User, charlie_admin: User
) -> None:
    """A regression (issue 43): the baseline run copied the job's variables unmasked into the
    admin's own job, where the admin could read them; "Run again" already dropped them."""
    job = job_for(alice, env={"WANDB_API_KEY": "alices-secret", "LEARNING_RATE": "0.1"})
    response = api(charlie_admin).post(f"/api/v1/jobs/{job.pk}/baseline-run")
    assert response.status_code == 201, response.content
    baseline = Job.objects.get(pk=response.json()["id"])
    assert baseline.owner == charlie_admin
    assert baseline.env == {"LEARNING_RATE": "0.1"}
    # Its owner's own baseline run keeps every value.
    response = api(alice).post(f"/api/v1/jobs/{job.pk}/baseline-run")
    assert response.status_code == 201, response.content
    assert Job.objects.get(pk=response.json()["id"]).env == job.env


def test_regex_metric_definitions_are_checked_on_submission(alice: User) -> None:
    client = api(alice)
    bad = job_request(metrics=[{"name": "loss", "regex": "loss=[0-9.]+"}])
    response = client.post("/api/v1/jobs", bad, content_type="application/json")
    assert response.status_code == 400
    assert "needs a group" in response.json()["errors"]["metrics"][0]
    good = job_request(metrics=[{"name": "loss", "regex": "loss=([0-9.]+)"}])
    response = client.post("/api/v1/jobs", good, content_type="application/json")
    assert response.status_code == 201
    assert response.json()["metrics"] == [{"name": "loss", "regex": "loss=([0-9.]+)"}]


@pytest.mark.django_db(transaction=True)
async def test_the_websocket_sends_metric_frames_in_stream_order(alice: User) -> None:
    job = await database_sync_to_async(job_for)(alice)
    sink = LogSink(get_redis())
    append_lines(sink, job.pk, "master", 0, "node-1", ["before"])
    report(job, "master", 0, {"name": "loss", "value": 0.5, "step": 1})
    append_lines(sink, job.pk, "master", 0, "node-1", ["after"])
    token = await database_sync_to_async(ApiToken.issue)(alice)
    comm = WebsocketCommunicator(
        application, f"/ws/jobs/{job.pk}/?after=0", [(b"authorization", f"Token {token}".encode())]
    )
    assert (await comm.connect())[0]
    frames: list[dict[str, Any]] = []
    while len(frames) < 3:
        frame = await comm.receive_json_from(timeout=5)
        if frame["type"] != "state":  # the job's state changes on its own meanwhile
            frames.append(frame)
    assert [f["type"] for f in frames] == ["log", "metric", "log"]
    assert [f["next"] for f in frames] == [1, 2, 3]
    point = frames[1]["points"][0]
    assert (point["name"], point["value"], point["step"], point["role"]) == (
        "loss",
        0.5,
        1,
        "master",
    )
    await comm.disconnect()
    # Starting from the tail, the charts still get every point from the start.
    comm = WebsocketCommunicator(
        application, f"/ws/jobs/{job.pk}/?tail=1", [(b"authorization", f"Token {token}".encode())]
    )
    assert (await comm.connect())[0]
    history = await comm.receive_json_from(timeout=5)
    while history["type"] == "state":
        history = await comm.receive_json_from(timeout=5)
    assert history["type"] == "metric" and [p["value"] for p in history["points"]] == [0.5]
    await comm.disconnect()
