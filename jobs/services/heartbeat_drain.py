"""Heartbeats taken straight off a Redis list, past Celery (issue 24): a Celery task costs the
console worker about 0.8 ms of CPU before its own code runs, which at 1,000 nodes every 5 s was
most of what heartbeats cost.

While the console worker runs this loop (TRAINYARD_HEARTBEAT_DRAIN, on by default) it keeps
contract.HEARTBEATS_DRAINED_KEY set, with a TTL of FLAG_TTL_SECONDS that it refreshes every
REFRESH_SECONDS, and agents RPUSH their signed heartbeats onto contract.HEARTBEATS_KEY instead
of sending the task (workers/heartbeat_route.py: what an agent does, and what becomes of
heartbeats when the console dies). The loop waits on the list with BLPOP (idle, it costs
nothing but a wake-up a second), then TRAINYARD_HEARTBEAT_BATCH_SECONDS for more to arrive,
then takes what did (at most heartbeat_batch.MAX_BATCH, with one LPOP) and hands it on as the
task would: a payload that is not a JSON object is dropped, one too large is refused
(heartbeat_limits.too_large), each with a log line, and the rest go through
heartbeat_batch.write (signatures, rate, one transaction), the one way in for both paths.

Two console workers may both drain: LPOP is atomic, so each heartbeat is taken by one of them.
A warm stop deletes the flag, so agents send tasks again at once, then writes what is still on
the list (a console worker beside it refreshes the flag within REFRESH_SECONDS). A loop that
starts while no flag lives deletes what is on the list first: it was pushed before the last
console worker died, and is older than what the agents send next.
"""

import json
import logging
import os
import socket
import time
from collections.abc import Callable
from typing import Any

import redis
from django.conf import settings
from django.db import close_old_connections

from jobs.redis_client import get_blocking_redis
from jobs.services import heartbeat_batch, heartbeat_limits
from jobs.services.periodic import PeriodicPass
from workers import contract

log = logging.getLogger(__name__)

FLAG_TTL_SECONDS = 15
REFRESH_SECONDS = 5.0
# BLPOP's time-out: how long an idle loop sleeps, and so how long a stop may wait for it.
WAIT_SECONDS = 1.0
# What a stop writes after deleting the flag: what agents pushed just before it went.
LAST_BATCHES = 4
# Payloads that are not JSON objects are logged at most this often, with a count.
LOG_EVERY_SECONDS = 60.0


# KEYS: the flag, the list; ARGV: the owner, the flag's TTL. The count dropped, or -1 when a
# flag already lived (another console worker drains: what is on the list is fresh).
_RAISE_FLAG_DROP_LEFTOVERS = """
if not redis.call('SET', KEYS[1], ARGV[1], 'NX', 'EX', ARGV[2]) then return -1 end
local stale = redis.call('LLEN', KEYS[2])
redis.call('DEL', KEYS[2])
return stale
"""


