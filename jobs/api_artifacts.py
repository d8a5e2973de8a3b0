"""API v1 operations on a job's artifacts: list its checkpoints and outputs, download one
(jobs/services/artifacts.py). The owner and staff only, as every job's data: another user gets
404, the same as for a job that does not exist. Registered on jobs.api's NinjaAPI, whose
refusals they share; console/urls.py imports this module beside it."""

from datetime import datetime
from typing import Any, Literal

from django.http import HttpRequest, StreamingHttpResponse
from django.http.response import HttpResponseBase
from django.utils.http import content_disposition_header
from pydantic import BaseModel, ConfigDict, Field

from jobs.access import get_job_for
from jobs.api import ERRORS, ApiError, _download, api
from jobs.services import artifacts

# Where the agents could not be asked, or did not answer, or the file went away.
ARTIFACT_ERRORS = {**ERRORS, 410: ERRORS[404], 503: ERRORS[404]}


class _Out(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ArtifactOut(_Out):
    path: str = Field(
        description="checkpoints/… (its checkpoint folder, TRAINYARD_CHECKPOINT_DIR) or "
        "outputs/… (what it wrote in its working folder); GET …/artifacts/PATH downloads it."
    )
    kind: Literal["checkpoint", "output"]
    size: int = Field(description="Bytes.")
    modified: datetime


class RefusedArtifactOut(_Out):
    path: str
    reason: str = Field(description="Why it is not served: a link, a FIFO, a hard link, …")


class ArtifactListOut(_Out):
    """A job's files, as a node that can reach its folders saw them."""

    node: str = Field(description="The node whose agent listed them.")
    files: list[ArtifactOut]
    refused: list[RefusedArtifactOut] = Field(
        description="Entries of the job's folders that are not served, with the reason."
    )
    truncated: bool = Field(description="The listing stopped at its bounds.")
    notes: list[str] = Field(description="What the user should know: files removed, …")


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
