"""Revocation that bites, on the real stack: a job stream opened with a token or a browser
session closes with 4401 once what opened it is revoked (the token on the API tokens page, the
user deactivated on the Users page, the password changed), `trainyard logs -f` exits 3 saying
why, and a password change ends token access unless the user keeps their tokens.

Real parts only: uvicorn, Redis (the channel layer that carries the revocation from the
process that revokes to the one that streams), node agents running numbered.py, a
`websockets` client, the installed `trainyard` command and httpx as the browser.
"""

import json
import re
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import websockets

from tests.conftest import (
    RunningStack,
    StackClient,
    frame_lines,
    run_async,
    signal_file,
    wait_until,
)
from tests.integration.test_cli import TRAINYARD, cli_env, run_cli

pytestmark = pytest.mark.integration

CLOSE_CREDENTIALS_REVOKED = 4401  # jobs.services.revocation.CLOSE_CREDENTIALS_REVOKED
QUOTA = {"cpu": 8, "gpus": 0, "memory_gb": 32, "running_jobs": 4}
PASSWORD = "an-old-long-password-1"
NEW_PASSWORD = "a-new-long-password-2"


def long_job(client: StackClient, name: str, **numbered: str) -> dict[str, Any]:
    """numbered.py, printing 5 lines a second for much longer than any test waits."""
    args = {"--lines": "100000", "--rate": "5", **numbered}
    return client.submit(
        {
            "name": name,
            "image": "pytorch:2.13-cpu",
            "program": {"script": "numbered.py", "args": [x for kv in args.items() for x in kv]},
            "roles": {"master": {"package": "cpu-1", "instances": 1}},
        }
    )


def browser(stack: RunningStack, username: str, password: str) -> httpx.Client:
    """A browser's session: logged in through the login page, CSRF cookie and all."""
    web = httpx.Client(base_url=stack.url, timeout=30)
    web.get("/accounts/login/")
    r = web.post(
        "/accounts/login/",
        data={"username": username, "password": password,
              "csrfmiddlewaretoken": web.cookies["csrftoken"]},
    )  # fmt: skip
    assert r.status_code == 302, r.text
    return web


def post_form(web: httpx.Client, path: str, data: dict[str, str]) -> httpx.Response:
    return web.post(path, data={**data, "csrfmiddlewaretoken": web.cookies["csrftoken"]})


def ws_url(stack: RunningStack, job_id: int) -> str:
    return stack.url.replace("http", "ws") + f"/ws/jobs/{job_id}/?after=0"


class Stream:
    """A websocket on a job, read in a thread of its own: lines as they arrive, with when,
    and the close code and reason once the server closes it."""

    def __init__(self, url: str, headers: dict[str, str]) -> None:
        self.lines: list[tuple[float, dict[str, Any]]] = []
        self.types: list[str] = []
        self.closed: tuple[int | None, str] | None = None
        self.closed_at = 0.0
        self._thread = threading.Thread(
            target=run_async, args=(self._read(url, headers),), daemon=True
        )
        self._thread.start()

    async def _read(self, url: str, headers: dict[str, str]) -> None:
        async with websockets.connect(url, additional_headers=headers, max_size=None) as ws:
            try:
                async for message in ws:
                    frame = json.loads(message)
                    self.types.append(frame["type"])
                    now = time.monotonic()
                    self.lines.extend((now, line) for line in frame_lines(frame))
            except websockets.ConnectionClosed:
                pass
        self.closed_at = time.monotonic()
        self.closed = (ws.close_code, ws.close_reason or "")

    def wait_closed(self) -> tuple[int | None, str]:
        closed = wait_until("the stream to close", lambda: self.closed)
        self._thread.join(timeout=30)
        return closed

    def lines_after(self, moment: float) -> int:
        return sum(1 for at, _ in self.lines if at > moment)


def token_stream(stack: RunningStack, job_id: int, token: str) -> Stream:
    stream = Stream(ws_url(stack, job_id), {"Authorization": f"Token {token}"})
    wait_until("the first lines on the stream", lambda: len(stream.lines) >= 2)
    return stream


def session_stream(stack: RunningStack, job_id: int, web: httpx.Client) -> Stream:
    cookie = f"sessionid={web.cookies['sessionid']}"
    stream = Stream(ws_url(stack, job_id), {"Cookie": cookie})
    wait_until("the first lines on the stream", lambda: len(stream.lines) >= 2)
    return stream


def token_ids(web: httpx.Client) -> list[int]:
    return [int(x) for x in re.findall(r'data-token="(\d+)"', web.get("/account/tokens/").text)]


def user_id(stack: RunningStack, username: str) -> int:
    code = (
        "from django.contrib.auth.models import User; "
        f"print(User.objects.get(username={username!r}).pk)"
    )
    # The shell may say more before (how many objects it imported): the id is the last line.
    return int(stack.stack.manage("shell", "-c", code).strip().splitlines()[-1])


def test_a_revoked_tokens_stream_closes_with_4401(stack: RunningStack) -> None:
    user = stack.create_user("revoke-ws", PASSWORD, quota=QUOTA)
    job = long_job(user, "revoke-ws")
    stream = token_stream(stack, job["id"], user.token)
    web = browser(stack, "revoke-ws", PASSWORD)
    (token_id,) = token_ids(web)
    r = post_form(web, f"/account/tokens/{token_id}/revoke/", {})
    assert r.status_code == 302
    revoked_at = time.monotonic()
    assert stream.wait_closed() == (
        CLOSE_CREDENTIALS_REVOKED,
        "credentials revoked: the API token was revoked",
    )
    # The figure for the report (no assertion on time): what the stream still carried.
    print(
        f"\nafter revocation: {stream.lines_after(revoked_at)} lines, "
        f"closed after {stream.closed_at - revoked_at:.2f} s"
    )
    assert user.http.get("/api/v1/jobs").status_code == 401
    stack.admin.http.post(f"/api/v1/jobs/{job['id']}/cancel")


