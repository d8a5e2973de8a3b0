"""HTTP API v1 on django-ninja: JSON over session or token auth. Thin operations over the
services layer; the shapes live in jobs/schemas.py, and the OpenAPI document at
/api/v1/openapi.json (a readable reference at /api/v1/docs) is generated from them."""

import dataclasses
from collections.abc import Callable
from functools import wraps
from typing import Any

from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.contrib.auth.models import AnonymousUser, User
from django.core.exceptions import RequestDataTooBig
from django.db.models import Prefetch
from django.http import Http404, HttpRequest, HttpResponse, StreamingHttpResponse
from django.http.response import HttpResponseBase
from ninja import File, Form, NinjaAPI, Query, Status
from ninja.errors import AuthenticationError, HttpError
from ninja.errors import ValidationError as NinjaValidationError
from ninja.files import UploadedFile
from ninja.parser import Parser
from ninja.security import APIKeyCookie, APIKeyHeader

from jobs import json_limits, logstream, text
from jobs.access import get_job_for, visible_jobs
from jobs.models import (
    FrameworkImage,
    Job,
    JobRole,
    KVStoreMode,
    Node,
    Package,
    PriorityClass,
    Replica,
    SlurmPool,
)
from jobs.money import currency
from jobs.schemas import (
    BaselineIn,
    CatalogOut,
    CompareOut,
    DrainIn,
    ErrorsOut,
    JobIn,
    JobListOut,
    JobOut,
    JobRequestOut,
    LabelsIn,
    LogCountsOut,
    LogPageOut,
    MeOut,
    MetricPageOut,
    NodeDrainOut,
    NodeListOut,
    NodeStateOut,
    QueueOut,
    RetentionIn,
    SnapshotDetailOut,
    SnapshotListOut,
    SnapshotUploadOut,
    TrainingReportOut,
    field_errors,
)
from jobs.services import (
    baselines,
    code_choices,
    metric_export,
    metric_summaries,
    nodes,
    quota,
    rerun,
    retention,
    run_labels,
    snapshots,
)
from jobs.services.lifecycle import outcomes, time_limits, transitions
from jobs.services.slurm import slurm_choices
from jobs.services.submission import ValidationFailed, check_job_request, submit_job
from jobs.services.views import (
    cluster,
    comparison,
    counts,
    job_pages,
    job_search,
    presenters,
    queue_listing,
    training_report,
)
from jobs.tokens import user_for_token
from jobs.upload_limit import ArchiveTooBig
from workers.snapshot import SnapshotError, is_sha256

MAX_LOG_PAGE = 10_000
DEFAULT_LOG_PAGE = 1_000
# The job list's page: by default, and at most. A page of 200 jobs took ~100 ms of CPU to
# serialise; a cursor reads the next page at the same cost however deep it is.
JOB_PAGE = 50
MAX_JOB_PAGE = 200


class ApiError(Exception):
    """A refusal, answered as {"errors": {field: [message]}, **extra} with `status`."""

    def __init__(self, status: int, field: str, message: str, **extra: Any) -> None:
        super().__init__(message)
        self.status = status
        self.errors = {field: [message]}
        self.extra = extra


# --- auth ---------------------------------------------------------------------------------------


class TokenAuth(APIKeyHeader):
    """`Authorization: Token KEY` (jobs.tokens). A token that is given but wrong is refused
    outright, even beside a logged-in session."""

    param_name = "Authorization"

    def authenticate(self, request: HttpRequest, key: str | None) -> User | None:
        if not key or not key.startswith("Token "):
            return None
        user = user_for_token(key[6:].strip())
        if user is None:
            raise ApiError(401, "auth", "Invalid or revoked token.")
        request.user = user
        return user


class SessionAuth(APIKeyCookie):
    """The browser's login session; a request that changes something also needs the CSRF
    token (X-CSRFToken), checked by ninja. Anonymous requests are a 401, not a CSRF 403."""

    param_name = settings.SESSION_COOKIE_NAME

    def __init__(self) -> None:
        super().__init__(csrf=True)

    def __call__(self, request: HttpRequest) -> User | None:
        if not request.user.is_authenticated:
            return None
        try:
            self._get_key(request)  # the CSRF check
        except HttpError:
            raise ApiError(403, "auth", "CSRF check failed; send the X-CSRFToken header.") from None
        return request.user

    def authenticate(self, request: HttpRequest, key: str | None) -> User | None:
        return None  # unused: __call__ decides


class GuardedParser(Parser):
    """JSON bodies, refused (400, with a reason) when they are not JSON or nest too deeply.
    ninja wraps what this raises in an HttpError; `_http_error` unwraps it."""

    def parse_body(self, request: HttpRequest) -> Any:
        try:
            data = json_limits.loads(request.body)
        except json_limits.TooDeep:
            raise ValidationFailed(
                {
                    "request": [
                        "The body is nested too deeply "
                        f"(more than {json_limits.MAX_JSON_DEPTH} levels)."
                    ]
                }
            ) from None
        except (ValueError, UnicodeDecodeError) as exc:
            raise ValidationFailed({"request": [f"The body is not valid JSON: {exc}"]}) from None
        problems = text.problems_by_field(data)
        if problems:
            raise ValidationFailed(problems)
        return data


