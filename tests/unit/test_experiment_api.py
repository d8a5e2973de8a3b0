"""API v1 on experiments (jobs/api_experiments.py): create (201, or 400 by field), list, show,
pause, resume, stop; another user's experiment is a 404, staff see every one."""

import json
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client

from jobs.models import Experiment, Trial
from jobs.services.experiments import control, driver
from tests.conftest import set_quota
from tests.unit.experiment_helpers import search_request, search_storage
from tests.unit.helpers import SentTasks

__all__ = ["search_storage"]

pytestmark = pytest.mark.usefixtures("catalog", "code_root", "nodes", "search_storage")


def client_for(user: User) -> Client:
    client = Client()
    client.force_login(user)
    return client


def post(client: Client, path: str, body: Any = None) -> Any:
    return client.post(path, json.dumps(body or {}), content_type="application/json")


def test_it_creates_an_experiment_and_answers_it(alice: User, sent_tasks: SentTasks) -> None:
    response = post(client_for(alice), "/api/v1/experiments", search_request())
    assert response.status_code == 201, response.content
    body = response.json()
    assert body["state"] == "running"
    assert body["owner"] == "alice"
    assert body["objective"] == {"metric": "eval_accuracy", "goal": "max", "unit": "epoch"}
    assert body["budget"] == {"trials": 6, "parallel": 3, "core_hours": None, "gpu_hours": None}
    assert body["used"] == {"trials": 0, "running": 0, "core_hours": 0.0, "gpu_hours": 0.0}
    assert body["trials"] == [] and body["best"] is None
    experiment = Experiment.objects.get(pk=body["id"])
    assert experiment.owner == alice and experiment.pruner == "successive_halving"


def test_a_bad_request_is_a_400_by_field_and_writes_nothing(alice: User) -> None:
    response = post(
        client_for(alice),
        "/api/v1/experiments",
        search_request(
            space={"--lr": {"type": "float", "low": 0, "high": 1, "log": True}},
            budget={"trials": 2, "parallel": 5},
        ),
    )
    assert response.status_code == 400
    errors = response.json()["errors"]
    assert errors["space.--lr"] == ['On a log scale "low" is above 0 (it is 0).']
    assert errors["budget.parallel"] == ["At most the number of trials (2)."]
    assert not Experiment.objects.exists()


def test_a_template_refused_as_a_job_is_a_400_under_template(alice: User) -> None:
    template = {**search_request()["template"], "roles": {"master": {"package": "huge"}}}
    response = post(client_for(alice), "/api/v1/experiments", search_request(template=template))
    assert response.status_code == 400
    assert all(f.startswith("template.") for f in response.json()["errors"]), response.json()
    assert not Experiment.objects.exists()


def test_bob_cannot_see_or_stop_alices_experiment(alice: User, bob: User) -> None:
    experiment = control.create_experiment(alice, search_request())
    bob_client = client_for(bob)
    for path in (f"/api/v1/experiments/{experiment.pk}",):
        response = bob_client.get(path)
        assert response.status_code == 404
        assert response.json() == {"errors": {"experiment": ["No such experiment."]}}
    for action in ("pause", "resume", "stop"):
        response = post(bob_client, f"/api/v1/experiments/{experiment.pk}/{action}")
        assert response.status_code == 404
    assert bob_client.get("/api/v1/experiments").json() == {"experiments": []}
    experiment.refresh_from_db()
    assert experiment.state == Experiment.State.RUNNING


def test_staff_see_every_experiment(alice: User, charlie_admin: User) -> None:
    experiment = control.create_experiment(alice, search_request())
    listed = client_for(charlie_admin).get("/api/v1/experiments").json()["experiments"]
    assert [e["id"] for e in listed] == [experiment.pk]
    assert "trials" not in listed[0]


def test_pause_resume_and_stop(alice: User, sent_tasks: SentTasks) -> None:
    set_quota(alice, cpu=8, jobs=8)
    experiment = control.create_experiment(alice, search_request())
    driver.advance(experiment.pk)
    client = client_for(alice)
    base = f"/api/v1/experiments/{experiment.pk}"
    paused = post(client, f"{base}/pause")
    assert paused.status_code == 200 and paused.json()["state"] == "paused"
    assert paused.json()["reason"] == "paused by alice"
    again = post(client, f"{base}/pause")
    assert again.status_code == 409
    assert again.json()["errors"]["state"] == [
        f"Experiment {experiment.pk} is paused; only a running experiment can be paused."
    ]
    assert post(client, f"{base}/resume").json()["state"] == "running"
    stopped = post(client, f"{base}/stop").json()
    assert stopped["state"] == "stopped" and stopped["reason"] == "experiment stopped by alice"
    assert {t["state"] for t in stopped["trials"]} == {"failed"}
    assert {t["job_state"] for t in stopped["trials"]} == {"cancelled"}
    assert {t["reason"] for t in stopped["trials"]} == {"experiment stopped by alice"}
    job = Trial.objects.get(experiment=experiment, number=0).job
    assert job is not None and job.reason == "experiment stopped by alice"
    assert post(client, f"{base}/stop").status_code == 409


def test_what_a_request_leaves_out_is_the_default(alice: User) -> None:
    request = search_request(budget={"trials": 4})
    for left_out in ("searcher", "pruner", "pruner_options", "seed"):
        del request[left_out]
    request["objective"] = {"metric": "eval_accuracy"}
    response = post(client_for(alice), "/api/v1/experiments", request)
    assert response.status_code == 201, response.content
    body = response.json()
    assert (body["searcher"], body["pruner"]) == ("tpe", "none")
    assert body["objective"] == {"metric": "eval_accuracy", "goal": "max", "unit": "epoch"}
    assert body["budget"]["parallel"] == 1


def test_a_field_the_request_does_not_have_is_named(alice: User) -> None:
    response = post(client_for(alice), "/api/v1/experiments", search_request(trials=12))
    assert response.status_code == 400
    assert response.json()["errors"] == {"request": ["Unknown field(s): trials."]}
    assert not Experiment.objects.exists()
