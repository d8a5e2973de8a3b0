"""A console disk that fills: 507 Insufficient Storage with a clear message, never a 500.

Whatever writes (the database growing, Django spooling an upload to a temporary file) fails
inside a transaction, which rolls back: no half-written row stays behind. This middleware only
turns that failure into an answer the user can act on, in the API's form under /api/ and as a
page elsewhere, and logs it for the administrators. Any other error is left alone.
"""

import contextlib
import logging
from collections.abc import Callable

from django.db import DatabaseError
from django.http import HttpRequest, HttpResponse
from django.http.response import HttpResponseBase
from django.shortcuts import render

from jobs.api_fallback import API_PREFIX, errors_response
from workers.diskspace import is_no_room

log = logging.getLogger(__name__)

INSUFFICIENT_STORAGE = 507
MESSAGE = (
    "The console's disk is full: nothing was saved. Try again once an administrator has "
    "freed space."
)
# How the databases say it. SQLite: SQLITE_FULL. PostgreSQL: SQLSTATE 53100 (disk_full),
# whose message is "could not extend file ...: No space left on device".
_SQLITE_FULL = "database or disk is full"
_POSTGRES_DISK_FULL = "53100"
_NO_SPACE = "No space left on device"


def is_disk_full(exc: BaseException) -> bool:
    if is_no_room(exc):
        return True
    if not isinstance(exc, DatabaseError):
        return False
    cause = exc.__cause__
    if getattr(cause, "sqlstate", None) == _POSTGRES_DISK_FULL:
        return True
    text = str(exc)
    return _SQLITE_FULL in text or _NO_SPACE in text


class DiskFullMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponseBase]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponseBase:
        return self.get_response(request)

    def process_exception(self, request: HttpRequest, exc: Exception) -> HttpResponse | None:
        if not is_disk_full(exc):
            return None
        log.error("%s %s refused: the disk is full (%s)", request.method, request.path, exc)
        # An upload cut short leaves its partial temporary file open, taking the very space
        # that ran out, for as long as the request lives: remove it now.
        for handler in getattr(request, "_upload_handlers", None) or []:
            with contextlib.suppress(OSError):
                handler.upload_interrupted()
        if request.path.startswith(API_PREFIX):
            return errors_response(INSUFFICIENT_STORAGE, {"storage": [MESSAGE]})
        return render(request, "disk_full.html", {"message": MESSAGE}, status=INSUFFICIENT_STORAGE)
