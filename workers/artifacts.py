"""A job's artifacts, as its node agent serves them to the console: what its trainers saved in
its checkpoint folder (TRAINYARD_CHECKPOINT_DIR) and what they wrote in its working folder
(workers/workfolder.py), listed and read in bounded chunks.

Only the agents reach the checkpoint root, and they run as root while the files are the job's:
every folder and file is opened through workers/jobfiles.py (nothing followed, no FIFO opened,
only regular files of the job's uid with one link), and a path from the console is checked
here as well, so that no request names a file outside the job's two folders.

Paths are the console's names for the files: `checkpoints/<path in the checkpoint folder>` and
`outputs/<path in the working folder>`. The working folder's `.code/` (the job's code
snapshot), the top-level links into it (the code's own files) and the platform's markers
(`.trainyard*`) are no output and are never listed or read.

The agent answers the console on a reply list of its own in Redis (agentreply.py): each
request names where, the console waits for it there.
"""

import errno
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from workers import agentreply, checkpoint_retention, jobfiles, workfolder

CHECKPOINTS = "checkpoints"
OUTPUTS = "outputs"
KINDS = {CHECKPOINTS: "checkpoint", OUTPUTS: "output"}
# A listing looks at no more entries than this, and goes no deeper into folders: a job may
# nest a million files, and one answer must stay small (about 100 bytes an entry).
MAX_ENTRIES = 2000
MAX_DEPTH = 8
# What one read answers at most: the console asks chunk by chunk, each through Redis.
CHUNK_BYTES = 4 << 20
MAX_PATH_CHARS = 4096
# The platform's own names in a job's folders (the checkpoint folder's marker, `.trainyard-job`).
PLATFORM_PREFIX = ".trainyard"


class BadPath(ValueError):
    """A path that names no file of a job's artifacts; the message says why."""


def check_path(path: str) -> tuple[str, tuple[str, ...]]:
    """(the top folder, CHECKPOINTS or OUTPUTS; the names below it) of a console path, or
    BadPath: no absolute path, no `..`, `.` or empty name, no NUL, nothing of the code or the
    platform."""
    if not isinstance(path, str) or not path:
        raise BadPath("no path given")
    if len(path) > MAX_PATH_CHARS:
        raise BadPath(f"the path is longer than {MAX_PATH_CHARS} characters")
    if "\x00" in path:
        raise BadPath("the path holds a NUL character")
    if path.startswith("/"):
        raise BadPath("the path must be relative (checkpoints/… or outputs/…), not absolute")
    top, *names = path.split("/")
    if top not in KINDS:
        raise BadPath(f"the path must start with {CHECKPOINTS}/ or {OUTPUTS}/")
    if not names:
        raise BadPath(f"the path names the {top} folder, not a file in it")
    for name in names:
        if name in ("", ".", ".."):
            raise BadPath(f"the path may not hold an empty name, '.' or '..' ({name!r})")
    if names[0].startswith(PLATFORM_PREFIX) or (top == OUTPUTS and names[0] == workfolder.CODE_DIR):
        raise BadPath(f"{names[0]} is the platform's, not an artifact of the job")
    return top, tuple(names)


@dataclass(frozen=True)
class JobFolders:
    """Where one job's artifacts are on this node, and whose they are."""

    checkpoint_root: Path
    job_id: int
    checkpoint_key: str
    uid: int

    def __post_init__(self) -> None:
        if not checkpoint_retention.is_key(self.checkpoint_key):
            raise BadPath("the job's checkpoint key is not one the console makes")

    def folder(self, top: str) -> Path:
        if top == CHECKPOINTS:
            return self.checkpoint_root / workfolder.folder_name(self.job_id, self.checkpoint_key)
        return workfolder.folder_of(self.checkpoint_root, self.job_id, self.checkpoint_key)


def _not_an_output(work_fd: int, name: str, found: os.stat_result) -> bool:
    """The working folder's entries that are no output of the job: its code, the links to
    the code's own files (`data.csv -> .code/data.csv`, or absolute into a shared code
    root), the platform's markers."""
    if name == workfolder.CODE_DIR or name.startswith((PLATFORM_PREFIX, workfolder.STAGING_PREFIX)):
        return True
    if not stat.S_ISLNK(found.st_mode):
        return False
    try:
        target = os.readlink(name, dir_fd=work_fd)  # the link's own text: nothing followed
    except OSError:
        return False
    return target == f"{workfolder.CODE_DIR}/{name}" or (
        target.startswith("/") and target.endswith(f"/{name}")
    )


def _not_a_checkpoint(_fd: int, name: str, _found: os.stat_result) -> bool:
    return name.startswith(PLATFORM_PREFIX)


