"""A simulated fleet, in the spirit of kwok: N fake node agents in one process, speaking the
real agent protocol over the real Redis to a real console (web, console worker, log keeper).

Each fake agent has what a real one has: its own Redis ACL user and signing key, made by the
product's own provisioning (`manage.py agent_credentials`, jobs/services/agent_access.py), its
own queue `node.<NAME>` that it consumes with BRPOP as kombu does, and Celery messages for the
console built by the agent's own Celery app (workers.agent.make_celery) and signed with
workers.credentials.sign. It sends heartbeats with inventory and running lists (onto the
console's heartbeat list while the console drains one, else as Celery messages, by the agent's
own rule: workers/heartbeat_route.py), acknowledges starts, reports exits and answers stops
(including "unknown" for replicas it never ran), and appends log lines and metric points with
the agent's own append script (workers.logsink).

What it does not have: processes. A replica "runs" for `job_seconds`, then exits 0, or 1 when
its job id is a multiple of `fail_every`. Everything runs on one asyncio loop; messages are
built synchronously (a Celery send onto kombu's in-memory transport, read back as the exact
JSON kombu's Redis transport would LPUSH) and pushed through the node's own connection.

This is a bench tool (make bench-scale, tests/integration/test_fleet.py), not a part of the
product: nothing in jobs/ or workers/ knows it exists.
"""

import asyncio
import base64
import json
import logging
import resource
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import redis.asyncio as aioredis
from kombu.transport import memory

from workers import contract, credentials, heartbeat_route
from workers.agent import HEARTBEAT_EXPIRES_INTERVALS, stamped
from workers.logsink import _APPEND_LUA, DEFAULT_MAXLEN, LogBatch

log = logging.getLogger("trainyard.fleet")

# kombu's Redis transport keeps priorities 3, 6 and 9 in sub-lists of a queue; an agent
# consumes them all (workers/credentials.py lets it).
_PRIORITY_SUFFIXES = ("", *(f"{credentials.KOMBU_PRIORITY_SEP}{p}" for p in (3, 6, 9)))
# kombu's Redis transport waits this long on BRPOP before it asks again.
_BRPOP_SECONDS = 1


@dataclass
class FleetConfig:
    cpus: int = 8
    memory_gb: int = 32
    gpus: int = 0
    heartbeat_seconds: float = 5.0
    job_seconds: float = 2.0
    fail_every: int = 0  # a job whose id is a multiple of this fails (exit 1); 0: none fail
    log_lines_per_second: float = 0.0  # per replica
    # How long a replica takes to exit after a stop that gives it a grace (a preemption's
    # SIGTERM: the trainer saves its checkpoint), at most that grace, as the agent's SIGKILL
    # would cut it short; it shows "stopping" in the heartbeats meanwhile. 0: it exits at once.
    stop_seconds: float = 0.0
    metrics_per_second: float = 0.0  # per replica
    # A misbehaving agent (issue 24, point 5): these nodes heartbeat this many times a second
    # and pad their running lists with this many made-up entries.
    noisy_nodes: tuple[str, ...] = ()
    noisy_heartbeats_per_second: float = 100.0
    noisy_running_entries: int = 0


@dataclass
class Event:
    """What happened on a fake node, for the checks of a test or a bench."""

    at: float  # time.time()
    node: str
    kind: str  # "start" (a replica began running), "exit", "stop", "duplicate-start"
    job_id: int
    attempt: int
    role: str
    index: int
    cpus: int = 0
    memory_gb: int = 0
    in_use_cpus: int = 0  # on the node, after this event
    in_use_memory_gb: int = 0


class Envelopes:
    """Celery messages for the console queue, byte for byte as the agent's Celery app makes
    them: sent onto kombu's in-memory transport and read back."""

    def __init__(self) -> None:
        from workers.agent import make_celery

        self._app = make_celery("memory://", "fleet")
        self._queue = f"fleet-envelopes-{uuid.uuid4().hex}"

    def console_message(self, task: str, payload: dict[str, Any], expires: float | None) -> str:
        self._app.send_task(
            task, kwargs={"payload": payload}, queue=contract.CONSOLE_QUEUE, expires=expires
        )
        message = memory.Channel.queues[contract.CONSOLE_QUEUE].get_nowait()
        # As kombu's Redis transport stores it (Channel._put: LPUSH of dumps(message)).
        return json.dumps(message)


SECONDS_ARG = "--fleet-seconds"


