"""The node agent as a real process: its trainers outlive it only for their keeper's grace, a new
agent takes over what a dead one's keepers hold and cleans up what no keeper holds, heartbeats
say what runs, and SIGUSR2 stops everything soon even with Redis gone."""

import base64
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import celery
import psutil
import pytest
import redis

from tests.conftest import (
    FIXTURE_CODE_ROOT,
    job_processes,
    private_redis,
    process_alive,
    required_here,
)
from tests.keeper_output import read_output
from tests.unit.test_supervisor import spec, texts, tree_pids, wait_until
from workers import agent, cgroups, contract, sandbox

REPO = Path(__file__).resolve().parents[2]
NODE = "t1"


class AgentProcess:
    """An agent; its trainers run outside the sandbox unless `--sandbox` is among `extra`: the
    death signal and the guardian, which these tests are about, are what holds them then (a
    node without bubblewrap). tests/unit/test_sandbox.py has the sandbox's own tests."""

    def __init__(self, redis_url: str, workdir: Path, log_path: Path, *extra: str) -> None:
        if "--sandbox" in extra:
            extra = tuple(e for e in extra if e != "--sandbox")
        else:
            extra = ("--no-sandbox", *extra)
        self.redis_url = redis_url
        self.workdir = workdir
        self.log_path = log_path
        with open(log_path, "ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "workers.agent", "--node", NODE, "--redis-url", redis_url,
                 "--workdir", str(workdir), "--heartbeat-seconds", "1",
                 "--code-root", str(FIXTURE_CODE_ROOT), "--cpus", "2", "--memory-gb", "2",
                 *extra],
                cwd=REPO,
                # As on a GPU host: no Django settings (pytest's would make Celery load Django).
                env={k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"},
                stdout=out,
                stderr=subprocess.STDOUT,
            )  # fmt: skip

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def procs_dir(self) -> Path:
        return self.workdir / NODE / "procs"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def guardian(self) -> int:
        def find() -> int | None:
            for child in psutil.Process(self.pid).children():
                if "workers.guardian" in child.cmdline():
                    return child.pid
            return None

        wait_until(find, 30, f"agent {self.pid} to start its guardian")
        pid = find()
        assert pid is not None
        return pid

    def start_replica(self, script: str, job_id: int) -> None:
        app = celery.Celery(broker=self.redis_url)
        app.send_task(
            contract.TASK_START_REPLICA,
            kwargs={"spec": spec(script, job_id=job_id, node=NODE).to_dict()},
            queue=contract.node_queue(NODE),
        )
        app.close()


class Agents:
    """Agents this test starts, and pids it learns; at the end, what is left dies by pid."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.started: list[AgentProcess] = []
        self.pids: list[int] = []

    def start(self, redis_url: str, workdir: Path, *extra: str) -> AgentProcess:
        log_path = self.tmp_path / f"agent-{len(self.started)}.log"
        started = AgentProcess(redis_url, workdir, log_path, *extra)
        self.started.append(started)
        return started

    def clean_up(self) -> None:
        for started in self.started:
            if started.proc.poll() is None:
                self.pids.append(started.guardian())
                started.proc.kill()
            started.proc.wait()
        for pid in self.pids:
            if process_alive(pid):
                os.kill(pid, signal.SIGKILL)
        # An agent killed by SIGKILL leaves its node's cgroup folders and its instances' (empty
        # once their processes are dead): they go here, not a few more per test in every
        # hierarchy of the machine, as its next start would sweep them.
        for workdir in {started.workdir.resolve() / NODE for started in self.started}:
            left = cgroups.probe(NODE, str(workdir), try_it=False)
            if left.enforced:
                left.sweep()
                left.remove_node_folders()


@pytest.fixture
def agents(tmp_path: Path) -> Iterator[Agents]:
    made = Agents(tmp_path)
    yield made
    made.clean_up()


@pytest.fixture
def client(redis_server: str) -> Iterator[redis.Redis]:
    c = redis.Redis.from_url(redis_server, decode_responses=True)
    c.flushdb()
    yield c


def heartbeats(client: redis.Redis) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(headers, payload) of the heartbeats waiting in the console's queue (kombu's Redis
    transport keeps each message as JSON with a base64 body)."""
    found = []
    for raw in client.lrange(contract.CONSOLE_QUEUE, 0, -1):
        message = json.loads(raw)
        if message["headers"]["task"] != contract.TASK_NODE_HEARTBEAT:
            continue
        _, kwargs, _ = json.loads(base64.b64decode(message["body"]))
        found.append((message["headers"], kwargs["payload"]))
    return found


