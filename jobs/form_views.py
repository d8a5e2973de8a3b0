"""The New-job form's live helpers, asked by its script as the user fills it in: the preview
of what admission would say, and the check of health rules as they are written. Both answer
JSON and write nothing; Launch is still judged in full by the services."""

from collections.abc import Callable
from typing import Any

from django.contrib.auth.models import User
from django.core.exceptions import ValidationError
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.http import require_POST

from jobs.forms import JobShapeForm, read_health_rules
from jobs.healthrules import check_each
from jobs.services.preview import preview
from jobs.services.submission import ValidationFailed, check_job_shape


def _login_required_json(
    view: Callable[[HttpRequest, User], HttpResponse],
) -> Callable[[HttpRequest], HttpResponse]:
    """A 401 in JSON for a script whose session has ended, not a redirect to the login page."""

    def wrapper(request: HttpRequest) -> HttpResponse:
        if not request.user.is_authenticated:
            return JsonResponse({"errors": {"auth": ["Log in again."]}}, status=401)
        return view(request, request.user)

    return wrapper


@require_POST
@_login_required_json
def job_preview(request: HttpRequest, user: User) -> HttpResponse:
    """The form's image, packages and counts → totals, price, formula, room left, where it is
    over, and the count of workers that fits (jobs.services.preview)."""
    form = JobShapeForm(request.POST)
    if not form.is_valid():
        return JsonResponse({"errors": _messages(form.errors)}, status=400)
    try:
        image, roles = check_job_shape(form.cleaned_data["image"], form.roles())
    except ValidationFailed as exc:
        return JsonResponse({"errors": form.field_errors(exc.errors)}, status=400)
    shown = preview(
        user,
        image,
        roles,
        form.cleaned_data["kvstore"],
        form.cleaned_data["args"],
        one_instance_per_node=form.cleaned_data["one_instance_per_node"],
    )
    return JsonResponse(shown.as_dict())


@require_POST
@_login_required_json
def health_rules_check(request: HttpRequest, user: User) -> HttpResponse:
    """The health-rules box as the form would send it → its rules as read, and the parser's
    verdict on each rule and on the list (jobs.healthrules.check_each)."""
    if "health_rules" not in request.POST:
        return JsonResponse(
            {"errors": {"health_rules": ["Send the health_rules field."]}}, status=400
        )
    try:
        rules = read_health_rules(request.POST["health_rules"])
    except ValidationError as exc:
        return JsonResponse({"rules": None, "verdicts": [], "error": exc.messages[0]})
    if rules is None:
        return JsonResponse({"rules": None, "verdicts": [], "error": None})
    return JsonResponse({"rules": rules, **check_each(rules)})


def _messages(errors: Any) -> dict[str, list[str]]:
    return {field: [str(m) for m in messages] for field, messages in errors.items()}
