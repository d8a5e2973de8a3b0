"""One fault at a time, injected into a running stack (real Redis, web server, console worker,
log keeper, node agents and gloo trainers), and what the job says afterwards.

The stack is one of its own (`fault_stack`), with short timings so that a lost node is judged
in seconds, not the production minute. Each job is held open by the test (it runs until a
release file exists), so the fault always lands while it runs. Each test prints the time from
the fault to the right state, which is what the closing note reports.
"""

import json
import re
import signal
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest
import redis

from tests.conftest import (
    RunningStack,
    StackClient,
    process_alive,
    pytorch_request,
    trainer_pids,
    wait_until,
)
from tests.keeper_output import read_output
from workers import contract
from workers.keeper import STATE

pytestmark = pytest.mark.integration

NO_SURVIVOR_SECONDS = 5.0  # the promise: nothing of a dead agent outlives it by more


@pytest.fixture
def faulty(fault_stack: RunningStack) -> RunningStack:
    return fault_stack


def hold_request(name: str, instances: int, release: Path) -> dict[str, Any]:
    return pytorch_request(name, "hold.py", instances, args=["--release", str(release)])


def printed_pids(client: StackClient, job_id: int) -> list[int]:
    """The pids hold.py printed: their count says how many trainers started (their values are
    of the trainers' own PID namespaces)."""
    return [
        int(m.group(1)) for x in client.logs(job_id) if (m := re.search(r" pid=(\d+)$", x["text"]))
    ]


def started(client: StackClient, job_id: int, instances: int) -> list[int]:
    """Until every instance runs and has printed a step; returns the trainers' pids."""
    client.wait(job_id, lambda j: j["state"] == "running")

    def every_rank_stepped() -> list[int] | None:
        lines = client.logs(job_id)
        stepped = {x["text"].split(" ")[0] for x in lines if re.search(r" \d+$", x["text"])}
        if len(stepped) < instances:
            return None
        pids = trainer_pids(job_id)
        return list(pids.values()) if len(pids) == instances else None

    return wait_until("every rank's first step", every_rank_stepped)


def held_cpu(stack: RunningStack) -> dict[str, int]:
    """CPU cores each node holds for jobs, as placement sees it."""
    out = stack.stack.manage(
        "shell",
        "-c",
        "import json; from django.contrib.auth.models import AnonymousUser; "
        "from jobs.services.views.cluster import node_rows; "
        "print(json.dumps({r.node.name: r.used['cpu'] for r in node_rows(AnonymousUser())}))",
    )
    held: dict[str, int] = json.loads(out.strip().splitlines()[-1])
    return held


def no_survivor(pids: list[int]) -> float:
    """Seconds until none of `pids` runs; fails if one outlives NO_SURVIVOR_SECONDS."""
    began = time.monotonic()
    wait_until(
        f"pids {pids} to end", lambda: not any(process_alive(p) for p in pids), NO_SURVIVOR_SECONDS
    )
    return time.monotonic() - began


def check_every_line(client: StackClient, job_id: int, instances: int) -> None:
    """Every rank's steps arrived, each once, in order, up to its 'done' line: none lost."""
    steps: dict[str, list[int]] = defaultdict(list)
    done: dict[str, int] = {}
    for x in client.logs(job_id):
        tag, _, rest = x["text"].partition(" ")
        if rest.isdigit():
            steps[tag].append(int(rest))
        elif rest.startswith("done after "):
            done[tag] = int(rest.removeprefix("done after "))
    assert len(done) == instances, done
    for tag, last in done.items():
        assert steps[tag] == list(range(last)), f"{tag}: lines lost or out of order"


def web_answers(client: StackClient) -> bool:
    try:
        return client.http.get("/healthz").status_code == 200
    except httpx.TransportError:
        return False


def report(fault: str, seconds: float) -> None:
    print(f"\n[fault timing] {fault}: {seconds:.1f} s from the fault to the right state")


# --- a node agent restarts: its keepers hold its trainers, and the new agent takes them over --


