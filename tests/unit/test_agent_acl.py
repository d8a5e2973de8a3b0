"""Each node agent's own Redis ACL user, on a real redis-server with a password: what node-1's
agent may do (its queue, reports, its jobs' keys, snapshots) and what it may not (anything of
node-2, of another job, of the console, or of the whole server)."""

import io
import json
import secrets
import signal
import subprocess
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import kombu
import pytest
import redis
from django.contrib.auth.models import User
from django.core.management import CommandError, call_command
from django.test import Client
from django.utils import timezone

from jobs.models import AgentCredential, Job, Node, Replica
from jobs.redis_client import get_redis
from jobs.services import agent_access
from jobs.services.lifecycle import reports
from jobs.services.reconcile import ReconcileLoop
from jobs.services.submission import check_job_request, submit_job
from stack.redis_server import wait_for_redis
from tests.conftest import private_redis
from tests.unit.helpers import SentTasks, job_request, stream_entries
from workers import contract, credentials, logship
from workers.agent import Heartbeat, make_celery
from workers.logship import LogShipper, ReplicaKey
from workers.logsink import LogBatch, LogSink

JOB = 5  # granted to node-1
OTHER_JOB = 6  # granted to node-2
SNAPSHOT = "ab" * 32

Capture = Callable[..., Any]


@pytest.fixture(scope="module")
def admin_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A Redis of its own that asks for a password, as `make run`'s does."""
    with private_redis(tmp_path_factory.mktemp("acl-redis"), secrets.token_hex(16)) as (url, _):
        yield url


def agent_url_for(admin_url: str, node: str, secret: str) -> str:
    port = redis.Redis.from_url(admin_url).connection_pool.connection_kwargs["port"]
    return credentials.agent_url(node, secret, "127.0.0.1", port)


@pytest.fixture(scope="module")
def agent_urls(admin_url: str) -> dict[str, str]:
    """node-1 and node-2 with credentials; node-1 runs job 5, node-2 job 6 (the rules written
    as the console writes them)."""
    admin = redis.Redis.from_url(admin_url)
    urls = {}
    for node, job in (("node-1", JOB), ("node-2", OTHER_JOB)):
        secret = credentials.new_secret()
        rules = credentials.acl_rules(node, credentials.password_hash(secret), {job})
        admin.execute_command("ACL", "SETUSER", credentials.user_of(node), *rules)
        urls[node] = agent_url_for(admin_url, node, secret)
    return urls


