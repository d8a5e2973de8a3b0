"""A NaN or infinite metric value reaches the console (a health rule can stop the job on it)
as `"value": null, "nonfinite": "nan"`, while charts, figures and the database see only numbers:
the trainer's helper, the agent's parsing, the stream, the keeper and the readers, all real."""

import json
import math
from pathlib import Path
from typing import Any

import pytest
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.contrib.auth.models import User

from console.asgi import application
from jobs import logstream
from jobs.models import ApiToken, Job, LogChunk, MetricPoint
from jobs.redis_client import get_redis
from jobs.services import logarchive
from jobs.services.submission import check_job_request, submit_job
from tests.unit.helpers import append_lines, job_request, stream_entries
from workers import contract
from workers.logsink import LogSink
from workers.metricparse import BadMetric, Point, RegexMetric, parse_line, scan_lines
from workers.trainer_lib import trainyard_metrics


def strict(text: str) -> Any:
    """JSON as a browser reads it: a bare NaN or Infinity is an error."""

    def refuse(constant: str) -> None:
        raise ValueError(f"not strict JSON: {constant}")

    return json.loads(text, parse_constant=refuse)


def kind(value: float) -> str:
    return "nan" if math.isnan(value) else repr(value)


# --- the trainer's helper and the agent's parsing --------------------------------------------