def reports(client: redis.Redis, task: str) -> list[dict[str, Any]]:
    """The payloads of the `task` reports waiting in the console's queue, oldest first."""
    found = []
    for raw in reversed(client.lrange(contract.CONSOLE_QUEUE, 0, -1)):
        message = json.loads(raw)
        if message["headers"]["task"] == task:
            _, kwargs, _ = json.loads(base64.b64decode(message["body"]))
            found.append(kwargs["payload"])
    return found


def keeper_of(node: AgentProcess) -> int:
    """The pid of the one keeper the node's agent started."""
    states = list((node.workdir / NODE / "keepers").glob("*/state.json"))
    wait_until(lambda: list((node.workdir / NODE / "keepers").glob("*/state.json")), 30, "keeper")
    [state] = list((node.workdir / NODE / "keepers").glob("*/state.json")) or states
    pid: int = json.loads(state.read_text())["keeper"]["pid"]
    return pid


def test_a_trainer_outlives_a_killed_agent_only_for_its_keepers_grace(
    redis_server: str, client: redis.Redis, agents: Agents, tmp_path: Path
) -> None:
    node = agents.start(redis_server, tmp_path / "work", "--keeper-grace", "2")
    node.start_replica("sleep_tree.py", job_id=41)
    trainer, child = tree_pids(client, 41)
    keeper = keeper_of(node)
    agents.pids += [trainer, child, keeper]
    guardian = node.guardian()
    assert [json.loads(p.read_text())["pid"] for p in node.procs_dir.iterdir()] == [trainer]

    os.kill(node.pid, signal.SIGKILL)
    node.proc.wait()

    wait_until(lambda: not process_alive(guardian), 5, "the guardian to finish")
    # The guardian spared the group its keeper holds: a new agent could still take it over.
    assert process_alive(trainer) and process_alive(child) and process_alive(keeper)
    wait_until(
        lambda: not any(map(process_alive, (trainer, child, keeper))),
        2 + 5 + 5,  # the grace, the keeper's SIGTERM-to-SIGKILL, some slack
        f"keeper {keeper} to stop trainer {trainer} and its child {child}, and end",
    )
    assert list(node.procs_dir.iterdir()) == []
    assert (
        "no agent claimed it within 2 s"
        in next(node.workdir.glob("*/keepers/*/keeper.log")).read_text()
    )


def test_a_sandboxed_trainer_and_all_it_started_end_with_its_keepers_grace(
    redis_server: str, client: redis.Redis, agents: Agents, tmp_path: Path
) -> None:
    """bubblewrap dies with the keeper's stop, and its PID namespace with it: the trainer and
    its child, group or no group."""
    if not sandbox.probe().isolation.isolated:
        required_here("the sandbox tests", "this host cannot sandbox")
    node = agents.start(redis_server, tmp_path / "work", "--sandbox", "--keeper-grace", "1")
    node.start_replica("sleep_tree.py", job_id=44)
    wait_until(lambda: texts(client, 44), 60, "the trainer to print")
    # bubblewrap's two processes, the trainer, and the child it started: the keeper's tree
    # (bubblewrap runs with an environment of the agent's, not the job's).
    keeper = keeper_of(node)
    tree = lambda: psutil.Process(keeper).children(recursive=True)  # noqa: E731
    wait_until(lambda: len(tree()) == 4, 30, "the sandbox, trainer and child")
    held = tree()
    assert len(job_processes(44)) == 2  # the trainer and its child have the job's variables
    agents.pids += [p.pid for p in held] + [keeper]
    wait_until(lambda: heartbeats(client), 30, "a heartbeat")
    assert heartbeats(client)[-1][1]["isolation"] in ("sandbox", "sandbox-shared-uid")

    os.kill(node.pid, signal.SIGKILL)
    node.proc.wait()  # dead and reaped: the clean-up at the end must not take it for living

    wait_until(
        lambda: not [p for p in held if p.is_running() and p.status() != psutil.STATUS_ZOMBIE],
        1 + 5 + 10,
        "everything of job 44 to end",
    )


