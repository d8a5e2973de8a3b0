"""The New-job form's preview (POST /jobs/new/preview/): what admission would say before Launch,
from the functions Launch is judged by."""

from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client

from jobs.models import Job, Quota
from jobs.services.submission import ValidationFailed, check_job_request, submit_job
from tests.conftest import set_quota
from tests.unit.helpers import job_request

pytestmark = pytest.mark.usefixtures("catalog", "code_root", "nodes", "redis_url", "sent_tasks")

URL = "/jobs/new/preview/"
SHAPE = {"image": "pytorch:2.13-cpu", "package": "cpu-1", "instances": "3"}


def preview(client: Client, **fields: str) -> Any:
    return client.post(URL, {**SHAPE, **fields})


def test_it_answers_the_totals_price_and_formula_of_the_request(
    client: Client, alice: User
) -> None:
    set_quota(alice, cpu=8, memory_gb=32)
    client.force_login(alice)
    r = preview(client)
    assert r.status_code == 200
    assert r.json() == {
        "need": {"cpu": 3, "gpus": 0, "memory_gb": 6, "jobs": 1},
        "left": {"cpu": 8, "gpus": 0, "memory_gb": 32, "jobs": 4},
        "price_per_hour": "0.1500",
        "formula": "CPU_total = master 1×1 + worker 1×2 = 3; "
        "GPU_total = master 0×1 + worker 0×2 = 0; Memory_total = master 2×1 + worker 2×2 = 6 GB",
        "over": [],
        "never": [],
        "fits_with": None,
        "instances": ["[master]", "[worker-1]", "[worker-2]"],
        "notes": None,
    }


def test_it_gives_the_refusals_words_and_the_count_that_fits_before_launch(
    client: Client, alice: User
) -> None:
    set_quota(alice, cpu=2)
    client.force_login(alice)
    body = preview(client).json()
    with pytest.raises(ValidationFailed) as refused:
        submit_job(alice, check_job_request(job_request(instances=3)))
    # The very sentences Launch would refuse with.
    assert body["over"] + [body["fits_with"]] == refused.value.errors["quota"]
    assert body["fits_with"] == "It fits with 1 worker (2 instances in all)."
    assert preview(client, instances="2").json()["fits_with"] is None


def test_it_counts_what_the_users_running_jobs_hold(client: Client, alice: User) -> None:
    set_quota(alice, cpu=4)
    submit_job(alice, check_job_request(job_request(instances=2)))
    client.force_login(alice)
    body = preview(client, instances="3").json()
    assert body["left"]["cpu"] == 2
    assert body["fits_with"] == "It fits with 1 worker (2 instances in all)."


def test_it_previews_a_parameter_server_request(client: Client, alice: User) -> None:
    client.force_login(alice)
    r = client.post(
        URL,
        {
            "image": "kvstore-ps:2.13",
            "kvstore": "dist_sync",
            "server_package": "server-2c12g",
            "servers": "1",
            "worker_package": "cpu-1",
            "workers": "2",
        },
    )
    assert r.status_code == 200
    # The scheduler is the platform's: not charged.
    assert r.json()["formula"].startswith("CPU_total = server 2×1 + worker 1×2 = 4;")


def test_it_says_what_no_node_could_hold(client: Client, alice: User) -> None:
    set_quota(alice, cpu=64, gpus=8, memory_gb=512)
    client.force_login(alice)
    body = preview(client, package="worker-p100x2", instances="1").json()
    assert body["never"] == [
        "No node can hold 'worker-p100x2' (P100 ×2, 12 cores, 120 GB), so it could never start."
    ]


def test_without_a_quota_it_says_so(client: Client, alice: User) -> None:
    Quota.objects.filter(is_default=True).delete()
    client.force_login(alice)
    body = preview(client).json()
    assert body["left"] is None
    assert body["over"] == ["No quota is set for you and there is no default quota; ask an admin."]


@pytest.mark.parametrize(
    ("fields", "errors"),
    [
        ({"instances": "0"}, {"instances": ["Ensure this value is greater than or equal to 1."]}),
        ({"instances": "many"}, {"instances": ["Enter a whole number."]}),
        ({"instances": ""}, {"instances": ["This field is required."]}),
        ({"package": "nope"}, {"package": ["Unknown package 'nope'."]}),
        ({"image": "nope:1"}, {"image": ["Unknown framework image 'nope:1'."]}),
        ({"instances": "100000"}, {"instances": ["At most 64 instances per role."]}),
    ],
)
def test_bad_input_gets_a_clear_message_and_changes_nothing(
    client: Client, alice: User, fields: dict[str, str], errors: dict[str, list[str]]
) -> None:
    client.force_login(alice)
    r = preview(client, **fields)
    assert r.status_code == 400
    assert r.json() == {"errors": errors}
    assert not Job.objects.exists()


def test_it_writes_nothing(client: Client, alice: User) -> None:
    client.force_login(alice)
    assert preview(client).status_code == 200
    assert not Job.objects.exists()


def test_it_refuses_anonymous_users(client: Client) -> None:
    r = preview(client)
    assert r.status_code == 401
    assert r.json() == {"errors": {"auth": ["Log in again."]}}


def test_it_takes_only_posts_with_the_csrf_token(alice: User) -> None:
    client = Client(enforce_csrf_checks=True)
    client.force_login(alice)
    assert client.get(URL, SHAPE).status_code == 405
    assert client.post(URL, SHAPE).status_code == 403


def test_it_names_the_instances_as_the_job_will_and_says_what_the_batch_size_means(
    client: Client, alice: User
) -> None:
    from jobs.models import Replica
    from jobs.services.preview import NAMED_INSTANCES

    client.force_login(alice)
    # The names are those the submitted job's replicas get, the rest elided after three.
    many = preview(client, instances="6").json()["instances"]
    assert many == ["[master]", "[worker-1]", "[worker-2]", "[worker-3]", "…", "[worker-5]"]
    job = submit_job(alice, check_job_request(job_request(instances=6)))
    assert {f"[{r.tag}]" for r in Replica.objects.filter(job=job)} >= set(many) - {"…"}
    assert NAMED_INSTANCES == 3

    ps = {
        "image": "kvstore-ps:2.13",
        "server_package": "cpu-1",
        "servers": "1",
        "worker_package": "cpu-1",
        "workers": "2",
        "kvstore": "dist_device_sync",
        "args": "--epochs 3 --batch-size 32",
    }
    body = client.post(URL, ps).json()
    assert body["instances"] == ["[scheduler]", "[server-0]", "[worker-0]", "[worker-1]"]
    assert "global batch = 2 × 32 = 64" in body["notes"]
    assert "dist_device_sync behaves exactly like dist_sync" in body["notes"]
    # dist_async has no global batch; an argument still being typed hides the size, no error.
    body = client.post(URL, {**ps, "kvstore": "dist_async", "args": "--batch-size 32 '"}).json()
    assert "no global batch" in body["notes"] and "(32)" not in body["notes"]
