"""Trainyard across hosts: each node agent in a network namespace of its own, set up as
docs/deploy.md says a cluster is.

- The console (web server, console worker, log keeper) runs with TRAINYARD_ENV=production on
  a fresh PostgreSQL database, with SECRET_KEY_FILE and ALLOWED_HOSTS; Redis asks for a
  password and listens on loopback and on the hosts' bridge.
- Each agent runs from a virtualenv that holds the agent part alone (`pip install '.[agent]'`:
  no Django), started as `trainyard-agent --node ... --address ...` with REDIS_URL in its
  environment; its trainers run with `--trainer-python`, the environment that holds torch.
- Code reaches the hosts as snapshots uploaded through the API, fetched from Redis by each
  agent.

Each host has 2 CPU cores, so jobs of `cpu-2` instances spread one instance per host.
"""

import re
import secrets
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from stack import netns
from stack.redis_server import free_port
from stack.run import ROOT, Stack
from tests.conftest import (
    FAST_FAULTS,
    FIXTURE_CODE_ROOT,
    TERMINAL,
    RunningStack,
    StackClient,
    number_jobs_apart,
    process_alive,
    pytorch_request,
    require_postgres,
    required_here,
    signal_file,
    trainer_pids,
    wait_until,
)
from tests.integration.test_escape import assert_reaches_nothing, run_probe
from tests.snapshots import snapshot_of

pytestmark = [pytest.mark.integration, pytest.mark.postgres]

CODE = Path(__file__).parent.parent / "fixtures" / "cluster_code"
# What the agent-only environment gets of the checkout: the packages and the project file.
AGENT_SOURCES = ("pyproject.toml", "README.md", "console", "jobs", "workers", "stack", "bench")


def require_hosts() -> None:
    required_here("the multi-host tests", netns.unavailable_reason())


