"""The job list as a run table (issue 49): columns a user chooses (config keys, metrics' final
and best values, tags, project), sorting by any of them (jobs.services.views.job_search), and
views a user keeps (models.RunTableView): named ones, and the last used one.

A page reads its cells in one query beside the jobs' own (the page's metric summaries); what
a column chooser offers is read from the most recent OFFER_FROM jobs of the list, so it costs
the same whatever the history holds.
"""

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl, urlencode

from django.contrib.auth.models import User
from django.db import transaction
from django.db.models import Count, QuerySet

from jobs import text
from jobs.models import Job, MetricSummary, RunTableView
from jobs.services import metric_summaries, run_labels
from jobs.services.views import comparison
from jobs.services.views.job_search import METRIC_PARTS, Column, column_of

MAX_COLUMNS = 12
OFFER_FROM = 1000  # recent jobs whose keys and metrics a column chooser offers
MAX_VIEWS = 50  # named views per user
MAX_QUERY = 2000  # characters of a view's query string (RunTableView.query)
MAX_PROJECTS_SHOWN = 30
# The query-string parameters a view is: the list's filters, its sort and its columns.
VIEW_PARAMETERS = (
    "state", "user", "name", "image", "program", "since", "until", "project", "tag", "sort",
    "columns",
)  # fmt: skip
# What the last used view keeps: how the list looks, not what it is narrowed to.
LOOK_PARAMETERS = ("sort", "columns")


class BadColumns(Exception):
    """Columns the table cannot show: the message says which."""


@dataclass(frozen=True)
class Offer:
    """A column a chooser offers, and whether it is shown now."""

    word: str
    label: str
    chosen: bool


def parse_columns(values: Sequence[str]) -> list[Column]:
    """The columns `columns=` asks for (repeated, or comma-separated), in order, once each."""
    words = list(dict.fromkeys(w.strip() for v in values for w in v.split(",") if w.strip()))
    bad = [w for w in words if column_of(w) is None]
    if bad:
        shown = ", ".join(text.shown_key(w)[:80] for w in bad[:3])
        raise BadColumns(
            f"Unknown column {shown}: give metric:NAME:final, metric:NAME:best, config:KEY, "
            "tags or project."
        )
    if len(words) > MAX_COLUMNS:
        raise BadColumns(f"At most {MAX_COLUMNS} columns; {len(words)} asked.")
    return [c for c in map(column_of, words) if c is not None]


def label_of(column: Column) -> str:
    if column.kind == "metric":
        return f"{column.key} ({column.part})"
    if column.kind == "config":
        return column.key if column.key.startswith("$") else f"--{column.key}"
    return column.kind


def offers(jobs: QuerySet[Job], chosen: Iterable[Column]) -> list[Offer]:
    """The columns worth choosing among `jobs`: tags and project, the config keys and metric
    names of its most recent OFFER_FROM jobs, and whatever is chosen already."""
    recent = jobs.order_by("-created", "-id").values("pk")[:OFFER_FROM]
    keys: set[str] = set()
    for config in jobs.order_by("-created", "-id").values_list("config", flat=True)[:OFFER_FROM]:
        keys.update(config or {})
    # The training's curves, not the agent's samples of the machines (a URL may still ask
    # for those).
    names = sorted(
        name
        for name in MetricSummary.objects.filter(job__in=recent)
        .values_list("name", flat=True)
        .distinct()
        if comparison.compared(name)
    )
    columns = [Column("project"), Column("tags")]
    columns += [Column("config", k) for k in sorted(keys, key=lambda k: (k.startswith("$"), k))]
    columns += [Column("metric", n, part) for n in names for part in METRIC_PARTS]
    chosen_words = {c.word for c in chosen}
    columns += [c for c in chosen if c not in columns]
    return [
        Offer(c.word, label_of(c), c.word in chosen_words)
        for c in columns
        if column_of(c.word) is not None
    ]


def cells(jobs: Sequence[Job], columns: Sequence[Column]) -> dict[int, list[str]]:
    """Each job's cells in `columns`, as text, by job id; the page's metric summaries are read
    in one query."""
    names = {c.key for c in columns if c.kind == "metric"}
    summaries: dict[tuple[int, str], MetricSummary] = {}
    if names and jobs:
        for s in MetricSummary.objects.filter(job__in=[j.pk for j in jobs], name__in=names):
            summaries[(s.job_id, s.name)] = s
    return {job.pk: [_cell(job, c, summaries) for c in columns] for job in jobs}


