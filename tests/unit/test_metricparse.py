"""The metrics protocol and regex metric definitions: every bad input is reported, none crashes
the agent (no Django involved)."""

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import NoReturn

import psutil
import pytest

from tests.conftest import wait_until
from workers.cgroups import InstanceGroup, Layout
from workers.metricfeed import MetricTail, SampledInstance, SystemSampler
from workers.metricparse import (
    BadMetric,
    Point,
    RegexMetric,
    is_system_metric,
    parse_line,
    scan_lines,
)
from workers.trainer_lib import trainyard_metrics


def test_it_reads_one_metric_or_several_at_a_step() -> None:
    assert parse_line('{"name": "loss", "value": 0.25, "step": 3}', now=5.0) == [
        Point("loss", 0.25, 3, None, 5.0)
    ]
    points = parse_line('{"step": 4, "epoch": 0.5, "loss": 0.2, "lr": 0.1, "ts": 7}', now=5.0)
    assert points == [Point("loss", 0.2, 4, 0.5, 7.0), Point("lr", 0.1, 4, 0.5, 7.0)]


@pytest.mark.parametrize(
    ("line", "says"),
    [
        ("loss=0.3", "not JSON"),
        ('{"name": "loss", "value": NaN}', "must be a number"),
        ('{"loss": Infinity}', "must be a number"),
        ('{"loss": 1e999}', "must be finite"),
        ('{"loss": ' + "9" * 400 + "}", "too large"),
        ('{"loss": "0.3"}', "must be a number"),
        ('{"loss": true}', "must be a number"),
        ('{"name": "loss"}', "name without value"),
        ('{"name": "loss", "value": 1, "colour": "red"}', "unexpected keys"),
        ('{"step": 3}', "no metric"),
        ('{"step": -1, "loss": 1}', "whole number"),
        ('{"step": 1.5, "loss": 1}', "whole number"),
        ('{"<script>": 1}', "not allowed"),
        ("[1, 2]", "JSON object"),
        ("{" * 100_000, "longer than"),
    ],
)
def test_it_refuses_bad_lines_and_says_why(line: str, says: str) -> None:
    with pytest.raises(BadMetric, match=says):
        parse_line(line)


def test_regex_definitions_read_metrics_off_printed_lines() -> None:
    loss = RegexMetric.compile("loss", r"loss=([0-9.]+)")
    acc = RegexMetric.compile("eval_accuracy", r"step (?P<step>\d+) acc=(?P<value>[0-9.]+)")
    lines = ["epoch 1 loss=0.50", "step 20 acc=0.91", "loss=nan-ish", "nothing here"]
    points = scan_lines([loss, acc], lines, ts=1.0)
    assert points == [
        Point("loss", 0.5, None, None, 1.0),
        Point("eval_accuracy", 0.91, 20, None, 1.0),
    ]


@pytest.mark.parametrize(
    ("name", "regex", "says"),
    [("loss", "loss=[0-9.]+", "needs a group"), ("loss", "loss=(", "not a valid regular"),
     ("bad name", "x=(1)", "not allowed")],
)  # fmt: skip
def test_bad_definitions_are_refused(name: str, regex: str, says: str) -> None:
    with pytest.raises(BadMetric, match=says):
        RegexMetric.compile(name, regex)


class Sink:
    def __init__(self) -> None:
        self.points: list[Point] = []
        self.notes: list[str] = []

    def on_points(self, ts: float, points: list[Point]) -> None:
        self.points.extend(points)

    def on_notes(self, ts: float, notes: list[str]) -> None:
        self.notes.extend(notes)


def test_the_tail_follows_a_growing_file_and_reports_bad_lines(tmp_path: Path) -> None:
    path = tmp_path / "metrics-0.jsonl"
    sink = Sink()
    tail = MetricTail(path, sink.on_points, sink.on_notes, below=tmp_path, uid=os.geteuid())
    tail.start()
    with open(path, "a") as f:
        f.write('{"step": 1, "loss": 0.5}\n{"loss": NaN}\nnot json\n{"step": 2, "my_metric": 3}\n')
        f.flush()
        f.write('{"step": 3, "lo')  # half a line: waits for the rest
        f.flush()
        wait_until("the tail to read the two good whole lines", lambda: len(sink.points) >= 2)
        f.write('ss": 0.25}\n')
    tail.stop()
    tail.join(5)
    assert [(p.name, p.step, p.value) for p in sink.points] == [
        ("loss", 1, 0.5), ("my_metric", 2, 3.0), ("loss", 3, 0.25)
    ]  # fmt: skip
    assert len([n for n in sink.notes if "skipped a line" in n]) == 2
    assert any("'my_metric' is not a metric Trainyard knows" in n for n in sink.notes)


def test_the_tail_drops_a_flood_over_the_rate_limit_with_a_note(tmp_path: Path) -> None:
    path = tmp_path / "metrics-0.jsonl"
    path.write_text("".join(json.dumps({"step": i, "loss": 1.0}) + "\n" for i in range(20_000)))
    sink = Sink()
    tail = MetricTail(path, sink.on_points, sink.on_notes, below=tmp_path, uid=os.geteuid())
    tail.start()
    tail.stop()
    tail.join(10)
    assert 5000 <= len(sink.points) < 20_000
    assert any("dropping points over the limit" in n for n in sink.notes)


