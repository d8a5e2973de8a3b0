"""The admins' Users page: who may see it, the list, adding a user (with groups and a quota of
their own), editing a user's or a group's quota; bad input changes nothing. And the default
quota that load_catalog makes, with and without options (`make run` fits it to its nodes)."""

import io
import re
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import Group, User
from django.core.management import CommandError, call_command
from django.test import Client

from jobs.management.commands.load_catalog import DEFAULT_QUOTA
from jobs.models import Quota
from jobs.services import users
from jobs.services.submission import check_job_request, submit_job
from stack.run import Stack
from tests.conftest import set_quota
from tests.unit.helpers import job_request
from workers.inventory import detect_gpus

pytestmark = pytest.mark.usefixtures("catalog")

PAGE = "/users/"

FORM = {
    "username": "dana",
    "password": "a-long-password-for-dana",
    "email": "dana@example.com",
    "new_group": "",
    "own_quota": "on",
    "cpu": "8",
    "gpus": "0",
    "memory_gb": "32",
    "running_jobs": "2",
}


@pytest.fixture
def admin(client: Client, charlie_admin: User) -> Client:
    client.force_login(charlie_admin)
    return client


def snapshot() -> tuple[list[str], list[str], int]:
    """Users, groups and quotas: what a refused form must leave as it was."""
    return (
        list(User.objects.order_by("username").values_list("username", flat=True)),
        list(Group.objects.order_by("name").values_list("name", flat=True)),
        Quota.objects.count(),
    )


def test_it_sends_anonymous_users_to_log_in(client: Client) -> None:
    r = client.get(PAGE)
    assert r.status_code == 302 and r["Location"].startswith("/accounts/login/")


def test_it_refuses_users_who_are_not_staff(client: Client, alice: User) -> None:
    client.force_login(alice)
    before = snapshot()
    assert client.get(PAGE).status_code == 403
    assert client.post(PAGE, FORM).status_code == 403
    assert client.get(f"/users/{alice.pk}/").status_code == 403
    assert snapshot() == before
    assert f'href="{PAGE}"' not in client.get("/").content.decode()


@pytest.mark.usefixtures("code_root", "nodes", "redis_url", "sent_tasks")
def test_it_lists_users_with_groups_quota_and_usage(admin: Client, alice: User, bob: User) -> None:
    group = Group.objects.create(name="vision")
    alice.groups.add(group)
    set_quota(alice, cpu=8, memory_gb=32, jobs=2)
    submit_job(alice, check_job_request(job_request(instances=3)))
    r = admin.get(PAGE)
    assert r.status_code == 200
    html = r.content.decode()
    rows = {row.user.username: row for row in r.context["rows"]}
    assert rows["alice"].kind == "own" and rows["bob"].kind == "default"
    assert rows["alice"].groups == ["vision"]
    assert rows["alice"].used.cpu == 3 and rows["alice"].used.jobs == 1
    assert re.search(r'data-user="alice" data-quota="own"', html)
    assert re.search(r'data-user="bob" data-quota="default"', html)
    assert '<td class="" data-resource="cpu">3 / 8</td>' in html
    assert f'<td class="" data-resource="cpu">0 / {DEFAULT_QUOTA["cpu"]}</td>' in html
    assert 'data-group="vision"' in html
    assert 'href="/admin/jobs/quota/"' in html
    assert f'href="{PAGE}"' in admin.get("/").content.decode()


def test_it_adds_a_user_with_groups_and_a_quota_of_their_own(admin: Client) -> None:
    vision = Group.objects.create(name="vision")
    r = admin.post(PAGE, dict(FORM, groups=[str(vision.pk)], new_group="speech", is_staff=""))
    assert r.status_code == 302 and r["Location"] == PAGE
    dana = User.objects.get(username="dana")
    assert dana.check_password(FORM["password"]) and dana.email == "dana@example.com"
    assert not dana.is_staff and dana.is_active
    assert sorted(g.name for g in dana.groups.all()) == ["speech", "vision"]
    quota = Quota.objects.get(user=dana)
    assert (quota.cpu, quota.gpus, quota.memory_gb, quota.running_jobs) == (8, 0, 32, 2)
    assert "Added dana." in admin.get(PAGE).content.decode()


