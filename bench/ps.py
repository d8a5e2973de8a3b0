"""Parameter server vs DDP: the digits example trained three ways on the same 2 workers.

The baseline is workers/examples/digits_ddp.py with 2 ranks; next to it, digits_ps.py with
1 scheduler + 2 servers + 2 workers in kvstore mode dist_sync, then dist_async. All three use the
same per-worker batch, seed and number of epochs, and each process is started as the platform
starts it: its own environment, session and pipes, one thread (OMP_NUM_THREADS=1).

The figure is the median over epochs of the job-wide samples_per_sec that rank 0 / worker 0
prints, leaving out the first epoch (warm-up); the accuracy is the run's final eval_accuracy.

    python -m bench.ps
"""

import os
import signal
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from stack.redis_server import free_port
from workers import contract

ROOT = Path(__file__).resolve().parent.parent
DDP_SCRIPT = ROOT / "workers" / "examples" / "digits_ddp.py"
PS_SCRIPT = ROOT / "workers" / "examples" / "digits_ps.py"

WORKERS = 2
SERVERS = 2
EPOCHS = 8
BATCH_SIZE = 32
SEED = 0

# Only turns a hang into a failure; far beyond what a run takes, and nothing is asserted on it.
RUN_GUARD_S = 600.0


@dataclass
class _Process:
    """One started process whose stdout and stderr are read to the end by two threads."""

    tag: str
    popen: subprocess.Popen[str]
    stdout: list[str] = field(default_factory=list)
    stderr: list[str] = field(default_factory=list)
    readers: list[threading.Thread] = field(default_factory=list)

    def tail(self, lines: int = 15) -> str:
        text = [f"  {self.tag} (exit {self.popen.poll()}):"]
        text += [f"    {line}" for line in (self.stdout + self.stderr)[-lines:]]
        return "\n".join(text)


@dataclass
class RunResult:
    label: str
    rates: dict[int, float]  # epoch -> job-wide samples/s
    accuracy: float
    seconds: float  # wall time of the whole run, start of the first process to exit of the last

    @property
    def median_rate(self) -> float:
        """Median over the epochs after the first, which also pays for warming up."""
        return statistics.median(rate for epoch, rate in self.rates.items() if epoch > 1)


class RunFailed(Exception):
    pass


def _read(pipe: IO[str], into: list[str]) -> None:
    for line in pipe:
        into.append(line.rstrip("\n"))


def _spawn(tag: str, argv: list[str], extra_env: dict[str, str]) -> _Process:
    # Only what a process needs from ours: nothing inherited can change its role or rendezvous.
    keep = ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "VIRTUAL_ENV")
    env = {key: value for key, value in os.environ.items() if key in keep}
    env.update({"PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", **extra_env})
    popen = subprocess.Popen(
        argv,
        cwd=ROOT,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # a group of its own, so killing it reaches nothing else
    )
    process = _Process(tag, popen)
    for pipe, into in ((popen.stdout, process.stdout), (popen.stderr, process.stderr)):
        reader = threading.Thread(target=_read, args=(pipe, into), daemon=True)
        reader.start()
        process.readers.append(reader)
    return process


def _ddp_envs(port: int) -> list[tuple[str, dict[str, str]]]:
    envs = []
    for rank in range(WORKERS):
        envs.append(
            (
                f"rank-{rank}",
                {
                    contract.MASTER_ADDR: "127.0.0.1",
                    contract.MASTER_PORT: str(port),
                    contract.WORLD_SIZE: str(WORKERS),
                    contract.RANK: str(rank),
                    contract.LOCAL_RANK: "0",
                    contract.TRAINYARD_ROLE: "master" if rank == 0 else "worker",
                    contract.TRAINYARD_INDEX: str(rank),
                },
            )
        )
    return envs


def _ps_envs(port: int) -> list[tuple[str, dict[str, str]]]:
    roles = [("scheduler", 0)]
    roles += [("server", i) for i in range(SERVERS)]
    roles += [("worker", i) for i in range(WORKERS)]
    envs = []
    for role, index in roles:
        envs.append(
            (
                f"{role}-{index}",
                {
                    contract.DMLC_ROLE: role,
                    contract.DMLC_PS_ROOT_URI: "127.0.0.1",
                    contract.DMLC_PS_ROOT_PORT: str(port),
                    contract.DMLC_NUM_SERVER: str(SERVERS),
                    contract.DMLC_NUM_WORKER: str(WORKERS),
                    contract.TRAINYARD_ROLE: role,
                    contract.TRAINYARD_INDEX: str(index),
                },
            )
        )
    return envs