def test_the_helper_writes_the_protocol(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "m.jsonl"
    monkeypatch.setenv(trainyard_metrics.ENV, str(path))
    trainyard_metrics.declare(total_steps=100)
    trainyard_metrics.report(step=1, epoch=0.01, loss=0.5, lr=math.nan, samples_per_sec=900.0)
    lines = path.read_text().splitlines()
    assert json.loads(lines[0]) == {"total_steps": 100}
    assert json.loads(lines[1])["lr"] == "nan"  # not finite: written, as a string
    points = parse_line(lines[1])
    assert [(p.name, p.step) for p in points] == [("loss", 1), ("lr", 1), ("samples_per_sec", 1)]
    assert [points[0].value, points[2].value] == [0.5, 900.0] and math.isnan(points[1].value)


def test_the_helper_does_nothing_outside_trainyard(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A run inside Trainyard first, so that the helper holds an open metrics file: leaving
    # Trainyard must stop the writes to it too, not only the opening of new files.
    inside = tmp_path / "inside.jsonl"
    monkeypatch.setenv(trainyard_metrics.ENV, str(inside))
    trainyard_metrics.report(step=1, loss=0.5)
    assert [json.loads(line)["step"] for line in inside.read_text().splitlines()] == [1]

    def refuse_to_open(*args: object, **kwargs: object) -> NoReturn:
        raise AssertionError(f"the helper opened a file outside Trainyard: {args}")

    # The module's own `open` comes before the builtin: any file it opens, anywhere, fails here.
    monkeypatch.setattr(trainyard_metrics, "open", refuse_to_open, raising=False)
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(trainyard_metrics.ENV)

    trainyard_metrics.declare(total_steps=100, total_epochs=2.0)
    trainyard_metrics.report(step=2, epoch=0.5, loss=0.25, lr=math.nan)

    assert [json.loads(line)["step"] for line in inside.read_text().splitlines()] == [1]
    assert list(tmp_path.iterdir()) == [inside]  # nothing new in the working directory


ROUNDING = 0.05 * 3  # two processes' shares and their sum, each rounded to 0.1


def tree_cpu_seconds(tree: list[psutil.Process]) -> float:
    """User plus system CPU time of these processes, as psutil's cpu_percent counts it."""
    return sum(t.user + t.system for t in (p.cpu_times() for p in tree))


def tree_rss_mb(tree: list[psutil.Process]) -> float:
    return sum(p.memory_info().rss for p in tree) / 2**20


def test_the_sampler_measures_a_process_tree_and_never_invents_gpu_figures() -> None:
    busy = (
        "import subprocess, sys\n"
        "subprocess.Popen([sys.executable, '-c', 'while True: pass']).wait()"
    )
    proc = subprocess.Popen([sys.executable, "-c", busy])
    try:
        sink = Sink()
        asked_for_gpus: list[list[int]] = []

        def gpu_usage(ids: list[int]) -> list[tuple[float, float]]:
            asked_for_gpus.append(ids)
            return [(50.0, 1000.0)]  # what a GPU would say, were one given

        watched = SampledInstance([proc.pid], gpu_ids=[], emit=sink.on_points)
        sampler = SystemSampler(lambda: [watched], gpu_usage=gpu_usage)
        top = psutil.Process(proc.pid)
        # Only the grandchild spins; its parent waits for it.
        [spinner] = wait_until("the busy grandchild to start", top.children)
        tree = [top, spinner]

        # Outer marks around both samples, inner marks between them: the sampler's window
        # holds the inner one and lies within the outer one.
        outer_start, outer_cpu_start = time.monotonic(), tree_cpu_seconds(tree)
        sampler.sample(watched)  # primes the CPU counters: no point yet
        assert sink.points == []
        inner_start, inner_cpu_start = time.monotonic(), tree_cpu_seconds(tree)
        # However busy this machine is: wait for CPU time used, not for time passed.
        wait_until(
            "the busy grandchild to use 0.3 s of CPU",
            lambda: tree_cpu_seconds(tree) - inner_cpu_start >= 0.3,
        )
        inner_end, inner_cpu_end = time.monotonic(), tree_cpu_seconds(tree)
        rss_before = tree_rss_mb(tree)
        sampler.sample(watched)
        rss_after = tree_rss_mb(tree)
        outer_end, outer_cpu_end = time.monotonic(), tree_cpu_seconds(tree)

        assert [p.name for p in sink.points] == ["cpu_percent", "memory_mb"]
        assert asked_for_gpus == []  # no GPU given: none asked about, and no GPU points
        cpu_percent, memory_mb = (p.value for p in sink.points)
        # The tree's CPU time over the sampler's window, per second of it, within what
        # psutil measured around and inside that window. ROUNDING: psutil rounds each
        # process's share to 0.1, and the sampler their sum.
        at_least = 100 * (inner_cpu_end - inner_cpu_start) / (outer_end - outer_start)
        at_most = 100 * (outer_cpu_end - outer_cpu_start) / (inner_end - inner_start)
        assert at_least > 0
        assert at_least - ROUNDING <= cpu_percent <= at_most + ROUNDING
        # The tree's resident memory as psutil read it just before and after (0.05 for rounding).
        low, high = sorted((rss_before, rss_after))
        assert low - 0.05 <= memory_mb <= high + 0.05
    finally:
        for child in psutil.Process(proc.pid).children(recursive=True):
            os.kill(child.pid, signal.SIGKILL)
        proc.kill()
        proc.wait()


def test_the_sampler_gives_no_figures_for_an_instance_whose_processes_have_ended() -> None:
    """An instance's process that has exited but is not reaped yet (a zombie) has no memory:
    sampled, it reported 0 MB at the end of every job, a line falling to 0 on the chart."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        top = psutil.Process(proc.pid)
        wait_until("the process to end, unreaped", lambda: top.status() == psutil.STATUS_ZOMBIE)
        sink = Sink()
        watched = SampledInstance([proc.pid], gpu_ids=[], emit=sink.on_points)
        sampler = SystemSampler(lambda: [watched])
        sampler.sample(watched)
        sampler.sample(watched)
        assert sink.points == []
    finally:
        proc.wait()


@pytest.mark.django_db
def test_an_image_refuses_bad_metric_definitions_in_the_admin() -> None:
    from django.core.exceptions import ValidationError

    from jobs.models import Framework, FrameworkImage

    image = FrameworkImage(name="x", framework=Framework.PYTORCH)
    image.metric_definitions = [{"name": "loss", "regex": "loss=([0-9.]+)"}]
    image.full_clean()
    image.metric_definitions = [{"name": "loss", "regex": "loss=[0-9.]+"}]
    with pytest.raises(ValidationError, match="needs a group"):
        image.full_clean()


def test_an_instance_with_several_gpus_gets_their_mean_and_each_gpus_own_figures() -> None:
    """NVML through a fake (no driver here): what the sampler makes of what it reads."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        sink = Sink()
        usage = {2: (90.0, 1000.0), 5: (70.0, 3000.0)}
        watched = SampledInstance([proc.pid], gpu_ids=[2, 5], emit=sink.on_points)
        sampler = SystemSampler(lambda: [watched], gpu_usage=lambda ids: [usage[i] for i in ids])
        sampler.sample(watched)  # primes the CPU counters
        sampler.sample(watched)
        gpu_points = {p.name: p.value for p in sink.points if "gpu" in p.name}
        assert gpu_points == {
            "gpu_util_percent": 80.0,
            "gpu_memory_mb": 4000.0,
            "gpu2_util_percent": 90.0,
            "gpu2_memory_mb": 1000.0,
            "gpu5_util_percent": 70.0,
            "gpu5_memory_mb": 3000.0,
        }
        assert all(is_system_metric(name) for name in gpu_points)
        assert not is_system_metric("gpu_util") and not is_system_metric("loss")
    finally:
        proc.kill()
        proc.wait()


def test_an_instance_in_containers_is_sampled_from_its_group(tmp_path: Path) -> None:
    """Its trainers are no process of the agent's (the runtime's client is, and idles): CPU
    is the group's CPU-seconds over the time between samples, memory its working set."""
    cpu, memory = tmp_path / "cpuacct", tmp_path / "memory"
    # A container's process, in its own group below the instance's, in every hierarchy.
    below = [cpu / "c", memory / "c"]
    for folder in below:
        folder.mkdir(parents=True)
        (folder / "cgroup.procs").write_text("4242\n")
    (memory / "memory.usage_in_bytes").write_text(f"{300 << 20}\n")
    (memory / "memory.stat").write_text(f"total_inactive_file {44 << 20}\n")
    group = InstanceGroup(Layout.V1, {"cpuacct": cpu, "memory": memory}, nested=True)
    sink = Sink()
    watched = SampledInstance([1], gpu_ids=[], emit=sink.on_points, group=group)
    sampler = SystemSampler(lambda: [watched])
    (cpu / "cpuacct.usage").write_text("1000000000\n")
    sampler.sample(watched)  # primes
    assert sink.points == [] and watched.last_cpu is not None
    primed_at = watched.last_cpu[0]
    (cpu / "cpuacct.usage").write_text("1500000000\n")  # half a CPU-second later
    wait_until("some time to pass", lambda: time.monotonic() - primed_at >= 0.5)
    sampler.sample(watched)
    window = watched.last_cpu[0] - primed_at
    cpu_percent, memory_mb = (p.value for p in sink.points)
    assert cpu_percent == round(100 * 0.5 / window, 1)
    assert memory_mb == 256.0
    # Once no process is left in it, no more points (as for ended processes).
    for folder in below:
        (folder / "cgroup.procs").write_text("")
    sampler.sample(watched)
    assert len(sink.points) == 2
