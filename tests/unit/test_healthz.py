"""/healthz answers quickly whatever hangs; anyone learns up or down, staff and holders of the
health token also which part fails."""

import json
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.http import HttpResponse
from django.test import Client

from jobs import views
from jobs.models import ApiToken, Node
from stack.redis_server import free_port
from tests.conftest import private_redis

# The check reads the database from a thread of its own, which sees committed rows only.
pytestmark = pytest.mark.django_db(transaction=True)

NO_ANSWER = f"no answer within {views.HEALTH_CHECK_SECONDS:g} s"
HEALTH_TOKEN = "health-token-for-tests"


@pytest.fixture(autouse=True)
def health_token(settings: Any) -> str:
    settings.TRAINYARD_HEALTHZ_TOKEN = HEALTH_TOKEN
    return HEALTH_TOKEN


def get_healthz(
    client: Client, hang_guard: float = 5.0, token: str | None = HEALTH_TOKEN
) -> tuple[int, dict[str, Any]]:
    """GET /healthz from a thread, so that a check that hangs fails the test instead of hanging
    it; the guard measures nothing, it only stops a hung test."""
    outcome: list[Any] = []

    def request() -> None:
        try:
            headers = {"Authorization": f"Token {token}"} if token else {}
            outcome.append(client.get("/healthz", headers=headers))
        except BaseException as exc:  # handed to the test below
            outcome.append(exc)

    thread = threading.Thread(target=request, name="healthz-request", daemon=True)
    thread.start()
    thread.join(hang_guard)
    assert outcome, f"/healthz gave no answer within {hang_guard} s"
    if isinstance(outcome[0], BaseException):
        raise outcome[0]
    response: HttpResponse = outcome[0]
    return response.status_code, json.loads(response.content)


@pytest.fixture
def stalled_redis(tmp_path: Path) -> Iterator[str]:
    """A private redis-server that accepts connections but answers nothing (SIGSTOP)."""
    with private_redis(tmp_path / "redis") as (url, proc):
        os.kill(proc.pid, signal.SIGSTOP)
        yield url


UP_WITH_TWO_NODES = {"status": "up", "redis": True, "database": True, "nodes_live": 2}


def test_it_answers_200_with_the_live_nodes(
    client: Client, redis_url: str, nodes: list[Node]
) -> None:
    assert get_healthz(client) == (200, UP_WITH_TWO_NODES)


def test_it_tells_anonymous_callers_only_up(
    client: Client, redis_url: str, nodes: list[Node]
) -> None:
    assert get_healthz(client, token=None) == (200, {"status": "up"})


def test_it_tells_anonymous_callers_only_down(client: Client, settings: Any) -> None:
    settings.REDIS_URL = f"redis://127.0.0.1:{free_port()}/0"
    assert get_healthz(client, token=None) == (503, {"status": "down"})


def test_it_gives_a_wrong_token_only_up(client: Client, redis_url: str, nodes: list[Node]) -> None:
    assert get_healthz(client, token="not-the-token") == (200, {"status": "up"})


def test_it_gives_staff_sessions_the_details(
    client: Client, redis_url: str, nodes: list[Node], charlie_admin: User
) -> None:
    client.force_login(charlie_admin)
    assert get_healthz(client, token=None) == (200, UP_WITH_TWO_NODES)


def test_it_gives_staff_api_tokens_the_details(
    client: Client, redis_url: str, nodes: list[Node], charlie_admin: User
) -> None:
    key = ApiToken.issue(charlie_admin)
    assert get_healthz(client, token=key) == (200, UP_WITH_TWO_NODES)


def test_it_gives_other_users_only_up(
    client: Client, redis_url: str, nodes: list[Node], alice: User
) -> None:
    client.force_login(alice)
    assert get_healthz(client, token=None) == (200, {"status": "up"})
    assert get_healthz(client, token=ApiToken.issue(alice)) == (200, {"status": "up"})


def test_it_names_redis_when_nothing_listens(client: Client, settings: Any) -> None:
    settings.REDIS_URL = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there
    status, body = get_healthz(client)
    assert status == 503
    assert body["redis"] is False and "Connection refused" in body["redis_error"]
    assert body["database"] is True and body["nodes_live"] == 0


def test_it_answers_while_redis_is_stalled(
    client: Client, settings: Any, stalled_redis: str
) -> None:
    settings.REDIS_URL = stalled_redis
    status, body = get_healthz(client)
    assert status == 503
    assert body["redis"] is False and body["redis_error"] == NO_ANSWER
    assert body["database"] is True


def test_it_names_the_database_when_it_hangs(
    client: Client, redis_url: str, monkeypatch: pytest.MonkeyPatch, charlie_admin: User
) -> None:
    staff = Client()
    staff.force_login(charlie_admin)
    released = threading.Event()

    def hung_query() -> list[str]:
        released.wait(60)
        return []

    monkeypatch.setattr(views, "_live_node_names", hung_query)
    try:
        assert get_healthz(client) == (
            503,
            {
                "status": "down",
                "redis": True,
                "database": False,
                "database_error": NO_ANSWER,
                "nodes_live": 0,
            },
        )
        # The stuck query still holds the worker: the next check says so at once rather than
        # queueing a second query behind it.
        status, body = get_healthz(client)
        assert status == 503
        assert body["database_error"] == "the previous check has not finished"
        # Staff are recognised through the database, which is not asked while it hangs.
        assert get_healthz(staff, token=None) == (503, {"status": "down"})
    finally:
        released.set()
    deadline = time.monotonic() + 10  # hang guard only
    while get_healthz(client)[0] != 200:
        assert time.monotonic() < deadline, "the database check never recovered"
        time.sleep(0.05)
