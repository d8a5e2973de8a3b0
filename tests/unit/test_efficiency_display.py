"""Use against the request (jobs/services/views/efficiency.py) wherever it is shown: the job page,
GET /api/v1/jobs/ID, `trainyard show`, the compare page, the Quotas page for admins, and the
Nodes page saying which nodes cannot measure it. tests/unit/test_job_usage.py has the first
checks; these add the figures of a known case, the CLI, and what users and admins never see."""

from datetime import timedelta
from io import StringIO
from typing import Any

import httpx
import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.utils import timezone
from rich.console import Console

from jobs.models import ApiToken, Job, Node, Quota, Replica
from jobs.services.nodes import node_heartbeat
from jobs.services.submission import check_job_request, submit_job
from jobs.services.views import efficiency
from jobs.services.views.efficiency import InstanceUse, JobUse
from tests.conftest import set_quota
from tests.unit.helpers import SentTasks, job_request
from tests.unit.test_lifecycle import Capture
from trainyard_cli import main as cli
from trainyard_cli import render
from trainyard_cli.client import API, Api
from trainyard_cli.config import Credentials
from workers.contract import PROTOCOL_VERSION

pytestmark = pytest.mark.usefixtures("catalog", "code_root", "redis_url")

HEADLINE = "CPU efficiency 50 %: asked 2 cores, used 1.0 on average; memory peak 1.5 of 4 GB"


def ran(job: Job, cpu_seconds: float, peaks: tuple[int, ...], seconds: float = 100.0) -> None:
    """Its instances (in role order: master, then workers) ended after `seconds` of running,
    each having used `cpu_seconds` and peaked at its entry of `peaks` (bytes)."""
    start = timezone.now() - timedelta(seconds=seconds + 60)
    for replica, peak in zip(job.replicas.order_by("role", "index"), peaks, strict=True):
        Replica.objects.filter(pk=replica.pk).update(
            state=Replica.State.SUCCEEDED,
            started=start,
            finished=start + timedelta(seconds=seconds),
            cpu_seconds=cpu_seconds,
            memory_peak_bytes=peak,
        )


def submit(owner: User, **overrides: Any) -> Job:
    if not Quota.objects.filter(user=owner).exists():
        set_quota(owner, cpu=100, memory_gb=1000, jobs=100)
    return submit_job(owner, check_job_request(job_request(instances=2, **overrides)))


@pytest.fixture
def measured(
    alice: User,
    nodes: list[Node],
    sent_tasks: SentTasks,
    django_capture_on_commit_callbacks: Capture,
) -> Job:
    """Two cpu-1 instances (1 core, 2 GB each) that ran 100 s and used 50 CPU-seconds each:
    half of what they held; memory peaks of 0.5 and 1 GB."""
    with django_capture_on_commit_callbacks(execute=True):
        job = submit(alice)
    ran(job, 50.0, (1 << 29, 1 << 30))
    return job


def token(user: User) -> dict[str, Any]:
    return {"HTTP_AUTHORIZATION": f"Token {ApiToken.issue(user)}"}


# --- the arithmetic ---------------------------------------------------------------------------


def instance(
    tag: str, cores: int, memory_gb: float, seconds: float, cpu: float, peak_gb: float
) -> InstanceUse:
    return InstanceUse(
        tag, "node-1", f"cpu-{cores}", cores, memory_gb, seconds, cpu, int(peak_gb * (1 << 30))
    )


def test_the_headline_says_what_seff_says() -> None:
    # 8 cores held for 1000 s (8000 CPU-seconds), 1840 used: 23 %, 1.84 cores busy on average.
    use = JobUse(
        [instance("master", 4, 8, 1000, 1000, 2.0), instance("worker-1", 4, 8, 1000, 840, 1.1)]
    )
    assert use.headline == (
        "CPU efficiency 23 %: asked 8 cores, used 1.8 on average; memory peak 3.1 of 16 GB"
    )
    assert use.cpu_efficiency == pytest.approx(0.23)
    assert use.memory_efficiency == pytest.approx(3.1 / 16)


