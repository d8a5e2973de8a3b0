"""Admins manage images, packages, quotas, nodes and jobs in Django admin."""

import re
from collections.abc import Callable
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db.models import Model
from django.test import Client
from django.utils.html import escape

from jobs.models import FrameworkImage, HealthEvent, Job, Node, Package, Quota
from jobs.services.submission import check_job_request, submit_job
from tests.unit.helpers import job_request

pytestmark = pytest.mark.usefixtures("catalog", "code_root", "nodes")


# Per model: the model, what names each of its rows in the change list, and the inputs its add
# form must have (None: it has none, rows come only through the services that check them).
MANAGED: dict[str, tuple[type[Model], Callable[[Any], list[str]], set[str] | None]] = {
    "frameworkimage": (
        FrameworkImage,
        lambda image: [image.name],
        {"name", "framework", "description", "container_image", "enabled",
         "metric_definitions", "restart_policy", "max_restarts", "health_rules"},
    ),
    "package": (
        Package,
        lambda package: [package.name],
        {"name", "cpu", "gpus", "gpu_model", "memory_gb", "price_per_hour", "roles", "enabled"},
    ),
    "quota": (
        Quota,
        lambda quota: [str(quota)],
        {"is_default", "user", "group", "cpu", "gpus", "memory_gb", "running_jobs"},
    ),
    "node": (Node, lambda node: [node.name], None),
    "job": (Job, lambda job: [job.name, job.owner.username], None),
}  # fmt: skip


def input_names(html: str) -> set[str]:
    return set(re.findall(r'<(?:input|select|textarea)[^>]*\bname="([^"]+)"', html))


@pytest.mark.parametrize("model", list(MANAGED))
def test_it_lists_and_opens_every_managed_model(
    client: Client, charlie_admin: User, alice: User, model: str
) -> None:
    submit_job(alice, check_job_request(job_request()))
    client.force_login(charlie_admin)
    model_class, names_of, fields = MANAGED[model]
    listing = client.get(f"/admin/jobs/{model}/")
    assert listing.status_code == 200
    rows = list(model_class._default_manager.all())
    assert rows  # the catalog, the nodes and alice's job gave every model rows
    assert {r.pk for r in listing.context["cl"].result_list} == {r.pk for r in rows}
    page = listing.content.decode()
    shown = [name for row in rows for name in names_of(row)]
    assert [name for name in shown if escape(name) not in page] == []
    add = client.get(f"/admin/jobs/{model}/add/")
    if fields is None:
        assert add.status_code == 403
        assert f"/admin/jobs/{model}/add/" not in page
    else:
        assert add.status_code == 200
        assert fields - input_names(add.content.decode()) == set()


def test_it_names_the_admin_trainyard_in_its_colours(client: Client, charlie_admin: User) -> None:
    client.force_login(charlie_admin)
    index = client.get("/admin/").content.decode()
    assert (
        "<title>Images, packages, quotas, nodes, jobs and users | Trainyard admin</title>" in index
    )
    assert 'class="trainyard-brand">Trainyard administration</a>' in index
    assert "trainyard/admin.css" in index
    assert "Django administration" not in index


def test_it_offers_no_way_to_add_a_job_or_its_rows_by_hand(
    client: Client, charlie_admin: User, alice: User
) -> None:
    """A job, its roles and replicas come only through the form, the API or the CLI, which
    check them; the admin shows them and adds none (no "Add job", no "Add another role")."""
    job = submit_job(alice, check_job_request(job_request()))
    client.force_login(charlie_admin)
    assert client.get("/admin/jobs/job/add/").status_code == 403
    refused = client.post("/admin/jobs/job/add/", {"owner": alice.pk, "name": "around"})
    assert refused.status_code == 403
    assert Job.objects.count() == 1
    change = client.get(f"/admin/jobs/job/{job.pk}/change/").content.decode()
    # Each inline's formset allows no new form (Django then draws no "Add another" link).
    assert re.findall(r'name="(\w+)-MAX_NUM_FORMS" value="(\d+)"', change) == [
        (prefix, "0") for prefix in ("roles", "attempts", "health_events", "replicas")
    ]
    assert 'href="/admin/jobs/job/add/"' not in client.get("/admin/jobs/job/").content.decode()
    assert 'href="/admin/jobs/job/add/"' not in client.get("/admin/").content.decode()


