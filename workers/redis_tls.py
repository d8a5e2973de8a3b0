"""TLS to Redis for Celery: a rediss:// URL's options as Celery's broker_use_ssl.

redis-py (the log path, the channel layer, Django's cache) reads `ssl_cert_reqs`,
`ssl_ca_certs`, `ssl_certfile` and `ssl_keyfile` from the URL's query by itself; Celery's
broker does not, and without them kombu connects without checking the server's certificate.
So both sides build Celery's settings from the same URL here, verifying by default.
"""

import ssl
from typing import Any
from urllib.parse import parse_qs, urlsplit

CERT_REQS = {"required": ssl.CERT_REQUIRED, "optional": ssl.CERT_OPTIONAL, "none": ssl.CERT_NONE}
FILES = ("ssl_ca_certs", "ssl_certfile", "ssl_keyfile")


def celery_ssl_options(url: str) -> dict[str, Any] | None:
    """broker_use_ssl for `url`: None for redis://; for rediss://, the certificate checks the
    query asks for (`ssl_cert_reqs=required`, the default, or optional or none) and the files
    it names."""
    parts = urlsplit(url)
    if parts.scheme != "rediss":
        return None
    query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
    wanted = query.get("ssl_cert_reqs", "required").lower().removeprefix("cert_")
    if wanted not in CERT_REQS:
        raise ValueError(f"ssl_cert_reqs={wanted!r} in REDIS_URL: use required, optional or none")
    options: dict[str, Any] = {"ssl_cert_reqs": CERT_REQS[wanted]}
    options.update({name: query[name] for name in FILES if name in query})
    return options
