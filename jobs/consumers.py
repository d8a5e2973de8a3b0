"""The job websocket: relays a job's log stream and state events to one browser.

It only relays: commands (cancel, submit) go through HTTP. Connect with ?after=C (every line
after cursor C, then live) or ?tail=N (about the last N lines, then live). Frames:
  {"type": "state", "job": {...}}             current state, then on every change
  {"type": "log", "batches": [...], "next": C}  lines after the client's cursor, then live; a
                                               batch is {"first", "role", "index", "attempt",
                                               "node", "stream", "ts", "lines"}: line k is
                                               cursor first+k; attempt 0 is the first run
  {"type": "heartbeat", "next": C}            nothing new for a while; the connection is alive
  {"type": "gap", "after": A, "next": B, "reason": "..."}
                                               lines after A up to B are kept nowhere any more
  {"type": "end", "reason": "...", "next": C}  the job's log is complete (after a last state
                                               frame with the final state); the socket closes
A client that cannot take frames as fast as they come is closed with code 4408 instead of
being buffered for: it reconnects with ?after=<its cursor> and loses nothing.
A stream whose credentials stop holding (its token revoked, its user deactivated, its session
ended by a password change) is closed with code 4401 and the reason (close frame's reason);
the client must authenticate again. See jobs.services.revocation.
"""

import asyncio
import contextlib
import itertools
import logging
from typing import Any
from urllib.parse import parse_qs

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from django.conf import settings
from django.http import Http404
from redis import RedisError
from uvicorn.protocols.utils import ClientDisconnected

from jobs import logstream
from jobs.access import get_job_for
from jobs.models import LogChunk
from jobs.redis_client import get_async_redis
from jobs.services import revocation
from jobs.services.events import job_group
from jobs.services.presenters import job_state_payload
from jobs.ws_auth import TOKEN_ID_SCOPE_KEY

log = logging.getLogger(__name__)

CLOSE_UNAUTHENTICATED = revocation.CLOSE_CREDENTIALS_REVOKED  # 4401, before or after opening
CLOSE_NOT_FOUND = 4404
CLOSE_BAD_REQUEST = 4400
CLOSE_TOO_SLOW = 4408
CLOSE_SERVER_ERROR = 1011


@database_sync_to_async
def _state_for(user: Any, job_id: int) -> dict[str, Any] | None:
    try:
        return job_state_payload(get_job_for(user, job_id))
    except Http404:
        return None


@database_sync_to_async
def _why_invalid(credential: revocation.Credential) -> str | None:
    return revocation.why_invalid(credential)


