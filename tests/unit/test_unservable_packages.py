"""Packages no quota of the user's or no node could ever serve are offered disabled on the
New-job form, saying why (jobs.services.unservable)."""

import re

import pytest
from django.contrib.auth.models import Group, User
from django.test import Client
from django.utils import timezone

from jobs.models import Node, Quota
from jobs.services.unservable import unservable_packages
from tests.conftest import set_quota

pytestmark = pytest.mark.usefixtures("catalog", "code_root", "redis_url")


def options_of(html: str, select: str) -> dict[str, str]:
    """{value: the <option> tag} of one select on the page."""
    menu = re.search(rf'<select name="{select}".*?</select>', html, re.S)
    assert menu is not None
    return {m[1]: m[0] for m in re.finditer(r'<option value="([^"]*)"[^>]*>[^<]*', menu[0])}


@pytest.mark.usefixtures("nodes")
def test_a_gpu_package_is_disabled_on_a_cpu_only_cluster_and_a_gpu_less_quota(
    client: Client, alice: User
) -> None:
    set_quota(alice, cpu=64, gpus=0, memory_gb=512)
    assert unservable_packages(alice) == {
        "worker-p100x2": "needs 2 GPUs: your quota has 0 GPUs; no node has a GPU"
    }
    client.force_login(alice)
    html = client.get("/jobs/new/").content.decode()
    for select in ("package", "server_package", "worker_package"):
        options = options_of(html, select)
        assert "disabled" in options["worker-p100x2"], select
        assert (
            "unavailable: needs 2 GPUs: your quota has 0 GPUs; no node has a GPU"
            in options["worker-p100x2"]
        )
        assert "disabled" not in options["cpu-1"]


def test_nodes_with_gpus_leave_only_the_quotas_reason(alice: User) -> None:
    Node.objects.create(
        name="gpu-1",
        address="127.0.0.1",
        cpu=16,
        gpus=2,
        memory_gb=128,
        last_heartbeat=timezone.now(),
    )
    set_quota(alice, cpu=8, gpus=4, memory_gb=64)
    assert unservable_packages(alice) == {
        "worker-p100x2": "needs 12 CPU cores: your quota has 8 CPU cores; "
        "needs 120 GB: your quota has 64 GB"
    }


def test_a_group_quota_binds_too(alice: User) -> None:
    team = Group.objects.create(name="team")
    alice.groups.add(team)
    set_quota(alice, cpu=64, gpus=4, memory_gb=512)
    Quota.objects.create(group=team, cpu=64, gpus=1, memory_gb=512, running_jobs=4)
    assert unservable_packages(alice) == {
        "worker-p100x2": "needs 2 GPUs: group team's quota has 1 GPU"
    }


def test_a_node_too_small_for_a_package_says_what_it_needs(alice: User) -> None:
    Node.objects.create(
        name="tiny", address="127.0.0.1", cpu=1, memory_gb=8, last_heartbeat=timezone.now()
    )
    set_quota(alice, cpu=64, gpus=4, memory_gb=512)
    reasons = unservable_packages(alice)
    assert reasons["cpu-2"] == "no node has 2 CPU cores and 4 GB"
    assert "cpu-1" not in reasons


def test_with_no_node_known_yet_the_nodes_are_not_judged(alice: User) -> None:
    set_quota(alice, cpu=64, gpus=4, memory_gb=512)
    assert unservable_packages(alice) == {}
