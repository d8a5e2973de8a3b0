"""An agent answers the console on its own node's reply lists and nowhere else (its Redis ACL
user, workers/credentials.py; the answer's shape, workers/agentreply.py), on a real
redis-server that asks for passwords."""

import secrets
from collections.abc import Iterator

import pytest
import redis

from tests.conftest import private_redis
from workers import agentreply, contract, credentials


@pytest.fixture(scope="module")
def admin_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with private_redis(tmp_path_factory.mktemp("reply-redis"), secrets.token_hex(16)) as (url, _):
        yield url


@pytest.fixture
def clients(admin_url: str) -> Iterator[tuple[redis.Redis, redis.Redis]]:
    """(the console's client, node-1's agent's client with its own ACL user)."""
    admin = redis.Redis.from_url(admin_url)
    admin.flushdb()
    secret = credentials.new_secret()
    rules = credentials.acl_rules("node-1", credentials.password_hash(secret), set())
    admin.execute_command("ACL", "SETUSER", credentials.user_of("node-1"), *rules)
    port = admin.connection_pool.connection_kwargs["port"]
    agent = redis.Redis.from_url(credentials.agent_url("node-1", secret, "127.0.0.1", port))
    yield admin, agent
    agent.close()
    admin.close()


def test_an_answer_on_its_own_reply_list_reaches_the_console_bytes_intact(
    clients: tuple[redis.Redis, redis.Redis],
) -> None:
    admin, agent = clients
    key = contract.reply_key("node-1", secrets.token_hex(8))
    chunk = bytes(range(256)) * 10  # not text: bytes travel as they are
    assert agentreply.answer(agent, "node-1", key, {"ok": True, "size": 2560}, chunk)
    popped = admin.blpop([key], timeout=1)
    assert popped is not None and isinstance(popped[1], bytes)
    assert agentreply.decode(popped[1]) == ({"ok": True, "size": 2560}, chunk)
    assert admin.ttl(key) == -2  # taken: nothing left behind


def test_an_answer_nobody_takes_expires(clients: tuple[redis.Redis, redis.Redis]) -> None:
    admin, agent = clients
    key = contract.reply_key("node-1", "late")
    agentreply.answer(agent, "node-1", key, {"ok": True})
    assert 0 < admin.ttl(key) <= agentreply.REPLY_TTL_SECONDS


def test_it_cannot_write_another_nodes_reply_list_nor_read_any(
    clients: tuple[redis.Redis, redis.Redis],
) -> None:
    admin, agent = clients
    theirs = contract.reply_key("node-2", "abc")
    ours = contract.reply_key("node-1", "abc")
    admin.rpush(ours, b"the console's own")
    for call in (
        lambda: agent.rpush(theirs, b"forged"),
        lambda: agent.lpush(ours, b"first in line"),
        lambda: agent.lrange(ours, 0, -1),
        lambda: agent.lpop(ours),
        lambda: agent.delete(ours),
        lambda: agent.set("trainyard:reply:node-1", b"x"),
    ):
        with pytest.raises(redis.exceptions.NoPermissionError):
            call()
    assert admin.exists(theirs) == 0
    # The agent's own check refuses before Redis would.
    assert not agentreply.answer(agent, "node-1", theirs, {"ok": True})


def test_a_message_without_its_header_is_refused() -> None:
    for message in (b"no header at all", b"[1, 2]\nbytes", b"{not json\n"):
        with pytest.raises(ValueError):
            agentreply.decode(message)
