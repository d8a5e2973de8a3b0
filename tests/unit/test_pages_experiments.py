"""The experiment pages (jobs/experiment_views.py): who sees which, the page's answer for its
script, Pause / Resume / Stop as form posts, the job page's trial line, and the New job form's
"Start search", which makes the experiment or says why not and makes nothing."""

from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client

from jobs.models import Experiment, Job, Trial
from jobs.services.submission import check_job_request, submit_job
from tests.conftest import set_quota
from tests.unit.helpers import job_request

pytestmark = pytest.mark.usefixtures("catalog", "code_root", "nodes", "redis_url", "sent_tasks")

NAME = "lr <b>search</b>"
SPACE = {"--lr": {"type": "float", "low": 0.01, "high": 1.0, "log": True}}


def experiment_of(user: User, name: str = NAME, state: str = "running") -> Experiment:
    return Experiment.objects.create(
        owner=user,
        name=name,
        template=job_request(instances=1),
        space=SPACE,
        objective_metric="eval_accuracy",
        max_trials=4,
        parallel_trials=2,
        state=state,
        study_name=f"ui-{user.pk}-{Experiment.objects.count()}",
    )


def trial_job(user: User, experiment: Experiment, number: int, lr: float) -> Job:
    set_quota(user, cpu=100, memory_gb=1000, jobs=100)
    job = submit_job(user, check_job_request(job_request(instances=1, name=f"trial {number}")))
    Trial.objects.create(
        experiment=experiment, number=number, job=job, params={"--lr": lr}, state="running"
    )
    return job


def test_it_lists_a_users_own_experiments_and_all_of_them_for_staff(
    client: Client, alice: User, bob: User, charlie_admin: User
) -> None:
    experiment_of(alice)
    experiment_of(bob, name="bobs search")
    client.force_login(alice)
    page = client.get("/experiments/").content.decode()
    assert "lr &lt;b&gt;search&lt;/b&gt;" in page and "<b>search</b>" not in page
    assert "bobs search" not in page
    client.force_login(charlie_admin)
    page = client.get("/experiments/").content.decode()
    assert "bobs search" in page and "lr &lt;b&gt;search" in page


def test_an_experiment_page_is_its_owners_and_carries_the_answer_its_script_draws(
    client: Client, alice: User, bob: User
) -> None:
    experiment = experiment_of(alice)
    trial_job(alice, experiment, 0, 0.1)
    client.force_login(bob)
    assert client.get(f"/experiments/{experiment.pk}/").status_code == 404
    client.force_login(alice)
    response = client.get(f"/experiments/{experiment.pk}/")
    assert response.status_code == 200
    page = response.content.decode()
    assert '<script id="experiment-detail" type="application/json">' in page
    assert response.context["detail"]["trials"][0]["params"] == {"--lr": 0.1}
    assert "<b>search</b>" not in page


@pytest.mark.parametrize(
    ("action", "before", "after"),
    [("pause", "running", "paused"), ("resume", "paused", "running"), ("stop", "running", None)],
)
def test_pause_resume_and_stop_are_posts_that_change_the_experiment(
    client: Client, alice: User, bob: User, action: str, before: str, after: str | None
) -> None:
    experiment = experiment_of(alice, state=before)
    client.force_login(alice)
    assert client.get(f"/experiments/{experiment.pk}/{action}/").status_code == 405
    client.force_login(bob)
    assert client.post(f"/experiments/{experiment.pk}/{action}/").status_code == 404
    experiment.refresh_from_db()
    assert experiment.state == before
    client.force_login(alice)
    response = client.post(f"/experiments/{experiment.pk}/{action}/")
    assert response.status_code == 302 and response["Location"] == f"/experiments/{experiment.pk}/"
    experiment.refresh_from_db()
    if after is None:
        assert experiment.state in ("stopping", "stopped")
    else:
        assert experiment.state == after


def test_an_ended_experiment_cannot_be_paused_and_the_page_says_why(
    client: Client, alice: User
) -> None:
    experiment = experiment_of(alice, state="finished")
    client.force_login(alice)
    page = client.post(f"/experiments/{experiment.pk}/pause/", follow=True)
    experiment.refresh_from_db()
    assert experiment.state == "finished"
    assert [m.level_tag for m in page.context["messages"]] == ["error"]


def test_a_trials_job_page_names_its_experiment_and_its_parameters(
    client: Client, alice: User
) -> None:
    experiment = experiment_of(alice)
    job = trial_job(alice, experiment, 3, 0.031622776)
    client.force_login(alice)
    page = client.get(f"/jobs/{job.pk}/").content.decode()
    assert "Trial 3 of experiment" in page
    assert f'href="/experiments/{experiment.pk}/"' in page
    assert "lr &lt;b&gt;search&lt;/b&gt;" in page
    assert '<code id="job-trial-params">--lr 0.0316</code>' in page


def form_post(**search: str) -> dict[str, Any]:
    """The New job form with digits-ddp on one instance, and its Search… part."""
    post: dict[str, Any] = {
        "name": "digits",
        "image": "pytorch:2.13-cpu",
        "script": "digits-ddp",
        "args": "--epochs 3",
        "package": "cpu-1",
        "instances": "1",
        "priority": "normal",
        "search-space-key": ["--lr", ""],
        "search-space-type": ["float", "float"],
        "search-space-low": ["0.01", ""],
        "search-space-high": ["1", ""],
        "search-space-scale": ["log", "linear"],
        "search-space-step": ["", ""],
        "search-space-choices": ["", ""],
        "search-metric": "eval_accuracy",
        "search-goal": "max",
        "search-unit": "epoch",
        "search-searcher": "random",
        "search-pruner": "median",
        "search-trials": "4",
        "search-parallel": "2",
    }
    post.update({f"search-{k}": v for k, v in search.items()})
    return post


def test_start_search_makes_the_forms_job_an_experiment(client: Client, alice: User) -> None:
    set_quota(alice, cpu=8, memory_gb=32, jobs=4)
    client.force_login(alice)
    response = client.post("/experiments/new/", form_post(name="from the form"))
    experiment = Experiment.objects.get(owner=alice)
    assert response.status_code == 302
    assert response["Location"] == f"/experiments/{experiment.pk}/"
    assert experiment.name == "from the form"
    assert experiment.space == {"--lr": {"type": "float", "low": 0.01, "high": 1.0, "log": True}}
    assert experiment.template["program"]["args"] == ["--epochs", "3"]
    assert (experiment.max_trials, experiment.parallel_trials) == (4, 2)


def test_a_refused_search_shows_the_form_again_with_why_and_makes_nothing(
    client: Client, alice: User
) -> None:
    set_quota(alice, cpu=8, memory_gb=32, jobs=4)
    client.force_login(alice)
    response = client.post("/experiments/new/", form_post(parallel="9", trials="2"))
    assert response.status_code == 400
    page = response.content.decode()
    assert 'id="search-errors"' in page and "budget.parallel" in page
    assert 'name="search-space-key" value="--lr"' in page  # the rows as they were sent
    assert not Experiment.objects.exists()