def test_it_generates_a_password_and_shows_it_once(admin: Client) -> None:
    form = dict(FORM, password="", own_quota="", is_staff="on")
    r = admin.post(PAGE, form)
    assert r.status_code == 200  # rendered, not redirected: the password is in no URL
    match = re.search(r'id="new-password"[^>]*value="([^"]+)"', r.content.decode())
    assert match
    dana = User.objects.get(username="dana")
    assert dana.check_password(match.group(1)) and dana.is_staff
    assert not Quota.objects.filter(user=dana).exists()  # the default applies
    assert match.group(1) not in admin.get(PAGE).content.decode()


@pytest.mark.parametrize(
    "change, field, message",
    [
        ({"username": "alice"}, "username", "A user named 'alice' exists already."),
        ({"username": "ALICE"}, "username", "exists already"),
        ({"username": "no spaces"}, "username", "Enter a valid username"),
        ({"password": "short"}, "password", "This password is too short"),
        ({"cpu": "-1"}, "cpu", "greater than or equal to 0"),
        ({"memory_gb": ""}, "memory_gb", "Give every limit of the quota"),
        ({"email": "not-an-email"}, "email", "Enter a valid email address."),
        ({"groups": ["999999"]}, "groups", "Select a valid choice."),
    ],
)
def test_a_bad_form_says_why_and_changes_nothing(
    admin: Client, alice: User, change: dict[str, Any], field: str, message: str
) -> None:
    before = snapshot()
    r = admin.post(PAGE, dict(FORM, new_group="would-be-created", **change))
    assert r.status_code == 200
    assert message in " ".join(str(e) for e in r.context["form"].errors[field])
    assert message.replace("'", "&#x27;") in r.content.decode()
    assert snapshot() == before


def test_a_write_that_fails_halfway_leaves_nothing(
    charlie_admin: User, monkeypatch: pytest.MonkeyPatch
) -> None:
    before = snapshot()

    def broken(user: User, limits: users.Limits | None) -> None:
        raise RuntimeError("the database went away")

    monkeypatch.setattr(users, "set_user_quota", broken)
    with pytest.raises(RuntimeError):
        users.create_user("erin", "a-long-password", new_group="speech")
    assert snapshot() == before


def test_it_edits_a_users_groups_staff_and_quota(admin: Client, alice: User) -> None:
    form = {"new_group": "nlp", "is_active": "on", "own_quota": "on",
            "cpu": "4", "gpus": "1", "memory_gb": "16", "running_jobs": "1"}  # fmt: skip
    r = admin.post(f"/users/{alice.pk}/", form)
    assert r.status_code == 302 and r["Location"] == PAGE
    alice.refresh_from_db()
    assert [g.name for g in alice.groups.all()] == ["nlp"] and alice.is_active
    assert Quota.objects.get(user=alice).gpus == 1
    # Unticked: her own quota goes, and the default applies again.
    r = admin.post(f"/users/{alice.pk}/", {"is_active": "on", "groups": []})
    assert r.status_code == 302
    assert not Quota.objects.filter(user=alice).exists()
    assert alice.groups.count() == 0


def test_an_admin_cannot_lock_themselves_out(admin: Client, charlie_admin: User) -> None:
    r = admin.post(f"/users/{charlie_admin.pk}/", {"is_active": ""})
    assert r.status_code == 200
    html = r.content.decode()
    assert "You cannot take away your own staff status." in html
    assert "You cannot deactivate yourself." in html
    charlie_admin.refresh_from_db()
    assert charlie_admin.is_staff and charlie_admin.is_active


