"""Start the whole Trainyard stack on this machine and stop it on Ctrl-C.

    python -m stack.run [--port 8000] [--nodes 2]

Every process is started by us, in its own session, and stopped by its PID (never by name):
node agents first, so they stop their trainers and report, then the console worker, the web
server and Redis.
"""

import argparse
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from stack.redis_server import free_port, redis_argv, redis_server_binary, wait_for_redis

ROOT = Path(__file__).resolve().parent.parent
STOP_TIMEOUT_SECONDS = 30.0


@dataclass
class Child:
    name: str
    argv: list[str]
    proc: subprocess.Popen[bytes]
    log_path: Path
    log_file: IO[bytes]


@dataclass
class Stack:
    var_dir: Path
    port: int
    nodes: int = 2
    node_cpus: int = 4
    node_memory_gb: int = 16
    redis_url: str = ""  # empty: start our own
    code_root: Path | None = None
    extra_env: dict[str, str] = field(default_factory=dict)
    children: list[Child] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(
            {
                "DJANGO_SETTINGS_MODULE": "console.settings",
                "TRAINYARD_VAR_DIR": str(self.var_dir),
                "REDIS_URL": self.redis_url,
                "PYTHONUNBUFFERED": "1",
            }
        )
        if self.code_root is not None:
            env["TRAINYARD_CODE_ROOT"] = str(self.code_root)
        env.update(self.extra_env)
        return env

    # --- start ---

    def prepare(self) -> str:
        """Migrate, load the starter catalog, make the admin; returns 'user password'."""
        self.var_dir.mkdir(parents=True, exist_ok=True)
        (self.var_dir / "logs").mkdir(exist_ok=True)
        self.manage("migrate", "--noinput", quiet=True)
        self.manage("load_catalog", quiet=True)
        return self.manage("ensure_admin").strip()

    def manage(self, *args: str, quiet: bool = False) -> str:
        result = subprocess.run(
            [sys.executable, str(ROOT / "manage.py"), *args],
            env=self.env(),
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=False,
        )
        if result.returncode != 0:
            raise RuntimeError(f"manage.py {' '.join(args)} failed:\n{result.stderr}")
        return "" if quiet else result.stdout

    def _spawn(self, name: str, argv: list[str]) -> Child:
        log_path = self.var_dir / "logs" / f"{name}.log"
        log_file = open(log_path, "ab")  # closed in stop()
        proc = subprocess.Popen(
            argv,
            env=self.env(),
            cwd=ROOT,
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # Ctrl-C reaches us only; we stop children in order
        )
        child = Child(name, argv, proc, log_path, log_file)
        self.children.append(child)
        return child

    def start(self) -> None:
        if _port_in_use(self.port):
            raise RuntimeError(f"port {self.port} is in use; pick another with PORT=...")
        if not self.redis_url:
            redis_port = free_port()
            data_dir = self.var_dir / "redis"
            data_dir.mkdir(parents=True, exist_ok=True)
            self.redis_url = f"redis://127.0.0.1:{redis_port}/0"
            child = self._spawn("redis", redis_argv(redis_server_binary(), redis_port, data_dir))
            wait_for_redis(self.redis_url, child.proc)
        else:
            wait_for_redis(self.redis_url, None)
        py = sys.executable
        self._spawn(
            "web",
            [py, "-m", "uvicorn", "console.asgi:application", "--host", "127.0.0.1",
             "--port", str(self.port), "--ws-ping-interval", "20",
             # Compressing every log frame cost the web process more CPU than relaying it.
             "--ws-per-message-deflate", "false"],
        )  # fmt: skip
        self._spawn(
            "console-worker",
            [py, "-m", "celery", "-A", "console", "worker", "-Q", "console",
             "-n", f"console@{self.port}", "--pool", "threads", "--concurrency", "4",
             "--without-mingle", "--without-gossip", "--loglevel", "INFO"],
        )  # fmt: skip
        self._spawn("log-keeper", [py, str(ROOT / "manage.py"), "keep_logs"])
        for i in range(1, self.nodes + 1):
            self._spawn(
                f"node-{i}",
                [py, "-m", "workers.agent", "--node", f"node-{i}", "--address", "127.0.0.1",
                 "--cpus", str(self.node_cpus), "--memory-gb", str(self.node_memory_gb),
                 "--workdir", str(self.var_dir / "agents")],
            )  # fmt: skip
        self.wait_ready()

    def wait_ready(self, timeout: float = 90.0) -> None:
        """Until the web server answers and every agent has registered its node."""
        deadline = time.monotonic() + timeout
        last = ""
        while time.monotonic() < deadline:
            self.check_alive()
            try:
                with urllib.request.urlopen(f"{self.url}/healthz", timeout=2) as response:  # noqa: S310
                    health = json.load(response)
                if health.get("nodes_live", 0) >= self.nodes:
                    return
                last = f"{health.get('nodes_live', 0)} of {self.nodes} nodes registered"
            except (urllib.error.URLError, ConnectionError, TimeoutError, ValueError) as exc:
                last = str(exc)
            time.sleep(0.2)
        raise RuntimeError(f"the stack did not become ready in {timeout:.0f} s: {last}")

    def check_alive(self) -> None:
        for child in self.children:
            code = child.proc.poll()
            if code is not None:
                tail = child.log_path.read_text(errors="replace").splitlines()[-30:]
                raise RuntimeError(
                    f"{child.name} exited with code {code}; last lines of {child.log_path}:\n"
                    + "\n".join(tail)
                )

    def restart(self, name: str, down_seconds: float = 0.0) -> None:
        """Stop one process by its PID and start it again as it was (same port, same data).

        For trying out what survives a crash or an upgrade of one part.
        """
        child = next(c for c in self.children if c.name == name)
        _stop_child(child)
        self.children.remove(child)
        time.sleep(down_seconds)
        self._spawn(name, child.argv)
        if name == "redis":
            wait_for_redis(self.redis_url, self.children[-1].proc)

    # --- stop ---

    def stop(self) -> None:
        # Agents first (they stop their trainers and report), then whoever they report to.
        def stage(child: Child) -> int:
            # The keeper stops after the agents, so it archives their last lines.
            return {"console-worker": 1, "log-keeper": 1, "web": 2, "redis": 3}.get(child.name, 0)

        for rank in sorted({stage(c) for c in self.children}):
            group = [c for c in self.children if stage(c) == rank]
            for child in group:
                _signal_group(child.proc, signal.SIGTERM)
            for child in group:
                _stop_child(child, signalled=True)
        self.children.clear()


