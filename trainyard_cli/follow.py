"""Following a job over its websocket: every log line once, in order, across dropped
connections and console restarts, and the job's state as it changes.

The websocket (/ws/jobs/ID/?after=C) sends the lines after cursor C, then live ones. A
connection that drops is opened again with ?after= the last cursor this client received, so
nothing is missed; a line at or before that cursor is never shown twice. A stream the console
closes because its token stopped holding (code 4401: revoked, the user deactivated, their
password changed) is not reopened: that ends the command with exit code 3 and the reason.
"""

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus
from websockets.sync.client import connect

from trainyard_cli.errors import NOT_LOGGED_IN, UNAVAILABLE, CliError
from trainyard_cli.render import duration

# The console sends a heartbeat frame when nothing else happens for a while; a connection
# silent for much longer than that is dead even if TCP has not noticed.
SILENT_LIMIT_SECONDS = 90.0
RECONNECT_FOR_SECONDS = 300.0
# The console's close code for a stream whose credentials were revoked (docs/security.md).
CLOSE_CREDENTIALS_REVOKED = 4401


@dataclass
class Line:
    cursor: int
    role: str
    index: int
    node: str
    stream: str
    ts: float
    text: str
    attempt: int = 0
    # How the line shows, when that is not simply its text: [[text, css classes], ...], as the
    # console shaped it (escape sequences and overwritten parts gone).
    shown: list[list[str]] | None = None


@dataclass
class Follower:
    """What `follow` calls: one line at a time, the job on each state change, and a note
    (a lost stretch of log, a reconnection) for the user."""

    on_line: Callable[[Line], None]
    on_state: Callable[[dict[str, Any]], None] = lambda job: None
    on_note: Callable[[str], None] = lambda text: None
    # The last line received: kept here, not in a connection's frame, so that a connection
    # that breaks mid-way leaves it where its last delivered line put it.
    cursor: int = 0


def websocket_url(console_url: str, job_id: int, after: int) -> str:
    parts = urlsplit(console_url)
    scheme = "wss" if parts.scheme == "https" else "ws"
    path = f"{parts.path.rstrip('/')}/ws/jobs/{job_id}/"
    return urlunsplit((scheme, parts.netloc, path, f"after={after}", ""))


class _Refused(Exception):
    """The console would not open the stream (token, job): ask HTTP why."""


def follow(
    console_url: str,
    token: str,
    job_id: int,
    after: int,
    follower: Follower,
    why_refused: Callable[[], CliError],
    reconnect_for: float = RECONNECT_FOR_SECONDS,
) -> int:
    """Relay the job's log after cursor `after` until it is complete; returns the last
    cursor. Reconnects for up to `reconnect_for` seconds in a row before giving up."""
    follower.cursor = after
    down_since: float | None = None
    pause = 0.25
    while True:
        try:
            if _one_connection(console_url, token, job_id, follower):
                return follower.cursor
            problem = "the console closed the stream"
        except _Refused:
            raise why_refused() from None
        except ConnectionClosed as exc:
            if exc.rcvd is not None and exc.rcvd.code == CLOSE_CREDENTIALS_REVOKED:
                raise _revoked(exc.rcvd.reason, job_id, follower.cursor) from None
            problem = str(exc) or type(exc).__name__
        except (OSError, InvalidHandshake, TimeoutError) as exc:
            problem = str(exc) or type(exc).__name__
        now = time.monotonic()
        if down_since is None:
            down_since = now
            follower.on_note(f"connection lost ({problem}); resuming after line {follower.cursor}")
        elif now - down_since > reconnect_for:
            raise CliError(
                f"Lost the console for {duration(reconnect_for)}: {problem}. Resume with "
                f"`trainyard logs {job_id} -f --since {follower.cursor}`.",
                UNAVAILABLE,
            )
        time.sleep(pause)
        pause = min(pause * 2, 5.0)


def _revoked(reason: str, job_id: int, cursor: int) -> CliError:
    said = reason or "credentials revoked"
    return CliError(
        f"The console ended the stream: {said}. Log in again with a valid token "
        f"(`trainyard login`), then resume with `trainyard logs {job_id} -f --since {cursor}`.",
        NOT_LOGGED_IN,
    )


def _one_connection(console_url: str, token: str, job_id: int, follower: Follower) -> bool:
    """One websocket, from the follower's cursor on; True when the log ended."""
    url = websocket_url(console_url, job_id, follower.cursor)
    try:
        socket = connect(
            url,
            additional_headers={"Authorization": f"Token {token}"},
            open_timeout=15,
            close_timeout=2,
            max_size=None,  # a frame holds as many lines as arrived at once
        )
    except InvalidStatus as exc:
        if exc.response.status_code == 403:  # the console turns every refusal into a 403
            raise _Refused from None
        raise
    with socket:
        while True:
            frame = json.loads(socket.recv(timeout=SILENT_LIMIT_SECONDS))
            kind = frame.get("type")
            if kind == "log":
                for batch in frame["batches"]:
                    _relay(batch, follower)
                follower.cursor = max(follower.cursor, frame["next"])
            elif kind == "state":
                follower.on_state(frame["job"])
            elif kind == "gap":
                follower.on_note(
                    f"lines {frame['after'] + 1} to {frame['next']} are lost: {frame['reason']}"
                )
                follower.cursor = max(follower.cursor, frame["next"])
            elif kind == "heartbeat":
                follower.cursor = max(follower.cursor, frame["next"])
            elif kind == "end":
                follower.cursor = max(follower.cursor, frame["next"])
                return True


def _relay(batch: dict[str, Any], follower: Follower) -> None:
    for k, text in enumerate(batch["lines"]):
        cursor = batch["first"] + k
        if cursor <= follower.cursor:
            continue  # already shown before a reconnection
        line = Line(
            cursor,
            batch["role"],
            batch["index"],
            batch["node"],
            batch["stream"],
            batch["ts"],
            text,
            batch.get("attempt", 0),
            batch.get("shown", {}).get(str(k)),
        )
        follower.on_line(line)
        follower.cursor = cursor
