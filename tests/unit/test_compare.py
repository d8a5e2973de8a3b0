"""Comparing runs: which configuration rows differ, who may compare which jobs, and what
`GET /api/v1/compare` and the compare page answer (jobs.services.views.comparison)."""

from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client

from jobs.models import ApiToken, Job, MetricPoint, Quota
from jobs.services.submission import check_job_request, submit_job
from jobs.services.views import comparison
from tests.conftest import set_quota
from tests.unit.helpers import job_request

pytestmark = pytest.mark.usefixtures("catalog", "code_root", "nodes", "redis_url", "sent_tasks")


def submit(owner: User, **overrides: Any) -> Job:
    if not Quota.objects.filter(user=owner).exists():
        set_quota(owner, cpu=100, memory_gb=1000, jobs=100)
    return submit_job(owner, check_job_request(job_request(instances=2, **overrides)))


def program(*args: str) -> dict[str, Any]:
    return {"script": "digits-ddp", "args": list(args)}


def compare(client: Client, user: User, jobs: str) -> Any:
    auth = {"HTTP_AUTHORIZATION": f"Token {ApiToken.issue(user)}"}
    return client.get("/api/v1/compare", {"jobs": jobs}, **auth)  # type: ignore[arg-type]


def rows_by_key(answer: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {row["key"]: row for row in answer["rows"]}


def test_it_marks_the_rows_that_differ_and_only_those(alice: User) -> None:
    one = submit(alice, program=program("--epochs", "2", "--lr", "0.05"))
    two = submit(alice, program=program("--epochs", "2", "--lr", "0.1"))
    three = submit(alice, program=program("--epochs", "2", "--lr", "0.1"), env={"SEED": "1"})
    rows = {r.key: r for r in comparison.configuration_rows([one, two, three], alice)}
    assert rows["program.args"].values == (
        "--epochs 2 --lr 0.05",
        "--epochs 2 --lr 0.1",
        "--epochs 2 --lr 0.1",
    )
    assert rows["program.args"].differs
    # A variable only one job has reads as not set in the others.
    assert rows["env.SEED"].values == ("—", "—", "1") and rows["env.SEED"].differs
    assert not rows["image"].differs and not rows["role.worker"].differs
    assert rows["role.worker"].values == ("cpu-1 × 1",) * 3
    assert {r.key for r in comparison.differing(rows.values())} == {"program.args", "env.SEED"}


def test_a_time_limit_is_a_row_of_its_own(alice: User) -> None:
    limited = submit(alice, time_limit="1h30m")
    rows = {r.key: r for r in comparison.configuration_rows([limited, submit(alice)], alice)}
    assert rows["time_limit"].values == ("1 h 30 min", "none") and rows["time_limit"].differs


def test_arguments_that_split_differently_are_not_equal(alice: User) -> None:
    spaced = submit(alice, program=program("--tag", "a b"))
    split = submit(alice, program=program("--tag", "a", "b"))
    [row] = [
        r for r in comparison.configuration_rows([spaced, split], alice) if r.key == "program.args"
    ]
    assert row.values == ('--tag "a b"', "--tag a b") and row.differs


def test_a_role_only_one_job_has_differs(alice: User) -> None:
    pair = submit(alice)
    alone = submit_job(alice, check_job_request(job_request(instances=1)))
    rows = {r.key: r for r in comparison.configuration_rows([alone, pair], alice)}  # fmt: skip
    assert rows["role.worker"].values == ("—", "cpu-1 × 1") and rows["role.worker"].differs
    assert not rows["role.master"].differs


def test_masked_values_stay_masked_and_compare_as_shown(alice: User, charlie_admin: User) -> None:
    one = submit(alice, env={"HF_TOKEN": "hf_first_secret"})
    two = submit(alice, env={"HF_TOKEN": "hf_second_secret"})
    shown = {r.key: r for r in comparison.configuration_rows([one, two], charlie_admin)}
    assert "secret" not in " ".join(shown["env.HF_TOKEN"].values)
    # Whether two secrets are equal is no business of the admin's either.
    assert not shown["env.HF_TOKEN"].differs
    own = {r.key: r for r in comparison.configuration_rows([one, two], alice)}
    assert own["env.HF_TOKEN"].values == ("hf_first_secret", "hf_second_secret")
    assert own["env.HF_TOKEN"].differs


@pytest.mark.parametrize(
    ("jobs", "message"),
    [
        ("", "Pick 2 to 8 jobs to compare, not 0."),
        ("7", "Pick 2 to 8 jobs to compare, not 1."),
        ("1,2,3,4,5,6,7,8,9", "Pick 2 to 8 jobs to compare, not 9."),
        ("1,1", "Name each job once."),
        ("1,x", "Job numbers are whole numbers, e.g. jobs=12,15; not 'x'."),
        ("1,-2", "Job numbers are whole numbers, e.g. jobs=12,15; not '-2'."),
        ("1,0", "Job numbers are whole numbers, e.g. jobs=12,15; not '0'."),
        # Larger than any id: refused here, not by the database driver (SQLite overflows).
        (f"1,{2**63}", f"Job numbers are whole numbers, e.g. jobs=12,15; not '{2**63}'."),
        (
            "1," + "9" * 5000,
            "Job numbers are whole numbers, e.g. jobs=12,15; not '99999999999999999999'.",
        ),
    ],
)
def test_a_bad_set_of_jobs_gets_a_clear_message(jobs: str, message: str) -> None:
    with pytest.raises(comparison.CompareError) as refused:
        comparison.parse_ids(jobs)
    assert refused.value.errors == {"jobs": [message]}


def test_up_to_eight_jobs_are_compared_in_the_order_given() -> None:
    assert comparison.parse_ids("8,3,5,1,2,7,6,4") == [8, 3, 5, 1, 2, 7, 6, 4]


def test_another_users_job_is_refused_like_a_missing_one(
    client: Client, alice: User, bob: User, charlie_admin: User
) -> None:
    mine = submit(alice, name="alice-run")
    theirs = submit(bob, name="bob-secret-run", env={"WANDB_MODE": "offline"})
    r = compare(client, alice, f"{mine.pk},{theirs.pk}")
    assert r.status_code == 404
    assert r.json() == {"errors": {"jobs": [f"No such job: {theirs.pk}."]}}
    assert compare(client, alice, f"{mine.pk},999999").json() == {
        "errors": {"jobs": ["No such job: 999999."]}
    }
    # The page says the same, and shows nothing of bob's job.
    client.force_login(alice)
    page = client.get("/compare/", {"jobs": f"{mine.pk},{theirs.pk}"})
    assert page.status_code == 404
    html = page.content.decode()
    assert f"No such job: {theirs.pk}." in html and "bob-secret-run" not in html
    # Staff see every job.
    assert compare(client, charlie_admin, f"{mine.pk},{theirs.pk}").status_code == 200


def test_the_api_answers_rows_figures_and_the_shared_charts(client: Client, alice: User) -> None:
    one = submit(alice, program=program("--epochs", "2"))
    two = submit(alice, program=program("--epochs", "3"))
    for job, losses in ((one, [1.0, 0.5]), (two, [0.9, 0.3, 0.4])):
        for step, loss in enumerate(losses):
            for name, value in (("loss", loss), ("eval_accuracy", 0.5 + step / 10)):
                MetricPoint.objects.create(
                    job=job, cursor=step * 2 + (name == "loss") + 1, role="master", index=0,
                    name=name, value=value, step=step, ts=1000.0 + step,
                )  # fmt: skip
    MetricPoint.objects.create(
        job=one, cursor=99, role="master", index=0, name="only_mine", value=1, step=0, ts=1.0
    )
    r = compare(client, alice, f"{two.pk},{one.pk}")
    assert r.status_code == 200, r.content
    body = r.json()
    assert [j["id"] for j in body["jobs"]] == [two.pk, one.pk]  # in the order asked
    assert body["charts"] == ["loss", "eval_accuracy"]  # only_mine is not shared
    assert body["jobs"][0]["metrics"] == f"/api/v1/jobs/{two.pk}/metrics"
    assert body["jobs"][0]["figures"]["curves"]["loss"] == {"final": 0.4, "best": 0.3}
    assert body["jobs"][1]["figures"]["curves"]["eval_accuracy"] == {"final": 0.6, "best": 0.6}
    assert body["jobs"][1]["figures"]["curves"]["only_mine"]["best"] is None
    assert body["jobs"][0]["figures"]["cost"] == 0.0  # never started
    assert body["jobs"][0]["started"] is None  # where the page's "time since start" counts from
    args = rows_by_key(body)["program.args"]
    assert args == {
        "key": "program.args",
        "label": "Arguments",
        "group": "Program",
        "values": ["--epochs 3", "--epochs 2"],
        "differs": True,
    }
    assert rows_by_key(body)["image"]["differs"] is False


def test_the_compare_page_highlights_the_rows_that_differ(client: Client, alice: User) -> None:
    one = submit(alice, name="lr-low", program=program("--lr", "0.05"))
    two = submit(alice, name="lr-high", program=program("--lr", "0.1"))
    client.force_login(alice)
    page = client.get("/compare/", {"jobs": f"{one.pk},{two.pk}"})
    assert page.status_code == 200
    html = page.content.decode()
    assert 'data-key="program.args" class="differs"' in html
    assert 'data-key="image" class="same"' in html
    assert "lr-low" in html and "lr-high" in html
    assert f'href="/?compare={one.pk},{two.pk}"' in html  # back to the list, both ticked
    refused = client.get("/compare/", {"jobs": str(one.pk)})
    assert refused.status_code == 400
    assert "Pick 2 to 8 jobs to compare, not 1." in refused.content.decode()


def test_health_rules_read_one_per_line_with_every_parameter(alice: User) -> None:
    stop = {"kind": "non-finite", "metric": "loss", "action": "stop"}
    warn = {"kind": "non-finite", "metric": "loss", "action": "warn"}
    one = submit(alice, health_rules=[stop])
    two = submit(alice, health_rules=[warn])
    [row] = [r for r in comparison.configuration_rows([one, two], alice) if r.key == "health_rules"]
    assert row.values == ('non-finite metric="loss" → stop', 'non-finite metric="loss" → warn')
    assert row.differs


def test_the_list_offers_a_box_per_job_and_the_job_page_compare_with(
    client: Client, alice: User
) -> None:
    job = submit(alice)
    client.force_login(alice)
    listed = client.get("/").content.decode()
    assert f'class="compare-pick" value="{job.pk}"' in listed
    assert 'id="compare-button" disabled' in listed  # until compare_pick.js counts 2 to 8
    page = client.get(f"/jobs/{job.pk}/").content.decode()
    assert f'href="/?compare={job.pk}"' in page
