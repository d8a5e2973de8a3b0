"""HTTP API v1: JSON over session or token auth. Thin views over the services layer."""

import json
from collections.abc import Callable
from functools import wraps
from typing import Any

from django.conf import settings
from django.contrib.auth.models import User
from django.core.exceptions import RequestDataTooBig
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse, StreamingHttpResponse
from django.http.response import HttpResponseBase
from django.middleware.csrf import CsrfViewMiddleware
from django.views.decorators.csrf import csrf_exempt

from jobs import logstream
from jobs.access import get_job_for, visible_jobs
from jobs.models import FrameworkImage, Job, KVStoreMode, Node, Package
from jobs.services import (
    baselines,
    cluster,
    metric_export,
    nodes,
    outcomes,
    presenters,
    quota,
    training_report,
    transitions,
)
from jobs.services.submission import ValidationFailed, check_job_request, submit_job
from jobs.tokens import user_for_token
from workers.programs import BUILTIN_DESCRIPTIONS, BUILTIN_EXAMPLES, BUILTIN_FRAMEWORKS

SAFE_METHODS = ("GET", "HEAD", "OPTIONS")
MAX_LOG_PAGE = 10_000
DEFAULT_LOG_PAGE = 1_000

View = Callable[..., HttpResponseBase]


def error(status: int, field: str, message: str, **extra: Any) -> JsonResponse:
    return JsonResponse({"errors": {field: [message]}, **extra}, status=status)


def _csrf_failure(request: HttpRequest) -> HttpResponse | None:
    check = CsrfViewMiddleware(lambda r: HttpResponse())
    check.process_request(request)
    return check.process_view(request, lambda r: HttpResponse(), (), {})


def api_endpoint(*methods: str) -> Callable[[View], View]:
    """Method check, then token or session auth (session writes need the CSRF token)."""

    def decorator(view: View) -> View:
        @csrf_exempt
        @wraps(view)
        def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
            if request.method not in methods:
                return error(405, "method", f"Use {' or '.join(methods)}.")
            header = request.headers.get("Authorization", "")
            if header.startswith("Token "):
                user = user_for_token(header[6:].strip())
                if user is None:
                    return error(401, "auth", "Invalid or revoked token.")
                request.user = user
            elif not request.user.is_authenticated:
                return error(401, "auth", "Log in or send Authorization: Token KEY.")
            elif request.method not in SAFE_METHODS and _csrf_failure(request) is not None:
                return error(403, "auth", "CSRF check failed; send the X-CSRFToken header.")
            try:
                return view(request, *args, **kwargs)
            except Http404:
                return error(404, "job", "No such job.")
            except RequestDataTooBig:
                limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
                return error(413, "request", f"The body is larger than {limit:,} bytes; send less.")

        return wrapper

    return decorator


# No request of this API nests deeper than a handful of levels; a body that does is refused
# before anything walks it (json.loads itself would hit the recursion limit near 1,000).
MAX_JSON_DEPTH = 32


def _json_body(request: HttpRequest) -> Any:
    """The body as JSON: ValidationFailed (400) if it is not JSON or nests too deeply, and
    RequestDataTooBig (413, in api_endpoint) over DATA_UPLOAD_MAX_MEMORY_SIZE."""
    too_deep = ValidationFailed(
        {"request": [f"The body is nested too deeply (more than {MAX_JSON_DEPTH} levels)."]}
    )
    raw = request.body or b"null"
    if _bracket_depth(raw) > MAX_JSON_DEPTH:
        raise too_deep
    try:
        return json.loads(raw)
    except RecursionError:
        raise too_deep from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise ValidationFailed({"request": [f"The body is not valid JSON: {exc}"]}) from None


def _bracket_depth(raw: bytes) -> int:
    """How deep [ and { nest, outside strings: measured without parsing, so that a hostile
    body costs one pass over its bytes."""
    depth = deepest = 0
    in_string = escaped = False
    for byte in raw:
        if in_string:
            if escaped:
                escaped = False
            elif byte == 0x5C:  # backslash
                escaped = True
            elif byte == 0x22:  # closing quote
                in_string = False
        elif byte == 0x22:
            in_string = True
        elif byte in (0x5B, 0x7B):  # [ {
            depth += 1
            deepest = max(deepest, depth)
        elif byte in (0x5D, 0x7D):  # ] }
            depth -= 1
    return deepest