def test_logs_follow_exits_3_with_the_reason_when_its_token_is_revoked(
    stack: RunningStack, tmp_path: Path
) -> None:
    config = tmp_path / "config"
    user = stack.create_user("revoke-cli", PASSWORD, quota=QUOTA)
    login = run_cli("login", stack.url, "--with-token", config_dir=config, stdin=user.token + "\n")
    assert login.returncode == 0, login.stderr
    job = long_job(user, "revoke-cli")
    follower = subprocess.Popen(
        [str(TRAINYARD), "logs", str(job["id"]), "-f"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=cli_env(config),
    )
    seen: list[str] = []
    reader = threading.Thread(target=lambda: seen.extend(follower.stdout or []), daemon=True)
    reader.start()
    try:
        wait_until("lines followed", lambda: len(seen) >= 2)
        # Revoked in another process than the web server's: the channel layer carries it.
        stack.stack.manage(
            "shell", "-c",
            "from django.contrib.auth.models import User; from jobs.services import tokens; "
            "u = User.objects.get(username='revoke-cli'); "
            "[tokens.revoke(u, t.pk) for t in tokens.tokens_of(u)]",
        )  # fmt: skip
        assert follower.wait(timeout=300) == 3
        stderr = follower.stderr.read() if follower.stderr else ""
    finally:
        if follower.poll() is None:
            follower.kill()
    assert "the API token was revoked" in stderr
    assert "trainyard login" in stderr
    stack.admin.http.post(f"/api/v1/jobs/{job['id']}/cancel")


def test_a_password_change_ends_token_access_and_other_sessions_streams(
    stack: RunningStack,
) -> None:
    user = stack.create_user("revoke-pw", PASSWORD, quota=QUOTA)
    job = long_job(user, "revoke-pw")
    by_token = token_stream(stack, job["id"], user.token)
    other_browser = browser(stack, "revoke-pw", PASSWORD)
    by_session = session_stream(stack, job["id"], other_browser)
    web = browser(stack, "revoke-pw", PASSWORD)
    r = post_form(
        web,
        "/account/password/",
        {"old_password": PASSWORD, "new_password1": NEW_PASSWORD, "new_password2": NEW_PASSWORD},
    )
    assert r.status_code == 302
    assert user.http.get("/api/v1/jobs").status_code == 401
    assert by_token.wait_closed() == (4401, "credentials revoked: the API token was revoked")
    assert by_session.wait_closed() == (4401, "credentials revoked: the password was changed")
    assert other_browser.get("/account/tokens/").status_code == 302  # to the login page
    assert web.get("/account/tokens/").status_code == 200  # the browser that changed it stays
    stack.admin.http.post(f"/api/v1/jobs/{job['id']}/cancel")


def test_a_password_change_that_keeps_the_tokens_leaves_them_working(
    stack: RunningStack,
) -> None:
    user = stack.create_user("keep-pw", PASSWORD, quota=QUOTA)
    release = signal_file()
    # 5 lines, then a stop until released; then 40 more lines at 5 a second (8 s, more than the
    # streams' periodic re-check) and the end.
    job = long_job(
        user, "keep-pw", **{"--lines": "45", "--hold-at": "5", "--release": str(release)}
    )
    by_token = token_stream(stack, job["id"], user.token)
    web = browser(stack, "keep-pw", PASSWORD)
    r = post_form(
        web,
        "/account/password/",
        {"old_password": PASSWORD, "new_password1": NEW_PASSWORD, "new_password2": NEW_PASSWORD,
         "keep_tokens": "on"},
    )  # fmt: skip
    assert r.status_code == 302
    assert user.http.get("/api/v1/jobs").status_code == 200
    release.touch()
    assert by_token.wait_closed() == (1000, "")
    assert by_token.types[-1] == "end"
    assert len(by_token.lines) == 45


def test_deactivating_a_user_closes_their_streams(stack: RunningStack) -> None:
    user = stack.create_user("revoke-off", PASSWORD, quota=QUOTA)
    job = long_job(user, "revoke-off")
    by_token = token_stream(stack, job["id"], user.token)
    by_session = session_stream(stack, job["id"], browser(stack, "revoke-off", PASSWORD))
    admin = browser(stack, "admin", stack.admin_password)
    r = post_form(
        admin, f"/users/{user_id(stack, 'revoke-off')}/", {"is_staff": "", "new_group": ""}
    )
    assert r.status_code == 302, r.text
    for stream in (by_token, by_session):
        assert stream.wait_closed() == (4401, "credentials revoked: the user was deactivated")
    assert user.http.get("/api/v1/jobs").status_code == 401
    stack.admin.http.post(f"/api/v1/jobs/{job['id']}/cancel")


def test_streams_of_other_users_stay_open(stack: RunningStack) -> None:
    """Revoking one user's token tells that user's streams only."""
    alice = stack.create_user("revoke-alice", PASSWORD, quota=QUOTA)
    bob = stack.create_user("revoke-bob", PASSWORD, quota=QUOTA)
    release = signal_file()
    job = long_job(
        bob, "revoke-bob", **{"--lines": "45", "--hold-at": "5", "--release": str(release)}
    )
    bobs = token_stream(stack, job["id"], bob.token)
    web = browser(stack, "revoke-alice", PASSWORD)
    (token_id,) = token_ids(web)
    assert post_form(web, f"/account/tokens/{token_id}/revoke/", {}).status_code == 302
    assert alice.http.get("/api/v1/jobs").status_code == 401
    release.touch()
    assert bobs.wait_closed() == (1000, "")
    assert len(bobs.lines) == 45
