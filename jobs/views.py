"""Browser pages: job list, New job form, job page, nodes, quotas, storage. Thin views over the
services layer."""

import functools
import secrets
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeoutError

import redis
from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.contrib.auth.models import User
from django.core.exceptions import ImproperlyConfigured
from django.db import DatabaseError, connections
from django.db.models import Prefetch
from django.http import HttpRequest, HttpResponse, JsonResponse, QueryDict
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST
from redis import RedisError
from redis import TimeoutError as RedisTimeoutError
from redis.backoff import NoBackoff
from redis.retry import Retry

from jobs.access import get_job_for, staff_required, visible_jobs
from jobs.api import catalog_for
from jobs.forms import NewJobForm, RetentionForm
from jobs.healthrules import describe_kinds, parse_stored_rules
from jobs.models import FrameworkImage, Job, Node, Replica
from jobs.services import metric_summaries, rerun, retention, run_labels, storage, totals
from jobs.services.batching import batch_note, mode_note
from jobs.services.lifecycle import outcomes, time_limits, transitions
from jobs.services.submission import ValidationFailed, check_job_request, submit_job
from jobs.services.views import (
    cluster,
    comparison,
    efficiency,
    failure,
    group_shares,
    job_pages,
    job_search,
    presenters,
    queue_listing,
    run_table,
    slurm_nodes,
)
from jobs.services.views.durations import format_duration
from jobs.time_limit_text import in_words
from jobs.tokens import user_for_token
from workers import contract

# The list page shows this many jobs a page; "Older" / "Newer" (a cursor) read the others.
LIST_PAGE = 50


@login_required
def job_list(request: HttpRequest) -> HttpResponse:
    """Every job the user may see, filtered and sorted by the query string (the API's
    parameters: jobs.services.views.job_search), a page at a time (`cursor`,
    jobs.services.views.job_pages), waiting jobs with their place and reason; the columns the
    user chose (jobs.services.views.run_table). Opened without a sort or columns, it takes
    those of the user's last used view."""
    assert isinstance(request.user, User)
    # What the page shows: the query string, or with the last used look where it gives none
    # (the URL stays as asked: no redirect, so that "/" is always the list).
    query = request.GET.copy()
    last = run_table.last_used(request.user)
    if not any(name in query for name in run_table.LOOK_PARAMETERS):
        for name, values in run_table.looks_of(last.query if last else "").items():
            query.setlist(name, values)
    try:
        where = job_search.parse(query, request.user)
    except job_search.BadFilter as exc:
        where, problems = job_search.JobFilter(), exc.errors
    else:
        problems = {}
    try:
        columns = run_table.parse_columns(query.getlist("columns"))
    except run_table.BadColumns as exc:
        columns, problems = [], {**problems, "columns": [str(exc)]}
    listed = visible_jobs(request.user)
    jobs = job_search.apply(listed, where)
    page = job_pages.Page([], None, None)
    count, count_capped = 0, False
    if not problems:
        run_table.remember(request.user, last, where.sort, columns)
        try:
            page = job_pages.read_page(
                # Replicas by id: their model's order ("job", then the job's own order) joins
                # the jobs table, and PostgreSQL read it whole at 100,000 jobs (issue 24).
                jobs.prefetch_related(
                    Prefetch("replicas", Replica.objects.order_by("id")), "roles", "tags"
                ),
                where.sort,
                LIST_PAGE,
                query.get("cursor", "").strip(),
            )
        except job_pages.BadCursor as exc:
            problems = {"cursor": [str(exc)]}
        else:
            count, count_capped = job_pages.capped_count(jobs)
    positions = presenters.queue_positions(page.jobs)
    cells = run_table.cells(page.jobs, columns)
    rows = [
        (
            job,
            presenters.listed_queue_position(job, positions),
            _first_line(job.reason),
            cells[job.pk],
            run_labels.tags_of(job),
        )
        for job in page.jobs
    ]
    later, earlier = PAGE_LINKS.get(where.sort, ("Next", "Previous"))
    sorted_by = where.sort.removeprefix("-")
    context = {
        "rows": rows,
        "where": where,
        "asked": {name: query.get(name, "") for name in job_search.PARAMETERS},
        "problems": problems,
        "states": Job.State.values,
        "sorts": SORT_LABELS,
        "column_sort": _column_sort_label(where.sort),
        "images": FrameworkImage.objects.order_by("name").values_list("name", flat=True),
        "count": count,
        "count_capped": count_capped,
        "next_page": _page_link(query, page.next),
        "previous_page": _page_link(query, page.previous),
        "next_label": later,
        "previous_label": earlier,
        "columns": [
            (
                c.word,
                run_table.label_of(c),
                _sort_link(query, c.word, where.sort),
                "descending"
                if where.sort == f"-{c.word}"
                else "ascending"
                if where.sort == c.word
                else "",
            )
            for c in columns
        ],
        "offers": run_table.offers(jobs, columns) if not problems else [],
        "projects": run_table.projects(listed),
        "grouped": sorted_by == "project",
        "saved_views": run_table.saved_views(request.user),
        "view_query": run_table.view_query(query),
    }
    return render(request, "jobs/job_list.html", context, status=400 if problems else 200)


