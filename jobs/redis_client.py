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


@functools.cache
def get_redis() -> redis.Redis:
    return redis.Redis.from_url(_url(), decode_responses=True)


def get_async_redis(blocking_seconds: float = 0, name: str | None = None) -> redis.asyncio.Redis:
    """A client for the caller's event loop (async clients can't be shared across loops),
    its connections called `name` in Redis's CLIENT LIST.

    A client that issues blocking reads must wait longer than they block: redis-py's own
    socket timeout (5 s by default since redis-py 8) would otherwise cut them off.
    """
    return redis.asyncio.Redis.from_url(
        _url(), decode_responses=True, socket_timeout=blocking_seconds + 10, client_name=name
    )