class JobConsumer(AsyncJsonWebsocketConsumer):
    job_id: int
    credential: revocation.Credential
    follower: asyncio.Task[None] | None = None
    # Re-checks the credential on a timer, in case the message that would have told us is lost.
    watchdog: asyncio.Task[None] | None = None
    revoked = False

    async def connect(self) -> None:
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            await self.close(code=CLOSE_UNAUTHENTICATED)
            return
        self.credential = _credential_of(self.scope)
        self.job_id = int(self.scope["url_route"]["kwargs"]["job_id"])
        query = parse_qs(self.scope.get("query_string", b"").decode())
        try:
            after = int(query.get("after", ["0"])[0])
            tail = int(query["tail"][0]) if "tail" in query else None
        except ValueError:
            after = -1
        if after < 0 or (tail is not None and tail < 0):
            await self.close(code=CLOSE_BAD_REQUEST)
            return
        # Join before reading the state, so no change can fall between the two.
        if not await self._join_group():
            await self.close(code=CLOSE_SERVER_ERROR)
            return
        state = await _state_for(user, self.job_id)
        if state is None:
            await self.channel_layer.group_discard(job_group(self.job_id), self.channel_name)
            await self.close(code=CLOSE_NOT_FOUND)
            return
        await self.accept()
        await self.send_json({"type": "state", "job": state})
        if tail is not None:
            after = max(0, await _head_cursor(self.job_id) - tail)
            # The log starts late; the charts need every point from the start.
            points, _ = await _metric_points(self.job_id, after)
            await self.send_json({"type": "metric", "points": points, "next": after})
        self.follower = asyncio.create_task(self._relay_log(after))
        self.watchdog = asyncio.create_task(self._recheck_credential_periodically())

    async def disconnect(self, code: int) -> None:
        await self._stop_tasks()
        if hasattr(self, "job_id"):
            # With Redis away the membership cannot be dropped; it expires on its own.
            with contextlib.suppress(RedisError, OSError):
                for group in self._groups():
                    await self.channel_layer.group_discard(group, self.channel_name)

    async def _stop_tasks(self) -> None:
        for task in self._cancel_tasks():
            with contextlib.suppress(asyncio.CancelledError):
                await task

    def _cancel_tasks(self) -> list[asyncio.Task[None]]:
        """Cancel the log relay and the watchdog (but not the task running this); the ones
        cancelled, for a caller that waits for them to end."""
        current = asyncio.current_task()
        running = [t for t in (self.follower, self.watchdog) if t is not None and t is not current]
        for task in running:
            task.cancel()
        return running

    def _groups(self) -> list[str]:
        """The job's group (state events) and the user's (credentials changed)."""
        return [job_group(self.job_id), revocation.user_group(self.credential.user_id)]

    async def _join_group(self) -> bool:
        """Join the job's group for state events and the user's for revocations. After Redis
        restarts, the layer's pooled connection is dead and the first command on it fails,
        though Redis is back: one more try takes a fresh connection. Redis still away: the
        client is told to come back."""
        for attempt in (1, 2):
            try:
                for group in self._groups():
                    await self.channel_layer.group_add(group, self.channel_name)
                return True
            except (RedisError, OSError) as exc:
                log.warning(
                    "job %s: joining its event group failed (try %d of 2): %s",
                    self.job_id, attempt, exc,
                )  # fmt: skip
        return False

    async def job_event(self, event: dict[str, Any]) -> None:
        await self.send_json(event["payload"])

    async def credentials_changed(self, event: dict[str, Any]) -> None:
        """Something of the user's was revoked (revocation.CREDENTIALS_CHANGED): maybe what
        opened this stream, maybe another token or session of theirs. Check ours."""
        await self._close_if_revoked()

    async def _recheck_credential_periodically(self) -> None:
        while True:
            await asyncio.sleep(settings.TRAINYARD_WS_RECHECK_SECONDS)
            try:
                await self._close_if_revoked()
            except Exception:
                # The database away for a moment is no reason to end a stream: try next time.
                log.warning("re-checking the credentials of a stream failed", exc_info=True)

    async def _close_if_revoked(self) -> None:
        if self.revoked:
            return
        reason = await _why_invalid(self.credential)
        if reason is None or self.revoked:
            return
        self.revoked = True
        # Stop relaying first: not one more line goes out once we know. Not waited for: a
        # follower in the middle of a database read ends when the read returns, and the
        # close must not wait for that (disconnect() waits for it).
        self._cancel_tasks()
        log.info(
            "closing a stream of job %s with %d: %s", self.job_id, CLOSE_UNAUTHENTICATED, reason
        )
        await self.close(code=CLOSE_UNAUTHENTICATED, reason=f"credentials revoked: {reason}")

    async def _relay_log(self, after: int) -> None:
        # Named, so that an operator (and a test) can tell which job each follower reads.
        client = get_async_redis(
            blocking_seconds=logstream.FOLLOW_BLOCK_SECONDS, name=f"log-follower-job-{self.job_id}"
        )
        position = after
        try:
            async for batches in logstream.follow(client, self.job_id, after):
                if not batches:
                    await self._send({"type": "heartbeat", "next": position})
                    continue
                first = batches[0]
                if first.kind == LogChunk.Kind.END:
                    # The end marker is written after the final state commits, but the state
                    # event travels another way and may come later than this: send the final
                    # state now, so a client never closes on a stale one.
                    state = await _state_for(self.scope["user"], self.job_id)
                    if state is not None:
                        await self._send({"type": "state", "job": state})
                    await self._send({"type": "end", "reason": first.reason, "next": first.last})
                    await self.close()
                    return
                # Gaps, log lines and metric points in stream order, each run of one kind a
                # frame, so that a frame's `next` never passes something not yet sent. A gap
                # may come anywhere in a page read from the archive, not only first.
                for kind, run in itertools.groupby(batches, key=_frame_kind):
                    same = list(run)
                    if kind == "gap":
                        for hole in same:
                            await self._send(
                                {"type": "gap", "after": position, "next": hole.last,
                                 "reason": hole.reason}
                            )  # fmt: skip
                            position = hole.last
                        continue
                    position = same[-1].last
                    if kind == "metric":
                        # A value that was not finite is null: no chart takes it (the
                        # health rules read it from the stream themselves).
                        points = [p for b in same for p in b.points() if p["value"] is not None]
                        await self._send({"type": "metric", "points": points, "next": position})
                    else:
                        wire = [b.wire() for b in same]
                        await self._send({"type": "log", "batches": wire, "next": position})
        except ClientDisconnected:
            # The client went away first (`trainyard logs -f` closes as soon as it reads the
            # end, a tab closes): nothing failed, and nothing is left to close.
            log.debug("the client of job %s's log stream went away", self.job_id)
        except _TooSlow:
            # Worth a line: a proxy that buffers badly, or a tab left in the background, shows
            # up here again and again.
            log.info(
                "closing the log stream of job %s with %d: the client did not take a frame "
                "within %s s (it resumes from the last frame it read)",
                self.job_id, CLOSE_TOO_SLOW, settings.TRAINYARD_WS_SEND_TIMEOUT_SECONDS,
            )  # fmt: skip
            with contextlib.suppress(ClientDisconnected):
                await self.close(code=CLOSE_TOO_SLOW)
        except Exception:
            # Redis away, say: the client reconnects from its cursor and loses nothing.
            log.exception("relaying the log of job %s failed", self.job_id)
            with contextlib.suppress(ClientDisconnected):
                await self.close(code=CLOSE_SERVER_ERROR)
        finally:
            await client.aclose()

    async def _send(self, frame: dict[str, Any]) -> None:
        """Send, or give up on a client that takes too long to read: the server never queues
        more than the one frame in flight for it."""
        try:
            await asyncio.wait_for(
                self.send_json(frame), settings.TRAINYARD_WS_SEND_TIMEOUT_SECONDS
            )
        except TimeoutError:
            raise _TooSlow from None


class _TooSlow(Exception):
    pass


def _credential_of(scope: dict[str, Any]) -> revocation.Credential:
    """The token (ws_auth.TokenAuthMiddleware) or else the session that authenticated it."""
    user_id = int(scope["user"].pk)
    token_id = scope.get(TOKEN_ID_SCOPE_KEY)
    if token_id is not None:
        return revocation.Credential(user_id=user_id, token_id=int(token_id))
    session = scope.get("session")
    session_key = session.session_key if session is not None else None
    return revocation.Credential(user_id=user_id, session_key=session_key)


def _frame_kind(batch: logstream.Batch) -> str:
    if batch.kind == LogChunk.Kind.GAP:
        return "gap"
    return "metric" if batch.is_metrics else "log"


@database_sync_to_async
def _metric_points(job_id: int, upto: int) -> tuple[list[dict[str, Any]], int]:
    return logstream.metric_points(job_id, 0, upto)


@database_sync_to_async
def _head_cursor(job_id: int) -> int:
    return logstream.head_cursor(job_id)