def _column_sort_label(sort: str) -> str:
    """How the Sort menu names a column's order ("" when the list is not sorted by one)."""
    column = job_search.sorted_column(sort)
    if column is None:
        return ""
    return (
        f"{run_table.label_of(column)}, {'high to low' if sort.startswith('-') else 'low to high'}"
    )


def _sort_link(asked: QueryDict, word: str, sort: str) -> str:
    """The list sorted by a column: best first for a metric, else A to Z; again reverses."""
    query = asked.copy()
    query.pop("cursor", None)
    if sort == word:
        query["sort"] = f"-{word}"
    elif sort == f"-{word}":
        query["sort"] = word
    else:
        column = job_search.column_of(word)
        best_first = (
            column is not None
            and column.kind == "metric"
            and not metric_summaries.lower_is_better(column.key)
        )
        query["sort"] = f"-{word}" if best_first else word
    return f"?{query.urlencode()}"


def _page_link(asked: QueryDict, cursor: str | None) -> str:
    """The list's URL with the same filter, at `cursor`; "" for no such page."""
    if cursor is None:
        return ""
    query = asked.copy()
    query["cursor"] = cursor
    return f"?{query.urlencode()}"


def _first_line(reason: str) -> str:
    """What the list shows of a reason: its first line (the job page has the rest)."""
    return reason.splitlines()[0] if reason else ""


SORT_LABELS = {
    "-submitted": "newest first",
    "submitted": "oldest first",
    "-duration": "longest first",
    "duration": "shortest first",
}
# What the links to the page after and the page before say, in each order.
PAGE_LINKS = {
    "-submitted": ("Older", "Newer"),
    "submitted": ("Newer", "Older"),
    "-duration": ("Shorter", "Longer"),
    "duration": ("Longer", "Shorter"),
}


@login_required
def new_job(request: HttpRequest) -> HttpResponse:
    return _job_form_page(request, NewJobForm(request.POST or None, user=request.user))


@login_required
def job_edit_again(request: HttpRequest, job_id: int) -> HttpResponse:
    """ "Edit and run again": the New job form, filled from the job (rerun.request_of)."""
    job = get_job_for(request.user, job_id)
    form = NewJobForm(request.POST or None, user=request.user)
    if request.method != "POST":
        form.fill_from(rerun.request_of(job, request.user), rerun.has_image_health_rules(job))
    return _job_form_page(request, form, again=job)


@login_required
@require_POST
def job_run_again(request: HttpRequest, job_id: int) -> HttpResponse:
    """ "Run again": the same request once more, as a new job; a refusal (the quota, code
    that is no longer yours) opens the filled form with the reasons instead."""
    job = get_job_for(request.user, job_id)
    user: User = request.user  # type: ignore[assignment]  # login_required
    try:
        again = submit_job(user, check_job_request(rerun.request_of(job, user), owner=user))
    except ValidationFailed as exc:
        for field, errors in exc.errors.items():
            messages.error(request, f"{field}: {' '.join(errors)}")
        return redirect("job_edit_again", job_id=job.pk)
    return redirect("job_detail", job_id=again.pk)