def test_the_helper_writes_values_that_are_not_finite_as_strings(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "m.jsonl"
    monkeypatch.setenv(trainyard_metrics.ENV, str(path))
    trainyard_metrics.report(step=40, loss=math.nan, up=math.inf, down=-math.inf, lr=0.1)
    trainyard_metrics.report(step=41, loss=float("inf"))  # alone: still written
    first, second = (strict(line) for line in path.read_text().splitlines())
    assert {k: first[k] for k in ("step", "loss", "up", "down", "lr")} == {
        "step": 40, "loss": "nan", "up": "inf", "down": "-inf", "lr": 0.1
    }  # fmt: skip
    assert (second["step"], second["loss"]) == (41, "inf")
    points = parse_line(path.read_text().splitlines()[0])
    assert [(p.name, kind(p.value), p.step) for p in points] == [
        ("loss", "nan", 40), ("up", "inf", 40), ("down", "-inf", 40), ("lr", "0.1", 40)
    ]  # fmt: skip


def test_the_parser_reads_the_three_strings_as_a_value_that_is_not_finite() -> None:
    (nan,) = parse_line('{"name": "loss", "value": "nan", "step": 40}', now=5.0)
    assert (nan.name, nan.step, nan.ts) == ("loss", 40, 5.0) and math.isnan(nan.value)
    inf, minus = parse_line('{"step": 2, "epoch": 0.5, "loss": "inf", "eval_loss": "-inf"}')
    assert (inf.value, minus.value, inf.epoch) == (math.inf, -math.inf, 0.5)


@pytest.mark.parametrize(
    ("line", "says"),
    [
        ('{"loss": "NaN"}', "must be a number"),  # exactly "nan", "inf" and "-inf"
        ('{"loss": "Infinity"}', "must be a number"),
        ('{"loss": "+inf"}', "must be a number"),
        ('{"loss": " nan"}', "must be a number"),
        ('{"name": "loss", "value": "INF"}', "must be a number"),
        ('{"loss": NaN}', "must be a number"),  # bare constants stay refused
        ('{"loss": -Infinity}', "must be a number"),
        ('{"loss": 1e999}', "must be finite"),  # an overflowing number too
        ('{"total_steps": "inf"}', "must be a number"),  # the run's length is a number
        ('{"step": "nan", "loss": 1}', "must be a number"),  # only values
        ('{"epoch": "inf", "loss": 1}', "must be a number"),
        ('{"ts": "-inf", "loss": 1}', "must be a number"),
        ('{"loss": true}', "must be a number"),
    ],
)
def test_nothing_else_new_is_accepted(line: str, says: str) -> None:
    with pytest.raises(BadMetric, match=says):
        parse_line(line)


def test_a_point_that_is_not_finite_is_written_as_null_with_what_it_was() -> None:
    nan = Point("loss", math.nan, 40, None, 5.0).to_json()
    assert nan == '{"name":"loss","value":null,"nonfinite":"nan","step":40,"ts":5.0}'
    inf = Point("loss", math.inf, None, 1.5, 5.0004).to_json()
    assert inf == '{"name":"loss","value":null,"nonfinite":"inf","epoch":1.5,"ts":5.0}'
    minus = Point("eval_loss", -math.inf, 3, 0.25, 7.0).to_json()
    assert strict(minus) == {
        "name": "eval_loss", "value": None, "nonfinite": "-inf", "step": 3, "epoch": 0.25,
        "ts": 7.0,
    }  # fmt: skip


def test_finite_points_are_written_as_before() -> None:
    point = Point("loss", 0.25, 120, 1.5, 1732230000.1)
    assert point.to_json() == (
        '{"name":"loss","value":0.25,"step":120,"epoch":1.5,"ts":1732230000.1}'
    )
    assert Point("lr", 1e-300, None, None, 2.0).to_json() == '{"name":"lr","value":1e-300,"ts":2.0}'


def test_a_regex_metric_that_captures_nan_or_inf_gives_such_a_point() -> None:
    loss = RegexMetric.compile("loss", r"loss=(\S+)")
    texts = ["loss=nan", "loss=NaN", "loss=inf", "loss=-inf", "loss=Infinity", "loss=-INFINITY"]
    skipped = ["loss=1e999", "loss=nanny", "loss=infinite", "loss=0x1p3"]
    points = scan_lines([loss], [*texts, *skipped, "loss=0.5"], ts=1.0)
    assert [kind(p.value) for p in points] == ["nan", "nan", "inf", "-inf", "inf", "-inf", "0.5"]
    assert json.loads(points[0].to_json())["nonfinite"] == "nan"
    # The usual patterns never capture such text; a declaration of the length stays finite.
    usual = RegexMetric.compile("loss", r"loss=([0-9.]+)")
    total = RegexMetric.compile("total_steps", r"total=(\S+)")
    assert scan_lines([usual, total], ["loss=nan", "total=inf"], ts=1.0) == []


def test_point_value_decodes_both_forms() -> None:
    assert logstream.point_value({"value": 0.5}) == 0.5
    assert logstream.point_value({"value": 3}) == 3.0
    assert math.isnan(logstream.point_value({"value": None, "nonfinite": "nan"}))
    assert logstream.point_value({"value": None, "nonfinite": "inf"}) == math.inf
    assert logstream.point_value({"value": None, "nonfinite": "-inf"}) == -math.inf
    with pytest.raises(ValueError):
        logstream.point_value({"value": None, "nonfinite": "1.5"})


# --- the stream, the keeper and the readers (real Redis) -------------------------------------

console = pytest.mark.usefixtures("catalog", "code_root", "nodes", "redis_url", "sent_tasks")


@pytest.fixture
def job(alice: User) -> Job:
    return submit_job(alice, check_job_request(job_request(instances=2)))


def ship(job: Job, points: list[Point], role: str = "master", index: int = 0) -> None:
    """Metric points as the agent ships them: one STREAM_METRIC batch of Point.to_json lines."""
    lines = [p.to_json() for p in points]
    append_lines(
        LogSink(get_redis()), job.pk, role, index, "node-1", lines, contract.STREAM_METRIC, 9.0
    )


def archive_all() -> None:
    while logarchive.archive_once(get_redis(), block_ms=10):
        pass


POINTS = [
    Point("loss", 0.5, 39, None, 100.0),
    Point("loss", math.nan, 40, None, 101.0),
    Point("lr", 0.1, 40, None, 101.0),
    Point("eval_loss", -math.inf, 40, None, 101.0),
]


@console
def test_the_stream_carries_the_point_and_readers_for_charts_leave_it_out(job: Job) -> None:
    ship(job, POINTS)
    ((entry_id, fields),) = stream_entries(get_redis(), job.pk)
    batch = logstream.parse_entry(entry_id, fields)
    streamed = batch.points()  # what the health rules read
    assert [p["value"] for p in streamed] == [0.5, None, 0.1, None]
    assert [p.get("nonfinite") for p in streamed] == [None, "nan", None, "-inf"]
    assert [kind(logstream.point_value(p)) for p in streamed] == ["0.5", "nan", "0.1", "-inf"]
    assert (streamed[1]["cursor"], streamed[1]["role"], streamed[1]["step"]) == (2, "master", 40)
    points, position = logstream.metric_points(job.pk)
    assert [(p["name"], p["value"], p["cursor"]) for p in points] == [
        ("loss", 0.5, 1), ("lr", 0.1, 3)
    ]  # fmt: skip
    assert position == 4


@console
def test_the_keeper_stores_the_finite_points_and_skips_the_others(job: Job) -> None:
    ship(job, POINTS)
    ship(job, [Point("loss", 0.25, 41, None, 102.0)], role="worker", index=1)
    live, _ = logstream.metric_points(job.pk)
    archive_all()
    rows = MetricPoint.objects.filter(job=job).order_by("cursor")
    assert [(r.name, r.value, r.step, r.cursor) for r in rows] == [
        ("loss", 0.5, 39, 1), ("lr", 0.1, 40, 3), ("loss", 0.25, 41, 5)
    ]  # fmt: skip
    # The log itself keeps every line, the one that is not finite included.
    (chunk, _) = LogChunk.objects.filter(job=job, stream=logstream.METRIC).order_by("last_cursor")
    assert '"nonfinite":"nan"' in chunk.text and '"nonfinite":"-inf"' in chunk.text
    get_redis().flushdb()  # from the database alone: the same points as from the stream
    archived, _ = logstream.metric_points(job.pk)
    assert [(p["name"], p["value"], p["cursor"]) for p in archived] == [
        (p["name"], p["value"], p["cursor"]) for p in live
    ]


@console
@pytest.mark.django_db(transaction=True)
async def test_the_websockets_metric_frames_leave_the_point_out(alice: User) -> None:
    job = await database_sync_to_async(job_for)(alice)
    ship(job, POINTS[:2])
    token = await database_sync_to_async(ApiToken.issue)(alice)
    comm = WebsocketCommunicator(
        application, f"/ws/jobs/{job.pk}/?after=0", [(b"authorization", f"Token {token}".encode())]
    )
    assert (await comm.connect())[0]
    frame = await comm.receive_json_from(timeout=5)
    while frame["type"] == "state":
        frame = await comm.receive_json_from(timeout=5)
    assert frame["type"] == "metric" and frame["next"] == 2
    assert [(p["name"], p["value"]) for p in frame["points"]] == [("loss", 0.5)]
    await comm.disconnect()


def job_for(user: User) -> Job:
    return submit_job(user, check_job_request(job_request(instances=2)))