def test_instances_that_ran_for_different_times_weigh_by_what_they_held() -> None:
    # 1 core for 100 s fully used, and 1 core for 300 s idle: 100 of 400 CPU-seconds, 25 %.
    use = JobUse([instance("master", 1, 2, 100, 100, 1), instance("worker-1", 1, 2, 300, 0, 0.5)])
    assert use.cpu_efficiency == pytest.approx(0.25)
    assert use.headline.startswith("CPU efficiency 25 %: asked 2 cores, used 1.0 on average")


def test_one_core_is_one_core_and_an_instant_divides_by_nothing() -> None:
    use = JobUse([instance("master", 1, 0.5, 0, 0, 0.25)])
    assert use.headline == (
        "CPU efficiency 0 %: asked 1 core, used 0.0 on average; memory peak 0.2 of 0.5 GB"
    )


def test_the_known_case_in_figures(measured: Job) -> None:
    use = efficiency.of_job(measured)
    assert use is not None
    assert (use.cores_asked, use.cores_used, use.cpu_efficiency) == (2, 1.0, 0.5)
    assert (use.memory_peak_gb, use.memory_asked_gb) == (1.5, 4.0)
    assert use.headline == HEADLINE


# --- the job page and the API -----------------------------------------------------------------


def test_the_api_gives_the_usage_with_each_instance(
    measured: Job, alice: User, client: Client
) -> None:
    usage = client.get(f"/api/v1/jobs/{measured.pk}", **token(alice)).json()["usage"]
    assert usage["summary"] == HEADLINE
    assert (usage["cpu_efficiency"], usage["cores_used"], usage["cores_asked"]) == (0.5, 1.0, 2)
    assert (usage["cpu_seconds"], usage["memory_peak_gb"], usage["memory_asked_gb"]) == (
        100.0,
        1.5,
        4.0,
    )
    assert usage["memory_efficiency"] == 0.375
    by_tag = {i["instance"]: i for i in usage["instances"]}
    assert set(by_tag) == {"master", "worker-1"}
    master = by_tag["master"]
    assert (master["node"], master["package"]) == (
        Replica.objects.get(job=measured, role="master").node.name,  # type: ignore[union-attr]
        "cpu-1",
    )
    assert (master["cores_asked"], master["cores_used"], master["cpu_efficiency"]) == (1, 0.5, 0.5)
    assert (master["seconds"], master["memory_peak_gb"], master["memory_efficiency"]) == (
        100.0,
        0.5,
        0.25,
    )


def test_the_job_page_shows_the_headline_and_a_row_per_instance(
    measured: Job, alice: User, client: Client
) -> None:
    client.force_login(alice)
    html = client.get(f"/jobs/{measured.pk}/").content.decode()
    assert f"<strong>Use</strong> {HEADLINE} " in html
    assert 'id="usage"' in html
    assert '<tr data-instance="master"><td>master</td>' in html
    assert '<tr data-instance="worker-1"><td>worker-1</td>' in html
    assert html.count("<td>cpu-1</td><td>1</td><td>0.50</td><td>50 %</td>") == 2
    assert "<td>0.50 / 2 GB</td><td>1 min 40 s</td>" in html and "<td>1.00 / 2 GB</td>" in html


def test_nothing_ended_yet_says_nothing(
    alice: User, nodes: list[Node], sent_tasks: SentTasks, client: Client
) -> None:
    job = submit(alice)
    assert client.get(f"/api/v1/jobs/{job.pk}", **token(alice)).json()["usage"] is None
    client.force_login(alice)
    html = client.get(f"/jobs/{job.pk}/").content.decode()
    assert 'id="job-usage"' not in html and 'id="usage"' not in html