def _job_form_page(
    request: HttpRequest, form: NewJobForm, again: Job | None = None
) -> HttpResponse:
    over: dict[str, dict[str, object]] = {}
    if request.method == "POST" and form.is_valid():
        try:
            user: User = request.user  # type: ignore[assignment]  # login_required
            job = submit_job(user, check_job_request(form.as_request(), owner=user))
        except ValidationFailed as exc:
            form.add_service_errors(exc.errors)
            over = exc.detail.get("quota", {})
        else:
            return redirect("job_detail", job_id=job.pk)
    catalog = catalog_for(request.user)  # type: ignore[arg-type]
    formulas = [
        {"label": totals.FORMULA_NAMES[r], **detail}
        for r, detail in over.items()
        if r in totals.FORMULA_NAMES
    ]
    return render(
        request,
        "jobs/new_job.html",
        {
            "form": form,
            "catalog": catalog,
            "over": formulas,
            "snapshot_scripts": form.snapshot_scripts(),
            "health_rule_kinds": describe_kinds(),
            "again": again,
        },
    )


@login_required
def job_detail(request: HttpRequest, job_id: int) -> HttpResponse:
    job = get_job_for(request.user, job_id)
    workers = sum(r.instances for r in job.roles.all() if r.role == "worker")
    # What its ended instances used of their packages (seff's figures), once measured.
    usage = efficiency.of_job(job)
    return render(
        request,
        "jobs/job_detail.html",
        {
            "job": job,
            "failure": failure.summary(job),
            "state": presenters.job_state_payload(job),
            "usage": usage,
            "usage_rows": presenters.usage_rows(usage) if usage is not None else [],
            "usage_unmeasured": presenters.why_unmeasured(job) if usage is None else None,
            "roles": job.roles.all(),
            "workers": workers,
            "batch_note": batch_note(job.kvstore, workers, job.per_worker_batch),
            "mode_note": mode_note(job.kvstore),
            "env": job.env_seen_by(request.user),
            # Rules refused by checks made since the job was stored are not shown: they are off.
            "health_rules": parse_stored_rules(job.health_rules)[0],
            # The image's defaults its trainers got: those its own variables did not replace.
            "image_env": {k: v for k, v in job.image_env.items() if k not in job.env},
            "retention_days": retention.retention_days(job),
            "retention_expires": retention.expires_at(job),
            "default_retention_days": settings.TRAINYARD_LOG_RETENTION_DAYS,
            "time_limit": in_words(job.time_limit) if job.time_limit else "",
            "time_limit_ends": time_limits.attempt_ends(
                job, job.attempts.filter(number=job.attempt).first()
            ),
        },
    )


@login_required
def compare_page(request: HttpRequest) -> HttpResponse:
    """2 to 8 jobs side by side (`?jobs=12,15,19`): the configuration here, with the rows that
    differ marked; the curves and figures come from GET /api/v1/compare (static/trainyard/
    compare.js)."""
    raw = request.GET.get("jobs", "")
    try:
        jobs = comparison.jobs_for(request.user, comparison.parse_ids(raw))
    except comparison.CompareError as exc:
        refused = {"problems": exc.errors["jobs"], "jobs": [], "rows": []}
        return render(request, "jobs/compare.html", refused, status=exc.status)
    rows = comparison.configuration_rows(jobs, request.user)
    context: dict[str, object] = {
        "problems": [],
        "jobs": jobs,
        "ids": ",".join(str(job.pk) for job in jobs),
        "rows": rows,
        "differing": len(comparison.differing(rows)),
    }
    return render(request, "jobs/compare.html", context)


@login_required
@require_POST
def job_cancel(request: HttpRequest, job_id: int) -> HttpResponse:
    job = get_job_for(request.user, job_id)
    try:
        outcomes.cancel(job.pk, request.user)  # type: ignore[arg-type]
    except transitions.InvalidTransition as exc:
        messages.error(request, str(exc))
    return redirect("job_detail", job_id=job.pk)


