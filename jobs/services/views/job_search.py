"""Finding jobs: the filters and sort orders that the job list page and `GET /api/v1/jobs`
share, read from a query string, so that both take the same words and refuse the same
mistakes (each refusal names its parameter).

Every filter is a condition on the job's own row (or its owner's username, or its tags, one
join), so a page of the list stays the same few queries however many jobs match, and the sort
orders end in the primary key: a page is stable and the next one starts where it ended.

Besides submission time and duration, the run table sorts by any of its columns (issue 49):
a metric's final or best value (from its summary, models.MetricSummary, never its points), a
config key (Job.config), the project or the first tag. Jobs without a value come last.
"""

import re
from collections.abc import Mapping
from dataclasses import dataclass, fields
from datetime import date, datetime, time, timedelta
from typing import Any

from django.contrib.auth.models import AnonymousUser, User
from django.db.models import (
    Case,
    DurationField,
    Exists,
    ExpressionWrapper,
    F,
    OuterRef,
    Q,
    QuerySet,
    Subquery,
    Value,
    When,
)
from django.db.models.fields.json import KeyTransform
from django.db.models.functions import Coalesce
from django.utils import timezone

from jobs import labels
from jobs.models import Job, JobTag, MetricSummary
from jobs.services import metric_summaries

# Sort orders: submitted (newest first by default) or how long the job ran. A leading "-"
# reverses. Jobs that never started sort after the others in both duration orders.
SORTS = ("-submitted", "submitted", "-duration", "duration")
DEFAULT_SORT = "-submitted"
MAX_SEARCH = 200  # characters of a name search: a job's name is at most 200
MAX_TAGS_ASKED = 10  # tags in one filter (a job has them all)


@dataclass(frozen=True)
class Column:
    """A column of the run table that the list can sort by: `kind` is "metric" (`key` a
    metric's name, `part` "final" or "best"), "config" (`key` a key of Job.config), "project"
    or "tags". Written in a query string as metric:eval_accuracy:best, config:lr, project, tags."""

    kind: str
    key: str = ""
    part: str = ""

    @property
    def word(self) -> str:
        return ":".join(p for p in (self.kind, self.key, self.part) if p)


METRIC_PARTS = ("final", "best")
_METRIC_NAME = re.compile(r"[A-Za-z0-9_.:/-]{1,64}")
_CONFIG_KEY = re.compile(r"\$?[A-Za-z0-9_.-]{1,100}")


def column_of(word: str) -> Column | None:
    """The column a word names, or None when it names none."""
    kind, _, rest = word.partition(":")
    if kind in ("project", "tags") and not rest:
        return Column(kind)
    if kind == "config" and _CONFIG_KEY.fullmatch(rest):
        return Column(kind, rest)
    if kind == "metric":
        name, _, part = rest.rpartition(":")
        if part in METRIC_PARTS and _METRIC_NAME.fullmatch(name):
            return Column(kind, name, part)
    return None


COLUMN_WORDS = (
    "metric:NAME:final, metric:NAME:best, config:KEY (an argument like lr, or $VARIABLE), "
    "project or tags"
)


class BadFilter(Exception):
    """A filter value the list cannot take: {parameter: [message]}."""

    def __init__(self, errors: dict[str, list[str]]) -> None:
        super().__init__(errors)
        self.errors = errors


@dataclass(frozen=True)
class JobFilter:
    """What to list. Empty strings and None mean "any"."""

    state: tuple[str, ...] = ()
    user: str = ""
    name: str = ""
    image: str = ""
    program: str = ""
    since: date | None = None
    until: date | None = None
    project: str = ""
    tag: tuple[str, ...] = ()
    sort: str = DEFAULT_SORT

    @property
    def active(self) -> bool:
        """Whether anything narrows the list (the page then says "no jobs match")."""
        return any(getattr(self, f.name) for f in fields(self) if f.name != "sort")


PARAMETERS = tuple(f.name for f in fields(JobFilter))


