"""The job list as a run table (issue 49 items 1 and 2): runs carry a project, tags and a note
(from submission, the job page and the API), their config as key/values and a summary of each
metric; the list filters by project and tag, shows chosen columns, sorts by any of them
(jobs without a value last), keeps the last used view and named views per user, and costs the
same queries for one job as for many."""

from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from jobs import labels
from jobs.models import ApiToken, Job, JobTag, MetricPoint, MetricSummary, RunTableView
from jobs.runconfig import config_of
from jobs.services import metric_summaries, rerun, run_labels
from jobs.services.submission import ValidationFailed, check_job_request, submit_job
from tests.conftest import set_quota
from tests.unit.helpers import job_request

pytestmark = pytest.mark.usefixtures("catalog", "code_root", "nodes", "redis_url", "sent_tasks")


def run(user: User, name: str, args: list[str], **fields: Any) -> Job:
    body = job_request(instances=1, name=name)
    body["program"]["args"] = args
    body.update(fields)
    return submit_job(user, check_job_request(body))


def report(job: Job, name: str, values: list[float], first_cursor: int = 1) -> None:
    """Points as the log keeper archives them: one per step, then their summary folded in."""
    points = [
        MetricPoint(
            job=job, cursor=first_cursor + i, role="master", index=0, name=name, value=v,
            step=i + 1, ts=1000.0 + i,
        )
        for i, v in enumerate(values)
    ]  # fmt: skip
    MetricPoint.objects.bulk_create(points)
    metric_summaries.record(job.pk, points)


def api(client: Client, user: User, method: str, path: str, body: Any = None) -> Any:
    auth = {"HTTP_AUTHORIZATION": f"Token {ApiToken.issue(user)}"}
    call = getattr(client, method)
    if body is None:
        return call(f"/api/v1{path}", **auth)
    return call(f"/api/v1{path}", body, content_type="application/json", **auth)


@pytest.fixture
def sweep(alice: User) -> dict[str, Job]:
    """Three runs of one learning-rate sweep and one without metrics."""
    set_quota(alice, cpu=100, memory_gb=1000, jobs=100)
    jobs = {
        "low": run(alice, "sweep", ["--lr", "0.01", "--batch-size", "64"], project="resnet"),
        "high": run(alice, "sweep", ["--lr=0.1", "--batch-size", "128"], project="resnet"),
        "mid": run(alice, "sweep", ["--lr", "0.05", "--batch-size", "32", "--amp"], tags=["ok"]),
        "bare": run(alice, "bare", ["--epochs", "1"]),
    }
    report(jobs["low"], "eval_accuracy", [0.50, 0.71, 0.70])
    report(jobs["high"], "eval_accuracy", [0.60, 0.93, 0.90])
    report(jobs["mid"], "eval_accuracy", [0.40, 0.80, 0.85])
    report(jobs["low"], "loss", [2.0, 0.5, 0.7], first_cursor=100)
    return jobs


def test_config_is_options_as_numbers_and_variables_without_secrets() -> None:
    config = config_of(
        ["train.py", "--lr", "1e-3", "--batch-size=64", "--amp", "--shift", "-0.5", "--opt", "sgd"],
        {"WARMUP": "500", "WANDB_API_KEY": "s3cret"},
    )
    assert config == {
        "lr": 0.001, "batch-size": 64, "amp": True, "shift": -0.5, "opt": "sgd", "$WARMUP": 500,
    }  # fmt: skip


@pytest.mark.parametrize("bad", ["", "+a", "-b", "a b", "x" * 41, "<b>", "é"])
def test_a_tag_is_a_short_safe_word(bad: str) -> None:
    assert labels.tag_problem(bad)
    assert labels.tag_problem("lr-sweep/v2:ok") is None


def test_a_summary_is_the_last_steps_mean_and_the_extremes_once_per_point(
    alice: User, sweep: dict[str, Job]
) -> None:
    low = MetricSummary.objects.get(job=sweep["low"], name="eval_accuracy")
    assert (low.final, low.maximum, low.minimum, low.points) == (0.70, 0.71, 0.50, 3)
    # The same points archived again (a keeper that died before its acknowledgement) count once.
    metric_summaries.record(
        sweep["low"].pk, list(MetricPoint.objects.filter(job=sweep["low"], name="eval_accuracy"))
    )
    assert MetricSummary.objects.get(pk=low.pk).points == 3
    # Two processes at the last step: their mean, as the job page's figures read it.
    point = MetricPoint(
        job=sweep["low"], cursor=50, role="worker", index=1, name="eval_accuracy", value=0.80,
        step=3, ts=2000.0,
    )  # fmt: skip
    metric_summaries.record(sweep["low"].pk, [point])
    assert MetricSummary.objects.get(pk=low.pk).final == pytest.approx(0.75)
    assert metric_summaries.best_field("loss") == "minimum"


