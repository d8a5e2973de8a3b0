"""Redis clients of the console process, created on first use from settings.REDIS_URL."""

import functools

import redis
import redis.asyncio
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured


def _url() -> str:
    if not settings.REDIS_URL:
        raise ImproperlyConfigured("REDIS_URL is not set; start the console with `make run`.")
    return settings.REDIS_URL


# How much longer than a blocking read blocks its caller waits for the answer before it gives
# up on the connection (a socket timeout for the threads' clients, asyncio.timeout for the
# async ones).
READ_MARGIN_SECONDS = 10
ASYNC_CONNECT_SECONDS = 5


@functools.cache
def get_redis() -> redis.Redis:
    return redis.Redis.from_url(_url(), decode_responses=True)


def get_blocking_redis(blocking_seconds: float, name: str) -> redis.Redis:
    """A client of its own for a thread that issues blocking reads, which wait longer than
    they block, its connections called `name` in CLIENT LIST. It answers bytes, not text:
    what it reads was written by others (agents), and one value that is not UTF-8 must not
    make a whole reply undecodable."""
    return redis.Redis.from_url(
        _url(), socket_timeout=blocking_seconds + READ_MARGIN_SECONDS, client_name=name
    )


def get_async_redis(name: str | None = None) -> redis.asyncio.Redis:
    """A client for the caller's event loop (async clients can't be shared across loops),
    its connections called `name` in Redis's CLIENT LIST.

    It has no socket timeout: the caller bounds each command with asyncio.timeout
    (READ_MARGIN_SECONDS beyond what a blocking read blocks). With a socket timeout,
    redis-py sends every command under asyncio.wait_for, which on Python 3.11 drops a cancel
    that lands just as the send completes: about one cancelled log follower in twenty went on
    reading, and an event loop shutting down waited for it forever. asyncio.timeout does not
    drop cancels. Connecting still times out, and TCP keepalive notices a peer that vanished.
    """
    return redis.asyncio.Redis.from_url(
        _url(),
        decode_responses=True,
        socket_timeout=None,
        socket_connect_timeout=ASYNC_CONNECT_SECONDS,
        socket_keepalive=True,
        client_name=name,
    )