def test_it_lets_admins_give_a_user_a_quota(
    client: Client, charlie_admin: User, alice: User
) -> None:
    client.force_login(charlie_admin)
    r = client.post(
        "/admin/jobs/quota/add/",
        {"user": alice.pk, "cpu": 4, "gpus": 0, "memory_gb": 8, "running_jobs": 1},
    )
    assert r.status_code == 302
    assert Quota.objects.get(user=alice).cpu == 4


def test_it_refuses_a_quota_that_is_neither_default_nor_a_users(
    client: Client, charlie_admin: User
) -> None:
    client.force_login(charlie_admin)
    r = client.post(
        "/admin/jobs/quota/add/", {"cpu": 4, "gpus": 0, "memory_gb": 8, "running_jobs": 1}
    )
    assert r.status_code == 200 and b"errornote" in r.content
    assert Quota.objects.count() == 1  # the default from the catalog


def test_it_keeps_admin_pages_from_non_staff(client: Client, alice: User) -> None:
    client.force_login(alice)
    page = client.get("/admin/jobs/job/")
    assert (page.status_code, page["Location"]) == (302, "/admin/login/?next=/admin/jobs/job/")
    # Nor can she run an admin action: the node stays in service.
    node = Node.objects.get(name="node-1")
    r = client.post("/admin/jobs/node/", {"action": "drain", "_selected_action": [node.pk]})
    assert (r.status_code, r["Location"]) == (302, "/admin/login/?next=/admin/jobs/node/")
    node.refresh_from_db()
    assert (node.state, node.status) == (Node.State.READY, "ready")


def test_it_drains_and_returns_nodes(client: Client, charlie_admin: User) -> None:
    from jobs.models import Node

    client.force_login(charlie_admin)
    node = Node.objects.get(name="node-1")
    r = client.post("/admin/jobs/node/", {"action": "drain", "_selected_action": [node.pk]})
    assert r.status_code == 302
    node.refresh_from_db()
    assert node.state == Node.State.DRAINING and node.status == "draining"
    client.post("/admin/jobs/node/", {"action": "return_to_service", "_selected_action": [node.pk]})
    node.refresh_from_db()
    assert node.state == Node.State.READY


def test_an_admin_set_capacity_sticks(client: Client, charlie_admin: User) -> None:
    from jobs.models import Node

    client.force_login(charlie_admin)
    node = Node.objects.get(name="node-1")
    r = client.post(
        f"/admin/jobs/node/{node.pk}/change/",
        {
            "state": "ready",
            "labels": '{"zone": "a"}',
            "cpu": 4,
            "gpus": 0,
            "memory_gb": 32,
        },
    )
    assert r.status_code == 302
    node.refresh_from_db()
    assert (node.cpu, node.capacity_set_by_admin, node.labels) == (4, True, {"zone": "a"})


def test_it_lets_admins_give_a_group_a_quota(client: Client, charlie_admin: User) -> None:
    from django.contrib.auth.models import Group

    team = Group.objects.create(name="ml-team")
    client.force_login(charlie_admin)
    r = client.post(
        "/admin/jobs/quota/add/",
        {"group": team.pk, "cpu": 64, "gpus": 8, "memory_gb": 512, "running_jobs": 10},
    )
    assert r.status_code == 302
    assert Quota.objects.get(group=team).gpus == 8


def test_a_jobs_page_lists_its_attempts_and_the_health_rules_that_fired(
    client: Client, charlie_admin: User, alice: User
) -> None:
    job = submit_job(alice, check_job_request(job_request()))
    HealthEvent.objects.create(
        job=job, attempt=0, rule="loss is not finite", action="stop", role="master",
        value="nan", message="loss is nan on master", outcome="stopped the job",
    )  # fmt: skip
    client.force_login(charlie_admin)
    page = client.get(f"/admin/jobs/job/{job.pk}/change/").content.decode()
    assert "attempt 1 of job" in page and "loss is nan on master" in page


def test_it_writes_times_as_the_consoles_pages_do(
    client: Client, charlie_admin: User, alice: User
) -> None:
    job = submit_job(alice, check_job_request(job_request()))
    client.force_login(charlie_admin)
    listing = client.get("/admin/jobs/job/").content.decode()
    assert job.created.strftime("%Y-%m-%d %H:%M:%S") in listing
    assert not re.search(r"[ap]\.m\.", listing)  # not the locale's "5:41 p.m."
