"""Pages' writes for filing runs and keeping run-table views (issue 49): thin views over
jobs.services.run_labels and jobs.services.views.run_table. Each answers with a redirect, and a
refusal as a message on the page it goes back to."""

from urllib.parse import urlencode

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.contrib.auth.models import User
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect
from django.urls import reverse
from django.views.decorators.http import require_POST

from jobs.access import get_job_for
from jobs.services import run_labels
from jobs.services.views import run_table


@login_required
@require_POST
def job_labels(request: HttpRequest, job_id: int) -> HttpResponse:
    """The job page's tags, project and note: `add` (tags separated by spaces or commas),
    `remove` (one tag), `project` and `note` where the form sends them."""
    job = get_job_for(request.user, job_id)
    post = request.POST
    try:
        run_labels.change(
            job.pk,
            add=post.get("add", "").replace(",", " ").split(),
            remove=[post["remove"]] if post.get("remove") else [],
            project=post.get("project"),
            note=post["note"].replace("\r\n", "\n") if "note" in post else None,
        )
    except run_labels.LabelError as exc:
        for problems in exc.errors.values():
            for problem in problems:
                messages.error(request, problem)
    return redirect(reverse("job_detail", kwargs={"job_id": job.pk}) + "#run-labels")


@login_required
@require_POST
def run_view_save(request: HttpRequest) -> HttpResponse:
    """Keep the list's current filters, sort and columns under a name."""
    assert isinstance(request.user, User)
    query = request.POST.get("query", "")
    try:
        view = run_table.save_view(request.user, request.POST.get("name", ""), query)
    except run_table.BadView as exc:
        messages.error(request, f"View not saved: {exc}")
        return redirect(f"{reverse('job_list')}?{query}")
    messages.success(request, f"View {view.name!r} saved.")
    return redirect(f"{reverse('job_list')}?{view.query}")


@login_required
@require_POST
def run_view_delete(request: HttpRequest) -> HttpResponse:
    assert isinstance(request.user, User)
    run_table.delete_view(request.user, request.POST.get("name", ""))
    return redirect(f"{reverse('job_list')}?{urlencode({'columns': ''})}")
