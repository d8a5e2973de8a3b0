"""Finding jobs: the filters and sort orders that the job list page and `GET /api/v1/jobs`
share, read from a query string, so that both take the same words and refuse the same
mistakes (each refusal names its parameter).

Every filter is a condition on the job's own row (or its owner's username, one join), so a
page of the list stays the same few queries however many jobs match, and the sort orders end
in the primary key: a page is stable and the next one starts where it ended.
"""

from collections.abc import Mapping
from dataclasses import dataclass, fields
from datetime import date, datetime, time, timedelta

from django.contrib.auth.models import AnonymousUser, User
from django.db.models import DurationField, ExpressionWrapper, F, Q, QuerySet, Value
from django.db.models.functions import Coalesce
from django.utils import timezone

from jobs.models import Job

# Sort orders: submitted (newest first by default) or how long the job ran. A leading "-"
# reverses. Jobs that never started sort after the others in both duration orders.
SORTS = ("-submitted", "submitted", "-duration", "duration")
DEFAULT_SORT = "-submitted"
MAX_SEARCH = 200  # characters of a name search: a job's name is at most 200


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
    if raw["sort"]:
        if raw["sort"] not in SORTS:
            errors["sort"] = [f"sort must be one of {', '.join(SORTS)}."]
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
    return _ordered(jobs, where.sort)


def _start_of(day: date) -> datetime:
    """Midnight of `day` in the console's zone (UTC unless TIME_ZONE says otherwise)."""
    return datetime.combine(day, time.min, tzinfo=timezone.get_current_timezone())


def _ordered(jobs: QuerySet[Job], sort: str) -> QuerySet[Job]:
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
