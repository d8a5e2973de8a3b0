"""Websocket authentication for scripts (Authorization: Token) and an Origin check that lets
non-browser clients in.

Browsers always send Origin, so checking it when present stops cross-site websocket hijacking:
a page elsewhere, even on this host at another port (http://localhost:3000), cannot open a
user's job stream with their cookie. Scripts send none and authenticate with a token instead of
a cookie.
"""

from typing import Any
from urllib.parse import urlsplit

from channels.db import database_sync_to_async
from channels.security.websocket import WebsocketDenier
from django.conf import settings
from django.contrib.auth.models import AnonymousUser
from django.http.request import split_domain_port, validate_host
from django.utils.http import is_same_domain

from jobs.tokens import token_for_key

# The scope key that holds the id of the API token a websocket was opened with, so that the
# stream can end when that token is revoked (jobs.services.revocation).
TOKEN_ID_SCOPE_KEY = "api_token_id"  # noqa: S105  (a scope key, no secret)


class TokenAuthMiddleware:
    def __init__(self, inner: Any) -> None:
        self.inner = inner

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> Any:
        headers = dict(scope.get("headers", []))
        auth = headers.get(b"authorization", b"").decode("latin-1")
        if auth.startswith("Token "):
            token = await database_sync_to_async(token_for_key)(auth[6:].strip())
            if token is None:
                scope = dict(scope, user=AnonymousUser())
            else:
                scope = dict(scope, user=token.user, **{TOKEN_ID_SCOPE_KEY: token.pk})
        return await self.inner(scope, receive, send)


DEFAULT_PORTS = {"http": 80, "https": 443}


class OriginCheck:
    """Refuses a websocket whose Origin is not the site's own nor a trusted one.

    The site's own origin is the request's Host with the scheme the page had (ws → http,
    wss → https, or https where SECURE_PROXY_SSL_HEADER says the proxy took TLS), so scheme,
    host and port must all match, as Django's CSRF check requires of an HTTP POST. Trusted
    origins are Django's CSRF_TRUSTED_ORIGINS (wildcards like https://*.example.com too): one
    setting for both. A Host outside ALLOWED_HOSTS is refused, as Django refuses it over HTTP.
    No Origin at all (a script with a token) passes.
    """

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> Any:
        headers = dict(scope.get("headers", []))
        origin = headers.get(b"origin")
        if origin is not None and not origin_allowed(origin.decode("latin-1"), scope, headers):
            denier = WebsocketDenier()
            return await denier(scope, receive, send)
        return await self.inner(scope, receive, send)


def origin_allowed(origin: str, scope: dict[str, Any], headers: dict[bytes, bytes]) -> bool:
    own = _own_origin(scope, headers)
    if own is None:
        return False
    if _normalised(origin) == own:
        return True
    return _trusted(origin)


def _own_origin(scope: dict[str, Any], headers: dict[bytes, bytes]) -> str | None:
    """scheme://host[:port] of the site as this request reached it; None if its Host is not
    one this site answers to."""
    raw_host = headers.get(b"host", b"").decode("latin-1")
    if settings.USE_X_FORWARDED_HOST and b"x-forwarded-host" in headers:
        raw_host = headers[b"x-forwarded-host"].decode("latin-1")
    domain, _ = split_domain_port(raw_host)
    allowed = settings.ALLOWED_HOSTS
    if settings.DEBUG and not allowed:
        allowed = [".localhost", "127.0.0.1", "[::1]"]  # as Django's HttpRequest.get_host()
    if not domain or not validate_host(domain, allowed):
        return None
    scheme = "https" if scope.get("scheme", "ws") in {"wss", "https"} else "http"
    proxy_header = settings.SECURE_PROXY_SSL_HEADER
    if proxy_header is not None:
        name, value = proxy_header
        # HTTP_X_FORWARDED_PROTO → x-forwarded-proto, as Django reads it from request.META.
        header = name.removeprefix("HTTP_").replace("_", "-").lower().encode("latin-1")
        if header in headers:
            scheme = "https" if headers[header].decode("latin-1") == value else "http"
    return _normalised(f"{scheme}://{raw_host}")


def _normalised(origin: str) -> str | None:
    """scheme://host:port in lower case with the port always written, so that
    http://Example.com and http://example.com:80 compare equal; None if it is no origin."""
    try:
        parts = urlsplit(origin.strip())
        port = parts.port
    except ValueError:
        return None
    if parts.scheme not in DEFAULT_PORTS or not parts.hostname:
        return None
    if parts.path not in {"", "/"} or parts.query or parts.fragment or parts.username:
        return None
    host = parts.hostname.lower()
    if ":" in host:  # IPv6 literal
        host = f"[{host}]"
    return f"{parts.scheme}://{host}:{port or DEFAULT_PORTS[parts.scheme]}"


def _trusted(origin: str) -> bool:
    """In CSRF_TRUSTED_ORIGINS, exactly or as a subdomain of a wildcard entry (the rules of
    Django's CsrfViewMiddleware)."""
    normalised = _normalised(origin)
    if normalised is None:
        return False
    scheme = normalised.split("://", 1)[0]
    netloc = urlsplit(origin.strip()).netloc.lower()
    for trusted in settings.CSRF_TRUSTED_ORIGINS:
        if "*" not in trusted:
            if _normalised(trusted) == normalised:
                return True
            continue
        pattern = urlsplit(trusted)
        if pattern.scheme == scheme and is_same_domain(netloc, pattern.netloc.lstrip("*")):
            return True
    return False
