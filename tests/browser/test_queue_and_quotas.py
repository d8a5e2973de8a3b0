"""A person's view of admission: a job that waits says why and where it stands; the quota
page shows use against limits."""

import re

import pytest
from playwright.sync_api import Browser, Page, expect

from tests.browser.conftest import keep_screenshot, user_page
from tests.conftest import RunningStack, pytorch_request, wait_until

pytestmark = [pytest.mark.browser, pytest.mark.integration]


def nodes_idle(stack: RunningStack) -> bool:
    nodes = stack.admin.http.get("/api/v1/nodes").json()["nodes"]
    return all(not node["jobs"] for node in nodes)


def test_a_queued_job_shows_its_reason_and_position_then_starts(
    browser: Browser, stack: RunningStack
) -> None:
    # The reason names what each node frees, which holds only on idle nodes: the shared
    # stack's other tests end their jobs, and this one waits until they have (its own user
    # makes sure no quota of theirs is in the way either).
    wait_until("the shared nodes to be idle before this test fills them", lambda: nodes_idle(stack))
    tess = stack.create_user(
        "tess", "tess-password-1", quota={"cpu": 16, "gpus": 0, "memory_gb": 64, "running_jobs": 4}
    )
    # 3 x 2 cores on two nodes of 4: node-1 full, node-2 has 2 cores left.
    blocker = tess.submit(pytorch_request("blocker", "sleep_tree.py", 3, package="cpu-2"))
    tess.wait(blocker["id"], lambda j: j["state"] == "running")
    waiting = tess.submit(pytorch_request("waits", "sleep_tree.py", 2, package="cpu-2"))
    job = tess.wait(waiting["id"], lambda j: j["reason"].startswith("waiting:"))
    assert job["queue_position"] == 1
    # The node the reason names frees all the blocker holds there: 2 cores an instance.
    named = re.search(r"(node-\d) frees", job["reason"])
    assert named, job["reason"]
    held = sum(r["node"] == named.group(1) for r in tess.job(blocker["id"])["replicas"])
    with user_page(browser, stack, "tess", "tess-password-1") as page:
        page.goto(f"{stack.url}/jobs/{waiting['id']}/")
        expect(page.locator("#job-state")).to_have_text("queued")
        expect(page.locator("#queue-position")).to_have_text("Position in the queue: 1")
        expect(page.locator("#job-reason")).to_have_text(
            re.compile(
                r"^waiting: needs a node with 2 CPU cores and 4 GB free; "
                rf"{named.group(1)} frees {2 * held} CPU cores when job {blocker['id']} ends$"
            )
        )

        assert tess.http.post(f"/api/v1/jobs/{blocker['id']}/cancel").status_code == 200
        # Freed room admits the waiting job, and the page follows without a reload.
        expect(page.locator("#job-state")).to_have_text("running")
        expect(page.locator("#queue-position")).to_be_hidden()
        assert tess.http.post(f"/api/v1/jobs/{waiting['id']}/cancel").status_code == 200
        tess.wait_finished(waiting["id"])
        tess.wait_finished(blocker["id"])


def test_the_quota_page_shows_each_users_use_against_the_limit(
    page: Page, stack: RunningStack
) -> None:
    quinn = stack.create_user(
        "quinn", "quinn-password-1", quota={"cpu": 2, "gpus": 0, "memory_gb": 8, "running_jobs": 2}
    )
    job = quinn.submit(pytorch_request("quinn's", "sleep_tree.py", 1, package="cpu-2"))
    refused = quinn.http.post("/api/v1/jobs", json=pytorch_request("more", "markup.py", 1))
    assert refused.status_code == 400
    assert refused.json()["errors"]["quota"][0].startswith("Over quota on CPU cores")

    page.goto(f"{stack.url}/quotas/")
    row = page.locator("#quotas tr[data-name=quinn]")
    expect(row.locator("td[data-resource=cpu]")).to_have_text("2 / 2")
    expect(row.locator("td[data-resource=cpu]")).to_have_class("full")
    expect(row.locator("td[data-resource=jobs]")).to_have_text("1 / 2")
    expect(page.locator("#quotas tr[data-name=admin]")).to_be_visible()
    quinn.http.post(f"/api/v1/jobs/{job['id']}/cancel")
    quinn.wait_finished(job["id"])

    page.goto(f"{stack.url}/nodes/")
    expect(page.locator("#nodes tr[data-node=node-1] .state")).to_have_text("ready")
    expect(page.locator("#nodes tr[data-node=node-2] .state")).to_have_text("ready")
    # A heartbeat a few seconds old says so in seconds (Django's timesince said "0 minutes").
    beat = page.locator("#nodes tr[data-node=node-1] td.heartbeat")
    expect(beat).to_have_text(re.compile(r"^\d+ s ago$"))
    expect(page.locator("#nodes tr[data-node=node-1] td.node-name")).to_have_css(
        "white-space", "nowrap"
    )
    expect(page.locator("#node-timing")).to_contain_text("heartbeat for")
    keep_screenshot(page, "nodes")