def _docs_login(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
    """The reference pages are for users: a logged-in session (else the login page), or a
    valid API token, so that a client can fetch openapi.json as it calls the API."""
    page = login_required(view)

    @wraps(view)
    def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        header = request.headers.get("Authorization", "")
        user = user_for_token(header[6:].strip()) if header.startswith("Token ") else None
        if user is not None:
            request.user = user
            return view(request, *args, **kwargs)
        return page(request, *args, **kwargs)

    return wrapper


api = NinjaAPI(
    title="Trainyard API",
    version="1",
    description="Submit and watch distributed training jobs. Authenticate with "
    "`Authorization: Token KEY` or a logged-in session (writes then need X-CSRFToken). "
    'Every refusal is `{"errors": {field: [message]}}`, a method that a path does not take '
    "included (405, with `Allow`).",
    auth=[TokenAuth(), SessionAuth()],
    parser=GuardedParser(),
    urls_namespace="api-v1",
    docs_decorator=_docs_login,
)

ERRORS: dict[int, type[ErrorsOut]] = {code: ErrorsOut for code in (400, 401, 403, 404, 409, 413)}


def errors_response(
    request: HttpRequest, status: int, errors: dict[str, list[str]], **extra: Any
) -> HttpResponse:
    return api.create_response(request, {"errors": errors, **extra}, status=status)


@api.exception_handler(ApiError)
def _api_error(request: HttpRequest, exc: ApiError) -> HttpResponse:
    return errors_response(request, exc.status, exc.errors, **exc.extra)


@api.exception_handler(ValidationFailed)
def _validation_failed(request: HttpRequest, exc: ValidationFailed) -> HttpResponse:
    return errors_response(request, 400, exc.errors, **exc.detail)


@api.exception_handler(NinjaValidationError)
def _schema_error(request: HttpRequest, exc: NinjaValidationError) -> HttpResponse:
    """pydantic's errors, by field path, in words (jobs.schemas.MESSAGES)."""
    located = []
    for error in exc.errors:
        loc = tuple(error.get("loc", ()))
        # ("body", PARAM, ...) for a body, ("query", NAME) for a query parameter.
        located.append({**error, "loc": loc[2:] if loc[:1] == ("body",) else loc[1:]})
    return errors_response(request, 400, field_errors(located))


@api.exception_handler(HttpError)
def _http_error(request: HttpRequest, exc: HttpError) -> HttpResponse:
    if isinstance(exc.__cause__, ValidationFailed):  # from GuardedParser
        return errors_response(request, 400, exc.__cause__.errors)
    return errors_response(request, exc.status_code, {"request": [str(exc)]})


@api.exception_handler(AuthenticationError)
def _unauthenticated(request: HttpRequest, exc: AuthenticationError) -> HttpResponse:
    return errors_response(request, 401, {"auth": ["Log in or send Authorization: Token KEY."]})


@api.exception_handler(Http404)
def _not_found(request: HttpRequest, exc: Http404) -> HttpResponse:
    # The same answer for another user's job as for a missing one (jobs.access).
    return errors_response(request, 404, {"job": ["No such job."]})


@api.exception_handler(RequestDataTooBig)
def _too_big(request: HttpRequest, exc: RequestDataTooBig) -> HttpResponse:
    if isinstance(exc, ArchiveTooBig):
        return errors_response(request, 413, {"archive": [str(exc)]})
    limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
    return errors_response(
        request, 413, {"request": [f"The body is larger than {limit:,} bytes; send less."]}
    )


def _download(content_type: str, description: str) -> dict[str, Any]:
    """The OpenAPI answer of a file download (the operation returns its own HttpResponse)."""
    body = {"schema": {"type": "string", "format": "binary"}}
    return {"responses": {200: {"description": description, "content": {content_type: body}}}}


def _user(request: HttpRequest) -> User:
    """The authenticated user (the auth classes have set it)."""
    user: User | AnonymousUser = request.user
    assert isinstance(user, User)
    return user


def job_as_dict(
    job: Job, viewer: User | AnonymousUser, queue_positions: dict[int, int] | None = None
) -> dict[str, Any]:
    """A job as `viewer` sees it through the API (schemas.JobOut): its owner sees every value
    of its environment, anyone else (an admin) the secret-looking ones masked.
    `queue_positions`, from presenters.queue_positions, saves a query per job in a list."""
    roles = {
        r.role: {"package": r.package.name, "instances": r.asked}
        for r in presenters.related(job, "roles", lambda: job.roles.select_related("package"))
    }
    return {
        "id": job.pk,
        "name": job.name,
        "owner": job.owner.get_username(),
        "image": job.image.name,
        "program": {
            "script": job.script,
            "args": job.args,
            **({"snapshot": job.program["snapshot"]} if "snapshot" in job.program else {}),
        },
        "roles": roles,
        "instances": _instances(job),
        "kvstore": job.kvstore or None,
        "totals": {
            "cpu": job.cpu_total,
            "gpus": job.gpus_total,
            "memory_gb": job.memory_gb_total,
            "price_per_hour": str(job.price_per_hour),
        },
        "created": job.created.isoformat(),
        "log_complete": job.log_complete,
        "log_archived": job.log_archived,
        "log_limits": {
            "lines_per_second": job.log_lines_per_second,
            "max_mb": job.log_max_mb,
            "metric_points_per_second": job.metric_points_per_second,
        },
        "log_dropped": {"lines": job.log_dropped_lines, "metric_points": job.log_dropped_points},
        "retention": retention.summary(job),
        "baseline": job.baseline_id,
        "metrics": job.metric_definitions,
        "restart": {
            "policy": job.restart_policy,
            "max_restarts": job.max_restarts,
            "backoff_seconds": job.restart_backoff_seconds,
            "exclude_failed_node": job.exclude_failed_node,
            "args_on_resume": job.args_on_resume,
        },
        "one_instance_per_node": job.one_instance_per_node,
        "health_rules": job.health_rules,
        "time_limit": job.time_limit,
        "time_limit_ends": _time_limit_ends(job),
        "env": job.env_seen_by(viewer),
        "priority": job.priority_name,
        "priority_value": job.priority,
        "pool": job.slurm_pool.name if job.slurm_pool_id and job.slurm_pool else "",
        "run_as": (
            {"uid": job.run_uid, "gid": job.run_gid, "groups": job.run_groups}
            if job.run_uid is not None
            else None
        ),
        "data": list(job.data_folders),
        "results": job.results_folder,
        "container_image": job.container_image,
        "slurm": job.slurm_options,
        "preempted_by": [int(j) for j in job.preempted_by],
        "usage": presenters.usage(job),
        "project": job.project,
        "tags": run_labels.tags_of(job),
        "note": job.note,
        "config": job.config,
        "metric_summary": {
            s.name: {
                "final": s.final,
                "best": getattr(s, metric_summaries.best_field(s.name)),
                "minimum": s.minimum,
                "maximum": s.maximum,
                "points": s.points,
            }
            for s in presenters.related(job, "metric_summaries", job.metric_summaries.all)
        },
        **presenters.job_state_payload(job, queue_positions),
    }


def _time_limit_ends(job: Job) -> str | None:
    attempts = presenters.related(job, "attempts", job.attempts.all)
    current = next((a for a in attempts if a.number == job.attempt), None)
    ends = time_limits.attempt_ends(job, current)
    return ends.isoformat() if ends else None


def _instances(job: Job) -> dict[str, Any]:
    count = counts.instance_count(job)
    return {
        "total": count.total,
        "trainers": count.trainers,
        "platform": list(count.platform),
        "text": count.text,
    }


def quota_summary(user: User) -> dict[str, Any] | None:
    """Room left (the tightest over every quota that binds the user), and each such quota."""
    try:
        scopes = quota.scopes_for(user)
    except quota.NoQuota:
        return None
    return {
        "left": quota.effective_left(scopes),
        "scopes": [scope_as_dict(s) for s in scopes],
    }


def scope_as_dict(scope: quota.Scope) -> dict[str, Any]:
    return {
        "kind": scope.kind,
        "name": scope.name,
        "limit": scope.limit,
        "used": scope.used.as_dict(),
        "left": scope.left,
        "max_priority": scope.quota.max_priority.name if scope.quota.max_priority else None,
    }


def catalog_for(user: User) -> dict[str, Any]:
    return {
        "images": [
            {
                "name": i.name,
                "framework": i.framework,
                "description": i.description,
                "roles": list(i.roles),
                "kvstore_modes": list(KVStoreMode.values) if i.framework == "kvstore" else [],
                "restart": {
                    "policy": i.restart_policy,
                    "max_restarts": i.max_restarts,
                    "backoff_seconds": i.restart_backoff_seconds,
                },
                "health_rules": i.health_rules,
                "container_image": i.container_image,
                "user_image_prefixes": i.user_image_prefixes,
                "default_env": i.default_env,
            }
            for i in FrameworkImage.objects.filter(enabled=True)
        ],
        "packages": [
            {
                "name": p.name,
                "cpu": p.cpu,
                "gpus": p.gpus,
                "gpu_model": p.gpu_model,
                "memory_gb": p.memory_gb,
                "price_per_hour": str(p.price_per_hour),
                "roles": p.roles,
                "processes": p.processes_per_instance,
                "summary": p.summary,
            }
            for p in Package.objects.filter(enabled=True)
        ],
        "pools": [
            {
                "name": pool.name,
                "partition": pool.partition,
                "images": sorted(i.name for i in pool.images.all() if i.enabled),
                "packages": sorted(p.name for p in pool.packages.all() if p.enabled),
                "choices": slurm_choices.allowed(pool),
            }
            for pool in SlurmPool.objects.filter(enabled=True).prefetch_related(
                "images", "packages"
            )
        ],
        "priority_classes": [
            {
                "name": c.name,
                "value": c.value,
                "may_preempt": c.may_preempt,
                "may_be_preempted": c.may_be_preempted,
                "description": c.description,
                "default": c.name == PriorityClass.DEFAULT_NAME,
            }
            for c in PriorityClass.objects.all()
        ],
        "examples": [
            {
                "name": e.name,
                "framework": e.framework,
                "description": e.description,
                "arguments": [dataclasses.asdict(a) for a in e.arguments],
            }
            for e in code_choices.examples()
        ],
        "currency": settings.TRAINYARD_CURRENCY,
        "money": currency().as_dict(),
        "time_zone": settings.TRAINYARD_TIME_ZONE or None,
        "code_root": str(settings.TRAINYARD_CODE_ROOT),
        "max_instances": settings.TRAINYARD_MAX_INSTANCES,
        "quota": quota_summary(user),
    }


# --- who ----------------------------------------------------------------------------------------


@api.get("/me", response={200: MeOut, **ERRORS}, tags=["catalog"], url_name="api_me")
def me(request: HttpRequest) -> dict[str, Any]:
    """Who you are to the console, and the quota you have left: what `trainyard login` checks."""
    user = _user(request)
    return {"username": user.username, "is_staff": user.is_staff, "quota": quota_summary(user)}


# --- catalog ------------------------------------------------------------------------------------


@api.get("/catalog", response={200: CatalogOut, **ERRORS}, tags=["catalog"], url_name="api_catalog")
def catalog(request: HttpRequest) -> dict[str, Any]:
    """Images, packages (priced in `currency`), the built-in examples with their arguments, and
    the quota left."""
    return catalog_for(_user(request))


# --- jobs ---------------------------------------------------------------------------------------


def _listed_jobs(user: User) -> Any:
    """The jobs the user may see, with everything a job's answer shows fetched up front: the
    list costs the same few queries whatever its length."""
    return visible_jobs(user).prefetch_related(
        Prefetch("roles", queryset=JobRole.objects.select_related("package")),
        Prefetch(
            "replicas", queryset=Replica.objects.select_related("node", "package").order_by("id")
        ),
        "attempts",
        "health_events",
        "tags",
        "metric_summaries",
    )


def _filter_query(description: str) -> Any:
    return Query(None, description=description)


@api.get("/jobs", response={200: JobListOut, **ERRORS}, tags=["jobs"], url_name="api_jobs")
def job_list(
    request: HttpRequest,
    limit: int = Query(JOB_PAGE, ge=1, le=MAX_JOB_PAGE),
    cursor: str | None = Query(
        None,
        description="Where the page starts: the `next` or `previous` of the page before "
        "(opaque). Without it, the first page.",
    ),
    offset: int = Query(
        0,
        ge=0,
        le=2**63 - 1,
        description="Skip this many jobs first (the old way to page: its cost grows with the "
        "offset; use `cursor`).",
    ),
    state: str | None = _filter_query(
        "Only jobs in this state (pending, queued, running, restarting, succeeded, failed, "
        "cancelled); several comma-separated."
    ),
    user: str | None = _filter_query("Only this user's jobs (a username; administrators)."),
    name: str | None = _filter_query("Only jobs whose name contains this (any case)."),
    image: str | None = _filter_query("Only jobs of this framework image."),
    program: str | None = _filter_query(
        "Only jobs of this program: a built-in example's name or the script's path."
    ),
    since: str | None = _filter_query("Only jobs submitted on or after this day, YYYY-MM-DD."),
    until: str | None = _filter_query("Only jobs submitted on or before this day, YYYY-MM-DD."),
    project: str | None = _filter_query("Only jobs of this project."),
    tag: str | None = _filter_query("Only jobs with this tag (several comma-separated: all)."),
    sort: str | None = _filter_query(
        "-submitted (newest first, the default), submitted, -duration (longest first) or "
        "duration; jobs that never started come last in both duration orders. Or a column, "
        "with a leading - for descending: metric:NAME:final, metric:NAME:best (e.g. "
        "-metric:eval_accuracy:best), config:KEY (config:lr, config:$WARMUP), project or "
        "tags; jobs without a value come last."
    ),
) -> dict[str, Any]:
    """The jobs you may see, newest first, a page at a time (`limit`; the next page with
    `cursor` set to this page's `next`), optionally filtered and sorted (the job list page
    takes the same parameters)."""
    asked = {
        "state": state,
        "user": user,
        "name": name,
        "image": image,
        "program": program,
        "since": since,
        "until": until,
        "project": project,
        "tag": tag,
        "sort": sort,
    }
    try:
        where = job_search.parse({k: v for k, v in asked.items() if v}, request.user)
    except job_search.BadFilter as exc:
        raise ValidationFailed(exc.errors) from None
    if cursor and offset:
        raise ApiError(400, "offset", "Give a cursor or an offset, not both.")
    jobs = job_search.apply(_listed_jobs(_user(request)), where)
    try:
        page = job_pages.read_page(
            jobs[offset:] if offset else jobs, where.sort, limit, cursor or ""
        )
    except job_pages.BadCursor as exc:
        raise ApiError(400, "cursor", str(exc)) from None
    count, more = job_pages.capped_count(jobs)
    positions = presenters.queue_positions(page.jobs)
    return {
        "jobs": [job_as_dict(j, request.user, positions) for j in page.jobs],
        "count": count,
        "count_capped": more,
        "limit": limit,
        "offset": offset,
        "next": page.next,
        "previous": page.previous,
    }


@api.post(
    "/jobs",
    response={201: JobOut, **ERRORS, 507: ErrorsOut},
    tags=["jobs"],
    url_name="api_jobs",
)
def job_create(request: HttpRequest, payload: JobIn) -> Status[dict[str, Any]]:
    """Check the request (400 with every problem), admit it against the quota and the nodes
    (400 saying which term is over and by how much), and queue it; 507 while the console's
    disk is full (nothing is written)."""
    user = _user(request)
    job = submit_job(user, check_job_request(payload, owner=user))
    job.refresh_from_db()
    return Status(201, job_as_dict(job, user))


@api.get("/jobs/{int:job_id}", response={200: JobOut, **ERRORS}, tags=["jobs"], url_name="api_job")
def job_detail(request: HttpRequest, job_id: int) -> dict[str, Any]:
    return job_as_dict(get_job_for(request.user, job_id), request.user)


@api.get(
    "/jobs/{int:job_id}/request",
    response={200: JobRequestOut, **ERRORS},
    tags=["jobs"],
    url_name="api_job_request",
)
def job_request(request: HttpRequest, job_id: int) -> dict[str, Any]:
    """The request that submits this job again (POST it to /api/v1/jobs, changed or not): its
    program and code snapshot, roles, restart policy, health rules and, for its owner, its
    variables (anyone else gets none whose values are masked to them)."""
    return rerun.request_of(get_job_for(request.user, job_id), request.user)


@api.post(
    "/jobs/{int:job_id}/cancel",
    response={200: JobOut, **ERRORS},
    tags=["jobs"],
    url_name="api_job_cancel",
)
def job_cancel(request: HttpRequest, job_id: int) -> dict[str, Any]:
    """Stop every process of the job; 409 when it has already ended."""
    job = get_job_for(request.user, job_id)
    try:
        job = outcomes.cancel(job.pk, _user(request))
    except transitions.InvalidTransition as exc:
        raise ApiError(409, "state", str(exc)) from None
    return job_as_dict(job, request.user)


@api.patch(
    "/jobs/{int:job_id}/labels",
    response={200: JobOut, **ERRORS},
    tags=["jobs"],
    url_name="api_job_labels",
)
def job_labels(request: HttpRequest, job_id: int, payload: LabelsIn) -> dict[str, Any]:
    """Body {"add": [tags], "remove": [tags], "project": name, "note": text}, any of them:
    file the run. 400 names every problem and changes nothing."""
    job = get_job_for(request.user, job_id)
    bad_text = text.problems_by_field(payload.model_dump(mode="python"))
    if bad_text:
        raise ValidationFailed(bad_text)
    try:
        run_labels.change(
            job.pk,
            add=payload.add,
            remove=payload.remove,
            project=payload.project,
            note=payload.note,
        )
    except run_labels.LabelError as exc:
        raise ValidationFailed(exc.errors) from None
    return job_as_dict(get_job_for(request.user, job_id), request.user)


@api.post(
    "/jobs/{int:job_id}/retention",
    response={200: JobOut, **ERRORS},
    tags=["jobs"],
    url_name="api_job_retention",
)
def job_retention(request: HttpRequest, job_id: int, payload: RetentionIn) -> dict[str, Any]:
    """Body {"keep": bool, "days": N or null}, either or both: keep the job's log and metrics,
    or say how many days after it ends they go (null: the console's default; 0: forever)."""
    job = get_job_for(request.user, job_id)
    given = payload.model_fields_set
    job = retention.set_retention(
        job.pk,
        keep=payload.keep if "keep" in given else None,
        days=payload.days if "days" in given else ...,
    )
    return job_as_dict(job, request.user)


# --- logs ---------------------------------------------------------------------------------------

# Cursors are Redis stream IDs (unsigned 64-bit); nothing larger means anything.
MAX_QUERY_INT = 2**63 - 1


def _whole(name: str, raw: str | None, default: int | None) -> int | None:
    """A query parameter as a whole number from 0 to 2**63-1, or a 400 that says so."""
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        value = -1
    if not 0 <= value <= MAX_QUERY_INT:
        raise ApiError(400, name, f"{name} must be a whole number from 0 to 2**63-1.")
    return value


@api.get(
    "/jobs/{int:job_id}/logs",
    response={200: LogPageOut, **ERRORS},
    tags=["logs"],
    url_name="api_job_logs",
    # more_before only on a page read backwards; a line has `shown` only when it shows other
    # than its text, `hits` only in a search.
    exclude_unset=True,
)
def job_logs(
    request: HttpRequest,
    job_id: int,
    after: str | None = None,
    before: str | None = None,
    role: str | None = None,
    index: str | None = None,
    node: str | None = None,
    stream: str | None = None,
    q: str | None = None,
    errors: str | None = None,
    limit: str | None = None,
) -> dict[str, Any]:
    """A page of the job's log: lines after cursor `after` (or, with `before`, the last lines
    before it), optionally only of one role, instance, node or stream, or containing `q`, or
    error lines (`errors=1`). Whole-number parameters are strings here so that a bad one gets
    this endpoint's own message."""
    job = get_job_for(request.user, job_id)
    values = {
        "after": _whole("after", after, 0),
        "before": _whole("before", before, None),
        "index": _whole("index", index, None),
        "limit": _whole("limit", limit, None),
    }
    if (stream or None) not in (None, "stdout", "stderr"):
        raise ApiError(400, "stream", "stream must be stdout or stderr.")
    where = logstream.LineFilter(
        role=role or None,
        index=values["index"],
        node=node or None,
        stream=stream or None,
        text=q or None,
        errors=errors in ("1", "true"),
    )
    page_size = min(values["limit"] or DEFAULT_LOG_PAGE, MAX_LOG_PAGE)
    if values["before"] is not None:
        page = logstream.read_page_before(job.pk, values["before"], page_size, where)
        extra = {"more_before": page.more_before}
    else:
        page = logstream.read_page(job.pk, values["after"] or 0, page_size, where)
        extra = {}
    return {"lines": page.lines, "next": page.next, "complete": page.complete, **extra}


@api.get(
    "/jobs/{int:job_id}/logs/counts",
    response={200: LogCountsOut, **ERRORS},
    tags=["logs"],
    url_name="api_job_log_counts",
)
def job_log_counts(request: HttpRequest, job_id: int) -> dict[str, Any]:
    """Lines so far per instance and stream, and per node."""
    return logstream.line_counts(get_job_for(request.user, job_id).pk)


@api.get(
    "/jobs/{int:job_id}/logs.txt",
    response={200: None, **ERRORS},
    tags=["logs"],
    openapi_extra=_download("text/plain", "The whole log, streamed."),
    url_name="api_job_log_text",
)
def job_log_text(request: HttpRequest, job_id: int) -> HttpResponseBase:
    """The whole log as text, one "[tag] line" per line, streamed as it is read."""
    job = get_job_for(request.user, job_id)
    text = StreamingHttpResponse(
        logstream.log_text(job.pk), content_type="text/plain; charset=utf-8"
    )
    return _attachment(text, f"trainyard-job-{job.pk}.log")


# --- metrics ------------------------------------------------------------------------------------


@api.get(
    "/jobs/{int:job_id}/metrics",
    response={200: MetricPageOut, **ERRORS},
    tags=["metrics"],
    url_name="api_job_metrics",
)
def job_metrics(
    request: HttpRequest, job_id: int, after: str | None = None, name: str | None = None
) -> dict[str, Any]:
    """Metric points after cursor `after`, optionally of one name."""
    job = get_job_for(request.user, job_id)
    start = _whole("after", after, 0) or 0
    points, position = logstream.metric_points(job.pk, start, name=name or None)
    return {"points": points, "next": position}


@api.get(
    "/jobs/{int:job_id}/metrics/summary",
    response={200: TrainingReportOut, **ERRORS},
    tags=["metrics"],
    url_name="api_job_metrics_summary",
)
def job_metrics_summary(request: HttpRequest, job_id: int) -> dict[str, Any]:
    """The training report: throughput, speedup against the baseline, cost, figures."""
    job = get_job_for(request.user, job_id)
    return training_report.report(_user(request), job)


@api.get(
    "/jobs/{int:job_id}/metrics.csv",
    response={200: None, **ERRORS},
    tags=["metrics"],
    openapi_extra=_download("text/csv", "Every metric point, streamed."),
    url_name="api_job_metrics_csv",
)
def job_metrics_csv(request: HttpRequest, job_id: int) -> HttpResponseBase:
    job = get_job_for(request.user, job_id)
    rows = StreamingHttpResponse(metric_export.csv_rows(job.pk), content_type="text/csv")
    return _attachment(rows, f"trainyard-job-{job.pk}-metrics.csv")


@api.get(
    "/jobs/{int:job_id}/metrics.tensorboard.tar.gz",
    response={200: None, **ERRORS},
    tags=["metrics"],
    openapi_extra=_download("application/gzip", "TensorBoard event files."),
    url_name="api_job_metrics_tensorboard",
)
def job_metrics_tensorboard(request: HttpRequest, job_id: int) -> HttpResponseBase:
    job = get_job_for(request.user, job_id)
    archive = HttpResponse(
        metric_export.tensorboard_archive(job.pk), content_type="application/gzip"
    )
    return _attachment(archive, f"trainyard-job-{job.pk}-tb.tar.gz")


def _attachment(response: HttpResponseBase, filename: str) -> HttpResponseBase:
    """A download: saved under `filename`, never rendered by the browser."""
    response["Content-Disposition"] = f'attachment; filename="{filename}"'
    response["X-Content-Type-Options"] = "nosniff"
    return response


@api.post(
    "/jobs/{int:job_id}/baseline",
    response={200: TrainingReportOut, **ERRORS},
    tags=["metrics"],
    url_name="api_job_baseline",
)
def job_baseline(request: HttpRequest, job_id: int, payload: BaselineIn) -> dict[str, Any]:
    """Body {"baseline": JOB_ID or null}: compare this job with an earlier one."""
    job = get_job_for(request.user, job_id)
    try:
        baselines.set_baseline(_user(request), job, payload.baseline)
    except baselines.BaselineError as exc:
        raise ApiError(400, "baseline", str(exc)) from None
    return training_report.report(_user(request), job)


@api.post(
    "/jobs/{int:job_id}/baseline-run",
    response={201: JobOut, **ERRORS},
    tags=["metrics"],
    url_name="api_job_baseline_run",
)
def job_baseline_run(request: HttpRequest, job_id: int) -> Status[dict[str, Any]]:
    """Launch a 1-trainer copy of the job and make it the job's baseline."""
    job = get_job_for(request.user, job_id)
    try:
        baseline = baselines.launch_single_worker_baseline(_user(request), job)
    except baselines.BaselineError as exc:
        raise ApiError(400, "baseline", str(exc)) from None
    baseline.refresh_from_db()
    return Status(201, job_as_dict(baseline, request.user))


@api.get(
    "/compare",
    response={200: CompareOut, **ERRORS},
    tags=["metrics"],
    url_name="api_compare",
)
def compare_jobs(
    request: HttpRequest,
    jobs: str | None = Query(None, description="2 to 8 job numbers, comma-separated: 12,15,19."),
) -> dict[str, Any]:
    """Jobs side by side: configuration rows (each saying whether the jobs differ there), the
    figures of each, and the metric names they share with where to read each job's points.
    404 names the jobs you cannot see (or that do not exist); nothing of them is answered."""
    return comparison.compare(_user(request), jobs)


@api.exception_handler(comparison.CompareError)
def _not_comparable(request: HttpRequest, exc: comparison.CompareError) -> HttpResponse:
    return errors_response(request, exc.status, exc.errors)


# --- nodes --------------------------------------------------------------------------------------


@api.get("/nodes", response={200: NodeListOut, **ERRORS}, tags=["nodes"], url_name="api_nodes")
def node_list(request: HttpRequest) -> dict[str, Any]:
    """Every node: capacity, what all jobs use and leave free, and which of your jobs run
    there (administrators see every job's id)."""
    return {
        "nodes": [
            {
                "name": row.node.name,
                "address": row.node.address,
                "status": row.status,
                "capacity": {
                    "cpu": row.node.cpu,
                    "gpus": row.node.gpus,
                    "memory_gb": row.node.memory_gb,
                },
                "used": row.used,
                "free": row.free,
                "jobs": row.jobs,
                "isolated": row.node.isolated,
                "isolation": row.node.isolation or "unknown",
                "limits_enforced": row.node.limits_enforced,
                "limits": row.node.limits or "unknown",
                "limits_reason": row.node.limits_reason,
                "status_reason": row.node.status_reason,
                "protocol": row.node.protocol,
                "last_heartbeat": row.node.last_heartbeat.isoformat()
                if row.node.last_heartbeat
                else None,
            }
            for row in cluster.node_rows(request.user)
        ]
    }


@api.get("/queue", response={200: QueueOut, **ERRORS}, tags=["nodes"], url_name="api_queue")
def queue_list(request: HttpRequest) -> dict[str, Any]:
    """Every job waiting for room, in the order the scheduler takes them, and why each waits.
    Another user's job shows its place, size and submission time only."""
    return {
        "jobs": [
            {
                **dataclasses.asdict(e),
                "submitted": e.submitted.isoformat(),
                "estimated_start": e.estimated_start.isoformat() if e.estimated_start else None,
            }
            for e in queue_listing.entries(request.user)
        ],
        "slurm": [
            {**dataclasses.asdict(e), "submitted": e.submitted.isoformat()}
            for e in queue_listing.slurm_entries(request.user)
        ],
    }


def _admin_node(request: HttpRequest, name: str, doing: str) -> None:
    if not request.user.is_staff:
        raise ApiError(403, "auth", f"Only administrators {doing}.")
    if not Node.objects.filter(name=name).exists():
        raise ApiError(404, "node", f"No node {name!r}.")


@api.post(
    "/nodes/{name}/drain",
    response={200: NodeDrainOut, **ERRORS},
    tags=["nodes"],
    url_name="api_node_drain",
)
def node_drain(request: HttpRequest, name: str, payload: DrainIn | None = None) -> dict[str, Any]:
    """Admins: no new work to the node; with {"evict": true}, move its running jobs away
    (SIGTERM, `grace_seconds` to checkpoint, then a restart elsewhere), as a spot instance's
    preemption notice would. No body (or null) means drain only."""
    _admin_node(request, name, "drain nodes")
    body = payload or DrainIn(grace_seconds=nodes.EVICT_GRACE_SECONDS)
    by = _user(request).get_username()
    evicted = nodes.drain([name], evict=body.evict, grace_seconds=float(body.grace_seconds), by=by)
    return {"node": name, "status": "draining", "evicted_jobs": evicted}


@api.post(
    "/nodes/{name}/ready",
    response={200: NodeStateOut, **ERRORS},
    tags=["nodes"],
    url_name="api_node_ready",
)
def node_ready(request: HttpRequest, name: str) -> dict[str, Any]:
    """Admins: return a drained node to service."""
    _admin_node(request, name, "return nodes to service")
    nodes.return_to_service([name])
    return {"node": name, "status": "ready"}


# --- code snapshots -------------------------------------------------------------------------


def snapshot_as_dict(upload: Any, **extra: Any) -> dict[str, Any]:
    snapshot = upload.snapshot
    return {
        "sha256": snapshot.sha256,
        "name": upload.name,
        "size": snapshot.size,
        "unpacked_size": snapshot.unpacked_size,
        "file_count": len(snapshot.files),
        "uploaded": upload.uploaded.isoformat(),
        **extra,
    }


@api.post(
    "/snapshots",
    response={
        201: SnapshotUploadOut,
        200: SnapshotUploadOut,
        **ERRORS,
        503: ErrorsOut,
        507: ErrorsOut,
    },
    tags=["code"],
    url_name="api_snapshots",
)
def snapshot_upload(
    request: HttpRequest, archive: File[UploadedFile], name: Form[str] = ""
) -> Status[dict[str, Any]]:
    """Upload a project folder as a .tar.gz (multipart field `archive`; `name` is yours to
    choose). Every member must be a plain file or folder inside the archive: absolute paths,
    `..`, links and devices are refused. The files are stored once, named by their SHA-256:
    201 for files you had not uploaded before, 200 (`new`: false) for ones you had (whether
    anyone else uploaded the same files is never told). Run it with
    `"program": {"script": "train.py", "snapshot": SHA256}`."""
    if problem := text.name_problem(name):
        raise ApiError(400, "name", problem)
    try:
        with archive.open("rb") as data:
            stored = snapshots.store_upload(_user(request), data, name)
    except SnapshotError as exc:
        raise ApiError(400, "archive", f"The archive is refused: {exc}.") from None
    except snapshots.UploadsBusy:
        raise ApiError(
            503, "archive", "The console is checking many other uploads; try again in a minute."
        ) from None
    return Status(201 if stored.new else 200, snapshot_as_dict(stored.upload, new=stored.new))


@api.get("/snapshots", response={200: SnapshotListOut, **ERRORS}, tags=["code"])
def snapshot_list(request: HttpRequest) -> dict[str, Any]:
    """Your code snapshots, the latest upload first."""
    return {"snapshots": [snapshot_as_dict(u) for u in snapshots.uploads_of(_user(request))]}


@api.get(
    "/snapshots/{sha256}",
    response={200: SnapshotDetailOut, **ERRORS},
    tags=["code"],
    url_name="api_snapshot",
)
def snapshot_detail(request: HttpRequest, sha256: str) -> dict[str, Any]:
    """One of your code snapshots, with its files."""
    upload = snapshots.upload_of(_user(request), sha256) if is_sha256(sha256) else None
    if upload is None:
        raise ApiError(404, "snapshot", "No such code snapshot of yours.")
    return snapshot_as_dict(upload, files=upload.snapshot.files)


@api.delete(
    "/snapshots/{sha256}",
    response={204: None, **ERRORS},
    tags=["code"],
    url_name="api_snapshot",
)
def snapshot_forget(request: HttpRequest, sha256: str) -> Status[None]:
    """Remove one of your code snapshots from your list: new jobs can no longer name it. Jobs
    that ran it keep their code."""
    if not (is_sha256(sha256) and snapshots.forget_upload(_user(request), sha256)):
        raise ApiError(404, "snapshot", "No such code snapshot of yours.")
    return Status(204, None)