@pytest.fixture
def admin(admin_url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(admin_url, decode_responses=True)
    client.flushdb()
    client.rpush("node.node-2", "a start spec of node-2")
    client.hset("unacked.node.node-2", "tag", "an unacked start spec of node-2")
    client.rpush(contract.CONSOLE_QUEUE, "a report of node-2")
    client.set(contract.snapshot_key(SNAPSHOT), b"archive bytes")
    client.xadd(contract.log_stream_key(OTHER_JOB), {"l": "secret line of job 6"}, id="1-0")
    client.set("asgi:group:job-6", "channel layer")
    yield client
    client.close()


@pytest.fixture
def node_1(agent_urls: dict[str, str], admin: redis.Redis) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(agent_urls["node-1"], decode_responses=True)
    yield client
    client.close()


def refused(call: Callable[[], object]) -> bool:
    try:
        call()
    except redis.exceptions.NoPermissionError:
        return True
    return False


def test_it_cannot_take_read_or_push_onto_another_nodes_queue(
    node_1: redis.Redis, admin: redis.Redis
) -> None:
    assert refused(lambda: node_1.brpop(["node.node-2"], timeout=1))
    assert refused(lambda: node_1.rpop("node.node-2"))
    assert refused(lambda: node_1.lrange("node.node-2", 0, -1))
    assert refused(lambda: node_1.lpush("node.node-2", "forged start"))
    assert refused(lambda: node_1.lpush("node.node-2\x06\x163", "forged start"))
    assert admin.lrange("node.node-2", 0, -1) == ["a start spec of node-2"]


def test_it_cannot_read_another_nodes_unacked_messages(node_1: redis.Redis) -> None:
    assert refused(lambda: node_1.hgetall("unacked.node.node-2"))
    assert refused(lambda: node_1.hget("unacked.node.node-2", "tag"))
    assert refused(lambda: node_1.hget("unacked", "tag"))  # kombu's shared default


def test_it_cannot_read_another_jobs_log(node_1: redis.Redis) -> None:
    assert refused(lambda: node_1.xrange(contract.log_stream_key(OTHER_JOB)))
    assert refused(lambda: node_1.get(contract.rendezvous_key(OTHER_JOB)))


def test_it_cannot_write_another_jobs_log(node_1: redis.Redis, admin: redis.Redis) -> None:
    batch = LogBatch(OTHER_JOB, "master", 0, "node-1", "o", 1.0, ["forged"], "w", 1)
    assert refused(lambda: LogSink(node_1).append([batch]))
    assert refused(lambda: node_1.xadd(contract.log_stream_key(OTHER_JOB), {"l": "forged"}))
    assert refused(lambda: node_1.set(contract.rendezvous_key(OTHER_JOB), 1234))
    assert len(stream_entries(admin, OTHER_JOB)) == 1


def test_it_cannot_read_the_console_queue(node_1: redis.Redis, admin: redis.Redis) -> None:
    assert refused(lambda: node_1.lrange(contract.CONSOLE_QUEUE, 0, -1))
    assert refused(lambda: node_1.brpop([contract.CONSOLE_QUEUE], timeout=1))
    assert refused(lambda: node_1.rpop(contract.CONSOLE_QUEUE))
    assert refused(lambda: node_1.delete(contract.CONSOLE_QUEUE))
    assert admin.lrange(contract.CONSOLE_QUEUE, 0, -1) == ["a report of node-2"]


def test_it_cannot_touch_the_console_channel_layer(node_1: redis.Redis) -> None:
    assert refused(lambda: node_1.get("asgi:group:job-6"))
    assert refused(lambda: node_1.zadd("asgi:group:job-6", {"x": 1}))
    assert refused(lambda: node_1.publish("asgi:group:job-6", "x"))
    # On a plain connection: an allowed one would answer with its confirmation.
    assert refused(lambda: node_1.execute_command("SUBSCRIBE", "asgi:group:job-6"))
    assert refused(lambda: node_1.execute_command("PSUBSCRIBE", "*"))


@pytest.mark.parametrize(
    "command",
    [
        ("FLUSHALL",),
        ("FLUSHDB",),
        ("CONFIG", "GET", "*"),
        ("CONFIG", "SET", "requirepass", ""),
        ("ACL", "LIST"),
        ("ACL", "SETUSER", "agent-node-1", "+@all", "~*"),
        ("KEYS", "*"),
        ("SCAN", "0"),
        ("SCRIPT", "FLUSH"),
        ("CLIENT", "LIST"),
        ("CLIENT", "KILL", "USER", "default"),
        ("SAVE",),
        ("MONITOR",),
        ("SHUTDOWN",),
    ],
    ids=lambda c: " ".join(c[:2]),
)
def test_it_cannot_run_server_wide_commands(
    node_1: redis.Redis, admin: redis.Redis, command: tuple[str, ...]
) -> None:
    assert refused(lambda: node_1.execute_command(*command))
    assert admin.exists(contract.CONSOLE_QUEUE)


def test_it_can_log_to_its_own_jobs_keys_through_the_script(
    node_1: redis.Redis, admin: redis.Redis
) -> None:
    sink = LogSink(node_1)
    batch = LogBatch(JOB, "master", 0, "node-1", "o", 1.0, ["one", "two"], "w", 1)
    assert sink.append([batch]) == [2]
    assert sink.append([batch]) == [-1]  # the script's "seen" check works under the ACL too
    node_1.set(contract.rendezvous_key(JOB, 1), 29500)
    assert node_1.get(contract.rendezvous_key(JOB, 1)) == "29500"
    assert [e[1]["l"] for e in stream_entries(admin, JOB)] == ["one\ntwo"]


def test_it_can_read_snapshots_but_not_write_them(
    agent_urls: dict[str, str], admin: redis.Redis
) -> None:
    client = redis.Redis.from_url(agent_urls["node-1"])
    key = contract.snapshot_key(SNAPSHOT)
    assert client.exists(key)
    assert client.getrange(key, 0, 6) == b"archive"
    assert refused(lambda: client.set(key, b"forged code"))
    assert refused(lambda: client.append(key, b"forged code"))


def test_it_consumes_its_own_queue_and_reports_to_the_console_through_celery(
    agent_urls: dict[str, str], admin_url: str, admin: redis.Redis
) -> None:
    """A real kombu round trip: the console sends a start to node-1's queue; node-1's agent
    takes it (kombu's unacked bookkeeping under its own keys), acks it, and reports back."""
    admin.delete(contract.CONSOLE_QUEUE)
    console = make_celery(admin_url)
    start = {"spec": {"job_id": JOB}}
    console.send_task(contract.TASK_START_REPLICA, kwargs=start, queue="node.node-1")
    agent = make_celery(agent_urls["node-1"], "node-1")
    got: list[Any] = []

    def on_message(body: Any, message: kombu.Message) -> None:
        got.append(body)
        message.ack()

    with agent.connection_for_read() as connection:
        queue = agent.amqp.queues[contract.node_queue("node-1")]
        with kombu.Consumer(connection, [queue], callbacks=[on_message], accept=["json"]):
            connection.drain_events(timeout=10)
    assert got and got[0][1] == start
    assert admin.hlen("unacked.node.node-1") == 0  # acked
    assert not admin.exists("unacked")  # nothing under the shared default

    agent.send_task(
        contract.TASK_NODE_HEARTBEAT, kwargs={"payload": {"node": "node-1"}}, queue="console"
    )
    assert admin.llen(contract.CONSOLE_QUEUE) == 1


# --- heartbeats past Celery (workers/heartbeat_route.py) ---


def test_it_may_push_a_heartbeat_and_read_whether_the_console_drains(
    node_1: redis.Redis, admin: redis.Redis
) -> None:
    assert node_1.get(contract.HEARTBEATS_DRAINED_KEY) is None
    admin.set(contract.HEARTBEATS_DRAINED_KEY, "console@1", ex=15)
    assert node_1.get(contract.HEARTBEATS_DRAINED_KEY) == "console@1"
    assert node_1.exists(contract.HEARTBEATS_DRAINED_KEY) == 1
    assert node_1.rpush(contract.HEARTBEATS_KEY, '{"node": "node-1"}') == 1
    assert admin.lrange(contract.HEARTBEATS_KEY, 0, -1) == ['{"node": "node-1"}']


def test_it_cannot_read_take_or_clear_the_heartbeats_of_other_nodes(
    node_1: redis.Redis, admin: redis.Redis
) -> None:
    admin.rpush(contract.HEARTBEATS_KEY, "a heartbeat of node-2")
    key = contract.HEARTBEATS_KEY
    for call in (
        lambda: node_1.lrange(key, 0, -1),
        lambda: node_1.lindex(key, 0),
        lambda: node_1.lpop(key),
        lambda: node_1.rpop(key),
        lambda: node_1.blpop([key], timeout=1),
        lambda: node_1.lmove(key, "node.node-1"),
        lambda: node_1.ltrim(key, 1, 0),
        lambda: node_1.lpush(key, "first in line"),
        lambda: node_1.lset(key, 0, "forged"),
        lambda: node_1.delete(key),
        lambda: node_1.expire(key, 1),
        lambda: node_1.rename(key, "node.node-1"),
        lambda: node_1.dump(key),
        # Scripts run under the same ACL: no way round it through EVAL.
        lambda: node_1.eval("return redis.call('LPOP', KEYS[1])", 1, key),
    ):
        assert refused(call)
    assert admin.lrange(key, 0, -1) == ["a heartbeat of node-2"]


def test_it_cannot_set_or_clear_the_drain_flag(node_1: redis.Redis, admin: redis.Redis) -> None:
    flag = contract.HEARTBEATS_DRAINED_KEY
    assert refused(lambda: node_1.set(flag, "1"))  # would send every agent to an unread list
    admin.set(flag, "console@1", ex=15)
    for call in (
        lambda: node_1.delete(flag),
        lambda: node_1.expire(flag, 1000),
        lambda: node_1.persist(flag),
        lambda: node_1.getdel(flag),
        lambda: node_1.eval("return redis.call('SET', KEYS[1], '1')", 1, flag),
    ):
        assert refused(call)
    assert admin.get(flag) == "console@1"


class Recorded:
    """Stands in for the agent's Celery app: records the tasks sent."""

    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []

    def send_task(self, name: str, kwargs: dict[str, Any], **_: Any) -> None:
        self.sent.append(kwargs["payload"])


def agent_heartbeat(url: str) -> tuple[Heartbeat, Recorded]:
    app = Recorded()
    return Heartbeat(app, {}, None, client=redis.Redis.from_url(url)), app  # type: ignore[arg-type]


def test_the_agent_pushes_its_heartbeat_while_the_console_drains_else_sends_the_task(
    agent_urls: dict[str, str], admin: redis.Redis
) -> None:
    heartbeat, app = agent_heartbeat(agent_urls["node-1"])
    heartbeat.send({"node": "node-1", "n": 1})
    assert (app.sent, admin.llen(contract.HEARTBEATS_KEY)) == ([{"node": "node-1", "n": 1}], 0)
    admin.set(contract.HEARTBEATS_DRAINED_KEY, "console@1", ex=15)
    heartbeat.send({"node": "node-1", "n": 2})
    assert len(app.sent) == 1
    assert [json.loads(m) for m in admin.lrange(contract.HEARTBEATS_KEY, 0, -1)] == [
        {"node": "node-1", "n": 2}
    ]


def test_an_agent_whose_acl_predates_the_list_sends_the_task(
    admin_url: str, admin: redis.Redis
) -> None:
    """An older console's rules (no grant of the flag or the list): the agent's GET is refused,
    and its heartbeat goes as the task, as before."""
    secret = credentials.new_secret()
    rules = credentials.acl_rules("node-9", credentials.password_hash(secret), set())
    older = [r for r in rules if contract.HEARTBEATS_KEY not in r]
    admin.execute_command("ACL", "SETUSER", credentials.user_of("node-9"), *older)
    admin.set(contract.HEARTBEATS_DRAINED_KEY, "console@1", ex=15)
    heartbeat, app = agent_heartbeat(agent_url_for(admin_url, "node-9", secret))
    heartbeat.send({"node": "node-9"})
    assert (app.sent, admin.llen(contract.HEARTBEATS_KEY)) == ([{"node": "node-9"}], 0)


# --- grants follow the jobs placed on the node ---


@pytest.fixture
def console_on(admin_url: str, settings: Any) -> Iterator[redis.Redis]:
    settings.REDIS_URL = admin_url
    get_redis.cache_clear()
    get_redis().flushdb()
    yield get_redis()
    get_redis.cache_clear()


def job_keys_allowed(url: str, job_id: int) -> bool:
    client = redis.Redis.from_url(url)
    try:
        return not refused(lambda: client.get(contract.rendezvous_key(job_id)))
    finally:
        client.close()


@pytest.mark.usefixtures("catalog", "code_root")
def test_a_job_is_granted_when_placed_and_taken_away_after_it_ended(
    console_on: redis.Redis,
    admin_url: str,
    alice: User,
    nodes: list[Node],
    sent_tasks: SentTasks,
    django_capture_on_commit_callbacks: Capture,
) -> None:
    with django_capture_on_commit_callbacks(execute=True):
        job = submit_job(alice, check_job_request(job_request(instances=1)))
    replica = job.replicas.select_related("node").get()
    assert replica.node is not None
    # The agent of the node it was placed on (either: the nodes are alike).
    node = replica.node.name
    url = agent_url_for(admin_url, node, agent_access.issue(node))
    # Dispatch granted it before the start was sent.
    assert sent_tasks.named(contract.TASK_START_REPLICA)
    assert job_keys_allowed(url, job.pk)
    assert not job_keys_allowed(url, job.pk + 1)
    assert agent_access.sync() == 0  # nothing changed: nothing written

    with django_capture_on_commit_callbacks(execute=True):
        reports.replica_exited(job.pk, "master", 0, node, "succeeded", 0, "", [])
    job.refresh_from_db()
    assert job.state == Job.State.SUCCEEDED
    assert agent_access.sync() == 0  # its last lines may still come: the grant lingers
    assert job_keys_allowed(url, job.pk)
    later = timezone.now() + timedelta(seconds=601)
    assert agent_access.sync(now=later) == 1
    assert not job_keys_allowed(url, job.pk)
    assert Replica.objects.filter(job=job, node__name=node).exists()


@pytest.mark.django_db
def test_users_come_back_after_redis_restarts_and_rotation_locks_out_the_old_secret(
    tmp_path: Path, settings: Any
) -> None:
    """A Redis restarted with the same argv (as `make run` does) has lost its ACL users; the
    next pass writes them again, once."""
    data = tmp_path / "redis"
    with private_redis(data, "pw") as (url, proc):
        settings.REDIS_URL = url
        get_redis.cache_clear()
        secret = agent_access.issue("node-1")
        agent = agent_url_for(url, "node-1", secret)
        assert redis.Redis.from_url(agent).ping()
        argv = proc.args
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        again = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            wait_for_redis(url, again)
            get_redis.cache_clear()
            with pytest.raises(redis.exceptions.AuthenticationError):
                redis.Redis.from_url(agent).ping()
            assert agent_access.sync() == 1
            assert agent_access.sync() == 0
            assert redis.Redis.from_url(agent).ping()

            rotated = agent_url_for(url, "node-1", agent_access.issue("node-1"))
            assert redis.Redis.from_url(rotated).ping()
            with pytest.raises(redis.exceptions.AuthenticationError):
                redis.Redis.from_url(agent).ping()
        finally:
            again.terminate()
            again.wait(10)
            get_redis.cache_clear()


# --- making credentials ---


def test_agent_credentials_prints_a_working_url_once_and_keeps_no_secret(
    console_on: redis.Redis, db: None
) -> None:
    out = io.StringIO()
    call_command("agent_credentials", "node-1", "node-2", stdout=out)
    urls = out.getvalue().split()
    assert [credentials.secret_from_url(u)[0] for u in urls] == ["node-1", "node-2"]  # type: ignore[index]
    for url in urls:
        client = redis.Redis.from_url(url)
        assert client.ping()  # as the agent's own user, which may not even ask who it is
        assert refused(lambda: client.acl_whoami())  # noqa: B023
        assert refused(lambda: client.keys("*"))  # noqa: B023
        client.close()
    secret = credentials.secret_from_url(urls[0])[1]  # type: ignore[index]
    row = AgentCredential.objects.get(node_name="node-1")
    assert row.password_sha256 == credentials.password_hash(secret)
    assert row.signing_key == credentials.signing_key(secret)
    assert secret not in {row.password_sha256, row.signing_key}

    with pytest.raises(CommandError, match="a node with credentials needs a name"):
        call_command("agent_credentials", "node-*", stdout=io.StringIO())
    assert not AgentCredential.objects.filter(node_name="node-*").exists()


def test_the_nodes_admin_action_rotates_and_shows_the_url_once(
    console_on: redis.Redis, client: Client, charlie_admin: User, nodes: list[Node]
) -> None:
    client.force_login(charlie_admin)
    r = client.post(
        "/admin/jobs/node/",
        {"action": "make_agent_credentials", "_selected_action": [nodes[0].pk]},
        follow=True,
    )
    assert r.status_code == 200
    shown = [str(m) for m in r.context["messages"]]
    assert len(shown) == 1 and "node-1: REDIS_URL=redis://agent-node-1:" in shown[0]
    url = shown[0].split("REDIS_URL=", 1)[1].split(" ", 1)[0]
    assert redis.Redis.from_url(url).ping()
    assert client.get("/admin/jobs/agentcredential/").status_code == 200


def test_lines_of_a_job_it_may_no_longer_write_wait_then_are_dropped_without_blocking_others(
    node_1: redis.Redis, admin: redis.Redis, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A grant can lag a start for a moment, so refused lines wait in the spool; lines of a job
    refused for long (ended long ago) are dropped, and the lines behind them get through."""
    shipper = LogShipper(node_1, tmp_path / "spool", retry_seconds=0.05)
    try:
        shipper.put(ReplicaKey(OTHER_JOB, "master", 0, "node-1"), "o", 1.0, ["refused"])
        shipper.put(ReplicaKey(JOB, "master", 0, "node-1"), "o", 1.0, ["allowed"])
        assert not shipper.flush(0.5)  # held: the refused batch waits in the spool
        monkeypatch.setattr(logship, "REFUSED_GIVE_UP_SECONDS", 0.0)
        assert shipper.flush(10)
    finally:
        shipper.close()
    assert [e[1]["l"] for e in stream_entries(admin, JOB)] == ["allowed"]  # once
    assert len(stream_entries(admin, OTHER_JOB)) == 1  # the admin's own entry only


@pytest.mark.django_db
def test_each_reconciliation_pass_rewrites_a_user_that_went_missing(
    console_on: redis.Redis, admin_url: str
) -> None:
    url = agent_url_for(admin_url, "node-1", agent_access.issue("node-1"))
    assert ReconcileLoop(60).run_once() is not None
    console_on.execute_command("ACL", "DELUSER", "agent-node-1")
    assert ReconcileLoop(60).run_once() is not None
    assert redis.Redis.from_url(url).ping()