def _cell(job: Job, column: Column, summaries: Mapping[tuple[int, str], MetricSummary]) -> str:
    if column.kind == "metric":
        summary = summaries.get((job.pk, column.key))
        if summary is None:
            return ""
        if column.part == "final":
            return _number(summary.final)
        return _number(getattr(summary, metric_summaries.best_field(column.key)))
    if column.kind == "config":
        value = (job.config or {}).get(column.key)
        if value is None:
            return ""
        if value is True:
            return "yes"
        return _number(value) if isinstance(value, float) else str(value)
    if column.kind == "tags":
        return " ".join(run_labels.tags_of(job))
    return job.project


def _number(value: float) -> str:
    return f"{value:.4g}"


def projects(jobs: QuerySet[Job]) -> list[tuple[str, int]]:
    """The projects among `jobs` with how many runs each has, largest first; "" for none."""
    rows = (
        jobs.order_by()
        .values_list("project")
        .annotate(runs=Count("id"))
        .order_by("-runs", "project")[:MAX_PROJECTS_SHOWN]
    )
    return [(project, runs) for project, runs in rows]


# Saved views -------------------------------------------------------------------------------


class BadView(Exception):
    """A view that cannot be saved: the message says why."""


def view_query(query: Mapping[str, Any]) -> str:
    """The part of a query string that a view keeps (its filters, sort and columns)."""
    getlist = getattr(query, "getlist", None)
    pairs: list[tuple[str, str]] = []
    for name in VIEW_PARAMETERS:
        values = getlist(name) if getlist else [query[name]] if name in query else []
        pairs.extend((name, str(v)) for v in values)
    return urlencode(pairs)


def looks_of(query: str) -> dict[str, list[str]]:
    """The sort and columns of a stored view's query string."""
    found: dict[str, list[str]] = {}
    for name, value in parse_qsl(query, keep_blank_values=True):
        if name in LOOK_PARAMETERS:
            found.setdefault(name, []).append(value)
    return found


def last_used(user: User) -> RunTableView | None:
    return RunTableView.objects.filter(owner=user, name="").first()


def remember(user: User, kept: RunTableView | None, sort: str, columns: Sequence[Column]) -> None:
    """Keep how the list looks now (its sort and columns, as parsed: a query string repeating
    a column a thousand times keeps it once) as the user's last used view; `kept` is that
    view as last_used read it for this page (None: none yet)."""
    look = urlencode([("sort", sort), ("columns", ",".join(c.word for c in columns))])
    if kept is None:
        RunTableView.objects.get_or_create(owner=user, name="", defaults={"query": look})
    elif kept.query != look:
        kept.query = look
        kept.save(update_fields=["query", "updated"])


def save_view(user: User, name: str, query: str) -> RunTableView:
    """Keep `query` under `name` (replacing a view of that name), or BadView."""
    name = name.strip()
    if not name:
        raise BadView("Give the view a name.")
    if len(name) > RunTableView._meta.get_field("name").max_length:  # type: ignore[operator]
        raise BadView("A view's name is at most 60 characters.")
    if problem := text.name_problem(name):
        raise BadView(problem)
    kept = view_query(_multi(query))
    if len(kept) > MAX_QUERY:
        raise BadView(f"A view keeps at most {MAX_QUERY} characters of filters and columns.")
    with transaction.atomic():
        views = RunTableView.objects.filter(owner=user).exclude(name="")
        if not views.filter(name=name).exists() and views.count() >= MAX_VIEWS:
            raise BadView(f"At most {MAX_VIEWS} views: delete one first.")
        view, _ = RunTableView.objects.update_or_create(
            owner=user, name=name, defaults={"query": kept}
        )
    return view


def saved_views(user: User) -> list[RunTableView]:
    return list(RunTableView.objects.filter(owner=user).exclude(name="").order_by("name"))


def delete_view(user: User, name: str) -> None:
    RunTableView.objects.filter(owner=user, name=name).exclude(name="").delete()


class _Multi(dict[str, list[str]]):
    """A query string parsed without Django's QueryDict (which needs a request's settings)."""

    def getlist(self, name: str) -> list[str]:
        return self.get(name, [])


def _multi(query: str) -> _Multi:
    """A query string's values by name, as a QueryDict would give them."""
    found = _Multi()
    for name, value in parse_qsl(query, keep_blank_values=True):
        found.setdefault(name, []).append(value)
    return found
