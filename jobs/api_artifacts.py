"""API v1 operations on a job's artifacts: list its checkpoints and outputs, download one
(jobs/services/artifacts.py). The owner and staff only, as every job's data: another user gets
404, the same as for a job that does not exist. Registered on jobs.api's NinjaAPI, whose
refusals they share; console/urls.py imports this module beside it."""

from typing import Any

from django.http import HttpRequest, StreamingHttpResponse
from django.http.response import HttpResponseBase
from django.utils.http import content_disposition_header

from jobs.access import get_job_for
from jobs.api import ERRORS, ApiError, _download, api
from jobs.schemas import ArtifactListOut
from jobs.services import artifacts

# Where the agents could not be asked, or did not answer, or the file went away.
ARTIFACT_ERRORS = {**ERRORS, 410: ERRORS[404], 503: ERRORS[404]}


def _refusal(exc: artifacts.ArtifactsUnavailable) -> ApiError:
    return ApiError(exc.status, exc.field, str(exc))


@api.get(
    "/jobs/{int:job_id}/artifacts",
    response={200: ArtifactListOut, **ARTIFACT_ERRORS},
    tags=["artifacts"],
    url_name="api_job_artifacts",
)
def job_artifacts(request: HttpRequest, job_id: int) -> dict[str, Any]:
    """The job's checkpoints and outputs, from a node it ran on whose agent is alive (503
    names the nodes when none can be asked or the one asked did not answer)."""
    job = get_job_for(request.user, job_id)
    try:
        return artifacts.list_files(job)
    except artifacts.ArtifactsUnavailable as exc:
        raise _refusal(exc) from None


@api.get(
    "/jobs/{int:job_id}/artifacts/{path:path}",
    response={200: None, **ARTIFACT_ERRORS},
    tags=["artifacts"],
    openapi_extra=_download("application/octet-stream", "The file, streamed."),
    url_name="api_job_artifact",
)
def job_artifact(request: HttpRequest, job_id: int, path: str) -> HttpResponseBase:
    """Download one file of the job's, by the path its listing gives: 400 for a path that
    names none (absolute, `..`), 404 when it is not there, 409 when it is not the job's own
    regular file (a link, a FIFO, a hard link), 410 when retention removed it."""
    job = get_job_for(request.user, job_id)
    try:
        found = artifacts.download(job, path)
    except artifacts.ArtifactsUnavailable as exc:
        raise _refusal(exc) from None
    response = StreamingHttpResponse(found.chunks, content_type="application/octet-stream")
    response["Content-Length"] = str(found.size)
    # The name is the job's: quoted (RFC 6266), never a header of its own.
    response["Content-Disposition"] = content_disposition_header(True, found.name) or "attachment"
    response["X-Content-Type-Options"] = "nosniff"
    response["X-Trainyard-Node"] = found.node
    return response