def simulated_seconds(spec: dict[str, Any], default: float) -> float:
    """How long the replica "runs": the job's own `--fleet-seconds N` argument, else the
    fleet's default."""
    args = [str(a) for a in spec.get("args", [])]
    if SECONDS_ARG in args[:-1]:
        try:
            return float(args[args.index(SECONDS_ARG) + 1])
        except ValueError:
            pass
    return default


def decode(raw: bytes | str) -> tuple[str, dict[str, Any]]:
    """(task name, kwargs) of a Celery protocol-2 message as kombu's Redis transport keeps it."""
    envelope = json.loads(raw)
    body = envelope["body"]
    if envelope.get("properties", {}).get("body_encoding") == "base64":
        body = base64.b64decode(body)
    args, kwargs, _ = json.loads(body)
    if args:
        raise ValueError(f"positional arguments in {envelope['headers']['task']}: {args!r}")
    return str(envelope["headers"]["task"]), kwargs


@dataclass
class _Run:
    spec: dict[str, Any]
    state: str = "running"
    task: asyncio.Task[None] | None = None


@dataclass
class FakeAgent:
    node: str
    url: str
    fleet: "Fleet"
    incarnation: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    runs: dict[tuple[int, int, str, int], _Run] = field(default_factory=dict)
    finished: dict[tuple[int, int, str, int], dict[str, Any]] = field(default_factory=dict)
    heartbeats: int = 0
    pushed: int = 0  # of them, onto the console's heartbeat list (the rest: Celery tasks)

    def __post_init__(self) -> None:
        found = credentials.secret_from_url(self.url)
        if found is None or found[0] != self.node:
            raise ValueError(f"{self.node}: the URL holds no credentials of this node")
        self._key = credentials.signing_key(found[1])
        self._writer = f"{self.node}:{self.incarnation}"
        self._seq = 0

    # --- the connections: one blocked in BRPOP, one for everything else (as kombu has) ---

    async def open(self) -> None:
        self.consumer = aioredis.Redis.from_url(self.url, socket_connect_timeout=10)
        self.client = aioredis.Redis.from_url(self.url, socket_connect_timeout=10)
        self._append = self.client.register_script(_APPEND_LUA)

    async def close(self) -> None:
        await self.consumer.aclose()
        await self.client.aclose()

    async def report(
        self, task: str, payload: dict[str, Any], expires: float | None = None
    ) -> None:
        await self._send_task(task, self._signed(task, payload), expires)

    def _signed(self, task: str, payload: dict[str, Any]) -> dict[str, Any]:
        # Stamped with the protocol version as a real agent stamps it (one place):
        # the console starts nothing on an agent that does not say it speaks its protocol.
        return credentials.sign(stamped(payload), self._key, task)

    async def _send_task(self, task: str, signed: dict[str, Any], expires: float | None) -> None:
        message = self.fleet.envelopes.console_message(task, signed, expires)
        await self.client.lpush(contract.CONSOLE_QUEUE, message)

    # --- heartbeats ---

    async def heartbeat(self, payload: dict[str, Any]) -> None:
        """As the agent's Heartbeat.send: onto the console's heartbeat list while it drains
        one, else as the Celery task (workers/heartbeat_route.py decides for both)."""
        signed = self._signed(contract.TASK_NODE_HEARTBEAT, payload)
        try:
            message = heartbeat_route.route(
                await self.client.get(contract.HEARTBEATS_DRAINED_KEY), signed
            )
            if message is not None:
                await self.client.rpush(contract.HEARTBEATS_KEY, message)
                self.pushed += 1
                return
        except aioredis.RedisError as exc:
            log.debug("%s: heartbeat not pushed (%s); sending it as a task", self.node, exc)
        expires = self.fleet.config.heartbeat_seconds * HEARTBEAT_EXPIRES_INTERVALS
        await self._send_task(contract.TASK_NODE_HEARTBEAT, signed, expires)

    def running(self) -> list[dict[str, Any]]:
        return [
            {"job_id": j, "attempt": a, "role": r, "index": i,
             "state": "running" if run.state == "running" else "stopping", "pids": [0]}
            for (j, a, r, i), run in self.runs.items()
        ]  # fmt: skip

    def heartbeat_payload(self, padding: int = 0) -> dict[str, Any]:
        config = self.fleet.config
        running = self.running()
        running += [
            {"job_id": 10**9 + k, "attempt": 0, "role": "worker", "index": k, "state": "running",
             "pids": [0]}
            for k in range(padding)
        ]  # fmt: skip
        return {
            "node": self.node, "address": "127.0.0.1", "cpus": config.cpus,
            "memory_gb": config.memory_gb, "gpus": config.gpus, "gpu_model": "",
            "hostname": "fleet", "pid": 0, "isolation": "none",
            "isolation_reason": "a simulated node (bench/fleet.py)",
            "limits": "none", "limits_reason": "a simulated node (bench/fleet.py)",
            "incarnation": self.incarnation, "running": running,
            "finished": list(self.finished.values())[-50:], "sent": time.time(),
        }  # fmt: skip

    async def heartbeat_loop(self, stopping: asyncio.Event) -> None:
        config = self.fleet.config
        noisy = self.node in config.noisy_nodes
        interval = 1 / config.noisy_heartbeats_per_second if noisy else config.heartbeat_seconds
        padding = config.noisy_running_entries if noisy else 0
        while not stopping.is_set():
            try:
                await self.heartbeat(self.heartbeat_payload(padding))
                self.heartbeats += 1
            except Exception:
                log.warning("%s: heartbeat not sent", self.node, exc_info=True)
            try:
                await asyncio.wait_for(stopping.wait(), interval)
            except TimeoutError:
                pass

    # --- the node's queue ---

    async def serve(self, stopping: asyncio.Event) -> None:
        queue = contract.node_queue(self.node)
        names = [queue + suffix for suffix in _PRIORITY_SUFFIXES]
        while not stopping.is_set():
            try:
                popped = await self.consumer.brpop(names, timeout=_BRPOP_SECONDS)
            except Exception:
                if stopping.is_set():
                    return
                log.warning("%s: BRPOP failed", self.node, exc_info=True)
                await asyncio.sleep(0.5)
                continue
            if popped is None:
                continue
            try:
                task, kwargs = decode(popped[1])
                await self.handle(task, kwargs)
            except Exception:
                log.exception("%s: a message it could not handle", self.node)

    async def handle(self, task: str, kwargs: dict[str, Any]) -> None:
        if task == contract.TASK_START_REPLICA:
            await self.start(kwargs["spec"])
        elif task == contract.TASK_STOP_JOB:
            await self.stop_job(**kwargs)
        elif task in (contract.TASK_REMOVE_CHECKPOINTS, contract.TASK_REMOVE_WORKING_FOLDER):
            pass  # nothing on disk
        else:
            log.warning("%s: unknown task %s", self.node, task)

    @staticmethod
    def ident(spec: dict[str, Any]) -> tuple[int, int, str, int]:
        return (int(spec["job_id"]), int(spec.get("attempt", 0)), spec["role"], int(spec["index"]))

    def _started_report(self, spec: dict[str, Any]) -> dict[str, Any]:
        job_id, attempt, role, index = self.ident(spec)
        return {"job_id": job_id, "attempt": attempt, "role": role, "index": index,
                "node": self.node, "pids": [0], "incarnation": self.incarnation}  # fmt: skip

    async def start(self, spec: dict[str, Any]) -> None:
        """As Supervisor.start: safe twice; a repeat is answered with the report it had."""
        ident = self.ident(spec)
        if ident in self.runs:
            self.fleet.record(self, "duplicate-start", spec)
            if self.runs[ident].state == "running":
                await self.report(contract.TASK_REPLICA_STARTED, self._started_report(spec))
            return
        if ident in self.finished:
            self.fleet.record(self, "duplicate-start", spec)
            await self.report(contract.TASK_REPLICA_EXITED, self.finished[ident])
            return
        run = _Run(spec)
        self.runs[ident] = run
        self.fleet.record(self, "start", spec)
        await self.report(contract.TASK_REPLICA_STARTED, self._started_report(spec))
        run.task = asyncio.create_task(self._live(run))

    async def _live(self, run: _Run) -> None:
        config = self.fleet.config
        spec = run.spec
        job_id = self.ident(spec)[0]
        ends = time.monotonic() + simulated_seconds(spec, config.job_seconds)
        step = 0
        tick = 1.0
        rates = config.log_lines_per_second, config.metrics_per_second
        owed = [0.0, 0.0]
        try:
            while (left := ends - time.monotonic()) > 0:
                await asyncio.sleep(min(tick, left))
                if rates == (0.0, 0.0):
                    continue
                owed = [owed[0] + rates[0] * tick, owed[1] + rates[1] * tick]
                lines = [
                    f"step {step + k} loss={1 / (step + k + 1):.4f}" for k in range(int(owed[0]))
                ]
                points = [
                    json.dumps({"name": "loss", "value": 1 / (step + k + 1), "step": step + k})
                    for k in range(int(owed[1]))
                ]
                step += len(lines)
                owed = [owed[0] - int(owed[0]), owed[1] - int(owed[1])]
                await self._ship(spec, contract.STREAM_STDOUT, lines)
                await self._ship(spec, contract.STREAM_METRIC, points)
            failed = bool(config.fail_every) and job_id % config.fail_every == 0
            await self._exit(run, "failed" if failed else "succeeded", 1 if failed else 0,
                             "exited with code 1 (simulated)" if failed else "")  # fmt: skip
        except asyncio.CancelledError:
            pass

    async def _ship(self, spec: dict[str, Any], stream: str, lines: list[str]) -> None:
        if not lines:
            return
        self._seq += 1
        job_id, attempt, role, index = self.ident(spec)
        batch = LogBatch(job_id, role, index, self.node, stream, time.time(), lines,
                         self._writer, self._seq, attempt)  # fmt: skip
        argv: list[Any] = [len(lines), DEFAULT_MAXLEN, self._writer, self._seq]
        for key, value in batch.fields().items():
            argv.extend((key, value))
        keys = [contract.log_stream_key(job_id), contract.log_cursor_key(job_id),
                contract.log_seen_key(job_id)]  # fmt: skip
        try:
            await self._append(keys=keys, args=argv)
        except Exception as exc:  # a grant that lags the start (workers/logship.py waits)
            log.debug("%s: lines of job %s refused: %s", self.node, job_id, exc)

    async def _exit(self, run: _Run, state: str, exit_code: int | None, reason: str) -> None:
        ident = self.ident(run.spec)
        if self.runs.pop(ident, None) is None:
            return
        job_id, attempt, role, index = ident
        report = contract.exit_report(
            job_id=job_id, attempt=attempt, role=role, index=index, node=self.node, state=state,
            exit_code=exit_code, reason=reason, stderr_tail=[], ended_at=time.time(),
            incarnation=self.incarnation,
        )  # fmt: skip
        self.finished[ident] = report
        if len(self.finished) > 200:
            self.finished.pop(next(iter(self.finished)))
        self.fleet.record(self, "exit" if state != "stopped" else "stop", run.spec)
        await self.report(contract.TASK_REPLICA_EXITED, report)

    async def _stop_after(self, run: _Run, seconds: float, reason: str) -> None:
        await asyncio.sleep(seconds)
        await self._exit(run, "stopped", -15, f"stopped: {reason}")

    async def stop_job(
        self,
        job_id: int,
        reason: str,
        replicas: list[dict[str, Any]] | None = None,
        up_to_attempt: int | None = None,
        grace_seconds: float | None = None,
        only_listed: bool = False,
    ) -> None:
        """As Supervisor.stop_job: stop what it runs of the job, and answer for each listed
        replica it does not run (its exit again, or "unknown")."""
        listed = {
            (int(r.get("attempt", 0)), str(r["role"]), int(r["index"])) for r in replicas or []
        }
        runs = [
            run for (j, a, r, i), run in list(self.runs.items())
            if j == job_id and (up_to_attempt is None or a <= up_to_attempt)
            and (not only_listed or (a, r, i) in listed)
        ]  # fmt: skip
        known = {(self.ident(r.spec)[1], r.spec["role"], int(r.spec["index"])) for r in runs}
        checkpoint = min(self.fleet.config.stop_seconds, grace_seconds or 0.0)
        for run in runs:
            if run.state != "running":
                continue  # stopping already: a repeated stop changes nothing
            if run.task is not None:
                run.task.cancel()
            if checkpoint > 0:
                run.state = "stopping"
                run.task = asyncio.create_task(self._stop_after(run, checkpoint, reason))
            else:
                await self._exit(run, "stopped", -15, f"stopped: {reason}")
        for attempt, role, index in sorted(listed - known):
            ident = (job_id, attempt, role, index)
            answer = self.finished.get(ident) or contract.exit_report(
                job_id=job_id, attempt=attempt, role=role, index=index, node=self.node,
                state=contract.REPLICA_UNKNOWN, exit_code=None,
                reason=f"not running on {self.node}", stderr_tail=[], ended_at=time.time(),
                incarnation=self.incarnation,
            )  # fmt: skip
            await self.report(contract.TASK_REPLICA_EXITED, answer)


