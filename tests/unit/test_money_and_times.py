"""Prices with the currency, times in UTC for the browser to localise, durations
(jobs/money.py, jobs/services/views/durations.py, jobs/templatetags/trainyard.py)."""

from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.template import Context, Template

from jobs.models import Job
from jobs.money import currency, format_price
from jobs.services.views.durations import format_ago, format_duration, run_seconds

T0 = datetime(2025, 3, 7, 14, 5, 9, 250000, tzinfo=UTC)


@pytest.mark.parametrize(
    ("code", "symbol", "price"),
    [
        ("USD", "$", "$0.05"),
        ("EUR", "€", "€0.05"),
        ("CNY", "¥", "¥0.05"),
        ("CHF", "CHF", "CHF\u00a00.05"),
    ],
)
def test_prices_carry_the_configured_currency(
    settings: Any, code: str, symbol: str, price: str
) -> None:
    settings.TRAINYARD_CURRENCY = code
    assert currency().symbol == symbol
    assert format_price(Decimal("0.0500")) == price


@pytest.mark.parametrize(
    ("amount", "text"),
    [
        (Decimal("0.0500"), "$0.05"),
        (Decimal("0.0125"), "$0.0125"),
        (Decimal("3.0000"), "$3.00"),
        (Decimal("1234.5"), "$1,234.50"),
        (0, "$0.00"),
    ],
)
def test_a_price_keeps_the_digits_that_count(amount: Decimal, text: str) -> None:
    assert format_price(amount) == text


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(0, "0 s"), (12.9, "12 s"), (65, "1 min 05 s"), (3599, "59 min 59 s"), (7500, "2 h 05 min")],
)
def test_durations_read_in_the_largest_units_that_matter(seconds: float, text: str) -> None:
    assert format_duration(seconds) == text


def job(started: datetime | None, finished: datetime | None, created: datetime = T0) -> Job:
    return Job(pk=1, created=created, started=started, finished=finished)


def test_a_job_runs_from_its_start_to_its_end_or_to_now() -> None:
    assert run_seconds(job(T0, T0 + timedelta(seconds=75.5))) == 75.5
    assert run_seconds(job(T0, None), now=T0 + timedelta(seconds=30)) == 30
    assert run_seconds(job(None, None)) is None
    assert run_seconds(job(None, T0)) is None  # cancelled while it waited


def render(source: str, **context: Any) -> str:
    return Template("{% load trainyard %}" + source).render(Context(context))


def test_a_time_is_rendered_in_utc_for_the_browser_to_localise() -> None:
    html = render('{% local_time moment "job-started" %}', moment=T0)
    assert html == (
        '<time class="local-time" datetime="2025-03-07T14:05:09.250000+00:00" id="job-started">'
        "2025-03-07 14:05:09 UTC</time>"
    )
    assert render("{% local_time moment %}", moment=None) == '<time class="local-time">—</time>'


def test_a_finished_jobs_duration_is_finished_minus_started() -> None:
    html = render("{% job_duration j %}", j=job(T0, T0 + timedelta(seconds=192.4)))
    assert 'data-started="2025-03-07T14:05:09.250000+00:00"' in html
    assert 'data-finished="2025-03-07T14:08:21.650000+00:00"' in html
    assert 'data-seconds="192.400"' in html
    assert html.endswith(">3 min 12 s</span>")
    assert "running" not in html


def test_a_running_jobs_duration_says_so_and_carries_the_servers_clock() -> None:
    started = datetime.now(UTC) - timedelta(seconds=200)
    html = render('{% job_duration j "job-duration" "running for " %}', j=job(started, None))
    assert 'class="duration running" id="job-duration"' in html
    assert "data-now=" in html and 'data-prefix="running for "' in html
    assert ">running for 3 min 2" in html  # 200 s and however long rendering took


def test_a_job_that_never_started_has_no_duration() -> None:
    html = render("{% job_duration j %}", j=job(None, T0))
    assert html == '<span class="duration">—</span>'


def test_money_and_currency_symbol_in_templates(settings: Any) -> None:
    settings.TRAINYARD_CURRENCY = "EUR"
    assert render("{{ p|money }} · per {% currency_symbol %}", p=Decimal("0.2")) == "€0.20 · per €"


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(0.4, "0 s ago"), (-2, "0 s ago"), (5, "5 s ago"), (190, "3 min 10 s ago"),
     (7500, "2 h 05 min ago")],
)  # fmt: skip
def test_how_long_ago_reads_in_the_units_of_a_duration(seconds: float, text: str) -> None:
    """A heartbeat 5 s old is "5 s ago", never Django's "0 minutes ago"."""
    assert format_ago(T0 - timedelta(seconds=seconds), now=T0) == text


def test_templates_say_how_long_ago_and_the_utc_time_behind_it() -> None:
    moment = datetime.now(UTC) - timedelta(seconds=5, milliseconds=200)
    assert render("{{ t|ago }}", t=moment) == "5 s ago"
    assert render("{{ t|ago }}", t=None) == "never"
    assert render("{{ t|utc_time }}", t=T0) == "2025-03-07 14:05:09 UTC"
    assert render("{{ t|utc_time }}", t=None) == "—"


def test_the_console_can_name_the_time_zone_that_pages_and_the_cli_show(
    settings: Any, client: Any, django_user_model: Any
) -> None:
    from jobs.page_rules import page_rules
    from trainyard_cli import render

    assert page_rules()["time_zone"] is None  # by default each reader's own zone
    settings.TRAINYARD_TIME_ZONE = "Asia/Tokyo"
    assert page_rules()["time_zone"] == "Asia/Tokyo"
    client.force_login(django_user_model.objects.create_user("tz-reader"))
    assert client.get("/api/v1/catalog").json()["time_zone"] == "Asia/Tokyo"

    render.show_times_in("Asia/Tokyo")
    try:
        assert render.local_time("2025-03-07T14:05:09+00:00") == "2025-03-07 23:05:09"
        render.show_times_in("No/Such_Zone")  # a zone this computer lacks: its own clock
        assert render.local_time("2025-03-07T14:05:09+00:00") == (
            T0.astimezone().strftime("%Y-%m-%d %H:%M:%S")
        )
    finally:
        render.show_times_in(None)


def test_a_time_zone_setting_that_names_no_zone_stops_the_console_with_why() -> None:
    import os
    import subprocess
    import sys

    result = subprocess.run(
        [sys.executable, "-c", "import console.settings"],
        env={**os.environ, "TRAINYARD_TIME_ZONE": "Mars/Olympus_Mons"},
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode != 0
    assert "TRAINYARD_TIME_ZONE='Mars/Olympus_Mons' is not a time zone" in result.stderr
