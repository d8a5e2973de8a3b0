"""`trainyard artifacts JOB [PATH] [-o FILE]`: list a job's checkpoints and outputs, or download
one (GET /api/v1/jobs/ID/artifacts[/PATH]).

A download is written as it arrives into a temporary file beside the target and renamed into
place only once every byte the console announced has come: a broken download leaves no file
that looks whole, and the file is never held in memory.
"""

import os
import tempfile
import urllib.parse
from pathlib import Path
from typing import Annotated

import httpx
import typer

from trainyard_cli import config, render
from trainyard_cli.client import Api, refusal
from trainyard_cli.errors import BAD_INPUT, UNAVAILABLE, CliError

JobId = Annotated[
    int, typer.Argument(metavar="JOB", help="The job's number, as `trainyard ls` shows it.")
]
ArtifactPath = Annotated[
    str | None,
    typer.Argument(
        metavar="PATH",
        help="A file the listing shows (checkpoints/… or outputs/…): download it.",
        show_default=False,
    ),
]
Output = Annotated[
    Path | None,
    typer.Option(
        "--output",
        "-o",
        help="Where to write the download (replaced if it exists); default: the file's name "
        "here, which must not exist yet.",
        show_default=False,
    ),
]
Json = Annotated[bool, typer.Option("--json", help="Print the API's answer as JSON.")]


def artifacts(
    job_id: JobId, path: ArtifactPath = None, output: Output = None, json_output: Json = False
) -> None:
    """The job's checkpoints and outputs (size, modified); with PATH, download that file."""
    api = Api(config.load())
    try:
        if path is None:
            _list(api, job_id, json_output)
        else:
            check_path(path)
            target = output if output is not None else Path(path.rsplit("/", 1)[-1])
            if output is None and target.exists():
                raise CliError(f"{target} exists already; name another with -o FILE.", BAD_INPUT)
            size = download(api, job_id, path, target)
            render.note(f"Saved {path} of job {job_id} to {target} ({render.human_bytes(size)}).")
    finally:
        api.close()


def _list(api: Api, job_id: int, json_output: bool) -> None:
    answer = api.get(f"/jobs/{job_id}/artifacts")
    if json_output:
        render.print_json(answer)
        return
    if answer["files"]:
        render.table(
            ["PATH", "KIND", "SIZE", "MODIFIED"],
            [
                [
                    f["path"],
                    f["kind"],
                    render.human_bytes(f["size"]),
                    render.local_time(f["modified"]),
                ]
                for f in answer["files"]
            ],
        )
    else:
        render.note(f"Job {job_id} has no files to download.")
    for refused in answer["refused"]:
        render.note(f"Not served: {refused['path']}: {refused['reason']}")
    for note in answer["notes"]:
        render.note(note)


def check_path(path: str) -> None:
    """Refuse here what an HTTP client would rewrite before the console sees it (`a/../b`
    becomes `b`): the console checks the rest, and says what is wrong."""
    names = path.split("/")
    if path.startswith("/") or "\x00" in path or any(n in ("", ".", "..") for n in names):
        raise CliError(
            f"{path!r}: give a path as the listing shows it (checkpoints/… or outputs/…), "
            "relative, with no '..', '.' or empty name.",
            BAD_INPUT,
        )


def download(api: Api, job_id: int, path: str, target: Path) -> int:
    """Stream the file to `target`; the number of bytes written."""
    url = f"/jobs/{job_id}/artifacts/{urllib.parse.quote(path, safe='/')}"
    folder = target.parent if str(target.parent) else Path(".")
    handle, partial = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".part", dir=folder)
    written = 0
    try:
        with os.fdopen(handle, "wb") as out, api.http.stream("GET", url) as response:
            if response.status_code >= 400:
                response.read()
                raise refusal(response)
            expected = int(response.headers.get("Content-Length", -1))
            for chunk in response.iter_bytes():
                out.write(chunk)
                written += len(chunk)
        if expected >= 0 and written != expected:
            raise CliError(
                f"The download of {path} stopped at {written:,} of {expected:,} bytes.",
                UNAVAILABLE,
            )
        os.replace(partial, target)
    except httpx.TransportError as exc:
        raise CliError(f"The download of {path} broke: {exc}", UNAVAILABLE) from None
    finally:
        if os.path.exists(partial):
            os.unlink(partial)
    return written
