"""Where an instance's metric points come from on the node: the process's metrics channel (a file
it appends JSON lines to), and the agent's own samples of the process tree's CPU, memory and GPUs.

Both run in threads of their own and hand points to a callback; nothing a trainer writes can
make them raise.
"""

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from workers import jobfiles
from workers.cgroups import InstanceGroup
from workers.logquota import TokenBucket
from workers.metricparse import KNOWN_METRICS, BadMetric, Point, parse_line

log = logging.getLogger(__name__)

POLL_SECONDS = 0.2
# A trainer may report this many points per second on average (bursts of BURST_POINTS); more
# are dropped, with a note, so that a runaway loop cannot flood the console.
POINTS_PER_SECOND = 500.0
BURST_POINTS = 5000.0
MAX_PROBLEMS_SHOWN = 20
READ_BYTES = 256 * 1024
SYSTEM_SAMPLE_SECONDS = 2.0

EmitPoints = Callable[[float, list[Point]], None]
EmitNotes = Callable[[float, list[str]], None]


class MetricTail(threading.Thread):
    """Follows one process's metrics file until stopped, then reads what is left once more."""

    def __init__(
        self,
        path: Path,
        emit_points: EmitPoints,
        emit_notes: EmitNotes,
        offset: int = 0,
        *,
        below: Path,
        uid: int,
    ) -> None:
        """`path` is in a folder the job writes to: it is read only as the job's own regular
        file, every folder from `below` (one no job can write to) down opened without
        following a link, and only if `uid` (the job's) owns it (workers/jobfiles.py)."""
        super().__init__(name=f"metrics-{path.name}", daemon=True)
        self.path = path
        self._below = below
        self._uid = uid
        self._refused: str | None = None  # why the file was last refused, said once
        self._emit_points = emit_points
        self._emit_notes = emit_notes
        self._stop_requested = threading.Event()
        self._offset = offset  # a new agent goes on where the points in Redis end
        self._pending = b""
        self._rate = TokenBucket(POINTS_PER_SECOND, BURST_POINTS, time.monotonic())
        self._problems = 0
        self._dropped = 0
        self._named: set[str] = set()
        self.points = 0

    def stop(self) -> None:
        self._stop_requested.set()

    def run(self) -> None:
        while not self._stop_requested.wait(POLL_SECONDS):
            self._read_safely()
        self._read_safely()  # what the process wrote just before it ended
        if self._pending:
            last, self._pending = self._pending, b""
            self._handle_lines([last])
        if self._dropped:
            self._note(f"{self._dropped} points over the rate limit were dropped in all")

    @property
    def consumed(self) -> int:
        """The file offset the lines handled so far end at (while emitting: those included)."""
        return self._offset - len(self._pending)

    def _read_safely(self) -> None:
        try:
            self._read()
        except Exception:  # a trainer's file must never take the agent down
            log.exception("reading metrics from %s failed", self.path)

    def _read(self) -> None:
        try:
            data = jobfiles.read_file(self.path, self._below, self._uid, self._offset, READ_BYTES)
        except FileNotFoundError:
            return  # the trainer reports nothing (yet)
        except jobfiles.UnsafeFile as exc:
            # A link, a FIFO, a folder or another's file where the metrics file should be:
            # nothing of it is read; the job is told once (and again if the reason changes).
            if str(exc) != self._refused:
                self._refused = str(exc)
                self._note(f"not reading {self.path.name}: {exc}")
            return
        self._refused = None
        if not data:
            return
        self._offset += len(data)
        data = self._pending + data
        cut = data.rfind(b"\n")
        if cut < 0:
            self._pending = data
            if len(self._pending) > READ_BYTES:
                self._problem("a line longer than 256 KiB was skipped")
                self._pending = b""
            return
        self._pending = data[cut + 1 :]
        self._handle_lines(data[:cut].split(b"\n"))

    def _handle_lines(self, raw_lines: list[bytes]) -> None:
        now = time.time()
        points: list[Point] = []
        for number, raw in enumerate(raw_lines):
            text = raw.decode("utf-8", errors="replace").strip()
            if not text:
                continue
            try:
                points.extend(parse_line(text, now))
            except BadMetric as exc:
                self._problem(f"skipped a line: {exc}: {text[:120]}")
            except RecursionError:  # deeply nested JSON
                self._problem(f"skipped a line: nested too deeply (line {number + 1} of a read)")
        points = self._within_rate(points)
        if points:
            self.points += len(points)
            for point in points:
                if point.name not in KNOWN_METRICS and point.name not in self._named:
                    self._named.add(point.name)
                    self._note(f"{point.name!r} is not a metric Trainyard knows: charted as custom")
            self._emit_points(now, points)

    def _within_rate(self, points: list[Point]) -> list[Point]:
        allowed = self._rate.take(len(points), time.monotonic())
        if allowed < len(points):
            if not self._dropped:
                self._note(
                    f"more than {POINTS_PER_SECOND:.0f} points/s: dropping points over the limit"
                )
            self._dropped += len(points) - allowed
        return points[:allowed]

    def _problem(self, message: str) -> None:
        self._problems += 1
        if self._problems <= MAX_PROBLEMS_SHOWN:
            self._note(message)
        elif self._problems == MAX_PROBLEMS_SHOWN + 1:
            self._note("more problems with metric lines; not showing them")

    def _note(self, message: str) -> None:
        self._emit_notes(time.time(), [f"[trainyard metrics] {message}"])


