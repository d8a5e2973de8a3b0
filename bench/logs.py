"""The log path, trainer -> node agent -> Redis -> websocket, beside a bare pipe reader.

Starts the real stack (stack.run.Stack with one node, code root bench/programs/) and follows
each job's log on the websocket as a browser does. Every figure sits beside a baseline measured
in the same run:

1. Throughput: a job printing 200,000 lines as fast as print() goes, in lines/s from its first
   print to the last line the websocket client received; beside the same program read by a bare
   pipe reader (subprocess stdout=PIPE, line by line). Lines lost, duplicated and out of order
   are counted by the sequence number in each line. Then the same with the lines written 1,000
   at a time, where the trainer's print() speed no longer limits the rate.
2. Latency from print to the websocket client at a steady 10,000 lines/s (p50, p99); beside the
   pipe reader at the same pace. Each line carries its print time.
3. The agent's CPU time (user + sys) per 100k lines during the 200,000-line job; beside the pipe
   reader's.
   Then the same lines read back from the database after a job during which Redis was killed
   -9 mid-stream (it comes back on its append-only file, synced once a second): lines lost,
   duplicated and out of order.
4. A small training loop that logs one line per step: its steps/s (timed inside the trainer) run
   by the agent with a websocket client following (the target), by the agent with nobody
   following, and with stdout to /dev/null (the baseline); rounds alternate, best of each.

Before each measured run the stack is left to settle, so that no figure pays for the tail of the
one before (such as the archiving of the last job's log).

Targets are printed with PASS/FAIL and never fail the run; a lost, duplicated or reordered line
or a job that does not succeed does.

    python -m bench.logs
"""

import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil
import websockets

from stack.redis_server import free_port
from stack.run import Stack
from workers.launcher import TRAINER_LIB, inherited_env

PROGRAMS = Path(__file__).resolve().parent / "programs"
LIFT_LOG_LIMITS = (
    "from jobs.models import FrameworkImage; "
    "FrameworkImage.objects.update(log_lines_per_second=10**8, log_max_mb=10**7)"
)

FLOOD_LINES = 200_000
FLOOD_BULK = 1000
PACED_RATE = 10_000
PACED_SECONDS = 6.0
TRAIN_STEPS = 1500
TRAIN_ROUNDS = 5  # each: followed on the websocket, unwatched, to /dev/null

TARGET_LINES_PER_S = 300_000
TARGET_P99_S = 0.100
TARGET_TRAIN_RATIO = 0.98

# A job's program sleeps this long before its first print, so that the websocket client is
# attached by then and every line is measured live rather than replayed from Redis.
HEADSTART_S = 1.0
# Only turns a hung run into a failure; no figure is judged against it.
RUN_GUARD_S = 180.0
# Before each measured run, wait (at most SETTLE_GUARD_S) until the stack's processes together
# use less than IDLE_CORES of a core over SETTLE_WINDOW_S.
SETTLE_WINDOW_S = 0.5
IDLE_CORES = 0.1
SETTLE_GUARD_S = 15.0

# Other processes' CPU use (in cores) above which the figures get a note that they were shared.
NOTICEABLE_OTHER_CORES = 0.1

# What the agent gives a cpu-1 trainer, so the pipe and /dev/null baselines run the same way:
# trainer_lib first on the path, whose sitecustomize makes stdout line-buffered.
TRAINER_ENV = {
    "PYTHONPATH": str(TRAINER_LIB),
    "OMP_NUM_THREADS": "1",
    "CUDA_VISIBLE_DEVICES": "",
}


class RunFailed(Exception):
    pass