def test_a_new_agent_kills_what_a_dead_keeper_and_its_guardian_left(
    redis_server: str, client: redis.Redis, agents: Agents, tmp_path: Path
) -> None:
    first = agents.start(redis_server, tmp_path / "work")
    first.start_replica("sleep_tree.py", job_id=42)
    trainer, child = tree_pids(client, 42)
    keeper = keeper_of(first)
    agents.pids += [trainer, child, keeper]
    os.kill(first.guardian(), signal.SIGKILL)
    os.kill(first.pid, signal.SIGKILL)
    os.kill(keeper, signal.SIGKILL)
    wait_until(lambda: not process_alive(trainer), 5, "the trainer to die of its death signal")
    assert process_alive(child)  # in the trainer's group: only a reaper can reach it now

    second = agents.start(redis_server, tmp_path / "work")

    line = f"cleaned up 1 process left by an earlier agent: job 42 master pid {child}"
    wait_until(lambda: line in second.log(), 60, f"the new agent to log {line!r}")
    assert not process_alive(child)
    assert list(second.procs_dir.iterdir()) == []
    # The replica it found is reported failed: its keeper is gone, and its outcome with it.
    wait_until(lambda: reports(client, contract.TASK_REPLICA_EXITED), 30, "the exit report")
    [exited] = reports(client, contract.TASK_REPLICA_EXITED)
    assert exited["state"] == "failed" and "keeper" in exited["reason"], exited
    # And an agent asked to stop ends, with its guardian.
    guardian = second.guardian()
    wait_until(lambda: f"agent@{NODE} ready" in second.log(), 60, "the agent to take tasks")
    second.proc.send_signal(signal.SIGTERM)
    assert second.proc.wait(30) == 0
    wait_until(lambda: not process_alive(guardian), 5, "the guardian to end with its agent")


@pytest.mark.parametrize("how", [signal.SIGKILL, signal.SIGTERM], ids=["SIGKILL", "SIGTERM"])
def test_a_new_agent_takes_over_a_replica_and_ships_every_line_once(
    how: signal.Signals, redis_server: str, client: redis.Redis, agents: Agents, tmp_path: Path
) -> None:
    """An agent killed (or stopped with SIGTERM, as for a restart) mid-job: the next one on the
    same work dir takes the replica over from its keeper, ships the lines printed meanwhile
    and reports the exit; no line is lost or sent twice."""
    lines = 300
    first = agents.start(redis_server, tmp_path / "work")
    app = celery.Celery(broker=redis_server)
    app.send_task(
        contract.TASK_START_REPLICA,
        kwargs={
            "spec": spec(
                "numbered.py", job_id=45, node=NODE, args=["--lines", str(lines), "--rate", "60"]
            ).to_dict()
        },
        queue=contract.node_queue(NODE),
    )
    app.close()
    wait_until(lambda: len(texts(client, 45)) > 20, 60, "the first lines in Redis")
    keeper = keeper_of(first)
    agents.pids.append(keeper)
    first.proc.send_signal(how)
    first.proc.wait(30)
    out = next((first.workdir / NODE / "keepers").glob("*/output-0"))
    shipped = len(texts(client, 45))
    wait_until(
        lambda: b"".join(read_output(out).values()).count(b"\n") > shipped + 20,
        30,
        "lines printed with no agent",
    )
    assert process_alive(keeper)

    second = agents.start(redis_server, tmp_path / "work")

    wait_until(lambda: reports(client, contract.TASK_REPLICA_EXITED), 60, "the exit report")
    [exited] = reports(client, contract.TASK_REPLICA_EXITED)
    assert (exited["state"], exited["exit_code"]) == ("succeeded", 0), exited
    assert not exited["incarnation"].startswith(f"{first.pid}-")
    # The trainer's lines only: the stream also carries the agent's notes and samples.
    printed = [t for t in texts(client, 45) if t.startswith("master-0 ")]
    assert sorted(printed, key=lambda t: int(t.split()[1])) == [
        f"master-0 {i}" for i in range(lines)
    ]
    assert "took over from an earlier agent: 45/master" in second.log()
    wait_until(lambda: not process_alive(keeper), 10, "the keeper to end once released")
    # The keeper's files are the agent's copy of the lines until the log keeper has them in
    # the database (none runs here: the test acknowledges what the exit report says it owes,
    # as the log keeper does once it has archived them); then they go.
    kept = second.workdir / NODE / "keepers"
    assert exited["log_ends"] and list(kept.iterdir())
    client.hset(contract.log_ack_key(45), mapping=exited["log_ends"])
    wait_until(lambda: list(kept.iterdir()) == [], 10, "the keeper's files to go once acknowledged")