def test_instances_that_ended_on_nodes_without_limits_say_why_there_is_no_use(
    alice: User,
    nodes: list[Node],
    sent_tasks: SentTasks,
    client: Client,
    django_capture_on_commit_callbacks: Capture,
) -> None:
    with django_capture_on_commit_callbacks(execute=True):
        job = submit(alice)
    assert not job.replicas.filter(node=None).exists()
    # The agent reported no counters: its node holds no instance to its package.
    start = timezone.now() - timedelta(minutes=5)
    job.replicas.update(state=Replica.State.SUCCEEDED, started=start, finished=timezone.now())
    client.force_login(alice)
    html = client.get(f"/jobs/{job.pk}/").content.decode()
    assert "not measured: limits not enforced on its nodes" in html
    # Where the nodes do enforce limits, something else is missing: the page claims nothing.
    Node.objects.update(limits="cgroup-v2")
    html = client.get(f"/jobs/{job.pk}/").content.decode()
    assert 'id="job-usage"' not in html
    # Containers are measured too (their group's counters): no excuse for them either.
    Job.objects.filter(pk=job.pk).update(container_image="registry.example.com/ml/pt:2.13")
    html = client.get(f"/jobs/{job.pk}/").content.decode()
    assert 'id="job-usage"' not in html


# --- trainyard show ---------------------------------------------------------------------------


def console_through(client: Client, user: User) -> Api:
    """The CLI's client, its HTTP requests answered by the test console in-process."""
    secret = ApiToken.issue(user)

    def answer(request: httpx.Request) -> httpx.Response:
        path = request.url.path + (f"?{request.url.query.decode()}" if request.url.query else "")
        reply = client.get(path, HTTP_AUTHORIZATION=f"Token {secret}")
        return httpx.Response(
            reply.status_code,
            content=reply.content,
            headers={"Content-Type": reply.headers.get("Content-Type", "application/json")},
        )

    api = Api(Credentials("http://console.test", secret), retry_seconds=0)
    api.http = httpx.Client(
        base_url="http://console.test" + API, transport=httpx.MockTransport(answer)
    )
    return api


def shown(monkeypatch: pytest.MonkeyPatch, api: Api, job: Job) -> str:
    monkeypatch.setattr(cli, "_api", lambda: api)
    printed = StringIO()
    # Wide enough that no field wraps: what is checked is the words, not the terminal.
    monkeypatch.setattr(render, "out", Console(file=printed, width=250, highlight=False))
    cli.show(job.pk, job_file=False, json_output=False)
    return printed.getvalue()


