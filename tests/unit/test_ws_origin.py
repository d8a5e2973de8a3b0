"""The websocket Origin check: only the site's own origin (scheme, host and port) or one in
CSRF_TRUSTED_ORIGINS may open a stream with the user's cookie; scripts send no Origin."""

from typing import Any

import pytest
from channels.generic.websocket import AsyncWebsocketConsumer
from channels.testing import WebsocketCommunicator

from jobs.ws_auth import OriginCheck

# Consumers close stale database connections as they dispatch, so they need database access
# even here, where nothing is queried.
pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def in_memory_channel_layer(settings: Any) -> None:
    """The refusal (channels' WebsocketDenier) is a consumer too: it needs a layer, not Redis."""
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}


class Accepting(AsyncWebsocketConsumer):
    async def connect(self) -> None:
        await self.accept()


def checked(scheme: str = "ws") -> Any:
    """OriginCheck around a consumer that accepts everyone, reached over `scheme`."""
    app = OriginCheck(Accepting.as_asgi())

    async def with_scheme(scope: dict[str, Any], receive: Any, send: Any) -> Any:
        return await app(dict(scope, scheme=scheme), receive, send)

    return with_scheme


async def opens(
    origin: str | None, host: str = "127.0.0.1:8000", scheme: str = "ws", **more: str
) -> bool:
    headers = [(b"host", host.encode())]
    if origin is not None:
        headers.append((b"origin", origin.encode()))
    headers += [(k.replace("_", "-").encode(), v.encode()) for k, v in more.items()]
    communicator = WebsocketCommunicator(checked(scheme), "/ws/jobs/1/", headers=headers)
    connected, _ = await communicator.connect()
    await communicator.disconnect()
    return connected


async def test_it_accepts_the_same_scheme_host_and_port() -> None:
    assert await opens("http://127.0.0.1:8000")
    assert await opens("http://localhost:8000", host="localhost:8000")


async def test_it_accepts_a_default_port_written_or_not() -> None:
    assert await opens("http://localhost", host="localhost:80")
    assert await opens("https://localhost:443", host="localhost", scheme="wss")


async def test_it_refuses_the_same_host_at_another_port() -> None:
    assert not await opens("http://127.0.0.1:9999")
    assert not await opens("http://localhost:3000", host="localhost:8000")


async def test_it_refuses_another_host_name_of_the_same_machine() -> None:
    assert not await opens("http://localhost:8000", host="127.0.0.1:8000")


async def test_it_refuses_another_scheme() -> None:
    assert not await opens("https://127.0.0.1:8000")  # page over https, socket over ws
    assert not await opens("http://127.0.0.1:8000", scheme="wss")


async def test_it_refuses_other_sites_and_odd_origins() -> None:
    assert not await opens("http://evil.example:8000")
    assert not await opens("null")
    assert not await opens("")


async def test_it_refuses_a_host_outside_allowed_hosts(settings: Any) -> None:
    """A DNS-rebinding page would be its own origin; Django refuses that Host over HTTP too."""
    settings.ALLOWED_HOSTS = ["console.example"]
    assert not await opens("http://rebound.example:8000", host="rebound.example:8000")
    assert await opens("http://console.example:8000", host="console.example:8000")


async def test_it_accepts_a_trusted_origin(settings: Any) -> None:
    settings.CSRF_TRUSTED_ORIGINS = ["http://localhost:3000", "https://*.example.com"]
    assert await opens("http://localhost:3000")
    assert await opens("https://ci.example.com")
    assert not await opens("http://ci.example.com")  # the wildcard is for https only
    assert not await opens("http://localhost:3001")


async def test_it_takes_the_scheme_from_the_trusted_proxy_header(settings: Any) -> None:
    """Behind a proxy that ends TLS the socket arrives as ws, but the page was https."""
    settings.SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    assert await opens("https://127.0.0.1:8000", host="127.0.0.1:8000", x_forwarded_proto="https")
    assert not await opens("http://127.0.0.1:8000", x_forwarded_proto="https")


async def test_it_accepts_no_origin() -> None:
    """Scripts send no Origin; they authenticate with a token, not a cookie."""
    assert await opens(None)


async def test_the_console_wraps_its_websockets_in_the_check() -> None:
    from console.asgi import application

    communicator = WebsocketCommunicator(
        application,
        "/ws/jobs/1/",
        headers=[(b"host", b"127.0.0.1:8000"), (b"origin", b"http://127.0.0.1:9999")],
    )
    connected, _ = await communicator.connect()
    assert not connected
