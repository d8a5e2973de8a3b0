"""The job websocket: relays a job's log stream and state events to one browser.

It only relays: commands (cancel, submit) go through HTTP. Frames:
  {"type": "state", "job": {...}}           current state, then on every change
  {"type": "log", "lines": [...], "next": C} lines after the client's cursor, then live
  {"type": "end", "reason": "...", "next": C} the job's log is complete (after a last state
                                              frame with the final state); the socket closes
"""

import asyncio
import contextlib
from typing import Any
from urllib.parse import parse_qs

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from django.http import Http404

from jobs import logstream
from jobs.access import get_job_for
from jobs.redis_client import get_async_redis
from jobs.services.events import job_group
from jobs.services.lifecycle import job_state_payload

CLOSE_UNAUTHENTICATED = 4401
CLOSE_NOT_FOUND = 4404
CLOSE_BAD_REQUEST = 4400


@database_sync_to_async
def _state_for(user: Any, job_id: int) -> dict[str, Any] | None:
    try:
        return job_state_payload(get_job_for(user, job_id))
    except Http404:
        return None


class JobConsumer(AsyncJsonWebsocketConsumer):
    job_id: int
    follower: asyncio.Task[None] | None = None

    async def connect(self) -> None:
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            await self.close(code=CLOSE_UNAUTHENTICATED)
            return
        self.job_id = int(self.scope["url_route"]["kwargs"]["job_id"])
        query = parse_qs(self.scope.get("query_string", b"").decode())
        try:
            after = int(query.get("after", ["0"])[0])
        except ValueError:
            after = -1
        if after < 0:
            await self.close(code=CLOSE_BAD_REQUEST)
            return
        # Join before reading the state, so no change can fall between the two.
        await self.channel_layer.group_add(job_group(self.job_id), self.channel_name)
        state = await _state_for(user, self.job_id)
        if state is None:
            await self.channel_layer.group_discard(job_group(self.job_id), self.channel_name)
            await self.close(code=CLOSE_NOT_FOUND)
            return
        await self.accept()
        await self.send_json({"type": "state", "job": state})
        self.follower = asyncio.create_task(self._relay_log(after))

    async def disconnect(self, code: int) -> None:
        if self.follower is not None:
            self.follower.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.follower
        if hasattr(self, "job_id"):
            await self.channel_layer.group_discard(job_group(self.job_id), self.channel_name)

    async def job_event(self, event: dict[str, Any]) -> None:
        await self.send_json(event["payload"])

    async def _relay_log(self, after: int) -> None:
        client = get_async_redis(blocking_seconds=logstream.FOLLOW_BLOCK_SECONDS)
        try:
            async for entry in logstream.follow(client, self.job_id, after):
                if entry.end is not None:
                    # The end marker is written after the final state commits, but the state
                    # event travels another way and may come later than this: send the final
                    # state now, so a client never closes on a stale one.
                    state = await _state_for(self.scope["user"], self.job_id)
                    if state is not None:
                        await self.send_json({"type": "state", "job": state})
                    await self.send_json(
                        {"type": "end", "reason": entry.end, "next": entry.last_cursor}
                    )
                    await self.close()
                    return
                if entry.lines:
                    await self.send_json(
                        {
                            "type": "log",
                            "lines": [line.as_dict() for line in entry.lines],
                            "next": entry.last_cursor,
                        }
                    )
        finally:
            await client.aclose()
