"""Admins manage images, packages, quotas, nodes and jobs in Django admin."""

import pytest
from django.contrib.auth.models import User
from django.test import Client

from jobs.models import FrameworkImage, Quota
from jobs.services.submission import check_job_request, submit_job
from tests.unit.helpers import job_request

pytestmark = pytest.mark.usefixtures("catalog", "code_root", "nodes")


@pytest.mark.parametrize("model", ["frameworkimage", "package", "quota", "node", "job"])
def test_it_lists_and_opens_every_managed_model(
    client: Client, charlie_admin: User, alice: User, model: str
) -> None:
    submit_job(alice, check_job_request(job_request()))
    client.force_login(charlie_admin)
    listing = client.get(f"/admin/jobs/{model}/")
    assert listing.status_code == 200
    assert client.get(f"/admin/jobs/{model}/add/").status_code == 200


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
    assert client.get("/admin/jobs/job/").status_code == 302
    assert FrameworkImage.objects.count() == 1