def keepers(stack: RunningStack, job_id: int, node: str | None = None) -> dict[str, int]:
    """The live keeper processes of the job's replicas (on `node`), by their folder's name;
    only this stack's (other stacks may run beside it). Found through the state each keeper
    writes in its folder, not its command line: a keeper that was the agent's spare was
    started before it had a folder to name."""
    root = stack.stack.var_dir / "agents"
    found = {}
    for folder in root.glob(f"*/keepers/{job_id}-*"):
        if node not in (None, folder.parent.parent.name):
            continue
        try:
            identity = json.loads((folder / STATE).read_text())["keeper"]
            proc = psutil.Process(int(identity["pid"]))
            same = abs(proc.create_time() - float(identity["create_time"])) < 0.01
            if same and proc.status() != psutil.STATUS_ZOMBIE:  # ended, not yet reaped
                found[folder.name] = proc.pid
        except (OSError, ValueError, KeyError, psutil.Error):
            continue  # not started yet, or ended
    return found


def kept_lines(stack: RunningStack, node: str) -> int:
    """Lines the trainers of `node` printed so far, as their keepers hold them."""
    folders = (stack.stack.var_dir / "agents" / node / "keepers").glob("*/output-*")
    return sum(read_output(path)["out"].count(b"\n") for path in folders)


def metric_points(client: StackClient, job_id: int) -> list[dict[str, Any]]:
    points: list[dict[str, Any]] = []
    after = 0
    while True:
        response = client.http.get(f"/api/v1/jobs/{job_id}/metrics", params={"after": after})
        assert response.status_code == 200, response.text
        page = response.json()
        points.extend(page["points"])
        if not page["points"] or page["next"] == after:
            return points
        after = page["next"]


def replica_nodes(client: StackClient, job_id: int) -> dict[str, str]:
    return {r["tag"]: r["node"] for r in client.job(job_id)["replicas"]}


@pytest.mark.parametrize("how", [signal.SIGKILL, signal.SIGTERM], ids=["kill-9", "SIGTERM"])
def test_a_job_runs_on_through_a_restart_of_its_agent_with_no_line_lost_or_repeated(
    faulty: RunningStack, release: Path, how: signal.Signals
) -> None:
    admin = faulty.admin
    job = admin.submit(hold_request(f"agent restarted ({how.name})", 3, release))
    pids = started(admin, job["id"], 3)
    where = replica_nodes(admin, job["id"])
    node = where["master"]
    # One keeper per replica, and each trainer runs under its own (through its sandbox).
    held = keepers(faulty, job["id"])
    assert len(held) == 3, held
    under = [{a.pid for a in psutil.Process(p).parents()} & set(held.values()) for p in pids]
    assert sorted(k for found in under for k in found) == sorted(held.values()), under

    def five_seconds_of_training_with_no_agent() -> None:
        began, lines = time.monotonic(), kept_lines(faulty, node)
        wait_until(
            "5 s of training while the agent is away",
            lambda: time.monotonic() - began >= 5.0 and kept_lines(faulty, node) > lines + 20,
        )

    down = time.monotonic()
    faulty.stack.restart(node, five_seconds_of_training_with_no_agent, how=how)
    back, back_at = time.monotonic(), time.time()
    before = len(admin.logs(job["id"]))
    wait_until("lines after the restart", lambda: len(admin.logs(job["id"])) > before + 30)
    report(f"{how.name} of {node}'s agent, back after {back - down:.1f} s", time.monotonic() - back)
    assert admin.job(job["id"])["state"] == "running"
    assert all(process_alive(p) for p in pids), "a trainer did not survive its agent's restart"
    assert keepers(faulty, job["id"]) == held

    # The new agent samples the replicas it took over, as the old one did.
    wait_until(
        "the master's metrics after the restart",
        lambda: any(
            p["role"] == "master" and p["ts"] > back_at for p in metric_points(admin, job["id"])
        ),
    )

    release.touch()
    final = admin.wait_finished(job["id"])
    assert final["state"] == "succeeded", final
    check_every_line(admin, job["id"], 3)
    no_survivor(pids)
    wait_until("the keepers to end", lambda: not keepers(faulty, job["id"]))
    assert held_cpu(faulty) == {"node-1": 0, "node-2": 0}