def job_as_dict(job: Job) -> dict[str, Any]:
    roles = {
        r.role: {"package": r.package.name, "instances": r.instances}
        for r in job.roles.select_related("package")
    }
    return {
        "id": job.pk,
        "name": job.name,
        "owner": job.owner.get_username(),
        "image": job.image.name,
        "program": {
            "script": job.script,
            "args": job.args,
        },
        "roles": roles,
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
        "baseline": job.baseline_id,
        "metrics": job.metric_definitions,
        "restart": {
            "policy": job.restart_policy,
            "max_restarts": job.max_restarts,
            "backoff_seconds": job.restart_backoff_seconds,
            "exclude_failed_node": job.exclude_failed_node,
        },
        "health_rules": job.health_rules,
        **presenters.job_state_payload(job),
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
                "summary": p.summary,
            }
            for p in Package.objects.filter(enabled=True)
        ],
        "examples": [
            {
                "name": name,
                "framework": BUILTIN_FRAMEWORKS[name],
                "description": BUILTIN_DESCRIPTIONS.get(name, ""),
            }
            for name in BUILTIN_EXAMPLES
        ],
        "code_root": str(settings.TRAINYARD_CODE_ROOT),
        "max_instances": settings.TRAINYARD_MAX_INSTANCES,
        "quota": quota_summary(user),
    }


@api_endpoint("GET")
def catalog(request: HttpRequest) -> HttpResponse:
    return JsonResponse(catalog_for(request.user))  # type: ignore[arg-type]


@api_endpoint("GET", "POST")
def jobs(request: HttpRequest) -> HttpResponse:
    if request.method == "GET":
        return JsonResponse({"jobs": [job_as_dict(j) for j in visible_jobs(request.user)[:200]]})
    try:
        job_request = check_job_request(_json_body(request))
        job = submit_job(request.user, job_request)  # type: ignore[arg-type]
    except ValidationFailed as exc:
        return JsonResponse({"errors": exc.errors, **exc.detail}, status=400)
    job.refresh_from_db()
    return JsonResponse(job_as_dict(job), status=201)


@api_endpoint("GET")
def job_detail(request: HttpRequest, job_id: int) -> HttpResponse:
    return JsonResponse(job_as_dict(get_job_for(request.user, job_id)))


@api_endpoint("POST")
def job_cancel(request: HttpRequest, job_id: int) -> HttpResponse:
    job = get_job_for(request.user, job_id)
    try:
        job = outcomes.cancel(job.pk, request.user)  # type: ignore[arg-type]
    except transitions.InvalidTransition as exc:
        return error(409, "state", str(exc))
    return JsonResponse(job_as_dict(job))


# Cursors are Redis stream IDs (unsigned 64-bit); nothing larger means anything.
MAX_QUERY_INT = 2**63 - 1


def _int_param(request: HttpRequest, name: str, default: int | None) -> int | None:
    raw = request.GET.get(name)
    if raw is None or raw == "":
        return default
    value = int(raw)  # ValueError is turned into a 400 by the caller
    if not 0 <= value <= MAX_QUERY_INT:
        raise ValueError
    return value


@api_endpoint("GET")
def job_logs(request: HttpRequest, job_id: int) -> HttpResponse:
    """A page of the job's log: lines after `after` (or, with `before`, the last lines before
    it), optionally only of one role, instance, node or stream, or containing `q`, or errors."""
    job = get_job_for(request.user, job_id)
    values: dict[str, int | None] = {}
    for name, default in (("after", 0), ("before", None), ("index", None), ("limit", None)):
        try:
            values[name] = _int_param(request, name, default)
        except ValueError:
            return error(400, name, f"{name} must be a whole number from 0 to 2**63-1.")
    stream = request.GET.get("stream") or None
    if stream not in (None, "stdout", "stderr"):
        return error(400, "stream", "stream must be stdout or stderr.")
    where = logstream.LineFilter(
        role=request.GET.get("role") or None,
        index=values["index"],
        node=request.GET.get("node") or None,
        stream=stream,
        text=request.GET.get("q") or None,
        errors=request.GET.get("errors") in ("1", "true"),
    )
    limit = min(values["limit"] or DEFAULT_LOG_PAGE, MAX_LOG_PAGE)
    if values["before"] is not None:
        page = logstream.read_page_before(job.pk, values["before"], limit, where)
        extra = {"more_before": page.more_before}
    else:
        page = logstream.read_page(job.pk, values["after"] or 0, limit, where)
        extra = {}
    return JsonResponse(
        {"lines": page.lines, "next": page.next, "complete": page.complete, **extra}
    )


@api_endpoint("GET")
def job_log_counts(request: HttpRequest, job_id: int) -> HttpResponse:
    """Lines so far per instance and stream, and per node."""
    job = get_job_for(request.user, job_id)
    return JsonResponse(logstream.line_counts(job.pk))


@api_endpoint("GET")
def job_log_text(request: HttpRequest, job_id: int) -> HttpResponseBase:
    """The whole log as text, one "[tag] line" per line, streamed as it is read."""
    job = get_job_for(request.user, job_id)
    text = StreamingHttpResponse(
        logstream.log_text(job.pk), content_type="text/plain; charset=utf-8"
    )
    return _attachment(text, f"trainyard-job-{job.pk}.log")


# --- metrics ------------------------------------------------------------------------------------