@dataclass
class Lines:
    """The numbered lines one reader got, in the order it got them."""

    seq: list[int] = field(default_factory=list)
    printed: list[float] = field(default_factory=list)  # time.time() in the trainer
    arrived: list[float] = field(default_factory=list)  # time.time() in the reader
    agent: list[float] = field(default_factory=list)  # the agent's read time (end to end only)
    other: list[str] = field(default_factory=list)  # lines that are not numbered
    reader_cpu_s: float = 0.0  # CPU time of this process while it read

    def add(self, text: str, arrived: float, agent: float | None = None) -> None:
        # "seq=<n> t=<time> ...", as bench/programs/flood.py and paced.py print them.
        parts = text.split(" ", 2)
        if len(parts) < 2 or not parts[0].startswith("seq=") or not parts[1].startswith("t="):
            self.other.append(text)
            return
        self.seq.append(int(parts[0][4:]))
        self.printed.append(float(parts[1][2:]))
        self.arrived.append(arrived)
        if agent is not None:
            self.agent.append(agent)

    def faults(self, expected: int) -> tuple[int, int, int]:
        """(lost, duplicated, out of order) against seq 0 .. expected - 1."""
        counts = [0] * expected
        strays = 0
        for n in self.seq:
            if 0 <= n < expected:
                counts[n] += 1
            else:
                strays += 1
        lost = counts.count(0)
        duplicated = strays + sum(c - 1 for c in counts if c > 1)
        out_of_order = sum(1 for a, b in zip(self.seq, self.seq[1:], strict=False) if b < a)
        return lost, duplicated, out_of_order

    def fault_text(self, expected: int) -> str:
        lost, duplicated, out_of_order = self.faults(expected)
        return f"lines lost {lost}, duplicated {duplicated}, out of order {out_of_order}"

    def ok(self, expected: int) -> bool:
        return self.faults(expected) == (0, 0, 0)

    def require(self, what: str) -> "Lines":
        """Itself, or RunFailed when no numbered line arrived at all (no figure to take)."""
        if not self.seq:
            raise RunFailed(f"{what}: no numbered line arrived; other lines: {self.other[-5:]}")
        return self

    def span(self) -> float:
        """Seconds from the first print to the last arrival."""
        return max(self.arrived) - min(self.printed)

    def latencies(self) -> list[float]:
        return [a - p for a, p in zip(self.arrived, self.printed, strict=True)]


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _ms(values: list[float]) -> str:
    # Three significant digits: the pipe's latencies are tens of microseconds.
    return (
        f"p50 {_quantile(values, 0.5) * 1000:.3g} ms, p99 {_quantile(values, 0.99) * 1000:.3g} ms"
    )


# --- baselines: the same programs without the platform ---------------------------------------


def _trainer_argv(program: str, *args: str) -> list[str]:
    # The agent runs `python script args` (workers/launcher.py); so do the baselines.
    return [sys.executable, str(PROGRAMS / program), *args]


def _trainer_env() -> dict[str, str]:
    return {**inherited_env(), **TRAINER_ENV}