@dataclass
class SampledInstance:
    """One instance the sampler measures: its top processes and the GPUs it was given; or,
    for an instance in containers, its group, since its trainers are no process of the
    agent's tree (the runtime's client is, and uses next to nothing)."""

    pids: list[int]
    gpu_ids: list[int]
    emit: EmitPoints
    processes: dict[int, psutil.Process] = field(default_factory=dict)
    group: InstanceGroup | None = None
    last_cpu: tuple[float, float] | None = None  # (monotonic time, CPU-seconds) of the last


class SystemSampler(threading.Thread):
    """Every few seconds, CPU and memory of each instance's whole process tree (children and
    grandchildren included), and utilisation and memory of its GPUs through NVML. An instance
    without GPUs gets no GPU points at all: "no GPU" is not 0 %."""

    def __init__(
        self,
        instances: Callable[[], list[SampledInstance]],
        interval: float = SYSTEM_SAMPLE_SECONDS,
        gpu_usage: Callable[[list[int]], list[tuple[float, float]]] | None = None,
    ) -> None:
        super().__init__(name="system-sampler", daemon=True)
        self._instances = instances
        self._interval = interval
        self._gpu_usage = gpu_usage
        self._stopped = threading.Event()
        self._trees: dict[int, dict[int, psutil.Process]] = {}

    def stop(self) -> None:
        self._stopped.set()

    def run(self) -> None:
        while not self._stopped.wait(self._interval):
            for instance in self._instances():
                try:
                    self.sample(instance)
                except Exception:
                    log.exception("sampling an instance failed")

    def sample(self, instance: SampledInstance) -> None:
        """One sample of one instance (the first call only primes the CPU counters)."""
        if instance.group is not None:
            self._sample_group(instance, instance.group)
            return
        cpu = 0.0
        rss = 0
        alive: dict[int, psutil.Process] = {}
        for pid in instance.pids:
            try:
                top = instance.processes.get(pid) or psutil.Process(pid)
                tree = [top, *top.children(recursive=True)]
            except psutil.Error:
                continue
            for proc in tree:
                known = instance.processes.get(proc.pid, proc)
                try:
                    # An ended process its parent has not reaped yet holds no memory: counted,
                    # it drew an instance's memory line down to 0 at the end of every job.
                    if known.status() == psutil.STATUS_ZOMBIE:
                        continue
                    cpu += known.cpu_percent(None)
                    rss += known.memory_info().rss
                except psutil.Error:
                    continue
                alive[proc.pid] = known
        primed = bool(instance.processes)
        instance.processes = alive
        if not alive or not primed:
            return
        self._emit(instance, cpu, rss)

    def _sample_group(self, instance: SampledInstance, group: InstanceGroup) -> None:
        """CPU from the group's CPU-seconds since the last sample, memory as it is now."""
        seconds, memory = group.now()
        at = time.monotonic()
        last, instance.last_cpu = instance.last_cpu, (at, seconds)
        if last is None or at <= last[0] or not group.pids():
            return
        self._emit(instance, 100.0 * max(0.0, seconds - last[1]) / (at - last[0]), memory)

    def _emit(self, instance: SampledInstance, cpu: float, rss: int) -> None:
        now = time.time()
        points = [
            Point("cpu_percent", round(cpu, 1), None, None, now),
            Point("memory_mb", round(rss / 2**20, 1), None, None, now),
        ]
        if instance.gpu_ids and self._gpu_usage is not None:
            usage = self._gpu_usage(instance.gpu_ids)
            if usage:
                points.append(
                    Point(
                        "gpu_util_percent", sum(u for u, _ in usage) / len(usage), None, None, now
                    )
                )
                points.append(Point("gpu_memory_mb", sum(m for _, m in usage), None, None, now))
                if len(usage) > 1:  # and each GPU's own, where the instance has several
                    for gpu, (util, memory) in zip(instance.gpu_ids, usage, strict=False):
                        points.append(Point(f"gpu{gpu}_util_percent", util, None, None, now))
                        points.append(Point(f"gpu{gpu}_memory_mb", memory, None, None, now))
        instance.emit(now, points)