@api_endpoint("GET")
def job_metrics(request: HttpRequest, job_id: int) -> HttpResponse:
    """Metric points after cursor `after`, optionally of one name."""
    job = get_job_for(request.user, job_id)
    try:
        after = _int_param(request, "after", 0) or 0
    except ValueError:
        return error(400, "after", "after must be a non-negative whole number.")
    points, position = logstream.metric_points(job.pk, after, name=request.GET.get("name") or None)
    return JsonResponse({"points": points, "next": position})


@api_endpoint("GET")
def job_metrics_summary(request: HttpRequest, job_id: int) -> HttpResponse:
    job = get_job_for(request.user, job_id)
    return JsonResponse(training_report.report(request.user, job))  # type: ignore[arg-type]


@api_endpoint("GET")
def job_metrics_csv(request: HttpRequest, job_id: int) -> HttpResponseBase:
    job = get_job_for(request.user, job_id)
    rows = StreamingHttpResponse(metric_export.csv_rows(job.pk), content_type="text/csv")
    return _attachment(rows, f"trainyard-job-{job.pk}-metrics.csv")


@api_endpoint("GET")
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


@api_endpoint("POST")
def job_baseline(request: HttpRequest, job_id: int) -> HttpResponse:
    """Body {"baseline": JOB_ID or null}: compare this job with an earlier one."""
    job = get_job_for(request.user, job_id)
    try:
        body = _json_body(request)
    except ValidationFailed as exc:
        return JsonResponse({"errors": exc.errors}, status=400)
    value = body.get("baseline") if isinstance(body, dict) else "missing"
    if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
        return error(400, "baseline", 'Send {"baseline": JOB_ID} or {"baseline": null}.')
    try:
        baselines.set_baseline(request.user, job, value)  # type: ignore[arg-type]
    except baselines.BaselineError as exc:
        return error(400, "baseline", str(exc))
    return JsonResponse(training_report.report(request.user, job))  # type: ignore[arg-type]


@api_endpoint("POST")
def job_baseline_run(request: HttpRequest, job_id: int) -> HttpResponse:
    """Launch a 1-worker copy of the job and make it the job's baseline."""
    job = get_job_for(request.user, job_id)
    try:
        baseline = baselines.launch_single_worker_baseline(request.user, job)  # type: ignore[arg-type]
    except baselines.BaselineError as exc:
        return error(400, "baseline", str(exc))
    except ValidationFailed as exc:
        return JsonResponse({"errors": exc.errors, **exc.detail}, status=400)
    baseline.refresh_from_db()
    return JsonResponse(job_as_dict(baseline), status=201)


@api_endpoint("GET")
def node_list(request: HttpRequest) -> HttpResponse:
    return JsonResponse(
        {
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
                    "last_heartbeat": row.node.last_heartbeat.isoformat()
                    if row.node.last_heartbeat
                    else None,
                }
                for row in cluster.node_rows()
            ]
        }
    )


MAX_EVICT_GRACE_SECONDS = 3600


@api_endpoint("POST")
def node_drain(request: HttpRequest, name: str) -> HttpResponse:
    """Admins: no new work to the node; with {"evict": true}, move its running jobs away
    (SIGTERM, `grace_seconds` to checkpoint, then a restart elsewhere), as a spot instance's
    preemption notice would."""
    if not request.user.is_staff:
        return error(403, "auth", "Only administrators drain nodes.")
    if not Node.objects.filter(name=name).exists():
        return error(404, "node", f"No node {name!r}.")
    try:
        body = _json_body(request)
    except ValidationFailed as exc:
        return JsonResponse({"errors": exc.errors}, status=400)
    body = {} if body is None else body
    if not isinstance(body, dict) or set(body) - {"evict", "grace_seconds"}:
        return error(400, "request", 'Send {"evict": true|false, "grace_seconds": N} or nothing.')
    evict = body.get("evict", False)
    grace = body.get("grace_seconds", nodes.EVICT_GRACE_SECONDS)
    if not isinstance(evict, bool):
        return error(400, "evict", "Give true or false.")
    if (
        isinstance(grace, bool)
        or not isinstance(grace, int | float)
        or not 0 <= grace <= MAX_EVICT_GRACE_SECONDS
    ):
        return error(400, "grace_seconds", f"Give seconds from 0 to {MAX_EVICT_GRACE_SECONDS}.")
    by = request.user.get_username()
    evicted = nodes.drain([name], evict=evict, grace_seconds=float(grace), by=by)
    return JsonResponse({"node": name, "status": "draining", "evicted_jobs": evicted})


@api_endpoint("POST")
def node_ready(request: HttpRequest, name: str) -> HttpResponse:
    """Admins: return a drained node to service."""
    if not request.user.is_staff:
        return error(403, "auth", "Only administrators return nodes to service.")
    if not Node.objects.filter(name=name).exists():
        return error(404, "node", f"No node {name!r}.")
    nodes.return_to_service([name])
    return JsonResponse({"node": name, "status": "ready"})
