"""The Django admin, as an administrator uses it in Chromium: the listings of images, packages,
quotas, nodes and jobs show the real rows, and every node action, run from the node listing
(tick a node, choose the action, Go), does what it says to the real nodes and jobs.

Draining and evicting would move other tests' jobs: this module has a stack of its own, with
two nodes of 4 cores and 16 GB."""

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Browser, Page, expect

from tests.browser.conftest import admin_page, keep_screenshot
from tests.conftest import RunningStack, pytorch_request, running_stack, signal_file, wait_until

pytestmark = [pytest.mark.browser, pytest.mark.integration]

NODE_CPUS, NODE_MEMORY_GB = 4, 16  # what running_stack's agents report


@pytest.fixture(scope="module")
def admin_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningStack]:
    with running_stack(tmp_path_factory.mktemp("admin"), nodes=2) as running:
        yield running


@pytest.fixture
def admin(browser: Browser, admin_stack: RunningStack) -> Iterator[Page]:
    with admin_page(browser, admin_stack) as page:
        yield page


def nodes(stack: RunningStack) -> dict[str, dict[str, Any]]:
    return {n["name"]: n for n in stack.admin.http.get("/api/v1/nodes").json()["nodes"]}


def listing(page: Page, stack: RunningStack, model: str) -> list[dict[str, str]]:
    """The rows of an admin changelist, each as {field: cell text}; a yes/no icon is read as
    its alt text ("True" or "False")."""
    page.goto(f"{stack.url}/admin/jobs/{model}/")
    expect(page.locator("#result_list")).to_be_visible()
    return page.locator("#result_list tbody tr").evaluate_all(
        """rows => rows.map(row => Object.fromEntries(
            [...row.querySelectorAll("th, td")]
              .filter(cell => [...cell.classList].some(c => c.startsWith("field-")))
              .map(cell => [
                [...cell.classList].find(c => c.startsWith("field-")).slice(6),
                cell.querySelector("img[alt]")?.alt ?? cell.textContent.trim(),
              ])))"""
    )


def run_node_action(page: Page, stack: RunningStack, node: str, action: str) -> None:
    """Tick the node in the node listing, choose the action, press Go."""
    page.goto(f"{stack.url}/admin/jobs/node/")
    row = page.locator("#result_list tbody tr").filter(
        has=page.locator("th.field-name a", has_text=re.compile(f"^{node}$"))
    )
    row.locator("input.action-select").check()
    page.select_option("select[name=action]", action)
    page.locator("button[name=index]").click()
    page.wait_for_url(f"{stack.url}/admin/jobs/node/")


def status_in_listing(page: Page, node: str) -> str:
    row = page.locator("#result_list tbody tr").filter(
        has=page.locator("th.field-name a", has_text=re.compile(f"^{node}$"))
    )
    return row.locator("td.field-status").inner_text().strip()


def restore_nodes(stack: RunningStack) -> None:
    """Every node ready, advertising what its agent reports."""
    for name in ("node-1", "node-2"):
        assert stack.admin.http.post(f"/api/v1/nodes/{name}/ready").status_code == 200
    stack.stack.manage(
        "shell",
        "-c",
        "from django.db.models import F; from jobs.models import Node; "
        "Node.objects.update(cpu=F('reported_cpu'), gpus=F('reported_gpus'), "
        "memory_gb=F('reported_memory_gb'), capacity_set_by_admin=False)",
    )


def test_the_admin_listings_show_the_real_rows(admin: Page, admin_stack: RunningStack) -> None:
    admin_stack.create_user(
        "olga", "olga-password-1", quota={"cpu": 6, "gpus": 0, "memory_gb": 24, "running_jobs": 2}
    )
    job = admin_stack.admin.submit(pytorch_request("listed", "markup.py", 1))
    job = admin_stack.admin.wait_finished(job["id"])
    assert job["state"] == "succeeded", job["reason"]

    images = listing(admin, admin_stack, "frameworkimage")
    assert sorted((r["name"], r["enabled"]) for r in images) == [
        ("kvstore-ps:2.13", "True"),
        ("pytorch:2.13-cpu", "True"),
    ]
    expect(admin.locator("p.paginator")).to_contain_text("2 framework images")

    packages = {r["name"]: r for r in listing(admin, admin_stack, "package")}
    assert sorted(packages) == ["cpu-1", "cpu-2", "cpu-2-x2", "server-2c12g", "worker-p100x2"]
    assert (packages["cpu-2"]["cpu"], packages["cpu-2"]["memory_gb"]) == ("2", "4")
    assert (packages["cpu-2-x2"]["processes"], packages["cpu-2"]["processes"]) == ("2", "0")
    assert (packages["worker-p100x2"]["gpus"], packages["worker-p100x2"]["gpu_model"]) == (
        "2",
        "P100",
    )

    quotas = {r["__str__"]: r for r in listing(admin, admin_stack, "quota")}
    assert sorted(quotas) == ["default quota", "quota of olga"]
    olga = quotas["quota of olga"]
    assert (olga["cpu"], olga["gpus"], olga["memory_gb"], olga["running_jobs"]) == (
        "6",
        "0",
        "24",
        "2",
    )
    default = quotas["default quota"]
    assert (default["cpu"], default["memory_gb"], default["running_jobs"]) == ("32", "256", "4")

    listed_nodes = listing(admin, admin_stack, "node")
    assert [(n["name"], n["status"], n["cpu"], n["memory_gb"]) for n in listed_nodes] == [
        ("node-1", "ready", str(NODE_CPUS), str(NODE_MEMORY_GB)),
        ("node-2", "ready", str(NODE_CPUS), str(NODE_MEMORY_GB)),
    ]

    jobs = listing(admin, admin_stack, "job")
    # Trainyard's admin, in its colours, where a job cannot be added around the form's checks.
    expect(admin.locator("#site-name")).to_have_text("Trainyard administration")
    expect(admin.locator("#header")).to_have_css("background-color", "rgb(17, 24, 39)")
    expect(admin.locator("a[href$='/jobs/job/add/'], a[href$='/jobs/node/add/']")).to_have_count(0)
    expect(admin.locator("a[href$='/jobs/quota/add/']").first).to_be_visible()  # others stay
    keep_screenshot(admin, "admin-jobs")
    row = next(r for r in jobs if r["id"] == str(job["id"]))
    assert (row["name"], row["owner"], row["image"], row["state"], row["cpu_total"]) == (
        "listed",
        "admin",
        "pytorch:2.13-cpu",
        "Succeeded",  # the state's label
        "1",
    )
    # Its own page in the admin, with its instance.
    admin.locator("#result_list th.field-id a", has_text=re.compile(f"^{job['id']}$")).click()
    expect(admin.locator("h2", has_text=f"job {job['id']} listed")).to_be_visible()
    expect(admin.locator(".field-state .readonly")).to_have_text("Succeeded")