def test_trainyard_show_prints_the_use(
    measured: Job, alice: User, client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    text = shown(monkeypatch, console_through(client, alice), measured)
    [line] = [line for line in text.splitlines() if line.strip().startswith("Use ")]
    assert line.split(None, 1)[1].strip() == HEADLINE


def test_trainyard_show_of_an_unmeasured_job_says_none(
    alice: User,
    nodes: list[Node],
    sent_tasks: SentTasks,
    client: Client,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    text = shown(monkeypatch, console_through(client, alice), submit(alice))
    [line] = [line for line in text.splitlines() if line.strip().startswith("Use ")]
    assert line.split() == ["Use", "—"]


# --- the compare page -------------------------------------------------------------------------


def test_the_compare_page_and_api_have_a_row_for_cpu_and_for_memory(
    measured: Job, alice: User, client: Client, sent_tasks: SentTasks
) -> None:
    other = submit(alice)
    ids = f"{measured.pk},{other.pk}"
    rows = {
        r["key"]: r
        for r in client.get("/api/v1/compare", {"jobs": ids}, **token(alice)).json()["rows"]
    }
    assert rows["use.cpu"]["values"] == ["50 % (1.0 of 2 cores on average)", "not measured"]
    assert rows["use.memory"]["values"] == ["1.5 of 4 GB", "not measured"]
    assert rows["use.cpu"]["group"] == "Use" and rows["use.cpu"]["differs"]
    client.force_login(alice)
    html = client.get("/compare/", {"jobs": ids}).content.decode()
    assert '<tr data-key="use.cpu" class="differs"><th scope="row">CPU efficiency' in html
    assert (
        "<td><code>50 % (1.0 of 2 cores on average)</code></td><td><code>not measured</code></td>"
        in html
    )
    assert '<tr data-key="use.memory" class="differs"><th scope="row">Memory peak' in html
    assert "<td><code>1.5 of 4 GB</code></td>" in html


# --- the Quotas page --------------------------------------------------------------------------


def test_admins_see_the_least_efficient_job_and_user_and_names_stay_text(
    alice: User,
    bob: User,
    charlie_admin: User,
    nodes: list[Node],
    sent_tasks: SentTasks,
    client: Client,
) -> None:
    busy = submit(alice, name="busy")
    ran(busy, 90.0, (1 << 30, 1 << 30))
    idle = submit(bob, name="<b>idle</b>")
    ran(idle, 10.0, (1 << 28, 1 << 28))
    client.force_login(charlie_admin)
    html = client.get("/quotas/").content.decode()
    assert "<h2>Least efficient in the last day</h2>" in html
    jobs_table = html.split('id="least-efficient-jobs"')[1].split("</table>")[0]
    # The least efficient first, linked to its page; a name is text, never markup.
    assert jobs_table.index(f'data-job="{idle.pk}"') < jobs_table.index(f'data-job="{busy.pk}"')
    assert f'<a href="/jobs/{idle.pk}/">#{idle.pk} &lt;b&gt;idle&lt;/b&gt; (bob)</a>' in jobs_table
    assert "<b>idle</b>" not in html
    assert "CPU efficiency 10 %: asked 2 cores, used 0.2 on average" in jobs_table
    users_table = html.split('id="least-efficient-users"')[1].split("</table>")[0]
    assert users_table.index('data-user="bob"') < users_table.index('data-user="alice"')
    assert "CPU efficiency 90 %" in users_table


def test_jobs_that_ended_over_a_day_ago_are_not_listed(
    measured: Job, charlie_admin: User, client: Client
) -> None:
    a_while_ago = timezone.now() - timedelta(days=2)
    measured.replicas.update(started=a_while_ago - timedelta(seconds=100), finished=a_while_ago)
    assert efficiency.least_efficient() == ([], [])
    client.force_login(charlie_admin)
    assert "Least efficient" not in client.get("/quotas/").content.decode()


# --- the Nodes page ---------------------------------------------------------------------------


def beat(name: str, limits: str, reason: str) -> None:
    node_heartbeat(
        {
            "node": name,
            "address": "127.0.0.1",
            "cpus": 8,
            "gpus": 0,
            "memory_gb": 32,
            "incarnation": f"{name}-1",
            "running": [],
            "finished": [],
            "sent": 0,
            "isolation": "sandbox",
            "isolation_reason": "bubblewrap sandbox",
            "protocol": PROTOCOL_VERSION,
            "limits": limits,
            "limits_reason": reason,
        }
    )


def test_a_node_without_limits_says_so_and_why_where_it_gets_no_work(
    db: None, alice: User, client: Client, settings: Any
) -> None:
    settings.TRAINYARD_ALLOW_UNISOLATED_NODES = False
    beat("node-1", "none", "cgroup v1: <memory> not writable")
    beat("node-2", "cgroup-v2", "cgroup v2: memory, cpu, pids per instance")
    nodes = {n["name"]: n for n in client.get("/api/v1/nodes", **token(alice)).json()["nodes"]}
    assert nodes["node-1"]["status"] == "limits not enforced"
    assert nodes["node-1"]["status_reason"] == (
        "node-1: limits not enforced: cgroup v1: <memory> not writable"
    )
    assert (nodes["node-1"]["limits_enforced"], nodes["node-1"]["limits"]) == (False, "none")
    assert (nodes["node-2"]["status"], nodes["node-2"]["limits"]) == ("ready", "cgroup-v2")
    client.force_login(alice)
    html = client.get("/nodes/").content.decode()
    row = html.split('<tr data-node="node-1">')[1].split("</tr>")[0]
    assert '<span class="state state-limits-not-enforced">limits not enforced</span>' in row
    assert "node-1: limits not enforced: cgroup v1: &lt;memory&gt; not writable" in row
    assert "<memory>" not in html
    assert ">cgroup-v2</span>" in html.split('<tr data-node="node-2">')[1].split("</tr>")[0]
    assert "Nor do nodes that do not enforce limits" in html


def test_an_agent_older_than_limits_shows_unknown(db: None, alice: User, client: Client) -> None:
    node_heartbeat({"node": "old", "address": "127.0.0.1", "cpus": 8, "gpus": 0, "memory_gb": 32})
    [node] = client.get("/api/v1/nodes", **token(alice)).json()["nodes"]
    assert (node["limits_enforced"], node["limits"], node["limits_reason"]) == (
        False,
        "unknown",
        "",
    )
