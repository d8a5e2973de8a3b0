"""A job's start and end as a user sees them, beside bare torchrun of the same script.

Starts the real stack (one node, code root bench/programs/) and runs bench/programs/ddp_steps.py
as a two-instance job (master and worker, cpu-1 each) followed on the websocket as a browser
does, alternating with `torchrun --nproc_per_node 2` of the same script read through a pipe:

1. First line: from the submit (the POST leaves this process) to the first training line at
   the websocket client; beside torchrun's start to its first line on the pipe.
2. The end: from the last training line at the websocket client to the `succeeded` state frame;
   beside the last line on torchrun's pipe to torchrun's exit.
3. A timeline of the console's first start, stage by stage: the console's own records (job
   created, start message sent, the agent's started report, as the database has them), the
   trainer's (process created, interpreter at the script, torch imported, rendezvous done) and
   the client's; and torchrun's stages from the same trainer times.
4. The stack's idle cost: RSS of its processes and their children, and the CPU they take, over
   an idle window before the first job and after the last.

Medians of ROUNDS rounds, each a bare run then a console run. No asserts: figures, ratios and
the targets (issue 27) with PASS/FAIL; a job that does not succeed fails the run.

    python -m bench.startup [--rounds 3] [--timeline]
"""

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil
import websockets

from bench import logs
from bench.logs import PROGRAMS, TRAINER_ENV, settle
from stack.redis_server import free_port
from stack.run import Stack
from workers.launcher import inherited_env

PROGRAM = "ddp_steps.py"
STEPS = 20
ROUNDS = 3
TARGET_FIRST_RATIO = 0.6
TARGET_END_AFTER_EXIT_S = 0.25
TARGET_IDLE_GROWTH = 0.10
IDLE_WINDOW_S = 10.0
# Only turns a hung run into a failure; no figure is judged against it.
RUN_GUARD_S = 180.0


class RunFailed(Exception):
    pass


def _fields(text: str) -> dict[str, float]:
    """The key=value numbers of a ddp_steps.py line ("first t=... created=..."), by key."""
    found = {}
    for part in text.split()[1:]:
        key, _, value = part.partition("=")
        try:
            found[key] = float(value)
        except ValueError:
            continue
    return found


@dataclass
class Run:
    """One run's times (unix seconds), by stage name, and the trainer's own times."""

    times: dict[str, float] = field(default_factory=dict)
    trainer: dict[str, float] = field(default_factory=dict)  # rank 0's
    other: dict[str, float] = field(default_factory=dict)  # rank 1's

    def read(self, text: str, now: float) -> None:
        """Take in one line of ddp_steps.py's stdout, read by the client at `now`."""
        if text.startswith("first ") and "first line" not in self.times:
            self.times["first line"] = now
            self.trainer = _fields(text)
        elif text.startswith("rank1 "):
            self.other = _fields(text)
        elif text.startswith("last "):
            self.times["last line"] = now

    @property
    def first_line(self) -> float:
        return self.times["first line"] - self.times["start"]

    @property
    def end_gap(self) -> float:
        return self.times["end"] - self.times["last line"]


# --- the baseline: torchrun, read through a pipe ------------------------------------------------