class DrainLoop(PeriodicPass[int]):
    """Takes heartbeats off the list until stopped; each pass takes and writes one batch
    (returns how many it took), or waits WAIT_SECONDS for one."""

    what = "heartbeat drain"

    def __init__(self, client: redis.Redis | None = None) -> None:
        super().__init__(WAIT_SECONDS)
        # Bytes, not text: a push that is not UTF-8 must fail one payload's parse, not the
        # decoding of a whole batch that other nodes' heartbeats are in.
        self.client = client or get_blocking_redis(WAIT_SECONDS, "heartbeat-drain")
        self._owner = f"{socket.gethostname()}:{os.getpid()}"  # whose flag it is, for a reader
        self._refreshed = -REFRESH_SECONDS
        self._junk = 0  # payloads that were not JSON objects, since the last log line
        self._junk_logged = -LOG_EVERY_SECONDS

    def run(self) -> None:
        log.info("heartbeats drained from Redis list %s", contract.HEARTBEATS_KEY)
        self._quietly(self.forget_leftovers)
        try:
            while not self.stopped.is_set():
                self.run_once()
        finally:
            self._quietly(self.finish)

    def _quietly(self, step: Callable[[], None]) -> None:
        close_old_connections()
        try:
            step()
        except Exception:  # the console worker goes on (or stops) whatever this is
            log.exception("%s: %s failed", self.what, step.__name__)
        finally:
            close_old_connections()

    def forget_leftovers(self) -> None:
        """Raise the flag if none lives and, in the same step, drop what is on the list: it
        was pushed under a flag that has expired. Atomic (a script), so that a second console
        worker starting at the same moment cannot find no flag, then drop what agents pushed
        under the first one's fresh flag."""
        dropped = int(
            self.client.eval(
                _RAISE_FLAG_DROP_LEFTOVERS,
                2,
                contract.HEARTBEATS_DRAINED_KEY,
                contract.HEARTBEATS_KEY,
                self._owner,
                FLAG_TTL_SECONDS,
            )
        )
        if dropped >= 0:
            self._refreshed = time.monotonic()  # the flag is ours and fresh
        if dropped > 0:
            log.info("dropped %d heartbeats pushed before the last console worker went", dropped)

    def one_pass(self) -> int:
        try:
            return self._take_and_write()
        except redis.RedisError as exc:
            # Agents send tasks once the flag expires; this waits for Redis to come back.
            log.warning("%s: Redis: %s", self.what, exc)
            self.stopped.wait(self.interval)
            return 0

    def _take_and_write(self) -> int:
        now = time.monotonic()
        if now - self._refreshed >= REFRESH_SECONDS:
            self.client.set(contract.HEARTBEATS_DRAINED_KEY, self._owner, ex=FLAG_TTL_SECONDS)
            self._refreshed = now
        first = self.client.blpop([contract.HEARTBEATS_KEY], timeout=self.interval)
        if first is None:
            return 0
        # What arrives meanwhile joins this batch (as heartbeat_batch's window does).
        self.stopped.wait(settings.TRAINYARD_HEARTBEAT_BATCH_SECONDS)
        raw = [first[1], *self._take(heartbeat_batch.MAX_BATCH - 1)]
        self._write(raw)
        return len(raw)

    def _write(self, raw: list[bytes | str]) -> None:
        payloads = self.admitted(raw)
        if payloads:
            heartbeat_batch.write(payloads)

    # Bytes, as the client is made (str only where a test hands in a client that decodes).
    def _take(self, count: int) -> list[bytes | str]:
        taken = self.client.lpop(contract.HEARTBEATS_KEY, count)
        return taken if isinstance(taken, list) else []  # with a count: a list, or None

    def admitted(self, raw: list[bytes | str]) -> list[dict[str, Any]]:
        """The pushed heartbeats worth checking: JSON objects no larger than the limits allow
        (the rest are dropped, each kind with its log line)."""
        payloads = []
        for message in raw:
            try:
                payload = json.loads(message)
            # Not JSON, not UTF-8 (UnicodeDecodeError is a ValueError), or nested too deep to
            # parse: one payload's fault, never the batch's (other nodes' heartbeats are in it).
            except (ValueError, RecursionError):
                payload = None
            if not isinstance(payload, dict):
                self._refuse_junk(message)
            elif not heartbeat_limits.too_large(payload):
                payloads.append(payload)
        return payloads

    def _refuse_junk(self, message: bytes | str) -> None:
        # Counted for all nodes together: a payload that is not a JSON object names none.
        self._junk += 1
        now = time.monotonic()
        if now - self._junk_logged < LOG_EVERY_SECONDS:
            return
        log.warning(
            "dropped %d pushed heartbeat(s) that were not JSON objects in the last minute; "
            "the latest began %r",
            self._junk, message[:80],
        )  # fmt: skip
        self._junk, self._junk_logged = 0, now

    def finish(self) -> None:
        """Agents back to the Celery task now; what they pushed before is written."""
        self.client.delete(contract.HEARTBEATS_DRAINED_KEY)
        for _ in range(LAST_BATCHES):
            raw = self._take(heartbeat_batch.MAX_BATCH)
            if not raw:
                break
            self._write(raw)

    def stop(self, timeout: float = WAIT_SECONDS + 5) -> None:
        """Stop, and wait (a while) for the flag to go and the last heartbeats to be written."""
        super().stop()
        if self.is_alive():
            self.join(timeout)
