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
The viewers of one job in one web process share one reader of its log (jobs/logfanout.py);
each still gets every line after its own cursor, once and in order, at its own pace.
"""

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import parse_qs

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from django.conf import settings
from django.http import Http404
from redis import RedisError
from uvicorn.protocols.utils import ClientDisconnected

from jobs import logfanout, logstream
from jobs.access import get_job_for
from jobs.services import revocation
from jobs.services.lifecycle.events import job_group
from jobs.services.views.presenters import job_state_payload
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
    # Set once this consumer has closed the socket: an event that arrives after (the final
    # state, relayed by the channel layer while the log's end went out) is dropped, since the
    # server may not send after a close, and the error raised there aborted the connection.
    closed = False

    async def close(self, code: int | bool | None = None, reason: str | None = None) -> None:
        self.closed = True
        await super().close(code=code, reason=reason)

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
        # Their CancelledError comes back as a result; this task's own, should it be cancelled
        # meanwhile, is raised (suppressing CancelledError around each await swallowed it too,
        # and a consumer cancelled while disconnecting went on waiting for messages: an event
        # loop closing waited for it forever).
        tasks = self._cancel_tasks()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)

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
        try:
            await self._send(event["payload"])
        except ClientDisconnected:
            return
        except _TooSlow:
            await self._close_too_slow()

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
        # The job's one feed in this web process (jobs/logfanout.py) reads the log; this
        # consumer sends what comes after its own cursor, at its client's pace.
        position = after
        try:
            async with contextlib.aclosing(logfanout.watch(self.job_id, after)) as pieces:
                async for piece in pieces:
                    if not piece.batches:
                        await self._send({"type": "heartbeat", "next": position})
                        continue
                    end = piece.end()
                    if end is not None:
                        # The end marker is written after the final state commits, but the
                        # state event travels another way and may come later than this: send
                        # the final state now, so a client never closes on a stale one.
                        state = await _state_for(self.scope["user"], self.job_id)
                        if state is not None:
                            await self._send({"type": "state", "job": state})
                        await self._send({"type": "end", "reason": end.reason, "next": end.last})
                        await self.close()
                        return
                    frames, reached = piece.frames_after(position)
                    for text in frames:
                        await self._send_text(text)
                    position = max(position, reached)
        except ClientDisconnected:
            # The client went away first (`trainyard logs -f` closes as soon as it reads the
            # end, a tab closes): nothing failed, and nothing is left to close.
            log.debug("the client of job %s's log stream went away", self.job_id)
        except _TooSlow:
            await self._close_too_slow()
        except Exception:
            # Redis away, say: the client reconnects from its cursor and loses nothing.
            log.exception("relaying the log of job %s failed", self.job_id)
            with contextlib.suppress(ClientDisconnected):
                await self.close(code=CLOSE_SERVER_ERROR)

    async def _send(self, frame: dict[str, Any]) -> None:
        """Send, or give up on a client that takes too long to read: the server never queues
        more than the one frame in flight for it."""
        self._still_open()
        async with _client_takes_it_in_time():
            await self.send_json(frame)

    async def _send_text(self, text: str) -> None:
        """`_send` of a frame already encoded (shared by every viewer at the same cursor)."""
        self._still_open()
        async with _client_takes_it_in_time():
            await self.send(text_data=text)

    async def _close_too_slow(self) -> None:
        """Close a client that did not take a frame in time (a log frame or a state event)."""
        # Worth a line: a proxy that buffers badly, or a tab left in the background, shows
        # up here again and again.
        log.info(
            "closing the log stream of job %s with %d: the client did not take a frame "
            "within %s s (it resumes from the last frame it read)",
            self.job_id, CLOSE_TOO_SLOW, settings.TRAINYARD_WS_SEND_TIMEOUT_SECONDS,
        )  # fmt: skip
        with contextlib.suppress(ClientDisconnected):
            await self.close(code=CLOSE_TOO_SLOW)

    def _still_open(self) -> None:
        """ClientDisconnected once this consumer has closed the socket (the relay may have a
        frame in hand when an event's too-slow client or a revocation closes it)."""
        if self.closed:
            raise ClientDisconnected


@contextlib.asynccontextmanager
async def _client_takes_it_in_time() -> AsyncIterator[None]:
    """_TooSlow when the send inside takes longer than TRAINYARD_WS_SEND_TIMEOUT_SECONDS.

    asyncio.timeout, not asyncio.wait_for: on Python 3.11, wait_for returns normally when the
    task is cancelled just as the send completes, and the cancel is lost; a relay cancelled by
    its stream's close would go on relaying. (The same race inside redis-py kept cancelled
    log feeds reading: see jobs.redis_client.get_async_redis.)
    """
    try:
        async with asyncio.timeout(settings.TRAINYARD_WS_SEND_TIMEOUT_SECONDS):
            yield
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


@database_sync_to_async
def _metric_points(job_id: int, upto: int) -> tuple[list[dict[str, Any]], int]:
    return logstream.metric_points(job_id, 0, upto)


@database_sync_to_async
def _head_cursor(job_id: int) -> int:
    return logstream.head_cursor(job_id)