def torchrun() -> Run:
    launcher = shutil.which("torchrun", path=str(Path(sys.executable).parent))
    if launcher is None:
        raise RunFailed("torchrun is not installed beside this Python")
    run = Run()
    env = {**inherited_env(), **TRAINER_ENV}
    run.times["start"] = time.time()
    proc = subprocess.Popen(
        [launcher, "--nproc_per_node", "2", str(PROGRAMS / PROGRAM), str(STEPS)],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    assert proc.stdout is not None
    with proc.stdout:
        for raw in proc.stdout:
            run.read(raw.decode(errors="replace"), time.time())
    code = proc.wait(timeout=RUN_GUARD_S)
    run.times["end"] = time.time()
    if code != 0 or "last line" not in run.times or not run.trainer:
        raise RunFailed(f"torchrun exited with code {code} (lines seen: {sorted(run.times)})")
    return run


# --- the console: a job through the API, followed on the websocket ----------------------------


class Console(logs.Console):
    """The log bench's API and websocket client, running one timed job at a time."""

    def run(self, name: str, pool: str = "", image: str = "pytorch:2.13-cpu") -> Run:
        """One timed job; `pool`: in that Slurm pool instead of on the agents; `image`: on
        that framework image (one that runs in containers, say)."""
        return asyncio.run(self._run(name, pool, image))

    async def _run(self, name: str, pool: str = "", image: str = "pytorch:2.13-cpu") -> Run:
        """Submit, then follow: the websocket is opened as soon as the job has an id, after=0,
        so no line is missed; a line that came before it is replayed, with its arrival time
        then (what a browser that opens the page at once would see)."""
        run = Run()
        body = {
            "name": name,
            "image": image,
            "program": {"script": PROGRAM, "args": [str(STEPS)]},
            "roles": {
                "master": {"package": "cpu-1", "instances": 1},
                "worker": {"package": "cpu-1", "instances": 1},
            },
        }
        if pool:
            body["pool"] = pool
        async with httpx.AsyncClient(
            base_url=self.stack.url, headers=self.headers, timeout=30
        ) as http:
            run.times["start"] = time.time()
            response = await http.post("/api/v1/jobs", json=body)
        run.times["submitted"] = time.time()
        if response.status_code != 201:
            raise RunFailed(f"submitting {name}: HTTP {response.status_code} {response.text}")
        job_id = int(response.json()["id"])
        url = f"{self.ws_url}/ws/jobs/{job_id}/?after=0"
        loop = asyncio.get_running_loop()
        deadline = loop.time() + RUN_GUARD_S
        state = ""
        async with websockets.connect(
            url, additional_headers=self.headers, max_size=None, open_timeout=30
        ) as ws:
            while True:
                raw = await asyncio.wait_for(ws.recv(), max(0.0, deadline - loop.time()))
                now = time.time()
                frame = json.loads(raw)
                kind = frame.get("type")
                if kind == "log":
                    for text in _stdout(frame):
                        run.read(text, now)
                elif kind == "state":
                    state = str(frame["job"].get("state", ""))
                    if state == "succeeded" and "end" not in run.times:
                        run.times["end"] = now
                elif kind == "end":
                    run.times["end frame"] = now
                    break
        if state != "succeeded" or "last line" not in run.times or not run.trainer:
            raise RunFailed(f"job {job_id} ended {state!r} (seen: {sorted(run.times)})")
        run.times.update(self._recorded(job_id))
        return run

    def _recorded(self, job_id: int) -> dict[str, float]:
        """The console's own times for the job, from its database."""
        code = (
            "import json; from jobs.models import Job; "
            f"j = Job.objects.get(pk={job_id}); "
            "r = {x.role + str(x.index): x for x in j.replicas.all()}; "
            "t = lambda d: d.timestamp() if d else None; "
            "out = {'created': t(j.created), 'job started': t(j.started), "
            "'job finished': t(j.finished)}; "
            "[out.update({f'{k} start sent': t(v.start_sent), f'{k} started': t(v.started), "
            "f'{k} finished': t(v.finished), f'{k} exited': t(v.cause_at)}) "
            "for k, v in r.items()]; "
            "print(json.dumps(out))"
        )
        recorded = json.loads(self.stack.manage("shell", "-c", code).strip().splitlines()[-1])
        return {k: float(v) for k, v in recorded.items() if v is not None}


def _stdout(frame: dict[str, Any]) -> list[str]:
    texts = [ln["text"] for ln in frame.get("lines", []) if ln.get("stream") == "stdout"]
    for batch in frame.get("batches", []):
        if batch.get("stream") == "stdout":
            texts.extend(batch["lines"])
    return texts


# --- idle cost ----------------------------------------------------------------------------------


@dataclass
class Idle:
    rss_mb: float
    cpu_cores: float


def idle_cost(stack: Stack) -> Idle:
    """RSS of the stack's processes and everything under them (keepers, prestarted
    interpreters), and the CPU they use over IDLE_WINDOW_S, the stack left alone."""
    settle(stack)

    def processes() -> list[psutil.Process]:
        found = []
        for child in stack.children:
            try:
                top = psutil.Process(child.proc.pid)
                found += [top, *top.children(recursive=True)]
            except psutil.NoSuchProcess:
                continue
        return found

    def cpu(procs: list[psutil.Process]) -> float:
        total = 0.0
        for p in procs:
            try:
                t = p.cpu_times()
                total += t.user + t.system
            except psutil.NoSuchProcess:
                continue
        return total

    procs = processes()
    before = cpu(procs)
    time.sleep(IDLE_WINDOW_S)  # a measuring window, not a wait for a condition
    used = cpu(procs) - before
    rss = 0
    for p in processes():
        try:
            rss += p.memory_info().rss
        except psutil.NoSuchProcess:
            continue
    return Idle(rss / 2**20, used / IDLE_WINDOW_S)


# --- report -------------------------------------------------------------------------------------


def _median(values: list[float]) -> float:
    return statistics.median(values)


def _stages(run: Run, console: bool) -> list[tuple[str, float]]:
    """(stage, its end in seconds after the start) in order, for one run."""
    t, tr = run.times, run.trainer
    stages: list[tuple[str, float]] = []
    if console:
        stages += [
            ("POST answered (admission)", t["submitted"]),
            ("job row created", t["created"]),
        ]
        sent = [v for k, v in t.items() if k.endswith("start sent")]
        if sent:
            stages.append(("placed, start message sent (last)", max(sent)))
    stages += [
        ("master trainer process created", tr["created"]),
        ("master interpreter reached the script", tr["reached"]),
        ("master torch imported", tr["imported"]),
        ("rendezvous done (all ranks)", tr["rendezvous"]),
        ("first line printed", tr["t"]),
        *[
            (f"worker trainer {what}", run.other[key])
            for key, what in (
                ("created", "process created"),
                ("reached", "interpreter reached the script"),
                ("imported", "torch imported"),
            )
            if key in run.other
        ],
        ("first line at the client", t["first line"]),
    ]
    if console:
        started = [v for k, v in t.items() if k.endswith(" started") and k != "job started"]
        if started:
            stages.append(("agents' started reports in (last)", max(started)))
    return [(name, at - t["start"]) for name, at in stages]


def _end_stages(run: Run) -> list[tuple[str, float]]:
    t = run.times
    stages = [("last line at the client", t["last line"])]
    finished = [v for k, v in t.items() if k.endswith(" finished") and k != "job finished"]
    if finished:
        stages.append(("replicas' exit reports in (last)", max(finished)))
    exited = [v for k, v in t.items() if k.endswith(" exited")]
    if exited:
        stages.append(("trainers exited (their keepers' records, last)", max(exited)))
    if "job finished" in t:
        stages.append(("job finished in the database", t["job finished"]))
    stages.append(("succeeded at the client", t["end"]))
    return [(name, at - t["last line"]) for name, at in stages]


def print_timeline(title: str, stages: list[tuple[str, float]]) -> None:
    print(f"  timeline, {title}:")
    previous = 0.0
    for name, at in sorted(stages, key=lambda s: s[1]):
        print(f"    {at:7.3f} s  (+{at - previous:6.3f})  {name}")
        previous = at


def report(bare: list[Run], ours: list[Run], timeline: bool) -> None:
    first, first_bare = _median([r.first_line for r in ours]), _median([r.first_line for r in bare])
    ratio = first / first_bare
    verdict = "PASS" if ratio <= TARGET_FIRST_RATIO else "FAIL"
    print(
        f"first line: submit -> first training line at the websocket client, median of "
        f"{len(ours)}: {first:.2f} s ({', '.join(f'{r.first_line:.2f}' for r in ours)})"
    )
    print(
        f"  baseline torchrun --nproc_per_node 2, start -> first line on its pipe: "
        f"{first_bare:.2f} s ({', '.join(f'{r.first_line:.2f}' for r in bare)}) -> "
        f"{ratio:.2f}x  target <= {TARGET_FIRST_RATIO}x: {verdict}"
    )
    end, end_bare = _median([r.end_gap for r in ours]), _median([r.end_gap for r in bare])
    verdict = "PASS" if end - end_bare <= TARGET_END_AFTER_EXIT_S else "FAIL"
    print(
        f"the end: last training line -> succeeded at the websocket client: {end:.2f} s "
        f"({', '.join(f'{r.end_gap:.2f}' for r in ours)})"
    )
    print(
        f"  baseline: last line -> torchrun's exit: {end_bare:.2f} s "
        f"({', '.join(f'{r.end_gap:.2f}' for r in bare)}) -> seen {end - end_bare:+.2f} s after "
        f"torchrun's exit  target <= {TARGET_END_AFTER_EXIT_S} s: {verdict}"
    )
    if timeline:
        # The run whose first line was the median one, of each kind.
        mid = sorted(ours, key=lambda r: r.first_line)[len(ours) // 2]
        mid_bare = sorted(bare, key=lambda r: r.first_line)[len(bare) // 2]
        print_timeline("console, from the submit", _stages(mid, console=True))
        print_timeline("torchrun, from its start", _stages(mid_bare, console=False))
        mid_end = sorted(ours, key=lambda r: r.end_gap)[len(ours) // 2]
        print_timeline("console, the end, from the last line", _end_stages(mid_end))


def startup(rounds: int = ROUNDS, timeline: bool = True) -> bool:
    """Start a one-node stack, print the figures, stop it; False if a run failed."""
    with tempfile.TemporaryDirectory(prefix="bench-startup-") as folder:
        tmp = Path(folder)
        stack = Stack(var_dir=tmp / "var", port=free_port(), nodes=1, code_root=PROGRAMS)
        console: Console | None = None
        try:
            stack.prepare()
            stack.start()
            console = Console(stack, stack.manage("token", "admin").strip())
            idle_before = idle_cost(stack)
            # One run of each first, unmeasured: the page cache holds torch for both alike.
            torchrun()
            console.run("bench-startup-warm-up")
            bare: list[Run] = []
            ours: list[Run] = []
            for round_ in range(rounds):
                settle(stack)
                bare.append(torchrun())
                settle(stack)
                ours.append(console.run(f"bench-startup-{round_}"))
            report(bare, ours, timeline)
            idle_after = idle_cost(stack)
            growth = idle_after.rss_mb / idle_before.rss_mb - 1
            verdict = "PASS" if growth <= TARGET_IDLE_GROWTH else "FAIL"
            print(
                f"idle stack (web, console worker, log keeper, Redis, 1 agent and all their "
                f"children), over {IDLE_WINDOW_S:.0f} s: before the jobs {idle_before.rss_mb:.0f} "
                f"MB RSS, {idle_before.cpu_cores * 100:.1f} % of a core; after them "
                f"{idle_after.rss_mb:.0f} MB, {idle_after.cpu_cores * 100:.1f} % "
                f"(RSS {growth * 100:+.1f} %; its baseline is the main branch's figure)"
            )
            print(f"  (the stack's RSS after the jobs against before them: {verdict})")
            return True
        except (RunFailed, RuntimeError, OSError, httpx.HTTPError, KeyError, ValueError) as exc:
            print(f"startup: FAILED {exc}")
            return False
        except (websockets.WebSocketException, TimeoutError) as exc:
            print(f"startup: FAILED on the websocket: {exc!r}")
            return False
        finally:
            if console is not None:
                console.close()
            stack.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    parser.add_argument("--timeline", action="store_true", help="print each stage's time")
    args = parser.parse_args()
    return 0 if startup(args.rounds, timeline=args.timeline) else 1


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