def _stop_child(child: Child, signalled: bool = False) -> None:
    if not signalled:
        _signal_group(child.proc, signal.SIGTERM)
    try:
        child.proc.wait(STOP_TIMEOUT_SECONDS)
    except subprocess.TimeoutExpired:
        _signal_group(child.proc, signal.SIGKILL)
        child.proc.wait()
    child.log_file.close()


def _signal_group(proc: subprocess.Popen[bytes], sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        pass


def _port_in_use(port: int) -> bool:
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Run Trainyard on this machine.")
    parser.add_argument("--port", type=int, default=int(os.environ.get("PORT", "8000")))
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument("--var-dir", type=Path, default=ROOT / "var")
    args = parser.parse_args(argv)

    stack = Stack(
        var_dir=args.var_dir.resolve(),
        port=args.port,
        nodes=args.nodes,
        redis_url=os.environ.get("REDIS_URL", ""),
    )
    pid_file = stack.var_dir / "stack.pid"
    if pid_file.exists():
        try:
            other = int(pid_file.read_text())
            os.kill(other, 0)
        except (ValueError, ProcessLookupError, PermissionError):
            pass
        else:
            print(f"Trainyard already runs from this folder (pid {other}).", file=sys.stderr)
            return 1

    stopping = False

    def on_signal(signum: int, frame: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    try:
        login = stack.prepare()
        stack.var_dir.mkdir(parents=True, exist_ok=True)
        pid_file.write_text(str(os.getpid()))
        print(
            "Starting Redis, the web server, the console worker, the log keeper and "
            f"{args.nodes} node agents…",
            flush=True,
        )
        stack.start()
        user, _, password = login.partition(" ")
        print(f"\nTrainyard is running at {stack.url}/", flush=True)
        if password:
            print(f"Log in as {user} / {password}", flush=True)
        print(f"Logs of each process: {stack.var_dir / 'logs'}/", flush=True)
        print("Press Ctrl-C to stop everything.", flush=True)
        while not stopping:
            stack.check_alive()
            time.sleep(0.5)
        return 0
    except RuntimeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    finally:
        print("\nStopping…", flush=True)
        stack.stop()
        pid_file.unlink(missing_ok=True)
        print("Stopped.", flush=True)


if __name__ == "__main__":
    sys.exit(main())