def test_heartbeats_say_what_the_agent_runs(
    redis_server: str, client: redis.Redis, agents: Agents, tmp_path: Path
) -> None:
    node = agents.start(redis_server, tmp_path / "work")
    node.start_replica("sleep_tree.py", job_id=43)
    trainer, child = tree_pids(client, 43)
    agents.pids += [trainer, child]

    def beat_with_the_trainer() -> tuple[dict[str, Any], dict[str, Any]] | None:
        return next(
            (
                (h, p)
                for h, p in heartbeats(client)
                if [r["pids"] for r in p["running"]] == [[trainer]]
            ),
            None,
        )

    wait_until(beat_with_the_trainer, 30, "a heartbeat that lists the trainer")
    found = beat_with_the_trainer()
    assert found is not None
    headers, payload = found
    assert payload["running"] == [
        {
            "job_id": 43,
            "attempt": 0,
            "role": "master",
            "index": 0,
            "state": "running",
            "pids": [trainer],
        }
    ]
    assert payload["finished"] == []
    assert payload["node"] == NODE and payload["pid"] == node.pid
    assert payload["incarnation"].startswith(f"{node.pid}-")
    assert headers["expires"]  # a stale heartbeat is dropped, not delivered late


def test_an_agent_asked_to_stop_its_trainers_ends_soon_even_with_redis_gone(
    agents: Agents, tmp_path: Path
) -> None:
    with private_redis(tmp_path / "redis") as (url, redis_proc):
        client = redis.Redis.from_url(url, decode_responses=True)
        node = agents.start(url, tmp_path / "work", "--stop-timeout", "8")
        node.start_replica("stubborn.py", job_id=44)  # ignores SIGTERM: only SIGKILL ends it
        wait_until(lambda: "tick 1" in texts(client, 44), 30, "the trainer's lines in Redis")
        [trainer] = [json.loads(p.read_text())["pid"] for p in node.procs_dir.iterdir()]
        agents.pids.append(trainer)
        redis_proc.terminate()
        redis_proc.wait(10)

        node.proc.send_signal(signal.SIGUSR2)  # stop the trainers too, not only the agent

        try:
            node.proc.wait(8 + 2)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the agent did not end within its stop timeout:\n{node.log()[-3000:]}")
        assert not process_alive(trainer)
        assert list(node.procs_dir.iterdir()) == []
        assert f"agent {NODE} stopped" in node.log()


def test_the_heartbeat_interval_comes_from_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert agent.parse_args(["--redis-url", "redis://x"]).heartbeat_seconds == 5.0
    monkeypatch.setenv(agent.HEARTBEAT_SECONDS_ENV, "2.5")
    args = agent.parse_args(["--redis-url", "redis://x"])
    assert (args.heartbeat_seconds, args.stop_timeout) == (2.5, 20.0)


def test_a_second_agent_on_the_same_work_dir_refuses_to_start(
    redis_server: str, agents: Agents, tmp_path: Path
) -> None:
    # It would take the first agent's trainers for an earlier agent's leftovers, and kill them.
    first = agents.start(redis_server, tmp_path / "work")
    wait_until(lambda: f"agent@{NODE} ready" in first.log(), 60, "the first agent to take tasks")

    second = agents.start(redis_server, tmp_path / "work")

    assert second.proc.wait(30) != 0
    assert f"another agent already runs on {tmp_path / 'work' / NODE}" in second.log()
    assert first.proc.poll() is None