def _run(
    label: str, argv: list[str], envs: list[tuple[str, dict[str, str]]], reporter: str
) -> RunResult:
    """Start every process, wait for all to exit 0, and parse the figures `reporter` printed."""
    processes: list[_Process] = []
    started = time.monotonic()
    try:
        for tag, env in envs:
            processes.append(_spawn(tag, argv, env))
        while any(p.popen.poll() is None for p in processes):
            # One failed process stops the others soon enough, but not waiting for that gives
            # a clearer message; the guard only turns a hang into a failure.
            failed = [p for p in processes if p.popen.poll() not in (None, 0)]
            if failed:
                raise RunFailed(f"{failed[0].tag} exited with code {failed[0].popen.returncode}")
            if time.monotonic() - started > RUN_GUARD_S:
                raise RunFailed(f"still running after {RUN_GUARD_S:.0f} s")
            time.sleep(0.1)
        seconds = time.monotonic() - started
        for p in processes:
            for reader in p.readers:
                reader.join(10)
        failed = [p for p in processes if p.popen.returncode != 0]
        if failed:
            raise RunFailed(f"{failed[0].tag} exited with code {failed[0].popen.returncode}")
        rates, accuracy = _parse(next(p for p in processes if p.tag == reporter).stdout)
        return RunResult(label, rates, accuracy, seconds)
    except RunFailed as exc:
        details = "\n".join(p.tail() for p in processes)
        raise RunFailed(f"{label}: {exc}\n{details}") from None
    finally:
        for p in processes:
            if p.popen.poll() is None:  # not reaped yet, so its PID is still its own
                try:
                    os.killpg(p.popen.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                p.popen.wait(10)


def _parse(lines: list[str]) -> tuple[dict[int, float], float]:
    """The job-wide `epoch=E/N ... samples_per_sec=R ...` lines and `final eval_accuracy=A`."""
    rates: dict[int, float] = {}
    accuracy: float | None = None
    for line in lines:
        fields = dict(token.split("=", 1) for token in line.split() if "=" in token)
        try:
            if line.startswith("epoch=") and "samples_per_sec" in fields:
                rates[int(fields["epoch"].split("/")[0])] = float(fields["samples_per_sec"])
            elif line.startswith("final ") and "eval_accuracy" in fields:
                accuracy = float(fields["eval_accuracy"])
        except ValueError:
            raise RunFailed(f"cannot read the line {line!r}") from None
    missing = sorted(set(range(1, EPOCHS + 1)) - set(rates))
    if missing or accuracy is None:
        raise RunFailed(f"output lacks epochs {missing} or the final accuracy")
    return rates, accuracy


def ps_vs_ddp() -> bool:
    """Train the three ways and print one line of figures; False (and why) if a run failed."""
    args = ["--epochs", str(EPOCHS), "--batch-size", str(BATCH_SIZE), "--seed", str(SEED)]
    try:
        ddp = _run(
            "DDP", [sys.executable, str(DDP_SCRIPT), *args], _ddp_envs(free_port()), "rank-0"
        )
        runs = [
            _run(
                mode,
                [sys.executable, str(PS_SCRIPT), "--kvstore", mode, *args],
                _ps_envs(free_port()),
                "worker-0",
            )
            for mode in ("dist_sync", "dist_async")
        ]
    except (RunFailed, OSError) as exc:
        print(f"ps: FAILED {exc}")
        return False
    parts = [
        f"ps: DDP {WORKERS} ranks {ddp.median_rate:.0f} samples/s (median epoch), "
        f"acc {ddp.accuracy:.4f}"
    ]
    for run in runs:
        parts.append(
            f"{run.label} {run.median_rate:.0f} samples/s = "
            f"{run.median_rate / ddp.median_rate:.2f}x DDP, acc {run.accuracy:.4f}"
        )
    print(" | ".join(parts))
    return True


if __name__ == "__main__":
    sys.exit(0 if ps_vs_ddp() else 1)