def test_an_agent_that_stays_away_past_the_grace_its_keepers_stop_the_trainers(
    faulty: RunningStack, release: Path
) -> None:
    admin = faulty.admin
    job = admin.submit(hold_request("agent gone for good", 3, release))
    pids = started(admin, job["id"], 3)
    node = replica_nodes(admin, job["id"])["master"]
    held = keepers(faulty, job["id"])
    there = keepers(faulty, job["id"], node)

    def until_the_job_has_failed_and_nothing_is_left() -> None:
        admin.wait(job["id"], lambda j: j["state"] == "failed")
        no_survivor(pids)
        wait_until("every keeper to end", lambda: not keepers(faulty, job["id"]))

    fault = time.monotonic()
    faulty.stack.restart(node, until_the_job_has_failed_and_nothing_is_left, how=signal.SIGKILL)
    report(f"kill -9 of {node}'s agent, gone past the keepers' grace", time.monotonic() - fault)
    final = admin.wait_finished(job["id"])
    assert final["reason"].startswith(f"{node} lost: no heartbeat"), final["reason"]
    log = "\n".join(
        (faulty.stack.var_dir / "agents" / node / "keepers" / name / "keeper.log").read_text()
        for name in there
        if (faulty.stack.var_dir / "agents" / node / "keepers" / name).is_dir()
    )
    assert not log or "no agent claimed it within" in log
    assert set(there) <= set(held)
    assert held_cpu(faulty) == {"node-1": 0, "node-2": 0}


# --- a console process or Redis dies: the running job does not notice ------------------------


@pytest.mark.parametrize("part", ["web", "console-worker", "log-keeper", "redis"])
def test_kill_9_of_a_console_process_leaves_the_running_job_whole(
    faulty: RunningStack, release: Path, part: str
) -> None:
    admin = faulty.admin
    job = admin.submit(hold_request(f"{part} killed", 2, release))
    pids = started(admin, job["id"], 2)
    old_pid = faulty.stack.pid(part)
    faulty.stack.kill(part, signal.SIGKILL)
    fault = time.monotonic()
    faulty.stack.wait_restarted(part, old_pid)
    wait_until("the web server to answer", lambda: web_answers(admin))
    assert all(process_alive(p) for p in pids), "the trainers kept running through it"
    # Training goes on past the restart: new lines still come.
    before = len(admin.logs(job["id"]))
    wait_until("lines after the restart", lambda: len(admin.logs(job["id"])) > before + 10)
    report(f"kill -9 of {part} (back, job still running)", time.monotonic() - fault)
    release.touch()
    final = admin.wait_finished(job["id"])
    assert final["state"] == "succeeded", final["reason"]
    check_every_line(admin, job["id"], 2)
    no_survivor(pids)
    assert held_cpu(faulty) == {"node-1": 0, "node-2": 0}


# --- a frozen agent: its node is lost after the grace, and it cleans up once it thaws --------


def test_a_frozen_agent_loses_its_node_after_the_grace(faulty: RunningStack, release: Path) -> None:
    admin = faulty.admin
    job = admin.submit(hold_request("agent frozen", 3, release))
    pids = started(admin, job["id"], 3)
    node = next(r["node"] for r in admin.job(job["id"])["replicas"] if r["tag"] == "master")
    faulty.stack.kill(node, signal.SIGSTOP)
    fault = time.monotonic()
    try:
        final = admin.wait(
            job["id"], lambda j: j["state"] == "failed" and j["reason"].startswith(node)
        )
        report(f"SIGSTOP of {node}'s agent", time.monotonic() - fault)
        assert re.match(rf"{node} lost: no heartbeat for \d+ s \(master", final["reason"])
        mine = [r for r in final["replicas"] if r["node"] == node]
        assert {r["state"] for r in mine} == {"failed"}
        assert held_cpu(faulty)[node] == 0, "the lost node's capacity is free"
    finally:
        faulty.stack.kill(node, signal.SIGCONT)
    # Thawed, the agent hears its stop (or reconciliation's) and ends what it still ran.
    thawed = time.monotonic()
    wait_until(
        "the thawed agent to stop its trainers", lambda: not any(map(process_alive, pids)), 60
    )
    print(
        "[fault timing] trainers on the thawed node gone "
        f"{time.monotonic() - thawed:.1f} s after SIGCONT"
    )
    admin.wait_finished(job["id"])
    assert held_cpu(faulty) == {"node-1": 0, "node-2": 0}


