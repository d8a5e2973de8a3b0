"""Websocket authentication for scripts (Authorization: Token) and an Origin check that lets
non-browser clients in.

Browsers always send Origin, so checking it when present stops cross-site websocket hijacking;
scripts send none and authenticate with a token instead of a cookie.
"""

from typing import Any
from urllib.parse import urlparse

from channels.db import database_sync_to_async
from channels.security.websocket import WebsocketDenier
from django.conf import settings
from django.contrib.auth.models import AnonymousUser
from django.http.request import validate_host

from jobs.tokens import user_for_token


class TokenAuthMiddleware:
    def __init__(self, inner: Any) -> None:
        self.inner = inner

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> Any:
        headers = dict(scope.get("headers", []))
        auth = headers.get(b"authorization", b"").decode("latin-1")
        if auth.startswith("Token "):
            user = await database_sync_to_async(user_for_token)(auth[6:].strip())
            scope = dict(scope, user=user or AnonymousUser())
        return await self.inner(scope, receive, send)


class OriginCheck:
    def __init__(self, inner: Any) -> None:
        self.inner = inner

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> Any:
        headers = dict(scope.get("headers", []))
        origin = headers.get(b"origin")
        if origin is not None:
            host = urlparse(origin.decode("latin-1")).hostname or ""
            if not validate_host(host, settings.ALLOWED_HOSTS):
                denier = WebsocketDenier()
                return await denier(scope, receive, send)
        return await self.inner(scope, receive, send)
