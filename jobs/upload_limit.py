"""The size limit of a code snapshot upload, enforced before the body is read.

Django counts only the non-file fields of a multipart body against DATA_UPLOAD_MAX_MEMORY_SIZE,
and spools files to disk whatever their size. A body that says it is too large is refused
before a byte of it is read; one that does not say (chunked) is cut off once it has sent more
than the limit.
"""

from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from django.core.files.uploadhandler import FileUploadHandler
from django.http import HttpRequest, JsonResponse
from django.http.response import HttpResponseBase

UPLOAD_PATH = "/api/v1/snapshots"
# Room for the multipart framing and the name field around the archive itself.
FRAMING_BYTES = 64 * 1024


class ArchiveTooBig(RequestDataTooBig):
    def __init__(self) -> None:
        limit = settings.TRAINYARD_SNAPSHOT_MAX_BYTES
        super().__init__(
            f"The archive is larger than {limit / 2**20:,.0f} MB "
            "(TRAINYARD_SNAPSHOT_MAX_MB); leave data sets and checkpoints out of it."
        )


class _CountingHandler(FileUploadHandler):
    """First in line: counts the bytes of every uploaded file and stops at the limit."""

    def __init__(self, request: HttpRequest, limit: int) -> None:
        super().__init__(request)
        self.limit = limit
        self.received = 0

    def receive_data_chunk(self, raw_data: bytes, start: int) -> bytes:
        self.received += len(raw_data)
        if self.received > self.limit:
            raise ArchiveTooBig()
        return raw_data

    def file_complete(self, file_size: int) -> Any:
        return None


class SnapshotUploadLimitMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponseBase]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponseBase:
        if request.method == "POST" and request.path == UPLOAD_PATH:
            limit = settings.TRAINYARD_SNAPSHOT_MAX_BYTES
            try:
                declared = int(request.META.get("CONTENT_LENGTH") or 0)
            except ValueError:
                declared = 0
            if declared > limit + FRAMING_BYTES:
                return JsonResponse({"errors": {"archive": [str(ArchiveTooBig())]}}, status=413)
            request.upload_handlers.insert(0, _CountingHandler(request, limit))
        return self.get_response(request)