class Fleet:
    """N fake agents on one asyncio loop. `urls` maps node names to their agents' Redis URLs
    (as `manage.py agent_credentials` prints them)."""

    def __init__(
        self,
        urls: dict[str, str],
        config: FleetConfig | None = None,
        on_event: Callable[[Event], None] | None = None,
    ) -> None:
        self.config = config or FleetConfig()
        self.envelopes = Envelopes()
        self.agents = [FakeAgent(node, url, self) for node, url in urls.items()]
        self.events: list[Event] = []
        self._in_use: dict[str, tuple[int, int]] = {}
        self._on_event = on_event

    def record(self, agent: FakeAgent, kind: str, spec: dict[str, Any]) -> None:
        job_id, attempt, role, index = FakeAgent.ident(spec)
        cpus, memory = int(spec.get("cpus", 0)), int(spec.get("memory_gb", 0))
        used_cpu, used_memory = self._in_use.get(agent.node, (0, 0))
        if kind == "start":
            used_cpu, used_memory = used_cpu + cpus, used_memory + memory
        elif kind in ("exit", "stop"):
            used_cpu, used_memory = used_cpu - cpus, used_memory - memory
        self._in_use[agent.node] = (used_cpu, used_memory)
        event = Event(time.time(), agent.node, kind, job_id, attempt, role, index, cpus,
                      memory, used_cpu, used_memory)  # fmt: skip
        self.events.append(event)
        if self._on_event is not None:
            self._on_event(event)

    async def run(self, stopping: asyncio.Event, spread: bool = True) -> None:
        """Until `stopping` is set. With `spread`, the first heartbeats are spread over one
        interval, as agents started at different times would send them."""
        _raise_open_files(len(self.agents) * 2 + 256)
        await asyncio.gather(*(agent.open() for agent in self.agents))
        tasks = []
        interval = self.config.heartbeat_seconds
        for k, agent in enumerate(self.agents):
            delay = interval * k / len(self.agents) if spread else 0.0
            tasks.append(asyncio.create_task(self._later(delay, agent.heartbeat_loop(stopping))))
            tasks.append(asyncio.create_task(agent.serve(stopping)))
        await stopping.wait()
        for agent in self.agents:
            for run in agent.runs.values():
                if run.task is not None:
                    run.task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await asyncio.gather(*(agent.close() for agent in self.agents), return_exceptions=True)

    @staticmethod
    async def _later(delay: float, coroutine: Any) -> None:
        await asyncio.sleep(delay)
        await coroutine