def pipe_read(program: str, *args: str) -> Lines:
    """Run a program with stdout=PIPE and read it line by line, as bare as Python reads."""
    lines = Lines()
    cpu = time.process_time()
    proc = subprocess.Popen(
        _trainer_argv(program, *args),
        env=_trainer_env(),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    assert proc.stdout is not None
    # Reading blocks until EOF: a hung program is killed, which ends the reading.
    hung = threading.Event()

    def kill() -> None:
        hung.set()
        proc.kill()

    guard = threading.Timer(RUN_GUARD_S, kill)
    guard.start()
    raw: list[tuple[bytes, float]] = []
    try:
        with proc.stdout:
            for line in proc.stdout:
                raw.append((line, time.time()))
    finally:
        guard.cancel()
    lines.reader_cpu_s = time.process_time() - cpu  # the reading only, not the parsing below
    code = proc.wait()
    if code != 0:
        raise RunFailed(
            f"{program} exited with code {code} under the pipe reader"
            + (f" (killed after {RUN_GUARD_S:.0f} s)" if hung.is_set() else "")
        )
    for line, arrived in raw:
        lines.add(line.decode().rstrip("\n"), arrived)
    return lines


def devnull_run(program: str, *args: str) -> None:
    """Run a program with stdout and stderr to /dev/null."""
    try:
        code = subprocess.run(
            _trainer_argv(program, *args),
            env=_trainer_env(),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            timeout=RUN_GUARD_S,
            check=False,
        ).returncode
    except subprocess.TimeoutExpired:
        raise RunFailed(f"{program} still running after {RUN_GUARD_S:.0f} s") from None
    if code != 0:
        raise RunFailed(f"{program} exited with code {code} with stdout to /dev/null")


# --- end to end: a job on the stack, followed on the websocket -------------------------------


@dataclass
class Followed:
    lines: Lines
    reason: str  # the end frame's
    state: dict[str, Any]  # the last state frame's job
    stderr: list[str]
    frames: Counter[str]  # how many of each type


class Console:
    """Submits jobs through the API and follows their logs on the websocket, as a browser."""

    def __init__(self, stack: Stack, token: str) -> None:
        self.stack = stack
        self.headers = {"Authorization": f"Token {token}"}
        self.http = httpx.Client(base_url=stack.url, headers=self.headers, timeout=30)
        self.ws_url = stack.url.replace("http://", "ws://", 1)

    def close(self) -> None:
        self.http.close()

    def submit(self, name: str, program: str, *args: str) -> int:
        """A one-instance cpu-1 job; returns its id."""
        response = self.http.post(
            "/api/v1/jobs",
            json={
                "name": name,
                "image": "pytorch:2.13-cpu",
                "program": {"script": program, "args": list(args)},
                "roles": {"master": {"package": "cpu-1", "instances": 1}},
            },
        )
        if response.status_code != 201:
            raise RunFailed(f"submitting {name}: HTTP {response.status_code} {response.text}")
        return int(response.json()["id"])

    def follow(self, name: str, program: str, *args: str) -> Followed:
        """Run a job and follow its log on the websocket to the end frame."""
        job_id = self.submit(name, program, *args)
        followed = asyncio.run(self._follow(job_id))
        if followed.state.get("state") != "succeeded":
            tail = "\n".join(followed.stderr[-10:])
            raise RunFailed(f"job {job_id} ({name}) ended: {followed.reason}\n{tail}")
        return followed

    def line_count(self, job_id: int) -> int:
        response = self.http.get(f"/api/v1/jobs/{job_id}/logs/counts")
        response.raise_for_status()
        return int(response.json()["total"])

    def wait_archived(self, job_id: int) -> dict[str, Any]:
        """The job once it has ended and its whole log is in the database (polled)."""
        deadline = time.monotonic() + RUN_GUARD_S
        while True:
            response = self.http.get(f"/api/v1/jobs/{job_id}")
            if response.status_code == 200:
                job: dict[str, Any] = response.json()
                if job["state"] in ("failed", "cancelled") or job["log_archived"]:
                    return job
            if time.monotonic() > deadline:
                raise RunFailed(f"job {job_id}: log not archived after {RUN_GUARD_S:.0f} s")
            time.sleep(0.2)

    def log_lines(self, job_id: int) -> list[dict[str, Any]]:
        """The job's whole log over the HTTP API, paged with `after`."""
        lines: list[dict[str, Any]] = []
        after = 0
        while True:
            response = self.http.get(
                f"/api/v1/jobs/{job_id}/logs", params={"after": after, "limit": 10_000}
            )
            response.raise_for_status()
            page = response.json()
            lines.extend(page["lines"])
            if page["complete"] or page["next"] == after:
                return lines
            after = page["next"]

    def unwatched(self, name: str, program: str, *args: str) -> None:
        """Run a job with nobody on its log; only its state is polled, once a second (each
        poll costs the web server CPU that the trainer would feel)."""
        job_id = self.submit(name, program, *args)
        deadline = time.monotonic() + RUN_GUARD_S
        while True:
            response = self.http.get(f"/api/v1/jobs/{job_id}")
            response.raise_for_status()
            job = response.json()
            if job["state"] == "succeeded":
                return
            if job["state"] in ("failed", "cancelled"):
                raise RunFailed(f"job {job_id} ({name}) {job['state']}: {job.get('reason')}")
            if time.monotonic() > deadline:
                raise RunFailed(f"job {job_id} ({name}) not done after {RUN_GUARD_S:.0f} s")
            time.sleep(1.0)

    async def _follow(self, job_id: int) -> Followed:
        frames: list[tuple[float, dict[str, Any]]] = []
        counts: Counter[str] = Counter()
        state: dict[str, Any] = {}
        loop = asyncio.get_running_loop()
        deadline = loop.time() + RUN_GUARD_S
        url = f"{self.ws_url}/ws/jobs/{job_id}/?after=0"
        cpu = time.process_time()
        # No Origin header, as a client that is not a browser; compression stays on, as
        # browsers ask for it, so the server pays for it as it would.
        async with websockets.connect(
            url, additional_headers=self.headers, max_size=None, open_timeout=30
        ) as ws:
            while True:
                try:
                    raw = await asyncio.wait_for(ws.recv(), max(0.0, deadline - loop.time()))
                except TimeoutError:
                    raise RunFailed(
                        f"job {job_id}: no end frame after {RUN_GUARD_S:.0f} s"
                    ) from None
                except websockets.ConnectionClosed as closed:
                    raise RunFailed(
                        f"job {job_id}: socket closed before the end: {closed}"
                    ) from None
                arrived = time.time()
                frame = json.loads(raw)
                kind = str(frame.get("type"))
                counts[kind] += 1
                if kind == "log":
                    # Lines are taken apart after the end, so that this client, which shares
                    # the 2 cores with everything it measures, does as little as it can.
                    frames.append((arrived, frame))
                elif kind == "state":
                    state = frame["job"]
                elif kind == "end":
                    reason = str(frame.get("reason", ""))
                    break
                # Anything else (heartbeat, gap, metric, newer types) is only counted.
        lines = Lines(reader_cpu_s=time.process_time() - cpu)
        stderr: list[str] = []
        for arrived, frame in frames:
            for stream, agent_ts, text in _frame_lines(frame):
                if stream == "stdout":
                    lines.add(text, arrived, agent_ts)
                else:
                    stderr.append(text)
        return Followed(lines, reason, state, stderr, counts)


def _frame_lines(frame: dict[str, Any]) -> Iterator[tuple[str, float, str]]:
    """(stream, time the agent read it, text) of each line of a "log" frame.

    Takes both shapes the log path has had: "lines", one object per line, and "batches" of
    consecutive lines of one pipe, with the agent's read time of the batch's first line.
    """
    for line in frame.get("lines", []):
        yield line["stream"], float(line["ts"]), line["text"]
    for batch in frame.get("batches", []):
        for text in batch["lines"]:
            yield batch["stream"], float(batch["ts"]), text


def _cpu_times(pid: int) -> tuple[float, float]:
    """(user + sys of the process, user + sys of its children that it has reaped)."""
    times = psutil.Process(pid).cpu_times()
    return times.user + times.system, times.children_user + times.children_system


class CpuMeter:
    """CPU time (user + sys) each process of the stack used since the meter was made."""

    def __init__(self, stack: Stack) -> None:
        self.pids = {child.name: child.proc.pid for child in stack.children}
        self.before = {name: _cpu_times(pid) for name, pid in self.pids.items()}

    def used(self) -> dict[str, float]:
        """By process name, plus "trainer": the agents' reaped children, that is, the trainers
        that ended meanwhile."""
        now = {name: _cpu_times(pid) for name, pid in self.pids.items()}
        used = {name: now[name][0] - self.before[name][0] for name in self.pids}
        used["trainer"] = sum(
            now[name][1] - self.before[name][1] for name in self.pids if name.startswith("node-")
        )
        return used


class OtherLoad:
    """CPU time that processes outside this bench took from the machine since it was made.

    The machine has 2 cores and may be shared (a test suite, another stack): what others take
    shows up as slower, noisier figures here, so it is printed beside them. Ours is this process,
    its reaped children (pipe and /dev/null runs), and the stack's processes with the trainers
    they reaped; steal time counts as others'.
    """

    def __init__(self, stack: Stack) -> None:
        self.pids = [child.proc.pid for child in stack.children]
        self.start = time.monotonic()
        self.busy, self.ours = self._busy(), self._ours()

    @staticmethod
    def _busy() -> float:
        c = psutil.cpu_times()
        return float(c.user + c.nice + c.system + c.irq + c.softirq + c.steal)

    def _ours(self) -> float:
        t = os.times()
        own = t.user + t.system + t.children_user + t.children_system
        return own + sum(sum(_cpu_times(pid)) for pid in self.pids)

    def note(self) -> str:
        """A line to print when others took a noticeable share, else ""."""
        others = (self._busy() - self.busy) - (self._ours() - self.ours)
        cores = others / (time.monotonic() - self.start)
        if cores < NOTICEABLE_OTHER_CORES:
            return ""
        return (
            f"  note: other processes took {cores:.2f} of this machine's "
            f"{psutil.cpu_count()} cores meanwhile; these figures are lower and noisier for it"
        )


def _per_lines(used: dict[str, float], lines: int, per: int, skip: str = "") -> str:
    return ", ".join(
        f"{name} {seconds * per / lines:.2f} s" for name, seconds in used.items() if name != skip
    )


def _print_if(text: str) -> None:
    if text:
        print(text)


def settle(stack: Stack) -> None:
    """Wait until the stack is idle, so that no figure pays for the work of the one before
    (e.g. the archiving of the last job's log). Gives up quietly after SETTLE_GUARD_S."""
    pids = [child.proc.pid for child in stack.children]
    deadline = time.monotonic() + SETTLE_GUARD_S
    before = sum(_cpu_times(pid)[0] for pid in pids)
    while time.monotonic() < deadline:
        time.sleep(SETTLE_WINDOW_S)
        now = sum(_cpu_times(pid)[0] for pid in pids)
        if now - before < SETTLE_WINDOW_S * IDLE_CORES:
            return
        before = now
    print(f"  (the stack was still busy after {SETTLE_GUARD_S:.0f} s; measuring anyway)")


# --- the four figures --------------------------------------------------------------------------


def throughput_and_cpu(console: Console, bulk: int = 0) -> bool:
    """`bulk` 0: the trainer print()s line by line; else it writes `bulk` lines at a time."""
    settle(console.stack)
    others = OtherLoad(console.stack)
    meter = CpuMeter(console.stack)
    e2e = console.follow(
        "bench-logs-flood", "flood.py", str(FLOOD_LINES), str(HEADSTART_S), str(bulk)
    )
    used = meter.used()
    used["ws client"] = e2e.lines.reader_cpu_s
    settle(console.stack)
    pipe = pipe_read("flood.py", str(FLOOD_LINES), "0", str(bulk))
    e2e.lines.require("end to end")
    pipe.require("pipe")

    rate = FLOOD_LINES / e2e.lines.span()
    pipe_rate = FLOOD_LINES / pipe.span()
    first = min(e2e.lines.printed)
    verdict = "PASS" if rate >= TARGET_LINES_PER_S else "FAIL"
    how = f"written {bulk:,} at a time" if bulk else "printed as fast as print() goes"
    print(f"throughput, {FLOOD_LINES:,} lines {how}, first print -> last line received:")
    print(
        f"  end to end    {rate:>9,.0f} lines/s ({e2e.lines.span():.2f} s; the trainer had "
        f"printed all at {max(e2e.lines.printed) - first:.2f} s, the agent read all by "
        f"{max(e2e.lines.agent) - first:.2f} s)  target >= {TARGET_LINES_PER_S:,}: {verdict}"
    )
    print(
        f"  baseline pipe {pipe_rate:>9,.0f} lines/s ({pipe.span():.2f} s) -> "
        f"end to end / pipe: {rate / pipe_rate:.2f}x"
    )
    print(f"  end to end: {e2e.lines.fault_text(FLOOD_LINES)}; frames {dict(e2e.frames)}")
    print(f"  pipe: {pipe.fault_text(FLOOD_LINES)}")

    agent = used["node-1"] * 100_000 / FLOOD_LINES
    pipe_cpu = pipe.reader_cpu_s * 100_000 / FLOOD_LINES
    print(
        f"agent CPU per 100k lines (user+sys, during the {FLOOD_LINES:,}-line job): "
        f"{agent:.2f} s; baseline pipe reader {pipe_cpu:.3f} s -> {agent / pipe_cpu:.1f}x"
    )
    print(
        f"  the rest, same job, per 100k lines: {_per_lines(used, FLOOD_LINES, 100_000, 'node-1')}"
    )
    _print_if(others.note())
    return e2e.lines.ok(FLOOD_LINES) and pipe.ok(FLOOD_LINES)


def redis_killed_mid_stream(console: Console) -> bool:
    """A paced job (PACED_RATE lines/s for PACED_SECONDS) during which Redis is killed -9 once
    a third of its lines are in; every line read back from the archived log, counted."""
    settle(console.stack)
    expected = int(PACED_RATE * PACED_SECONDS)
    job_id = console.submit("bench-logs-redis-killed", "paced.py", str(PACED_RATE),
                            str(PACED_SECONDS))  # fmt: skip
    deadline = time.monotonic() + RUN_GUARD_S
    while console.line_count(job_id) < expected // 3:
        if time.monotonic() > deadline:
            raise RunFailed(f"job {job_id}: {expected // 3} lines not in after {RUN_GUARD_S} s")
        time.sleep(0.05)
    console.stack.restart("redis", how=signal.SIGKILL)
    job = console.wait_archived(job_id)
    if job["state"] != "succeeded":
        raise RunFailed(f"job {job_id} (Redis killed mid-stream) ended: {job.get('reason')}")
    lines = Lines()
    for line in console.log_lines(job_id):
        lines.add(line["text"], 0.0)
    print(
        f"Redis killed -9 mid-stream ({expected:,} lines at {PACED_RATE:,}/s), lines in the "
        f"database: {lines.fault_text(expected)}"
    )
    return lines.ok(expected)


def latency(console: Console) -> bool:
    rate, seconds = str(PACED_RATE), str(PACED_SECONDS)
    expected = int(PACED_RATE * PACED_SECONDS)
    settle(console.stack)
    others = OtherLoad(console.stack)
    meter = CpuMeter(console.stack)
    e2e = console.follow("bench-logs-paced", "paced.py", rate, seconds, str(HEADSTART_S))
    used = meter.used()
    used["ws client"] = e2e.lines.reader_cpu_s
    settle(console.stack)
    pipe = pipe_read("paced.py", rate, seconds)
    e2e.lines.require("end to end")
    pipe.require("pipe")
    lat, pipe_lat = e2e.lines.latencies(), pipe.latencies()
    to_agent = [a - p for a, p in zip(e2e.lines.agent, e2e.lines.printed, strict=True)]
    from_agent = [a - g for a, g in zip(e2e.lines.arrived, e2e.lines.agent, strict=True)]
    p99 = _quantile(lat, 0.99)
    verdict = "PASS" if p99 < TARGET_P99_S else "FAIL"
    print(f"latency, print -> reader at {PACED_RATE:,} lines/s for {PACED_SECONDS:.0f} s:")
    print(
        f"  end to end    {_ms(lat)}, max {max(lat) * 1000:.0f} ms  "
        f"target p99 < {TARGET_P99_S * 1000:.0f} ms: {verdict}"
    )
    # A line's ts is when the agent read the first line of its batch (up to 20 ms of lines
    # are sent together), so the split below is approximate and can be negative.
    print(
        f"    of which print -> agent read (batch's first line) {_ms(to_agent)}; "
        f"agent -> ws client {_ms(from_agent)}"
    )
    print(
        f"  baseline pipe {_ms(pipe_lat)} -> end to end / pipe: p50 "
        f"{_quantile(lat, 0.5) / _quantile(pipe_lat, 0.5):.0f}x, p99 "
        f"{p99 / _quantile(pipe_lat, 0.99):.0f}x"
    )
    print(f"  end to end: {e2e.lines.fault_text(expected)}; frames {dict(e2e.frames)}")
    print(f"  pipe: {pipe.fault_text(expected)}")
    print(f"  CPU per 100k lines at this pace: {_per_lines(used, expected, 100_000)}")
    _print_if(others.note())
    return e2e.lines.ok(expected) and pipe.ok(expected)


def _result(tmp: Path, name: str, mode: str) -> Path:
    """Where train.py wrote its rate: here, or in its job's checkpoint folder (found by its
    name, unique in the run)."""
    if mode == "devnull":
        return tmp / name
    found = list((tmp / "var" / "agents" / "checkpoints").glob(f"job-*/{name}"))
    if len(found) != 1:
        raise RunFailed(f"train.py's {name}: {len(found)} found in the checkpoint folders")
    return found[0]


def training(console: Console, tmp: Path) -> bool:
    modes = ("followed", "unwatched", "devnull")
    rates: dict[str, list[float]] = {mode: [] for mode in modes}
    followed_cpu: dict[str, float] = {}
    others = OtherLoad(console.stack)
    for round_ in range(TRAIN_ROUNDS):
        # Alternating, so that a slow spell of this shared machine hits every mode alike.
        for mode in modes:
            # Under the agent, a name in the job's checkpoint folder (the one place besides its
            # scratch folder a sandboxed trainer writes); bare, a path here.
            written = f"train-{mode}-{round_}.json"
            args = (str(TRAIN_STEPS), written if mode != "devnull" else str(tmp / written))
            settle(console.stack)
            if mode == "followed":
                meter = CpuMeter(console.stack)
                run = console.follow(f"bench-logs-train-{round_}", "train.py", *args)
                used = {**meter.used(), "ws client": run.lines.reader_cpu_s}
                for name, seconds in used.items():
                    followed_cpu[name] = followed_cpu.get(name, 0.0) + seconds
            elif mode == "unwatched":
                console.unwatched(f"bench-logs-train-{round_}-unwatched", "train.py", *args)
            else:
                devnull_run("train.py", *args)
            rates[mode].append(
                json.loads(_result(tmp, written, mode).read_text())["steps_per_second"]
            )
    best = {mode: max(values) for mode, values in rates.items()}
    print(
        f"training: an MLP on 1 CPU thread printing a step/loss/lr line per step, {TRAIN_STEPS} "
        f"steps, steps/s timed inside the trainer; {TRAIN_ROUNDS} rounds:"
    )
    labels = {
        "devnull": "stdout to /dev/null (baseline)",
        "followed": "under the agent, ws client following",
        "unwatched": "under the agent, nobody following",
    }
    for mode in ("devnull", "followed", "unwatched"):
        line = (
            f"  {labels[mode]:<38} {', '.join(f'{r:.0f}' for r in rates[mode])} steps/s,"
            f" best {best[mode]:.0f}"
        )
        if mode != "devnull":
            ratio = best[mode] / best["devnull"]
            # Each round's run beside the /dev/null run of the same round (they ran seconds
            # apart), then the median over rounds: what a slow spell of the machine moves least.
            paired = statistics.median(
                m / d for m, d in zip(rates[mode], rates["devnull"], strict=True)
            )
            line += (
                f" -> best {ratio * 100:.1f} % of /dev/null; median of per-round ratios "
                f"{paired * 100:.1f} %"
            )
            if mode == "followed":
                verdict = "PASS" if paired >= TARGET_TRAIN_RATIO else "FAIL"
                line += f"  target >= {TARGET_TRAIN_RATIO * 100:.0f} %: {verdict}"
        print(line)
    # One line per step, and the final one.
    lines = TRAIN_ROUNDS * (TRAIN_STEPS + 1)
    print(f"  CPU per 1k lines, followed runs: {_per_lines(followed_cpu, lines, 1_000)}")
    _print_if(others.note())
    return True


def log_path() -> bool:
    """Start a one-node stack, print the four figures, stop it; False if a line went astray."""
    with tempfile.TemporaryDirectory(prefix="bench-logs-") as folder:
        tmp = Path(folder)
        stack = Stack(var_dir=tmp / "var", port=free_port(), nodes=1, code_root=PROGRAMS)
        console: Console | None = None
        started = time.monotonic()
        try:
            stack.prepare()
            stack.start()
            console = Console(stack, stack.manage("token", "admin").strip())
            # This section measures what the log path carries: the image's log limits, which
            # would drop most of a flood on purpose, are lifted (bench/logquota.py measures them).
            stack.manage("shell", "-c", LIFT_LOG_LIMITS)
            ok = throughput_and_cpu(console)
            # The same lines written in bulk: what the log path carries when the trainer's
            # own printing is not the limit.
            ok = throughput_and_cpu(console, bulk=FLOOD_BULK) and ok
            ok = redis_killed_mid_stream(console) and ok
            ok = latency(console) and ok
            ok = training(console, tmp) and ok
            print(
                f"  (logs section: {time.monotonic() - started:.0f} s wall, stack start included)"
            )
            return ok
        except (
            # KeyError, ValueError: a frame or an answer not in the shape this bench knows.
            KeyError,
            ValueError,
            RunFailed,
            RuntimeError,
            OSError,
            httpx.HTTPError,
            websockets.WebSocketException,
        ) as exc:
            print(f"logs: FAILED {exc}")
            return False
        finally:
            if console is not None:
                console.close()
            stack.stop()


if __name__ == "__main__":
    sys.exit(0 if log_path() else 1)
