"""Browser pages: job list, New job form, job page. Thin views over the services layer."""

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST
from redis import RedisError

from jobs.access import get_job_for, visible_jobs
from jobs.api import catalog_for
from jobs.forms import NewJobForm
from jobs.models import Node
from jobs.redis_client import get_redis
from jobs.services import cluster, lifecycle
from jobs.services.submission import ValidationFailed, check_job_request, submit_job


@login_required
def job_list(request: HttpRequest) -> HttpResponse:
    jobs = visible_jobs(request.user).prefetch_related("replicas")[:200]
    return render(request, "jobs/job_list.html", {"jobs": jobs})


@login_required
def new_job(request: HttpRequest) -> HttpResponse:
    form = NewJobForm(request.POST or None)
    over: dict[str, dict[str, object]] = {}
    if request.method == "POST" and form.is_valid():
        try:
            job = submit_job(request.user, check_job_request(form.as_request()))  # type: ignore[arg-type]
        except ValidationFailed as exc:
            form.add_service_errors(exc.errors)
            over = exc.detail.get("quota", {})
        else:
            return redirect("job_detail", job_id=job.pk)
    catalog = catalog_for(request.user)  # type: ignore[arg-type]
    formulas = [
        {"label": RESOURCE_FORMULA_NAMES[r], **detail}
        for r, detail in over.items()
        if r in RESOURCE_FORMULA_NAMES
    ]
    return render(
        request, "jobs/new_job.html", {"form": form, "catalog": catalog, "over": formulas}
    )


# Seed 004 writes the totals as CPU_Total and GPU_Total.
RESOURCE_FORMULA_NAMES = {"cpu": "CPU_total", "gpus": "GPU_total", "memory_gb": "Memory_total"}


@login_required
def job_detail(request: HttpRequest, job_id: int) -> HttpResponse:
    job = get_job_for(request.user, job_id)
    workers = sum(r.instances for r in job.roles.all() if r.role == "worker")
    batch = job.per_worker_batch
    return render(
        request,
        "jobs/job_detail.html",
        {
            "job": job,
            "state": lifecycle.job_state_payload(job),
            "roles": job.roles.all(),
            "workers": workers,
            "global_batch": workers * batch if batch else None,
        },
    )


@login_required
@require_POST
def job_cancel(request: HttpRequest, job_id: int) -> HttpResponse:
    job = get_job_for(request.user, job_id)
    try:
        lifecycle.cancel(job.pk, request.user)  # type: ignore[arg-type]
    except lifecycle.InvalidTransition as exc:
        messages.error(request, str(exc))
    return redirect("job_detail", job_id=job.pk)


def healthz(request: HttpRequest) -> HttpResponse:
    """Liveness for operators and `make run`: database, Redis, and how many nodes heartbeat."""
    nodes_live = len(_live_node_names())
    try:
        redis_ok = bool(get_redis().ping())
    except RedisError:
        redis_ok = False
    status = 200 if redis_ok else 503
    return JsonResponse({"redis": redis_ok, "nodes_live": nodes_live}, status=status)


def _live_node_names() -> list[str]:
    return [n.name for n in Node.objects.all() if not n.is_lost()]


@login_required
def node_list(request: HttpRequest) -> HttpResponse:
    return render(
        request,
        "jobs/node_list.html",
        {"rows": cluster.node_rows(), "stale_seconds": settings.TRAINYARD_NODE_STALE_SECONDS},
    )


@login_required
def quota_list(request: HttpRequest) -> HttpResponse:
    rows = cluster.quota_rows(request.user)  # type: ignore[arg-type]
    return render(request, "jobs/quota_list.html", {"rows": rows})
