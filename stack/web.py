"""The console's web server: Django and Channels under uvicorn, static files by WhiteNoise.

    trainyard-web [--host 127.0.0.1] [--port 8000] [--workers 1]
    (or python -m stack.web ...)

`make run` starts it with one worker; a deployment runs it under systemd with several
(deploy/systemd/trainyard-web.service, docs/deploy.md). It listens on loopback unless told
otherwise: in production a reverse proxy that ends TLS sits in front of it, and only the
proxy's address is trusted for X-Forwarded-For and X-Forwarded-Proto.
"""

import argparse
import os
import sys

import uvicorn

APP = "console.asgi:application"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--host", default=os.environ.get("TRAINYARD_WEB_HOST", "127.0.0.1"))
    parser.add_argument(
        "--port", type=int, default=int(os.environ.get("TRAINYARD_WEB_PORT", "8000"))
    )
    parser.add_argument(
        "--workers",
        type=int,
        default=int(os.environ.get("TRAINYARD_WEB_WORKERS", "1")),
        help="processes (each serves pages, the API and websockets; they share nothing but "
        "the database and Redis)",
    )
    parser.add_argument(
        "--forwarded-allow-ips",
        default=os.environ.get("FORWARDED_ALLOW_IPS", "127.0.0.1"),
        help="the proxies whose X-Forwarded-* headers are believed (docs/operations.md)",
    )
    args = parser.parse_args(argv)
    if args.workers < 1:
        parser.error("--workers must be at least 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")
    uvicorn.run(
        APP,
        host=args.host,
        port=args.port,
        workers=args.workers,
        proxy_headers=True,
        forwarded_allow_ips=args.forwarded_allow_ips,
        ws_ping_interval=20,
        # Compressing every log frame cost the web process more CPU than relaying it.
        ws_per_message_deflate=False,
        # Open log websockets would otherwise hold a stop; clients resume from their cursor.
        timeout_graceful_shutdown=10,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