@pytest.fixture(scope="module")
def agent_env(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A virtualenv with the agent part of the project alone, as a GPU host installs it
    (docs/deploy.md), at the versions of the development environment (from pip's cache)."""
    where = tmp_path_factory.mktemp("agent-env")
    source = where / "src"
    source.mkdir()
    for name in AGENT_SOURCES:
        item = ROOT / name
        if item.is_dir():
            shutil.copytree(item, source / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(item, source / name)
    pins = where / "pins.txt"
    frozen = subprocess.run(
        [sys.executable, "-m", "pip", "freeze", "--exclude-editable"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    pins.write_text(frozen)
    env = where / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(env)], check=True)
    installed = subprocess.run(
        [str(env / "bin" / "pip"), "install", "--quiet", "-c", str(ROOT / "constraints.txt"),
         "-c", str(pins), f"{source}[agent]"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert installed.returncode == 0, f"pip install '.[agent]' failed:\n{installed.stderr}"
    return env


def runs_without(env: Path, module: str) -> bool:
    """Whether `module` cannot be imported in that environment."""
    probe = subprocess.run(
        [str(env / "bin" / "python"), "-c", f"import {module}"],
        capture_output=True, cwd="/", check=False,
    )  # fmt: skip
    return probe.returncode != 0 and b"ModuleNotFoundError" in probe.stderr


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, agent_env: Path) -> Iterator[RunningStack]:
    require_hosts()
    require_postgres()
    from bench.databases import fresh_postgres

    var_dir = tmp_path_factory.mktemp("cluster")
    key_file = var_dir / "secret_key"
    key_file.write_text(secrets.token_urlsafe(50))
    with fresh_postgres() as database_url:
        stack = Stack(
            var_dir=var_dir,
            port=free_port(),
            nodes=3,
            node_cpus=2,
            node_memory_gb=8,
            redis_password=secrets.token_urlsafe(16),
            hosts_in_namespaces=True,
            agent_command=[str(agent_env / "bin" / "trainyard-agent")],
            trainer_python=sys.executable,
            code_root=FIXTURE_CODE_ROOT,
            extra_env={
                **FAST_FAULTS,
                "TRAINYARD_ENV": "production",
                "DATABASE_URL": database_url,
                "SECRET_KEY_FILE": str(key_file),
                "ALLOWED_HOSTS": "127.0.0.1,localhost",
            },
        )
        try:
            login = stack.prepare()
            number_jobs_apart(stack)
            stack.start()
            yield RunningStack(stack, login.split(" ", 1)[1])
        finally:
            stack.stop()


@pytest.fixture(scope="module")
def user(cluster: RunningStack) -> StackClient:
    return cluster.create_user(
        "hoster",
        "hoster-password",
        quota={"cpu": 64, "gpus": 0, "memory_gb": 256, "running_jobs": 8},
    )


def probe_request(
    name: str, sha: str, instances: int, args: list[str] | None = None
) -> dict[str, Any]:
    request = pytorch_request(name, "probe.py", instances, package="cpu-2", args=args)
    request["program"]["snapshot"] = sha
    return request


def probe_lines(client: StackClient, job_id: int) -> dict[int, dict[str, str]]:
    found = {}
    for line in client.logs(job_id):
        if line["text"].startswith("rank="):
            fields = dict(item.split("=", 1) for item in line["text"].split())
            found[int(fields["rank"])] = fields | {"node": line["node"]}
    return found


def addresses(cluster: RunningStack) -> dict[str, str]:
    network = cluster.stack.network
    assert network is not None
    return {h.node: h.address for h in network.hosts}


def first_line_after(client: StackClient, job_id: int, submitted: float) -> float:
    """Seconds from submission to the job's first line from a trainer."""
    job = client.wait_finished(job_id)
    assert job["state"] == "succeeded", job["reason"]
    first = min(line["ts"] for line in client.logs(job_id))
    return first - submitted


def test_the_agents_run_from_an_environment_without_django(
    cluster: RunningStack, agent_env: Path
) -> None:
    assert runs_without(agent_env, "django") and runs_without(agent_env, "torch")
    for node in ("node-1", "node-2", "node-3"):
        # `ip netns exec` became the agent: its script, run by the environment's Python.
        command = psutil.Process(cluster.stack.pid(node)).cmdline()
        assert Path(command[0]).parent == agent_env / "bin"
        assert command[1] == str(agent_env / "bin" / "trainyard-agent")


def test_a_ddp_job_spans_three_hosts_over_their_own_addresses(
    cluster: RunningStack, user: StackClient
) -> None:
    sha = user.upload(CODE, "probe v1")
    submitted = time.time()
    job = user.submit(probe_request("3 hosts", sha, 3))
    three_hosts = first_line_after(user, job["id"], submitted)
    final = user.job(job["id"])
    nodes = {r["tag"]: r["node"] for r in final["replicas"]}
    assert sorted(nodes.values()) == ["node-1", "node-2", "node-3"], nodes
    where = addresses(cluster)
    master = where[nodes["master"]]
    lines = probe_lines(user, job["id"])
    assert sorted(lines) == [0, 1, 2]
    for rank, fields in lines.items():
        assert fields["master"] == master != "127.0.0.1"
        assert fields["ifname"] == netns.HOST_INTERFACE
        assert (fields["sum"], fields["version"], fields["marker"]) == ("3", "1", "v1")
        # Gloo's connections lead to the other hosts' addresses: the traffic crossed the bridge.
        others = {where[n] for n in nodes.values()} - {where[fields["node"]]}
        assert others <= set(fields["peers"].split(",")), (rank, fields)

    # The same job on one host, for the figure: node-1 gets room for all three, the others
    # are drained meanwhile.
    admin = cluster.admin
    cluster.stack.manage(
        "shell", "-c",
        "from jobs.models import Node; Node.objects.filter(name='node-1')"
        ".update(cpu=6, memory_gb=24, capacity_set_by_admin=True)",
    )  # fmt: skip
    for node in ("node-2", "node-3"):
        assert admin.http.post(f"/api/v1/nodes/{node}/drain", json={}).status_code == 200
    try:
        submitted = time.time()
        alone = user.submit(probe_request("1 host", sha, 3))
        one_host = first_line_after(user, alone["id"], submitted)
        assert {r["node"] for r in user.job(alone["id"])["replicas"]} == {"node-1"}
    finally:
        for node in ("node-2", "node-3"):
            admin.http.post(f"/api/v1/nodes/{node}/ready")
        cluster.stack.manage(
            "shell", "-c",
            "from django.db.models import F; from jobs.models import Node; "
            "Node.objects.update(cpu=F('reported_cpu'), memory_gb=F('reported_memory_gb'), "
            "capacity_set_by_admin=False)",
        )  # fmt: skip
    print(
        f"\n[cluster] time to first training line, 3-instance DDP job: {three_hosts:.2f} s on "
        f"3 hosts, {one_host:.2f} s on 1 host"
    )


def test_a_parameter_server_job_spans_three_hosts(cluster: RunningStack, user: StackClient) -> None:
    request = {
        "name": "ps across hosts",
        "image": "kvstore-ps:2.13",
        "program": {"script": "digits-ps", "args": ["--epochs", "2"]},
        "roles": {
            "server": {"package": "cpu-2", "instances": 2},
            "worker": {"package": "cpu-1", "instances": 2},
        },
        "kvstore": "dist_sync",
    }
    job = user.wait_finished(user.submit(request)["id"])
    assert job["state"] == "succeeded", job["reason"]
    nodes = {r["tag"]: r["node"] for r in job["replicas"]}
    assert len(set(nodes.values())) == 3, nodes
    assert set(nodes) == {"scheduler", "server-0", "server-1", "worker-0", "worker-1"}
    lines = user.logs(job["id"])
    workers = [x for x in lines if re.match(r"worker \d/2 kvstore=dist_sync servers=2", x["text"])]
    assert sorted(x["node"] for x in workers) == sorted([nodes["worker-0"], nodes["worker-1"]])


def test_a_queued_job_runs_the_snapshot_it_was_submitted_with_and_agents_fetch_it_once(
    cluster: RunningStack, user: StackClient, tmp_path: Path
) -> None:
    v1 = user.upload(CODE, "probe v1")
    hold = signal_file()
    holder = user.submit(probe_request("holds a host", v1, 1, args=["--hold", str(hold)]))
    user.wait(holder["id"], lambda j: j["state"] == "running")
    # Three hosts' worth: it waits for the held one.
    waiting = user.submit(probe_request("waits", v1, 3))
    user.wait(waiting["id"], lambda j: j["state"] == "queued" and j["reason"])
    # A new version is uploaded while it waits...
    changed = tmp_path / "code"
    shutil.copytree(CODE, changed)
    (changed / "version.py").write_text('VERSION = "2"\n')
    (changed / "data" / "marker.txt").write_text("v2\n")
    v2 = user.upload(changed, "probe v2")
    assert v2 != v1
    hold.touch()
    finished = user.wait_finished(waiting["id"])
    assert finished["state"] == "succeeded", finished["reason"]
    # ...and it ran what it was submitted with.
    assert {(f["version"], f["marker"]) for f in probe_lines(user, waiting["id"]).values()} == {
        ("1", "v1")
    }
    assert user.wait_finished(holder["id"])["state"] == "succeeded"
    # Each agent read v1 from Redis at most once, however many jobs ran it there. A job's code
    # is unpacked once for all its hosts, in its working folder on the shared root: a host
    # whose peer unpacked it first reads nothing at all.
    fetched = []
    for node in ("node-1", "node-2", "node-3"):
        log = (cluster.stack.var_dir / "logs" / f"{node}.log").read_text()
        count = log.count(f"fetched code snapshot {v1}")
        assert count <= 1, (node, count)
        if count:
            fetched.append(node)
            cached = cluster.stack.var_dir / "agents" / node / "snapshots" / f"{v1}.tar.gz"
            assert cached.read_bytes() == snapshot_of(CODE).archive
    assert fetched, "no agent fetched the snapshot the jobs ran"


def test_a_host_cut_off_the_network_is_a_lost_node(
    cluster: RunningStack, user: StackClient, tmp_path: Path
) -> None:
    network = cluster.stack.network
    assert network is not None
    release = signal_file()
    job = user.submit(
        pytorch_request("cut", "hold.py", 2, package="cpu-2", args=["--release", str(release)])
    )
    running = user.wait(job["id"], lambda j: j["state"] == "running")
    pids = wait_until(
        "both ranks' pids",
        lambda: (
            list(trainer_pids(job["id"]).values())
            if sum(" pid=" in x["text"] for x in user.logs(job["id"])) == 2
            else None
        ),
    )
    worker_node = next(r["node"] for r in running["replicas"] if r["tag"] == "worker-1")
    host = next(h for h in network.hosts if h.node == worker_node)
    network.cut(host)
    try:
        failed = user.wait(job["id"], lambda j: j["state"] in TERMINAL)
        assert failed["state"] == "failed"
        assert re.match(
            rf"{worker_node} lost: no heartbeat for \d+ s \(worker-1", failed["reason"]
        ), failed["reason"]
    finally:
        network.mend(host)
    # Back on the network, its agent hears that the job is over and stops what it still ran.
    wait_until(
        "the cut-off host's trainer to be stopped", lambda: not any(map(process_alive, pids)), 120
    )
    assert user.wait_finished(job["id"])["state"] == "failed"


def test_a_job_reaches_nothing_beyond_itself_on_hosts_of_their_own(
    cluster: RunningStack, tmp_path: Path
) -> None:
    """The escape probe of tests/integration/test_escape.py, on agents in network namespaces
    run from an agent-only virtualenv, with PostgreSQL and a production console."""
    with run_probe(cluster, tmp_path, "cluster") as probe:
        assert_reaches_nothing(probe)