@login_required
@require_POST
def job_retention(request: HttpRequest, job_id: int) -> HttpResponse:
    job = get_job_for(request.user, job_id)
    form = RetentionForm(request.POST)
    if form.is_valid():
        retention.set_retention(
            job.pk, keep=form.cleaned_data["keep"], days=form.cleaned_data["days"]
        )
    else:
        for field, errors in form.errors.items():
            messages.error(request, f"{field}: {' '.join(str(e) for e in errors)}")
    return redirect("job_detail", job_id=job.pk)


# Each part of /healthz gets this long to answer, so that the whole check answers within a
# second even while Redis or the database hangs: load balancers and `make run` poll it.
HEALTH_CHECK_SECONDS = 0.5


def healthz(request: HttpRequest) -> HttpResponse:
    """Liveness for load balancers, operators and `make run`: database, Redis, live nodes.

    Everyone gets {"status": "up"} (200) or {"status": "down"} (503). Staff (a session or an
    API token of a staff user) and holders of TRAINYARD_HEALTHZ_TOKEN also get the details:
    503 names the failing part, e.g. {"redis": false, "redis_error": "no answer within 0.5 s"}.
    Anonymous callers learn no more, so that error texts (addresses, driver messages) and the
    size of the cluster stay inside.
    """
    # The database is asked in a worker thread (a query cannot be interrupted), Redis meanwhile
    # in this one through a client with short timeouts.
    deadline = time.monotonic() + HEALTH_CHECK_SECONDS
    pending_nodes = _ask_database_for_live_nodes()
    redis_error = _redis_problem()
    nodes_live, database_error = _database_answer(pending_nodes, deadline)
    healthy = redis_error is None and database_error is None
    body: dict[str, object] = {"status": "up" if healthy else "down"}
    if _may_see_health_details(request, database_answers=database_error is None):
        body.update(redis=redis_error is None, database=database_error is None)
        body["nodes_live"] = nodes_live
        if redis_error is not None:
            body["redis_error"] = redis_error
        if database_error is not None:
            body["database_error"] = database_error
    return JsonResponse(body, status=200 if healthy else 503)


def _may_see_health_details(request: HttpRequest, database_answers: bool) -> bool:
    """The health token, or a staff user's session or API token. Users are looked up in the
    database, so while it does not answer only the health token shows details: a lookup could
    hang, and /healthz must answer."""
    header = request.headers.get("Authorization", "")
    key = header[6:].strip() if header.startswith("Token ") else ""
    health_token = settings.TRAINYARD_HEALTHZ_TOKEN
    if key and health_token and secrets.compare_digest(key.encode(), health_token.encode()):
        return True
    if not database_answers:
        return False
    try:
        if key:
            user = user_for_token(key)
            return user is not None and user.is_staff
        return bool(request.user.is_authenticated and request.user.is_staff)
    except DatabaseError:
        return False


def _redis_problem() -> str | None:
    """None if Redis answers PING in time, else what went wrong."""
    try:
        _health_redis(settings.REDIS_URL).ping()
    except RedisTimeoutError:
        return f"no answer within {HEALTH_CHECK_SECONDS:g} s"
    except RedisError as exc:
        return str(exc) or type(exc).__name__
    except ImproperlyConfigured as exc:
        return str(exc)
    return None


@functools.cache
def _health_redis(url: str) -> redis.Redis:
    """A client only for /healthz: short timeouts and no retries (redis-py 8 retries ten times
    with back-off by default), unlike the console's shared one, whose commands may block."""
    if not url:
        raise ImproperlyConfigured("REDIS_URL is not set")
    return redis.Redis.from_url(
        url,
        socket_connect_timeout=HEALTH_CHECK_SECONDS,
        socket_timeout=HEALTH_CHECK_SECONDS,
        retry=Retry(NoBackoff(), 0),
    )


# One database check at a time: while a hung query holds the worker, later checks answer at
# once instead of piling up threads.
_database_checker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="healthz-db")
_database_check_lock = threading.Lock()
_database_check: Future[int] | None = None


def _ask_database_for_live_nodes() -> Future[int] | None:
    """The running check (a fresh one unless the last has not finished); None if that one is
    still stuck."""
    global _database_check
    with _database_check_lock:
        if _database_check is not None and not _database_check.done():
            return None
        _database_check = _database_checker.submit(_count_live_nodes)
        return _database_check