# --- messages lost at the broker -------------------------------------------------------------


def freeze_agents(stack: RunningStack, broker: redis.Redis) -> None:
    """SIGSTOP both agents, then wait until Redis holds no read of theirs still blocked on
    their queues: a message pushed now stays in the queue instead of going to a frozen one."""
    ports: set[int] = set()
    for node in ("node-1", "node-2"):
        stack.stack.kill(node, signal.SIGSTOP)
        agent = psutil.Process(stack.stack.pid(node))
        ports |= {c.laddr.port for c in agent.net_connections(kind="tcp") if c.raddr}

    def none_blocked() -> bool:
        return not any(
            int(c["addr"].rsplit(":", 1)[1]) in ports and "b" in c["flags"]
            for c in broker.client_list()
        )

    wait_until("the frozen agents' blocked reads to time out", none_blocked)


def thaw_agents(stack: RunningStack) -> None:
    for node in ("node-1", "node-2"):
        stack.stack.kill(node, signal.SIGCONT)


def drop_start_messages(stack: RunningStack, client: StackClient, request: dict[str, Any]) -> int:
    """Submit while both agents are frozen, and delete the start messages from their queues
    before they are read: the broker lost them. Returns the job id; the agents are thawed."""
    broker = redis.Redis.from_url(stack.stack.redis_url, decode_responses=True)
    queues = [contract.node_queue(n) for n in ("node-1", "node-2")]
    freeze_agents(stack, broker)
    try:
        job_id = int(client.submit(request)["id"])
        client.wait(job_id, lambda j: all(r["state"] == "assigned" for r in j["replicas"]))
        wait_until("the start messages in the queues", lambda: sum(map(broker.llen, queues)) > 0)
        dropped = broker.delete(*queues)
        assert dropped, "the start messages were there to drop"
    finally:
        thaw_agents(stack)
    return job_id


def test_a_start_message_dropped_at_the_broker_is_sent_again(
    faulty: RunningStack, release: Path
) -> None:
    admin = faulty.admin
    job_id = drop_start_messages(faulty, admin, hold_request("start dropped", 2, release))
    fault = time.monotonic()
    pids = started(admin, job_id, 2)
    report("start messages dropped at the broker (job running)", time.monotonic() - fault)
    release.touch()
    final = admin.wait_finished(job_id)
    assert final["state"] == "succeeded", final["reason"]
    check_every_line(admin, job_id, 2)
    no_survivor(pids)
    assert held_cpu(faulty) == {"node-1": 0, "node-2": 0}


def test_a_cancel_for_replicas_their_agent_never_heard_of_frees_them(
    faulty: RunningStack, release: Path
) -> None:
    admin = faulty.admin
    broker = redis.Redis.from_url(faulty.stack.redis_url, decode_responses=True)
    queues = [contract.node_queue(n) for n in ("node-1", "node-2")]
    freeze_agents(faulty, broker)
    try:
        job_id = int(admin.submit(hold_request("cancel forgotten", 2, release))["id"])
        admin.wait(job_id, lambda j: all(r["state"] == "assigned" for r in j["replicas"]))
        wait_until("the start messages in the queues", lambda: sum(map(broker.llen, queues)) > 0)
        assert broker.delete(*queues)
        response = admin.http.post(f"/api/v1/jobs/{job_id}/cancel")
        assert response.status_code == 200, response.text
        fault = time.monotonic()
    finally:
        thaw_agents(faulty)
    final = admin.wait_finished(job_id)
    report("cancel of replicas their agents never started (all released)", time.monotonic() - fault)
    assert final["state"] == "cancelled" and final["reason"] == "cancelled by admin"
    assert {r["state"] for r in final["replicas"]} == {"stopped"}
    assert printed_pids(admin, job_id) == [], "nothing of it ever ran"
    assert held_cpu(faulty) == {"node-1": 0, "node-2": 0}
