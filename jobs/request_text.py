"""Refuses a request whose path or query string is not text (jobs.text), before any view
looks it up: a NUL in `?search=` or in `/api/v1/nodes/<name>/drain` reaches the database as
it is, and PostgreSQL answers that with an error the view does not expect (a 500)."""

from collections.abc import Callable

from django.http import HttpRequest, HttpResponse
from django.http.response import HttpResponseBase

from jobs import text
from jobs.api_fallback import API_PREFIX, errors_response


class RequestTextMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponseBase]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponseBase:
        problems = _problems(request)
        if not problems:
            return self.get_response(request)
        if request.path.startswith(API_PREFIX):
            return errors_response(400, problems)
        lines = [
            f"{field}: {message}" for field, messages in problems.items() for message in messages
        ]
        return HttpResponse(
            "Bad request.\n" + "\n".join(lines),
            status=400,
            content_type="text/plain; charset=utf-8",
        )


def _problems(request: HttpRequest) -> dict[str, list[str]]:
    problems: dict[str, list[str]] = {}
    path_problem = text.text_problem(request.path)
    if path_problem:
        problems["path"] = [path_problem]
    for key, values in request.GET.lists():
        for value in (key, *values):
            problem = text.text_problem(value)
            if problem:
                problems.setdefault(text.shown_key(key), []).append(problem)
                break
    return problems