def parse(query: Mapping[str, str], viewer: User | AnonymousUser) -> JobFilter:
    """The filter a query string asks for, or BadFilter naming every parameter it cannot take."""
    errors: dict[str, list[str]] = {}
    values: dict[str, object] = {}
    raw = {name: (query.get(name) or "").strip() for name in PARAMETERS}

    if raw["state"]:
        states = tuple(s.strip() for s in raw["state"].split(",") if s.strip())
        unknown = [s for s in states if s not in Job.State.values]
        if unknown:
            errors["state"] = [
                f"state must be one of {', '.join(Job.State.values)} (several: comma-separated); "
                f"not {', '.join(unknown)}."
            ]
        values["state"] = states
    if raw["user"]:
        if not getattr(viewer, "is_staff", False) and raw["user"] != viewer.get_username():
            errors["user"] = ["Only administrators can list other users' jobs."]
        values["user"] = raw["user"]
    for name in ("name", "image", "program"):
        if len(raw[name]) > MAX_SEARCH:
            errors[name] = [f"{name} is at most {MAX_SEARCH} characters."]
        values[name] = raw[name]
    for name in ("since", "until"):
        if raw[name]:
            try:
                values[name] = date.fromisoformat(raw[name])
            except ValueError:
                errors[name] = [f"{name} must be a date, YYYY-MM-DD."]
    if raw["project"]:
        if problem := labels.project_problem(raw["project"]):
            errors["project"] = [problem]
        values["project"] = raw["project"]
    if raw["tag"]:
        tags = tuple(dict.fromkeys(t.strip() for t in raw["tag"].split(",") if t.strip()))
        problems = [p for p in map(labels.tag_problem, tags) if p]
        if len(tags) > MAX_TAGS_ASKED:
            problems.append(f"tag takes at most {MAX_TAGS_ASKED} tags (comma-separated).")
        if problems:
            errors["tag"] = problems
        values["tag"] = tags
    if raw["sort"]:
        if raw["sort"] not in SORTS and column_of(raw["sort"].removeprefix("-")) is None:
            errors["sort"] = [
                f"sort must be one of {', '.join(SORTS)}, or a column with an optional "
                f"leading - ({COLUMN_WORDS})."
            ]
        values["sort"] = raw["sort"]
    if errors:
        raise BadFilter(errors)
    return JobFilter(**values)  # type: ignore[arg-type]


def apply(jobs: QuerySet[Job], where: JobFilter) -> QuerySet[Job]:
    """`jobs` narrowed and ordered as `where` says."""
    if where.state:
        jobs = jobs.filter(state__in=where.state)
    if where.user:
        jobs = jobs.filter(owner__username=where.user)
    if where.name:
        jobs = jobs.filter(name__icontains=where.name)
    if where.image:
        jobs = jobs.filter(image__name=where.image)
    if where.program:
        # A job's program is a built-in example or a path (under the code root or in its
        # snapshot): Job.script reads the same two keys.
        jobs = jobs.filter(Q(program__example=where.program) | Q(program__path=where.program))
    if where.since:
        jobs = jobs.filter(created__gte=_start_of(where.since))
    if where.until:
        jobs = jobs.filter(created__lt=_start_of(where.until + timedelta(days=1)))
    if where.project:
        jobs = jobs.filter(project=where.project)
    for tag in where.tag:
        # One EXISTS per tag: a job with all of them, without joining a row per tag.
        jobs = jobs.filter(Exists(JobTag.objects.filter(job=OuterRef("pk"), label=tag)))
    return _ordered(jobs, where.sort)


def sorted_column(sort: str) -> Column | None:
    """The run table's column a sort order is by, if it is by one."""
    return None if sort in SORTS else column_of(sort.removeprefix("-"))


def _start_of(day: date) -> datetime:
    """Midnight of `day` in the console's zone (UTC unless TIME_ZONE says otherwise)."""
    return datetime.combine(day, time.min, tzinfo=timezone.get_current_timezone())


def _ordered(jobs: QuerySet[Job], sort: str) -> QuerySet[Job]:
    column = sorted_column(sort)
    if column is not None:
        jobs = jobs.annotate(sort_value=_value_of(column))
        if sort.startswith("-"):
            return jobs.order_by(F("sort_value").desc(nulls_last=True), "-id")
        return jobs.order_by(F("sort_value").asc(nulls_last=True), "id")
    if sort.endswith("submitted"):
        direction = "-" if sort.startswith("-") else ""
        return jobs.order_by(f"{direction}created", f"{direction}id")
    # How long it ran, as durations.run_seconds counts it: to its end, or to now while it runs.
    ran = ExpressionWrapper(
        Coalesce(F("finished"), Value(timezone.now())) - F("started"),
        output_field=DurationField(),
    )
    jobs = jobs.annotate(ran=ran)
    if sort.startswith("-"):
        return jobs.order_by(F("ran").desc(nulls_last=True), "-id")
    return jobs.order_by(F("ran").asc(nulls_last=True), "id")


def _value_of(column: Column) -> Any:
    """The expression a job's value in `column` is read with, one row per job."""
    if column.kind == "metric":
        field = "final" if column.part == "final" else metric_summaries.best_field(column.key)
        summary = MetricSummary.objects.filter(job=OuterRef("pk"), name=column.key)
        return Subquery(summary.values(field)[:1])
    if column.kind == "config":
        return KeyTransform(column.key, "config")
    if column.kind == "tags":
        return Subquery(
            JobTag.objects.filter(job=OuterRef("pk")).order_by("label").values("label")[:1]
        )
    # No project sorts with the jobs that have none: last, not first.
    return Case(When(project="", then=Value(None)), default=F("project"))
