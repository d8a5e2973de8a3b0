"""REDIS_URL=rediss://...: Celery (the agents' and the console's) checks the server's
certificate as the URL says, against a real Redis that speaks TLS only."""

import shutil
import ssl
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from stack.redis_server import free_port, redis_server_binary, wait_for_redis
from workers.agent import make_celery
from workers.redis_tls import celery_ssl_options


def test_a_plain_url_has_no_tls_and_a_rediss_one_verifies_by_default() -> None:
    assert celery_ssl_options("redis://:pw@10.0.0.2:6379/0") is None
    assert celery_ssl_options("rediss://:pw@redis.internal:6380/0") == {
        "ssl_cert_reqs": ssl.CERT_REQUIRED
    }
    assert celery_ssl_options(
        "rediss://:pw@r:6380/0?ssl_cert_reqs=none&ssl_ca_certs=/etc/ca.pem&ssl_certfile=/c.pem"
    ) == {"ssl_cert_reqs": ssl.CERT_NONE, "ssl_ca_certs": "/etc/ca.pem", "ssl_certfile": "/c.pem"}
    with pytest.raises(ValueError, match="ssl_cert_reqs='sometimes' in REDIS_URL"):
        celery_ssl_options("rediss://r:6380/0?ssl_cert_reqs=sometimes")


def certificate(folder: Path, name: str) -> tuple[Path, Path]:
    if shutil.which("openssl") is None:
        pytest.fail("openssl is needed to make the test's certificates")
    cert, key = folder / f"{name}.pem", folder / f"{name}.key"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key),
         "-out", str(cert), "-days", "1", "-subj", "/CN=127.0.0.1",
         "-addext", "subjectAltName=IP:127.0.0.1"],
        check=True, capture_output=True,
    )  # fmt: skip
    return cert, key


@pytest.fixture
def tls_redis(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """A Redis that takes TLS connections only, with a password; (its address, its CA)."""
    cert, key = certificate(tmp_path, "server")
    port = free_port()
    proc = subprocess.Popen(
        [redis_server_binary(), "--port", "0", "--tls-port", str(port), "--bind", "127.0.0.1",
         "--tls-cert-file", str(cert), "--tls-key-file", str(key), "--tls-ca-cert-file",
         str(cert), "--tls-auth-clients", "no", "--requirepass", "pw", "--save", "",
         "--dir", str(tmp_path)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    address = f":pw@127.0.0.1:{port}/0"
    try:
        wait_for_redis(f"rediss://{address}?ssl_ca_certs={cert}", proc)
        yield address, cert
    finally:
        proc.terminate()
        proc.wait(10)


def test_celery_sends_over_tls_to_a_server_it_trusts(tls_redis: tuple[str, Path]) -> None:
    address, ca = tls_redis
    url = f"rediss://{address}?ssl_cert_reqs=required&ssl_ca_certs={ca}"
    app = make_celery(url)
    app.send_task("trainyard.test", kwargs={"x": 1}, queue="tls-check", retry=False)
    assert redis.Redis.from_url(url).llen("tls-check") == 1


def test_celery_refuses_a_server_whose_certificate_it_cannot_verify(
    tls_redis: tuple[str, Path], tmp_path: Path
) -> None:
    address, _ = tls_redis
    other_ca, _ = certificate(tmp_path, "other")
    app = make_celery(f"rediss://{address}?ssl_ca_certs={other_ca}")
    with pytest.raises(Exception, match=r"CERTIFICATE_VERIFY_FAILED|certificate verify failed"):
        app.send_task("trainyard.test", queue="tls-check", retry=False)
