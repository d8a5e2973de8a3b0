"""ASGI entry point: Django for HTTP, Channels for the job websockets."""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")
django_asgi_app = get_asgi_application()

from channels.auth import AuthMiddlewareStack  # noqa: E402  (needs Django set up first)
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402

from console.lifespan import lifespan  # noqa: E402
from jobs.routing import websocket_urlpatterns  # noqa: E402
from jobs.ws_auth import OriginCheck, TokenAuthMiddleware  # noqa: E402

application = ProtocolTypeRouter(
    {
        "http": django_asgi_app,
        "websocket": OriginCheck(
            AuthMiddlewareStack(TokenAuthMiddleware(URLRouter(websocket_urlpatterns)))
        ),
        "lifespan": lifespan,
    }
)