def listing(job: JobFolders) -> dict[str, Any]:
    """Both folders' files: {"files": [{path, kind, size, mtime}], "refused": [{path,
    reason}], "truncated", "missing": [top folders not there]}, paths sorted."""
    files: list[dict[str, Any]] = []
    refused: list[dict[str, str]] = []
    missing: list[str] = []
    truncated = False
    left = MAX_ENTRIES
    for top, leave_out in ((CHECKPOINTS, _not_a_checkpoint), (OUTPUTS, _not_an_output)):
        try:
            found = jobfiles.list_tree(
                job.folder(top), job.checkpoint_root, job.uid, left, MAX_DEPTH, leave_out
            )
        except FileNotFoundError:
            missing.append(top)
            continue
        except jobfiles.UnsafeFile as exc:
            refused.append({"path": top, "reason": in_console_words(str(exc), job)})
            continue
        for name, st in found.files:
            if _is_text(name):
                files.append(
                    {"path": f"{top}/{name}", "kind": KINDS[top], "size": st.st_size,
                     "mtime": st.st_mtime}
                )  # fmt: skip
            else:
                refused.append({"path": _shown(f"{top}/{name}"), "reason": "its name is not UTF-8"})
        refused += [{"path": _shown(f"{top}/{name}"), "reason": why} for name, why in found.refused]
        truncated = truncated or found.truncated
        left = max(0, left - len(found.files) - len(found.refused))
    return {"files": files, "refused": refused, "truncated": truncated, "missing": missing}


def in_console_words(reason: str, job: JobFolders) -> str:
    """A refusal with the job's folders named as the console names them (checkpoints/…,
    outputs/…): where the node keeps them is the node's business, not the job owner's."""
    for top in (OUTPUTS, CHECKPOINTS):  # the working folder lies below the checkpoint root
        for folder in {str(job.folder(top)), os.path.realpath(job.folder(top))}:
            reason = reason.replace(folder, top)
    return reason


def _is_text(name: str) -> bool:
    """Whether a name (from os.listdir: bytes that are not UTF-8 come as lone surrogates) is
    UTF-8 text, which a path in a URL and a JSON answer can carry."""
    try:
        name.encode()
    except UnicodeEncodeError:
        return False
    return True


def _shown(name: str) -> str:
    """A name as text, whatever its bytes: what is not UTF-8 shows as U+FFFD."""
    return name.encode(errors="surrogateescape").decode(errors="replace")


def read_chunk(job: JobFolders, path: str, offset: int, length: int = CHUNK_BYTES) -> Any:
    """(the file's size, a version that changes when the file is replaced or written, up to
    min(length, CHUNK_BYTES) bytes from `offset`) of the job's file at console path `path`.
    BadPath for a path that names no artifact, FileNotFoundError, or jobfiles.UnsafeFile
    with the reason for a link, FIFO, hard link or a file of another owner."""
    top, names = check_path(path)
    if offset < 0 or length < 0:
        raise BadPath("offset and length must not be negative")
    folder = job.folder(top)
    try:
        fd = jobfiles.open_file(folder.joinpath(*names), job.checkpoint_root, job.uid)
    except NotADirectoryError:
        raise FileNotFoundError(errno.ENOENT, "no such file", path) from None
    try:
        found = os.fstat(fd)
        data = os.pread(fd, min(length, CHUNK_BYTES), offset)
    finally:
        os.close(fd)
    version = f"{found.st_dev}:{found.st_ino}:{found.st_mtime_ns}:{found.st_size}"
    return found.st_size, version, data


# --- the agent's tasks (workers/agent.py): answer on the request's reply list ---


def serve(
    request: dict[str, Any], *, client: Any, node: str, checkpoint_root: Path, sandbox: Any
) -> None:
    """Answer a TASK_LIST_ARTIFACTS (no "path") or TASK_READ_ARTIFACT request: {job_id,
    checkpoint_key, owner, uid, gid (the owner's own identity's; -1: none), container,
    reply_to[, path, offset]}. The answer's header is
    {"ok": true, ...} or {"error": "bad-path" | "not-found" | "refused" | "failed",
    "message"}; a chunk's bytes follow its header."""
    header: dict[str, Any]
    data = b""
    reply_to = request.get("reply_to", "")
    try:
        job = JobFolders(
            checkpoint_root,
            int(request["job_id"]),
            str(request["checkpoint_key"]),
            sandbox.file_owner(
                sandbox.user_of(
                    int(request["owner"]), int(request.get("uid", -1)), int(request.get("gid", -1))
                ),
                bool(request.get("container")),
            ),
        )
        if "path" in request:
            size, version, data = read_chunk(job, request["path"], int(request.get("offset", 0)))
            header = {"ok": True, "size": size, "version": version}
        else:
            header = {"ok": True, **listing(job)}
    except BadPath as exc:
        header = {"error": "bad-path", "message": str(exc)}
    except FileNotFoundError:
        header = {"error": "not-found", "message": f"no such file: {request.get('path')}"}
    except jobfiles.UnsafeFile as exc:
        header = {"error": "refused", "message": f"not served: {in_console_words(str(exc), job)}"}
    except (OSError, KeyError, TypeError, ValueError) as exc:
        header = {"error": "failed", "message": f"{node} could not read it: {exc}"}
    header["node"] = node
    agentreply.answer(client, node, reply_to, header, data)