def _count_live_nodes() -> int:
    try:
        return len(_live_node_names())
    finally:
        # No request ends in this thread, so nothing else would close its connection.
        connections.close_all()


def _database_answer(pending: Future[int] | None, deadline: float) -> tuple[int, str | None]:
    """(nodes_live, None) if the database answered before the deadline, else (0, the problem)."""
    if pending is None:
        return 0, "the previous check has not finished"
    try:
        return pending.result(timeout=max(0.0, deadline - time.monotonic())), None
    except FutureTimeoutError:
        return 0, f"no answer within {HEALTH_CHECK_SECONDS:g} s"
    except Exception as exc:  # whatever the driver raises: the answer is "not healthy"
        return 0, f"{type(exc).__name__}: {exc}"


def _live_node_names() -> list[str]:
    return [n.name for n in Node.objects.all() if not n.is_lost()]


@login_required
def node_list(request: HttpRequest) -> HttpResponse:
    rows = cluster.node_rows(request.user)
    return render(
        request,
        "jobs/node_list.html",
        {
            "rows": rows,
            "slurm_pools": slurm_nodes.pool_rows(request.user),
            "stale_seconds": settings.TRAINYARD_NODE_STALE_SECONDS,
            "lost_seconds": settings.TRAINYARD_NODE_LOST_SECONDS,
            "min_protocol": contract.MIN_AGENT_PROTOCOL,
            "allow_unisolated": settings.TRAINYARD_ALLOW_UNISOLATED_NODES,
            "any_unisolated": any(not row.node.isolated for row in rows),
            "any_unlimited": any(not row.node.limits_enforced for row in rows),
        },
    )


@login_required
def queue_page(request: HttpRequest) -> HttpResponse:
    """Every waiting job in the order the scheduler takes them; others' jobs without names."""
    return render(
        request,
        "jobs/queue.html",
        {
            "entries": queue_listing.entries(request.user),
            "slurm_entries": queue_listing.slurm_entries(request.user),
        },
    )


@login_required
def quota_list(request: HttpRequest) -> HttpResponse:
    rows = cluster.quota_rows(request.user)  # type: ignore[arg-type]
    shares = group_shares.rows() if request.user.is_staff else []
    # Admins see who held much and used little (seff's figures) over the last day.
    wasteful_jobs, wasteful_users = (
        efficiency.least_efficient() if request.user.is_staff else ([], [])
    )
    return render(
        request,
        "jobs/quota_list.html",
        {
            "rows": rows,
            "shares": shares,
            "wasteful_jobs": wasteful_jobs,
            "wasteful_users": wasteful_users,
        },
    )


# The Storage page lists this many jobs, the largest first (`manage.py storage --jobs N` lists
# more), and this many of the items the next prune removes (`manage.py prune --dry-run`: all).
STORAGE_JOBS_SHOWN = 100
STORAGE_PRUNE_ITEMS_SHOWN = 20


@staff_required
def storage_page(request: HttpRequest) -> HttpResponse:
    """Storage per user and per job, when each job's log and metrics go, and what a prune now
    would remove: `manage.py storage` and `manage.py prune --dry-run` on one page."""
    jobs = storage.per_job(include_pruned=True)
    plan = retention.plan()
    seconds = settings.TRAINYARD_RETENTION_SECONDS
    return render(
        request,
        "jobs/storage.html",
        {
            "users": storage.per_user(jobs),
            "jobs": jobs[:STORAGE_JOBS_SHOWN],
            "jobs_not_shown": len(jobs[STORAGE_JOBS_SHOWN:]),
            "plan": plan,
            "due_jobs": {item.job_id for item in plan.logs},
            "expired_logs": plan.logs[:STORAGE_PRUNE_ITEMS_SHOWN],
            "loose_snapshots": plan.snapshots[:STORAGE_PRUNE_ITEMS_SHOWN],
            "prune_items_not_shown": len(plan.logs[STORAGE_PRUNE_ITEMS_SHOWN:])
            + len(plan.snapshots[STORAGE_PRUNE_ITEMS_SHOWN:]),
            "default_days": settings.TRAINYARD_LOG_RETENTION_DAYS,
            "prune_every": format_duration(seconds) if seconds else None,
        },
    )