def test_every_node_action_from_the_node_listing(
    admin: Page, admin_stack: RunningStack, tmp_path: Path
) -> None:
    stack = admin_stack
    release = signal_file()
    try:
        # Drain: no new work goes there.
        run_node_action(admin, stack, "node-2", "drain")
        assert status_in_listing(admin, "node-2") == "draining"
        assert {n: x["status"] for n, x in nodes(stack).items()} == {
            "node-1": "ready",
            "node-2": "draining",
        }
        request = pytorch_request(
            "evicted", "hold.py", 2, package="cpu-2", args=["--release", str(release)]
        )
        request["restart"] = {"policy": "on-failure", "max_restarts": 1, "backoff_seconds": 0}
        job = stack.admin.submit(request)
        running = stack.admin.wait(job["id"], lambda j: j["state"] == "running")
        assert {r["node"] for r in running["replicas"]} == {"node-1"}
        assert nodes(stack)["node-2"]["jobs"] == []

        # Return to service.
        run_node_action(admin, stack, "node-2", "return_to_service")
        assert status_in_listing(admin, "node-2") == "ready"
        assert nodes(stack)["node-2"]["status"] == "ready"

        # Drain and evict: the job is stopped on node-1 and starts again on node-2.
        run_node_action(admin, stack, "node-1", "drain_and_evict")
        expect(admin.locator("ul.messagelist li")).to_have_text(
            f"Drained node-1; evicted jobs {job['id']}."
        )
        assert status_in_listing(admin, "node-1") == "draining"
        assert nodes(stack)["node-1"]["status"] == "draining"
        moved = stack.admin.wait(job["id"], lambda j: j["attempt"] == 1 and j["state"] == "running")
        assert {r["node"] for r in moved["replicas"]} == {"node-2"}
        assert moved["attempts"][0]["reason"] == "node-1 drained with eviction by admin"
        assert moved["restarts_used"] == 0  # the platform's doing: no restart used up
        wait_until("node-1 to hold nothing", lambda: nodes(stack)["node-1"]["jobs"] == [])

        run_node_action(admin, stack, "node-1", "return_to_service")
        assert status_in_listing(admin, "node-1") == "ready"
        assert nodes(stack)["node-1"]["status"] == "ready"
        release.touch()
        done = stack.admin.wait_finished(job["id"])
        assert done["state"] == "succeeded", done["reason"]

        # An admin sets node-1's capacity by hand; heartbeats leave it alone...
        admin.goto(f"{stack.url}/admin/jobs/node/")
        admin.locator("#result_list th.field-name a", has_text=re.compile("^node-1$")).click()
        expect(admin.locator(".field-reported_cpu .readonly")).to_have_text(str(NODE_CPUS))
        expect(admin.locator(".field-reported_memory_gb .readonly")).to_have_text(
            str(NODE_MEMORY_GB)
        )
        admin.fill("#id_cpu", "2")
        admin.fill("#id_memory_gb", "8")
        admin.click("input[name=_save]")
        admin.wait_for_url(f"{stack.url}/admin/jobs/node/")
        set_at = nodes(stack)["node-1"]
        assert set_at["capacity"] == {"cpu": 2, "gpus": 0, "memory_gb": 8}

        def after_a_heartbeat() -> dict[str, Any] | None:
            node = nodes(stack)["node-1"]
            return node if node["last_heartbeat"] != set_at["last_heartbeat"] else None

        later = wait_until("a heartbeat of node-1 after the edit", after_a_heartbeat)
        assert later["capacity"] == {"cpu": 2, "gpus": 0, "memory_gb": 8}
        # ...until "use reported capacity" gives it back what the agent reports.
        run_node_action(admin, stack, "node-1", "use_reported_capacity")
        listed = {n["name"]: n for n in listing(admin, stack, "node")}
        assert (listed["node-1"]["cpu"], listed["node-1"]["memory_gb"]) == (
            str(NODE_CPUS),
            str(NODE_MEMORY_GB),
        )
        assert listed["node-1"]["capacity_set_by_admin"] == "False"
        assert nodes(stack)["node-1"]["capacity"] == {
            "cpu": NODE_CPUS,
            "gpus": 0,
            "memory_gb": NODE_MEMORY_GB,
        }
    finally:
        release.touch()
        restore_nodes(stack)