def test_submission_files_the_run_and_refuses_bad_labels_whole(
    alice: User, sweep: dict[str, Job]
) -> None:
    job = run(alice, "filed", [], project="p1", tags=["a", "b", "a"], note="why <b>this</b>")
    assert (job.project, job.note) == ("p1", "why <b>this</b>")
    assert sorted(job.tags.values_list("label", flat=True)) == ["a", "b"]
    before = Job.objects.count()
    with pytest.raises(ValidationFailed) as refused:
        run(alice, "bad", [], project="no spaces", tags=["-x"], note="n" * 2001)
    assert set(refused.value.errors) == {"project", "tags", "note"}
    assert Job.objects.count() == before


def test_run_again_keeps_project_and_tags_but_not_the_note(
    alice: User, sweep: dict[str, Job]
) -> None:
    run_labels.change(sweep["high"].pk, add=["best"], note="the good one")
    body = rerun.request_of(Job.objects.get(pk=sweep["high"].pk), alice)
    assert (body["project"], body["tags"]) == ("resnet", ["best"])
    again = submit_job(alice, check_job_request(body))
    assert (again.project, again.note, run_labels.tags_of(again)) == ("resnet", "", ["best"])


def test_the_api_changes_labels_and_a_bad_change_changes_nothing(
    client: Client, alice: User, bob: User, sweep: dict[str, Job]
) -> None:
    job = sweep["mid"]
    change = {"add": ["x", "y"], "remove": ["ok"], "project": "p", "note": "n"}
    answer = api(client, alice, "patch", f"/jobs/{job.pk}/labels", change)
    assert answer.status_code == 200, answer.json()
    body = answer.json()
    assert (body["tags"], body["project"], body["note"]) == (["x", "y"], "p", "n")
    assert body["config"] == {"lr": 0.05, "batch-size": 32, "amp": True}
    assert body["metric_summary"]["eval_accuracy"]["best"] == 0.85
    bad_change = {"add": ["z", "+bad"], "project": "a b"}
    refused = api(client, alice, "patch", f"/jobs/{job.pk}/labels", bad_change)
    assert refused.status_code == 400
    assert set(refused.json()["errors"]) == {"add", "project"}
    assert sorted(JobTag.objects.filter(job=job).values_list("label", flat=True)) == ["x", "y"]
    assert Job.objects.get(pk=job.pk).project == "p"
    assert api(client, bob, "patch", f"/jobs/{job.pk}/labels", {"add": ["b"]}).status_code == 404


def test_the_api_filters_by_tag_and_project_and_sorts_by_best_accuracy(
    client: Client, alice: User, sweep: dict[str, Job]
) -> None:
    def ids(query: str) -> list[int]:
        answer = api(client, alice, "get", f"/jobs?{query}")
        assert answer.status_code == 200, answer.json()
        return [j["id"] for j in answer.json()["jobs"]]

    j = {k: v.pk for k, v in sweep.items()}
    assert ids("project=resnet&sort=submitted") == [j["low"], j["high"]]
    assert ids("tag=ok") == [j["mid"]]
    assert ids("sort=-metric:eval_accuracy:best") == [j["high"], j["mid"], j["low"], j["bare"]]
    assert ids("sort=metric:eval_accuracy:final") == [j["low"], j["mid"], j["high"], j["bare"]]
    assert ids("sort=config:lr") == [j["low"], j["mid"], j["high"], j["bare"]]
    assert ids("sort=-config:batch-size") == [j["high"], j["low"], j["mid"], j["bare"]]
    assert ids("sort=metric:loss:best")[0] == j["low"]
    for bad in ("sort=-metric:acc:worst", "tag=a%20b", "project=%2Bx"):
        assert api(client, alice, "get", f"/jobs?{bad}").status_code == 400


def page(client: Client, query: str) -> Any:
    return client.get(f"/?{query}")


def test_the_list_shows_chosen_columns_sorted_with_the_rest_last(
    client: Client, alice: User, sweep: dict[str, Job]
) -> None:
    client.force_login(alice)
    answer = page(
        client,
        "columns=config:lr,config:batch-size,metric:eval_accuracy:best&sort=-metric:eval_accuracy:best",
    )
    assert answer.status_code == 200
    rows = [row for _, _, _, row, _ in answer.context["rows"]]
    assert rows == [
        ["0.1", "128", "0.93"], ["0.05", "32", "0.85"], ["0.01", "64", "0.71"], ["", "", ""]
    ]  # fmt: skip
    offered = {o.word for o in answer.context["offers"]}
    assert {"config:lr", "config:amp", "metric:loss:best", "tags", "project"} <= offered
    assert answer.context["projects"][0] == ("", 2) or ("resnet", 2) in answer.context["projects"]
    bad = page(client, "columns=config:lr,secret()")
    assert bad.status_code == 400
    assert "Unknown column" in bad.context["problems"]["columns"][0]


