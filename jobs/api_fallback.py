"""Answers under /api/ that Django or ninja make before any API view runs, in the API's form.

A path under /api/ that matches no operation (`/api/v1/jobs/2.5`, `/api/v2/...`) would get
Django's HTML 404 page, and a known path with the wrong method ninja's empty 405: a client
that parses every answer as `{"errors": {field: [message]}}` should get that form here too.
"""

import json
from collections.abc import Callable

from django.http import HttpRequest, HttpResponse
from django.http.response import HttpResponseBase

API_PREFIX = "/api/"


class ApiFallbackErrorsMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponseBase]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponseBase:
        response = self.get_response(request)
        if not request.path.startswith(API_PREFIX):
            return response
        if response.get("Content-Type", "").startswith("application/json"):
            return response  # an API view's own answer
        if response.status_code == 404:
            return _errors(404, f"No API operation at {request.path}; see /api/v1/docs.")
        if response.status_code == 405:
            allowed = response.get("Allow", "")
            answer = _errors(
                405, f"{request.method} is not allowed on {request.path}; allowed: {allowed}."
            )
            answer["Allow"] = allowed
            return answer
        return response


def _errors(status: int, message: str) -> HttpResponse:
    return errors_response(status, {"request": [message]})


def errors_response(status: int, errors: dict[str, list[str]]) -> HttpResponse:
    """The API's form of a refusal, for answers made outside any API view."""
    body = json.dumps({"errors": errors})
    return HttpResponse(body, status=status, content_type="application/json")
