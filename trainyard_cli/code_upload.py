"""A request's code folder sent as a code snapshot, and taken back when the request is refused.

`trainyard submit` sends a job request and `trainyard search submit` an experiment whose
template is one; both upload the script's folder first and name the snapshot in the job's
`program`, so that the job (or every trial) runs exactly the files the user has here.
"""

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from trainyard_cli import jobfile, render, upload
from trainyard_cli.client import Api
from trainyard_cli.errors import BAD_INPUT, CliError

Answer = TypeVar("Answer")


@dataclass(frozen=True)
class Uploaded:
    sha256: str
    new: bool  # you had not uploaded these files before (whoever else may have)


def send_with_code(
    api: Api,
    job: dict[str, Any],
    folder: Path | None,
    no_upload: bool,
    quiet: bool,
    send: Callable[[], Answer],
) -> Answer:
    """Upload the code of the job request `job` (its program gets the snapshot), then `send`
    the request it belongs to. A request refused, unreachable or interrupted takes its upload
    back with it, so that a bad file leaves nothing behind."""
    uploaded = upload_code(api, job, folder, no_upload, quiet)
    if uploaded:
        job["program"] = {**job["program"], "snapshot": uploaded.sha256}
    try:
        return send()
    except BaseException:  # refused, unreachable, or Ctrl-C: the upload goes with it
        if uploaded and uploaded.new:
            take_back(api, uploaded.sha256)
        raise


def upload_code(
    api: Api, body: dict[str, Any], folder: Path | None, no_upload: bool, quiet: bool
) -> Uploaded | None:
    """Upload the job's code folder when the script is in it.

    With no folder named, the current one is uploaded if it holds the script; otherwise the
    console runs a script of its own (a built-in example or its code root) by that name."""
    script = jobfile.script_of(body)
    program = body.get("program")
    if no_upload or not script or (isinstance(program, dict) and program.get("snapshot")):
        return None
    explicit = folder is not None
    folder = folder or Path.cwd()
    if not (folder / script).is_file():
        if explicit:
            raise CliError(f"program.script: {script} is not a file in {folder}.", BAD_INPUT)
        if not quiet:
            render.note(f"{script} is not in this folder: the console runs its own {script}.")
        return None
    packed = upload.pack(folder)
    for link in packed.skipped_links:
        render.note(f"left out {link}: a symbolic link", style="yellow")
    if packed.ignored and not quiet:
        render.note(ignored_words(packed.ignored), style="yellow")
    answer = api.post(
        "/snapshots",
        files={"archive": ("code.tar.gz", packed.archive, "application/gzip")},
        # A folder whose name is not text (bytes that were not UTF-8) goes without one.
        data={"name": "" if jobfile.first_unusable_character(folder.name) else folder.name},
    )
    if not quiet:
        held = "new" if answer["new"] else "you had uploaded these files before"
        render.note(
            f"Uploaded {folder.name}/: {len(packed.files)} files, "
            f"{render.human_bytes(packed.size)} as code {answer['sha256'][:12]} ({held})."
        )
    return Uploaded(str(answer["sha256"]), bool(answer["new"]))


def take_back(api: Api, sha256: str) -> None:
    """A refused request leaves nothing behind: not even the code uploaded for it (only when
    these files were new from you: an earlier upload of yours stays in your list). The
    console keeps the files themselves while anyone else's upload or job still needs them."""
    try:
        api.delete(f"/snapshots/{sha256}")
    except CliError as exc:
        render.note(f"The code uploaded for it stays ({exc.message}).")


def ignored_words(ignored: list[str], shown: int = 5) -> str:
    """What the folder's ignore files left out, and how to send it after all."""
    names = ", ".join(ignored[:shown]) + (
        f" and {len(ignored) - shown} more" if ignored[shown:] else ""
    )
    return (
        f"left out what .gitignore or .trainyardignore names: {names}. A script that needs it "
        f"fails without it: to upload it, add a line `!{ignored[0]}` to .trainyardignore "
        "(git's rules; docs/cli.md)."
    )
