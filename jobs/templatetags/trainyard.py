"""Template tags for what pages show people: prices with the currency, counts, sizes, times in
the reader's own zone, durations. `{% load trainyard %}`.

Times are rendered as <time datetime="ISO">…UTC</time> and durations as <span class="duration"
data-…>: static/trainyard/times.js turns the first into local time and keeps the second
ticking while the job runs. Without the script the page still reads right, in UTC.
"""

from datetime import UTC, datetime
from decimal import Decimal

from django import template
from django.utils import timezone as django_timezone
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

from jobs.models import Job
from jobs.money import currency, format_price
from jobs.services.views.counts import instance_count
from jobs.services.views.durations import format_ago, format_duration, run_seconds
from workers.logquota import human_bytes

register = template.Library()

NOTHING_YET = "—"


@register.filter
def money(amount: Decimal | float | int | None) -> str:
    """`{{ package.price_per_hour|money }}`: "$0.05"."""
    return NOTHING_YET if amount is None else format_price(amount)


@register.filter
def thousands(number: int | None) -> str:
    """12,345: counts of lines read at a glance."""
    return f"{number or 0:,}"


@register.filter
def instances(job: Job) -> str:
    """`{{ job|instances }}`: "3", "5 (4 trainers + scheduler)", as the API and the CLI say it."""
    return instance_count(job).text


@register.filter
def ago(moment: datetime | None) -> str:
    """`{{ node.last_heartbeat|ago }}`: "5 s ago", "3 min 05 s ago"; "never" for no moment."""
    return "never" if moment is None else format_ago(moment, django_timezone.now())


@register.filter
def size(count: int | None) -> str:
    """`{{ user.snapshot_bytes|size }}`: "12 kB", "1.5 MB", in decimal units as everywhere
    else in the console (workers.logquota.human_bytes)."""
    return human_bytes(count or 0)


@register.simple_tag
def currency_symbol() -> str:
    """ "$" in "Samples per $"; the code ("CHF") where the currency has no symbol."""
    return currency().symbol


@register.simple_tag
def local_time(moment: datetime | None, element_id: str = "") -> SafeString:
    """A <time> in UTC that the page's script shows in the reader's zone; "—" when there is no
    such moment (yet)."""
    id_attr = format_html(' id="{}"', element_id) if element_id else ""
    if moment is None:
        return format_html('<time class="local-time"{}>{}</time>', id_attr, NOTHING_YET)
    return format_html(
        '<time class="local-time" datetime="{}"{}>{}</time>',
        moment.astimezone(UTC).isoformat(),
        id_attr,
        utc_time(moment),
    )


@register.filter
def utc_time(moment: datetime | None) -> str:
    """`title="{{ token.last_used|utc_time }}"`: "2025-03-07 14:05:09 UTC", as a page shows
    a time before its script puts it in the reader's zone; "—" for none."""
    if moment is None:
        return NOTHING_YET
    return moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


@register.simple_tag
def job_duration(job: Job, element_id: str = "", running_prefix: str = "") -> SafeString:
    """How long the job has run (durations.run_seconds), "—" before it started. While it runs
    the script counts on from `data-now`, the server's clock at rendering, so that a browser
    whose clock is off still shows the right time; `running_prefix` ("running for ") goes
    before a running job's duration, also once the page learns that a waiting job started."""
    now = django_timezone.now()
    seconds = run_seconds(job, now)
    running = seconds is not None and job.finished is None
    attributes = {
        "id": element_id,
        "data-started": job.started.isoformat() if seconds is not None and job.started else "",
        "data-finished": job.finished.isoformat() if seconds is not None and job.finished else "",
        "data-now": now.isoformat() if job.finished is None else "",
        "data-seconds": f"{seconds:.3f}" if seconds is not None else "",
        "data-prefix": running_prefix,
    }
    return format_html(
        '<span class="duration{}"{}>{}</span>',
        " running" if running else "",
        format_html_join("", ' {}="{}"', ((k, v) for k, v in attributes.items() if v)),
        NOTHING_YET
        if seconds is None
        else f"{running_prefix if running else ''}{format_duration(seconds)}",
    )
