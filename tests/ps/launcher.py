"""A small local launcher for the tests: one real process per role, as the node agent starts them.

Each process gets its own environment (the DMLC_* and TRAINYARD_* variables the platform sets),
its own stdout/stderr pipes drained by reader threads, and its own session, so that a test can
SIGKILL one of them; `Job.stop()` kills every process still alive, by PID, and tests call it in a
`finally`.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from workers import contract

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "workers" / "examples"
PS_SCRIPT = EXAMPLES / "digits_ps.py"
KV_SCRIPT = Path(__file__).resolve().parent / "kv_script.py"
DDP_SCRIPT = EXAMPLES / "digits_ddp.py"

# Never wait forever on a process in a test. This only turns a hang into a failure, far beyond
# anything the runtime should take (its own bound on noticing a dead peer is 20 s); it measures
# nothing and no test asserts on time.
HANG_GUARD_S = 300.0


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def base_env() -> dict[str, str]:
    keep = ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "VIRTUAL_ENV")
    env = {k: v for k, v in os.environ.items() if k in keep}
    env.update({"PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"})
    return env


@dataclass
class Proc:
    tag: str
    popen: subprocess.Popen[str]
    lines: list[tuple[float, str, str]] = field(default_factory=list)  # (time, stream, text)
    readers: list[threading.Thread] = field(default_factory=list)
    exited_at: float | None = None

    def text(self, stream: str | None = None) -> str:
        return "".join(t for _, s, t in list(self.lines) if stream in (None, s))

    def stdout_lines(self) -> list[str]:
        return [t.rstrip("\n") for _, s, t in list(self.lines) if s == "stdout"]


@dataclass
class Job:
    procs: dict[str, Proc]

    def __getitem__(self, tag: str) -> Proc:
        return self.procs[tag]

    def wait(self, guard_s: float = HANG_GUARD_S) -> dict[str, int]:
        """Wait for every process to exit on its own; return the exit codes by tag."""
        deadline = time.monotonic() + guard_s
        for proc in self.procs.values():
            proc.popen.wait(timeout=max(0.1, deadline - time.monotonic()))
            proc.exited_at = proc.exited_at or time.monotonic()
        for proc in self.procs.values():
            for reader in proc.readers:
                reader.join(10)
        return {tag: int(p.popen.returncode) for tag, p in self.procs.items()}

    def watch_exits(self, guard_s: float = HANG_GUARD_S) -> dict[str, int]:
        """Like wait(), but note each process's exit time as it happens (for measurements)."""
        deadline = time.monotonic() + guard_s
        while time.monotonic() < deadline:
            running = False
            for proc in self.procs.values():
                if proc.exited_at is None:
                    if proc.popen.poll() is None:
                        running = True
                    else:
                        proc.exited_at = time.monotonic()
            if not running:
                break
            time.sleep(0.05)
        return self.wait(guard_s=1.0)

    def wait_for_line(self, tag: str, needle: str, guard_s: float = HANG_GUARD_S) -> None:
        deadline = time.monotonic() + guard_s
        while needle not in self.procs[tag].text("stdout"):
            if self.procs[tag].popen.poll() is not None:
                raise AssertionError(f"{tag} exited before printing {needle!r}:\n{self.dump()}")
            if time.monotonic() > deadline:
                raise AssertionError(f"{tag} never printed {needle!r}:\n{self.dump()}")
            time.sleep(0.05)

    def stop(self) -> None:
        """Kill what is still running, each process (and its session) by its own PID."""
        for proc in self.procs.values():
            if proc.popen.poll() is None:
                try:
                    os.killpg(proc.popen.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                proc.popen.wait(10)

    def dump(self) -> str:
        return "\n".join(
            f"--- {tag} (exit {p.popen.poll()}) ---\n{p.text()}" for tag, p in self.procs.items()
        )


def _drain(proc: Proc, stream: str) -> None:
    pipe = proc.popen.stdout if stream == "stdout" else proc.popen.stderr
    assert pipe is not None
    for line in pipe:
        proc.lines.append((time.monotonic(), stream, line))


def spawn(tag: str, script: Path, args: list[str], env: dict[str, str]) -> Proc:
    popen = subprocess.Popen(
        [sys.executable, "-u", str(script), *args],
        env=env,
        cwd=REPO,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group: killpg reaches only this process
    )
    proc = Proc(tag, popen)
    for stream in ("stdout", "stderr"):
        reader = threading.Thread(target=_drain, args=(proc, stream), daemon=True)
        reader.start()
        proc.readers.append(reader)
    return proc


def ps_env(role: str, index: int, servers: int, workers: int, port: int) -> dict[str, str]:
    env = base_env()
    env.update(
        {
            contract.DMLC_ROLE: role,
            contract.DMLC_PS_ROOT_URI: "127.0.0.1",
            contract.DMLC_PS_ROOT_PORT: str(port),
            contract.DMLC_NUM_SERVER: str(servers),
            contract.DMLC_NUM_WORKER: str(workers),
            contract.TRAINYARD_JOB_ID: "1",
            contract.TRAINYARD_ROLE: role,
            contract.TRAINYARD_INDEX: str(index),
        }
    )
    return env


@contextmanager
def ps_job(servers: int, workers: int, args: list[str], script: Path = PS_SCRIPT) -> Iterator[Job]:
    """1 scheduler + `servers` + `workers` processes of `script`, like the platform starts them."""
    port = free_port()
    roles = [("scheduler", 0)]
    roles += [("server", i) for i in range(servers)]
    roles += [("worker", i) for i in range(workers)]
    job = Job({})
    try:
        for role, index in roles:
            tag = role if role == "scheduler" else f"{role}-{index}"
            env = ps_env(role, index, servers, workers, port)
            job.procs[tag] = spawn(tag, script, args, env)
        yield job
    finally:
        job.stop()


@contextmanager
def ddp_job(ranks: int, args: list[str], extra_env: dict[str, str] | None = None) -> Iterator[Job]:
    """digits_ddp.py with `ranks` processes and torchrun's variables, as the platform runs it;
    `extra_env` is added to every process's environment."""
    port = free_port()
    job = Job({})
    try:
        for rank in range(ranks):
            env = base_env()
            env.update(
                {
                    contract.MASTER_ADDR: "127.0.0.1",
                    contract.MASTER_PORT: str(port),
                    contract.WORLD_SIZE: str(ranks),
                    contract.RANK: str(rank),
                    contract.LOCAL_RANK: "0",
                    contract.TRAINYARD_ROLE: "master" if rank == 0 else "worker",
                    contract.TRAINYARD_INDEX: str(rank),
                }
            )
            env.update(extra_env or {})
            tag = "master" if rank == 0 else f"worker-{rank}"
            job.procs[tag] = spawn(tag, DDP_SCRIPT, args, env)
        yield job
    finally:
        job.stop()