def test_it_sets_and_removes_a_groups_quota(admin: Client) -> None:
    group = Group.objects.create(name="vision")
    quota = {"own_quota": "on", "cpu": "16", "gpus": "2", "memory_gb": "64", "running_jobs": "3"}
    assert admin.post(f"/users/groups/{group.pk}/", quota).status_code == 302
    assert Quota.objects.get(group=group).cpu == 16
    assert admin.post(f"/users/groups/{group.pk}/", {}).status_code == 302
    assert not Quota.objects.filter(group=group).exists()
    assert admin.get("/users/groups/999999/").status_code == 404


def test_it_sets_a_groups_default_time_limit_and_refuses_a_bad_one(admin: Client) -> None:
    group = Group.objects.create(name="speech")
    quota = {"own_quota": "on", "cpu": "16", "gpus": "2", "memory_gb": "64", "running_jobs": "3"}
    page = f"/users/groups/{group.pk}/"
    refused = admin.post(page, dict(quota, default_time_limit="soon")).content.decode()
    assert "&#x27;soon&#x27; is not a time limit" in refused
    assert not Quota.objects.filter(group=group).exists()
    assert admin.post(page, dict(quota, default_time_limit="4h")).status_code == 302
    assert Quota.objects.get(group=group).default_time_limit == 4 * 3600
    assert 'value="4 h"' in admin.get(page).content.decode()
    assert admin.post(page, quota).status_code == 302  # emptied: no default
    assert Quota.objects.get(group=group).default_time_limit is None


# --- the default quota ---------------------------------------------------------------------


def default_quota() -> tuple[int, int, int, int]:
    q = Quota.objects.get(is_default=True)
    return q.cpu, q.gpus, q.memory_gb, q.running_jobs


def starter() -> tuple[int, int, int, int]:
    q = DEFAULT_QUOTA
    return q["cpu"], q["gpus"], q["memory_gb"], q["running_jobs"]


def load_catalog(*args: str) -> str:
    out = io.StringIO()
    call_command("load_catalog", *args, stdout=out)
    return out.getvalue()


def test_load_catalog_makes_the_starter_default_quota_without_options() -> None:
    assert default_quota() == starter()
    assert "default quota kept" in load_catalog()
    assert default_quota() == starter()


def test_load_catalog_fits_a_new_default_quota_to_its_options() -> None:
    Quota.objects.filter(is_default=True).delete()
    out = load_catalog("--quota-cpu", "8", "--quota-gpus", "0", "--quota-memory-gb", "32")
    assert "default quota: 8 CPU cores, 0 GPUs, 32 GB" in out
    assert default_quota() == (8, 0, 32, DEFAULT_QUOTA["running_jobs"])


def test_load_catalog_refits_the_starter_default_quota() -> None:
    out = load_catalog("--quota-cpu", "8", "--quota-gpus", "0", "--quota-memory-gb", "32")
    assert "default quota refitted" in out
    assert default_quota() == (8, 0, 32, DEFAULT_QUOTA["running_jobs"])


def test_load_catalog_keeps_a_default_quota_an_admin_changed() -> None:
    Quota.objects.filter(is_default=True).update(cpu=100)
    out = load_catalog("--quota-cpu", "8", "--quota-gpus", "0", "--quota-memory-gb", "32")
    assert "default quota kept" in out
    assert default_quota()[0] == 100


def test_load_catalog_refuses_a_negative_limit() -> None:
    with pytest.raises(CommandError, match="cannot be negative"):
        load_catalog("--quota-cpu", "-1")
    assert default_quota() == starter()


def test_make_run_fits_the_default_quota_to_its_nodes(tmp_path: Path) -> None:
    stack = Stack(var_dir=tmp_path, port=1, nodes=2, node_cpus=4, node_memory_gb=16)
    assert stack.default_quota_options() == []  # the test stacks keep the starter quota
    stack.fit_default_quota = True
    assert stack.default_quota_options() == [
        "--quota-cpu", "8", "--quota-memory-gb", "32", "--quota-gpus", str(detect_gpus()[0]),
    ]  # fmt: skip