def _raise_open_files(wanted: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < wanted:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, max(wanted, soft)), hard))


def provision(manage: Callable[..., str], names: list[str]) -> dict[str, str]:
    """Each node's agent REDIS_URL, through the product's own provisioning: `manage` runs a
    manage.py command of the console (stack.run.Stack.manage) and returns its output."""
    urls: dict[str, str] = {}
    for start in range(0, len(names), 500):  # command lines of a sane length
        chunk = names[start : start + 500]
        lines = manage("agent_credentials", *chunk).split()
        urls.update(zip(chunk, lines, strict=True))
    return urls


class FleetThread:
    """The fleet on a loop of its own thread, for code that is not async (tests, benches):

    with FleetThread(urls, config) as fleet:
        ...  # fleet.fleet.events, fleet.fleet.agents
    """

    def __init__(
        self,
        urls: dict[str, str],
        config: FleetConfig | None = None,
        on_event: Callable[[Event], None] | None = None,
    ) -> None:
        self.fleet = Fleet(urls, config, on_event)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping: asyncio.Event | None = None
        self._thread: Any = None
        self.error: BaseException | None = None

    def __enter__(self) -> "FleetThread":
        import threading

        ready = threading.Event()

        async def main() -> None:
            self._loop = asyncio.get_running_loop()
            self._stopping = asyncio.Event()
            ready.set()
            await self.fleet.run(self._stopping)

        def run() -> None:
            try:
                asyncio.run(main())
            except BaseException as exc:  # reported to whoever waits on the fleet
                self.error = exc
                ready.set()

        self._thread = threading.Thread(target=run, name="fleet", daemon=True)
        self._thread.start()
        ready.wait()
        if self.error is not None:
            raise RuntimeError("the fleet did not start") from self.error
        return self

    def call(self, function: Callable[[], Any]) -> Any:
        """Run `function` on the fleet's loop (its state is the loop's alone) and return what
        it returns."""
        import concurrent.futures

        assert self._loop is not None
        done: concurrent.futures.Future[Any] = concurrent.futures.Future()

        def inside() -> None:
            try:
                done.set_result(function())
            except BaseException as exc:
                done.set_exception(exc)

        self._loop.call_soon_threadsafe(inside)
        return done.result(timeout=60)

    def __exit__(self, *exc: object) -> None:
        """Stop every agent of the fleet (again: a no-op); they go silent, as dead ones do."""
        if self._thread.is_alive() and self._loop is not None and self._stopping is not None:
            self._loop.call_soon_threadsafe(self._stopping.set)
        self._thread.join(60)

    stop = __exit__
