"""Small tmpfs mounts for full-disk tests (root only: the test machines run as root).

Each is mounted on a folder of its own, made here, and unmounted however the test ends; no
other mount is touched. Where mounting is impossible the test fails, loudly: a full-disk case
must not pass untested.
"""

import contextlib
import errno
import os
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

UNMOUNT_WAIT_SECONDS = 30.0  # a hang guard: a keeper ends within seconds of its processes


@contextlib.contextmanager
def small_tmpfs(size: str) -> Iterator[Path]:
    """A tmpfs of `size` ("4m") on a new folder."""
    folder = Path(tempfile.mkdtemp(prefix="trainyard-full-"))
    try:
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs", str(folder)],
            check=True,
            capture_output=True,
        )
    except (OSError, subprocess.CalledProcessError) as exc:
        folder.rmdir()
        raise AssertionError(
            f"cannot mount a tmpfs for a full-disk test (root needed): {exc}"
        ) from exc
    try:
        yield folder
    finally:
        _unmount(folder)


def _unmount(folder: Path) -> None:
    """Unmount, waiting for what still has files open there (a keeper that is ending) to let
    go; if something still holds it after the wait, detach it anyway, so that no test leaves a
    mount behind, and fail naming the folder."""
    deadline = time.monotonic() + UNMOUNT_WAIT_SECONDS
    while subprocess.run(["umount", str(folder)], capture_output=True).returncode != 0:
        if time.monotonic() > deadline:
            subprocess.run(["umount", "--lazy", str(folder)], check=True)
            folder.rmdir()
            raise AssertionError(f"{folder} was still in use at the end of the test")
        time.sleep(0.1)
    folder.rmdir()


def fill(folder: Path, name: str = "filler") -> Path:
    """Write a file in `folder` until its file system has no block left."""
    path = folder / name
    chunk = b"\0" * 65536
    with open(path, "wb", buffering=0) as f:
        try:
            while True:
                f.write(chunk)
        except OSError as exc:
            if exc.errno != errno.ENOSPC:
                raise
        # Then what is left of the last blocks, in ever smaller writes.
        size = len(chunk) // 2
        while size:
            try:
                f.write(b"\0" * size)
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
                size //= 2
    assert os.statvfs(folder).f_bavail == 0
    return path
