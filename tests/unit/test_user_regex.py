"""Users' regexes (issue 23): RE2 refuses what cannot run in linear time, with a message naming
the field; a job's matching is metered, and the pattern that overspends is switched off on that
job alone, visibly; stored patterns that RE2 refuses switch off instead of crashing."""

import json
from collections.abc import Callable
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client

from jobs.healthrules import Watch, parse_rules, parse_stored_rules
from jobs.models import ApiToken, HealthEvent, Job
from jobs.services import health
from jobs.services.submission import check_job_request, submit_job
from tests.unit.helpers import job_request
from workers.metricparse import RegexMetric, RegexScanner, check_definitions, compile_definitions
from workers.userregex import MatchBudget, UnsafeRegex, compile_pattern

HOSTILE = "(a+)+$"
HOSTILE_LINE = "a" * 30 + "b"  # 2**30 steps for a backtracking engine


class FakeClocks:
    """The budget's two clocks: `cpu` moves by `cost` every time it is read after a start, as if
    each match cost that many CPU seconds; `now` is the window clock, moved by the test."""

    def __init__(self, cost: float) -> None:
        self.cost = cost
        self.cpu_reads = 0
        self.wall = 0.0

    def cpu(self) -> float:
        self.cpu_reads += 1
        return (self.cpu_reads // 2) * self.cost  # start, end, start, end: each pair costs `cost`

    def now(self) -> float:
        return self.wall


def budget(clocks: FakeClocks, seconds: float = 1.0, window: float = 10.0) -> MatchBudget[Any]:
    return MatchBudget(seconds=seconds, window=window, now=clocks.now, cpu_clock=clocks.cpu)


# --- the engine ----------------------------------------------------------------------------------


def test_the_pattern_that_stalled_a_node_is_linear_on_re2() -> None:
    # On Python's re this search takes minutes (a hang here fails by pytest-timeout, by name).
    assert compile_pattern(HOSTILE).search(HOSTILE_LINE * 100) is None
    assert compile_pattern(HOSTILE).search("a" * 30) is not None


@pytest.mark.parametrize(
    ("pattern", "says"),
    [
        (r"(a)\1", "backreferences such as \\1"),
        (r"(?=a)b", "lookahead (?=...)"),
        (r"(?!a)b", "negative lookahead (?!...)"),
        (r"(?<=a)b", "lookbehind (?<=...)"),
        (r"(?<!a)b", "negative lookbehind (?<!...)"),
        (r"a++", "possessive repetition"),
        (r"a{1001}", "counted repetition beyond {1000}"),
        ("(" * 3 + "x", "is not a valid regular expression for RE2: missing )"),
        ("x" * 501, "is 501 characters long; at most 500"),
        (7, "must be a string"),
    ],
)
def test_what_re2_cannot_run_in_linear_time_is_refused_in_words(pattern: object, says: str) -> None:
    with pytest.raises(UnsafeRegex) as raised:
        compile_pattern(pattern)
    assert says in str(raised.value)


def test_a_line_with_a_lone_surrogate_is_searched_not_raised_on() -> None:
    (rule,) = parse_rules([{"kind": "log-pattern", "pattern": "FATAL", "action": "warn"}])
    assert Watch([rule], 0.0).line("master", 0, "\ud800 FATAL", "stdout", 1.0)
    assert RegexMetric.compile("loss", r"loss=([0-9.]+)").point("\ud800 loss=1", 1.0)


def test_named_groups_and_flags_users_write_still_work() -> None:
    metric = RegexMetric.compile("acc", r"(?i)step (?P<step>\d+) ACC=(?P<value>[0-9.]+)")
    point = metric.point("Step 20 acc=0.91", 1.0)
    assert point is not None and (point.value, point.step) == (0.91, 20)


# --- the budget ----------------------------------------------------------------------------------


def test_a_budget_names_the_pattern_that_spent_most_once_the_job_goes_over() -> None:
    clocks = FakeClocks(cost=0.0)
    meter: MatchBudget[str] = budget(clocks, seconds=1.0)
    assert meter.charge("cheap", 0.3) is None
    assert meter.charge("costly", 0.6) is None
    overrun = meter.charge("costly", 0.3)  # 1.2 s in the window: over
    assert overrun is not None and overrun.key == "costly" and overrun.spent == pytest.approx(0.9)
    assert "metric 'x' switched off: its regex spent 0.90 s of CPU" in overrun.message("metric 'x'")
    # What the switched-off pattern spent is forgotten: the cheap one goes on.
    assert meter.charge("cheap", 0.3) is None


def test_a_new_window_starts_with_a_full_budget() -> None:
    clocks = FakeClocks(cost=0.0)
    meter: MatchBudget[str] = budget(clocks, seconds=1.0, window=10.0)
    assert meter.charge("p", 0.9) is None
    clocks.wall = 10.0
    assert meter.charge("p", 0.9) is None
    assert meter.charge("p", 0.2) is not None


def test_a_metric_over_budget_is_switched_off_with_a_note_and_the_others_go_on() -> None:
    clocks = FakeClocks(cost=0.4)  # every batch of one definition costs 0.4 s
    costly = RegexMetric.compile("loss", r"loss=([0-9.]+)")
    cheap = RegexMetric.compile("lr", r"lr=([0-9.]+)")
    scanner = RegexScanner([costly, cheap], budget(clocks, seconds=1.0))
    points, notes = scanner.scan(["loss=1 lr=0.1"], ts=1.0)
    assert [p.name for p in points] == ["loss", "lr"] and notes == []
    points, notes = scanner.scan(["loss=2 lr=0.2"], ts=2.0)  # 1.2 s: loss spent 0.8, lr 0.4
    assert [p.name for p in points] == ["loss", "lr"]
    (note,) = notes
    assert note.startswith("metric 'loss' switched off: its regex spent 0.80 s of CPU")
    clocks.wall = 10.0  # the next window
    points, notes = scanner.scan(["loss=3 lr=0.3"], ts=3.0)
    assert [p.name for p in points] == ["lr"] and notes == []


def test_stored_metric_definitions_re2_refuses_switch_off_alone() -> None:
    stored = [{"name": "loss", "regex": r"loss=([0-9.]+)"}, {"name": "echo", "regex": r"(a)\1"}]
    definitions, problems = compile_definitions(stored)
    assert [d.name for d in definitions] == ["loss"]
    (problem,) = problems
    assert problem.startswith("metric definition 'echo' switched off: regex of 'echo' uses")


def test_submission_checks_refuse_a_backreference_in_a_metric() -> None:
    with pytest.raises(ValueError, match="backreferences"):
        check_definitions([{"name": "x", "regex": r"(\d)\1"}])


# --- health rules in the log keeper --------------------------------------------------------------


def test_a_log_pattern_rule_over_budget_is_switched_off_and_said_once() -> None:
    costly, stop = parse_rules(
        [
            {"kind": "log-pattern", "pattern": "a+b", "action": "warn", "name": "costly"},
            {"kind": "log-pattern", "pattern": "FATAL", "action": "stop", "stream": "stderr"},
        ]
    )
    clocks = FakeClocks(cost=0.3)  # each search
    watch = Watch([costly, stop], 0.0, budget=budget(clocks, seconds=1.0))
    assert watch.line("master", 0, "nothing", "stderr", 1.0) == []  # 0.3 s each
    for _ in range(3):  # stdout: the costly rule alone
        assert watch.line("master", 0, "nothing", "stdout", 1.0) == []
    (off,) = watch.take_switched_off()  # 1.2 s in the window: the costly one spent 0.9
    assert off.rule == costly and (off.role, off.index) == ("master", 0)
    assert off.message.startswith("health rule 'costly' switched off: its regex spent 0.90 s")
    assert watch.take_switched_off() == []
    clocks.wall = 10.0  # a new window
    assert watch.line("master", 0, "aab", "stdout", 2.0) == []  # costly no longer runs
    (firing,) = watch.line("master", 0, "FATAL: disk", "stderr", 3.0)
    assert firing.rule == stop


def test_a_watch_without_a_budget_reads_no_clock() -> None:
    (rule,) = parse_rules([{"kind": "log-pattern", "pattern": HOSTILE, "action": "warn"}])
    assert Watch([rule], 0.0).line("master", 0, "a" * 30, "stdout", 1.0)


def test_stored_rules_re2_refuses_switch_off_one_by_one() -> None:
    stored = [
        {"kind": "log-pattern", "pattern": r"(x)\1", "action": "stop"},
        {"kind": "log-pattern", "pattern": "FATAL", "action": "stop"},
    ]
    rules, problems = parse_stored_rules(stored)
    assert [r.pattern for r in rules] == ["FATAL"]
    (problem,) = problems
    assert problem.startswith("switched off: rule 1: 'pattern' uses backreferences")
    assert parse_stored_rules("not a list")[0] == []


# --- submission and the keeper, with the database ------------------------------------------------

pytestmark_db = pytest.mark.usefixtures("catalog", "code_root", "nodes", "redis_url", "sent_tasks")


def post_job(client: Client, user: User, body: dict[str, Any]) -> Any:
    return client.post(
        "/api/v1/jobs",
        data=json.dumps(body),
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Token {ApiToken.issue(user)}",
    )


@pytestmark_db
@pytest.mark.parametrize(
    ("field", "extra", "says"),
    [
        ("metrics", {"metrics": [{"name": "loss", "regex": r"(\d)\1"}]}, "backreferences"),
        (
            "health_rules",
            {"health_rules": [{"kind": "log-pattern", "pattern": "(?<=x)y", "action": "stop"}]},
            "lookbehind",
        ),
        (
            "health_rules",
            {"health_rules": [{"kind": "log-pattern", "pattern": "e" * 501, "action": "stop"}]},
            "at most 500",
        ),
    ],
)
def test_the_api_refuses_a_pattern_re2_will_not_run_and_stores_nothing(
    client: Client, alice: User, field: str, extra: dict[str, Any], says: str
) -> None:
    r = post_job(client, alice, job_request(instances=1, **extra))
    assert r.status_code == 400, r.content
    (message,) = r.json()["errors"][field]
    assert says in message
    assert not Job.objects.exists()


@pytestmark_db
def test_the_api_accepts_the_hostile_pattern_because_re2_runs_it_in_linear_time(
    client: Client, alice: User
) -> None:
    extra: dict[str, Any] = {
        "metrics": [{"name": "a", "regex": HOSTILE}],
        "health_rules": [{"kind": "log-pattern", "pattern": HOSTILE, "action": "warn"}],
    }
    assert post_job(client, alice, job_request(instances=1, **extra)).status_code == 201


@pytestmark_db
def test_the_keeper_switches_off_a_stored_rule_re2_refuses_and_says_so_on_the_job(
    alice: User, django_capture_on_commit_callbacks: Callable[..., Any]
) -> None:
    with django_capture_on_commit_callbacks(execute=True):
        job = submit_job(alice, check_job_request(job_request(instances=1)))
    # As stored before this check existed (Python's re took backreferences).
    Job.objects.filter(pk=job.pk).update(
        health_rules=[
            {"kind": "log-pattern", "pattern": r"(x)\1", "action": "stop"},
            {"kind": "log-pattern", "pattern": "FATAL", "action": "stop"},
        ],
        state=Job.State.RUNNING,
    )
    from jobs.redis_client import get_redis

    monitor = health.HealthMonitor(get_redis())
    with django_capture_on_commit_callbacks(execute=True):
        monitor.refresh()
        monitor._by_job.clear()
        monitor.refresh()  # as after a keeper restart: said once all the same
    (event,) = HealthEvent.objects.filter(job=job)
    assert event.action == health.SWITCHED_OFF
    assert "rule 1: 'pattern' uses backreferences" in event.message
    assert [r.pattern for r in monitor._by_job[job.pk].watch.rules] == ["FATAL"]


def test_volume_alone_never_switches_a_cheap_pattern_off() -> None:
    """A busy, honest job: a cheap pattern tried on many lines spends more than the base budget
    in the window, but far less than its allowance per line. The job's matching as a whole stays
    bounded by base + allowance x lines (the log limit bounds the lines): a costly pattern that
    goes past that is switched off, not the cheap one."""
    clock = [0.0]
    meter: MatchBudget[str] = MatchBudget(now=lambda: clock[0])
    for _ in range(100):  # 100 batches of 10,000 lines at 2 µs a line: 2 s of CPU in all
        assert meter.charge("literal", 10_000 * 2e-6, lines=10_000) is None
    # 1,000,500 lines tried allow 0.5 + 20.01 s; 50 ms a line on 500 lines goes past it.
    overrun = meter.charge("costly", 0.05 * 500, lines=500)
    assert overrun is not None and overrun.key == "costly"