def test_the_last_used_look_comes_back_and_named_views_are_the_users_own(
    client: Client, alice: User, bob: User, sweep: dict[str, Job]
) -> None:
    client.force_login(alice)
    page(client, "columns=config:lr&sort=-config:lr&state=succeeded")
    back = client.get("/")
    assert back.status_code == 200
    assert [c[0] for c in back.context["columns"]] == ["config:lr"]
    assert back.context["where"].sort == "-config:lr"
    assert not back.context["where"].state  # what the list is narrowed to is not kept
    assert "cursor" not in back.context["view_query"]
    page(client, "columns=" + "&columns=".join(["config:lr"] * 1000))
    assert (
        RunTableView.objects.get(owner=alice, name="").query
        == "sort=-submitted&columns=config%3Alr"
    )
    too_long = client.post("/jobs/views/save/", {"name": "long", "query": "name=" + "x" * 2100})
    assert too_long.status_code == 302
    assert not RunTableView.objects.filter(owner=alice, name="long").exists()
    query = "tag=ok&columns=config:lr&cursor=x"
    saved = client.post("/jobs/views/save/", {"name": "by lr", "query": query})
    assert saved.status_code == 302
    view = RunTableView.objects.get(owner=alice, name="by lr")
    assert view.query == "tag=ok&columns=config%3Alr"
    assert client.post("/jobs/views/save/", {"name": "", "query": "x=1"}).status_code == 302
    assert RunTableView.objects.filter(owner=alice).exclude(name="").count() == 1
    client.force_login(bob)
    assert [v.name for v in page(client, "columns=").context["saved_views"]] == []
    client.post("/jobs/views/delete/", {"name": "by lr"})
    assert RunTableView.objects.filter(owner=alice, name="by lr").exists()
    client.force_login(alice)
    client.post("/jobs/views/delete/", {"name": "by lr"})
    assert not RunTableView.objects.filter(owner=alice, name="by lr").exists()


def test_the_job_page_files_the_run_and_shows_the_note_as_text(
    client: Client, alice: User, bob: User, sweep: dict[str, Job]
) -> None:
    job = sweep["bare"]
    client.force_login(alice)
    client.post(f"/jobs/{job.pk}/labels/", {"add": "first, second"})
    client.post(f"/jobs/{job.pk}/labels/", {"remove": "first"})
    client.post(f"/jobs/{job.pk}/labels/", {"note": "<script>alert(1)</script>\r\nline 2"})
    client.post(f"/jobs/{job.pk}/labels/", {"project": "p/2"})
    job.refresh_from_db()
    assert (run_labels.tags_of(job), job.project) == (["second"], "p/2")
    assert job.note == "<script>alert(1)</script>\nline 2"
    html = client.get(f"/jobs/{job.pk}/").content.decode()
    assert "&lt;script&gt;alert(1)&lt;/script&gt;<br>line 2" in html
    refused = client.post(f"/jobs/{job.pk}/labels/", {"add": "ok +bad"}, follow=True)
    assert "A tag is letters" in refused.content.decode()
    assert run_labels.tags_of(Job.objects.get(pk=job.pk)) == ["second"]
    client.force_login(bob)
    assert client.post(f"/jobs/{job.pk}/labels/", {"add": "x"}).status_code == 404


def test_a_page_of_the_table_costs_the_same_queries_for_one_job_as_for_many(
    client: Client, alice: User, sweep: dict[str, Job]
) -> None:
    client.force_login(alice)
    query = (
        "columns=config:lr,tags,project,metric:eval_accuracy:best,metric:loss:final"
        "&sort=-metric:eval_accuracy:best"
    )
    page(client, query)
    with CaptureQueriesContext(connection) as few:
        page(client, f"{query}&project=resnet&tag=")
    for i in range(6):
        extra = run(alice, f"more-{i}", ["--lr", str(i)], tags=["t"], project="resnet")
        report(extra, "eval_accuracy", [0.1 * i], first_cursor=1)
    with CaptureQueriesContext(connection) as many:
        page(client, f"{query}&project=resnet&tag=")
    assert len(many) == len(few)


def test_sorted_by_project_the_rows_are_grouped_with_no_project_last(
    client: Client, alice: User, sweep: dict[str, Job]
) -> None:
    client.force_login(alice)
    answer = page(client, "columns=project&sort=project")
    assert answer.status_code == 200
    assert answer.context["grouped"]
    projects = [job.project for job, *_ in answer.context["rows"]]
    assert projects == ["resnet", "resnet", "", ""]
    html = answer.content.decode()
    assert html.index("Project resnet") < html.index("No project")
    assert page(client, "sort=-project").context["rows"][0][0].project == "resnet"


def test_edit_and_run_again_keeps_the_project_and_tags_in_the_form(
    client: Client, alice: User, sweep: dict[str, Job]
) -> None:
    job = sweep["high"]
    run_labels.change(job.pk, add=["best", "lr"])
    client.force_login(alice)
    initial = client.get(f"/jobs/{job.pk}/again/").context["form"].initial
    assert (initial["project"], initial["tags"]) == ("resnet", "best lr")
    fields = {**initial, "script_path": "", "exclude_failed_node": "", "tags": "best, v2"}
    sent = {k: v for k, v in fields.items() if v is not None}
    answer = client.post(f"/jobs/{job.pk}/again/", sent)
    again = Job.objects.order_by("-pk").first()
    assert again is not None and answer["Location"] == f"/jobs/{again.pk}/"
    assert (again.project, run_labels.tags_of(again)) == ("resnet", ["best", "v2"])
