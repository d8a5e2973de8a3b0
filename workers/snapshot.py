"""Code snapshots: a project folder as one content-addressed archive, checked, shipped, unpacked.

A user uploads a folder as a .tar.gz; the console checks every member, packs the files again
in a canonical form (sorted names, no owners, no times, modes 644/755) and names the result by
its SHA-256. Equal folders get equal names however they were packed, so an upload that changes
nothing is stored once. The console puts the archive in Redis under `snapshot_key(sha)`; an
agent reads it from there (the one channel it has, authenticated by Redis's password), checks
the hash, keeps it in its cache and unpacks it into the job's folder.

No member may leave the folder it is unpacked into: absolute names, `..`, links (symbolic or
hard), devices, FIFOs and anything but regular files and folders are refused, both when the
console takes an upload and again when an agent unpacks one: neither trusts the other's check.
No Django here: the agent imports this module.
"""

import gzip
import hashlib
import io
import os
import stat
import tarfile
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import IO

import redis

from workers import contract

SHA256_HEX = 64
# Limits of one snapshot, whatever the console's size limit for the archive itself.
MAX_MEMBERS = 20_000
MAX_UNPACKED_BYTES = 2 * 2**30
MAX_NAME_LENGTH = 1_000
READ_CHUNK = 4 * 2**20  # what an agent reads from Redis at a time
FETCH_WAIT_SECONDS = 30.0  # an archive not in Redis yet (republished on the next start message)


class SnapshotError(ValueError):
    """The archive is refused; the message says which member and why, in words."""


@dataclass(frozen=True)
class Member:
    path: str  # relative, POSIX, normalised
    size: int
    executable: bool


@dataclass(frozen=True)
class Packed:
    sha256: str
    archive: bytes
    files: list[Member]

    @property
    def unpacked_size(self) -> int:
        return sum(m.size for m in self.files)


def is_sha256(value: str) -> bool:
    return len(value) == SHA256_HEX and all(c in "0123456789abcdef" for c in value)


def _member_path(name: str) -> str:
    """The member's name as a safe relative path, or SnapshotError."""
    if "\x00" in name or len(name) > MAX_NAME_LENGTH:
        raise SnapshotError(f"{name[:80]!r}: not a usable file name")
    pure = PurePosixPath(name)
    if pure.is_absolute() or name.startswith(("/", "\\")):
        raise SnapshotError(f"{name!r}: an absolute path (members must be relative)")
    if ".." in pure.parts:
        raise SnapshotError(f"{name!r}: contains '..' (it would leave the folder)")
    parts = [p for p in pure.parts if p not in ("", ".")]
    if not parts:
        return ""
    return "/".join(parts)


def read_members(archive: IO[bytes], max_unpacked_bytes: int = MAX_UNPACKED_BYTES) -> list[Member]:
    """Check every member of a .tar.gz (or plain .tar) and list its files; SnapshotError on
    the first one that is not a plain file or folder inside the archive's root."""
    files: list[Member] = []
    total = 0
    try:
        with tarfile.open(fileobj=archive, mode="r:*") as tar:
            for count, info in enumerate(_members(tar), start=1):
                if count > MAX_MEMBERS:
                    raise SnapshotError(f"more than {MAX_MEMBERS:,} members")
                path = _member_path(info.name)
                if info.isdir():
                    continue
                if info.issym() or info.islnk():
                    raise SnapshotError(f"{info.name!r}: a link (links are not taken)")
                if not info.isreg():
                    raise SnapshotError(f"{info.name!r}: not a regular file (a device or FIFO)")
                if not path:
                    raise SnapshotError(f"{info.name!r}: a file without a name")
                total += info.size
                if total > max_unpacked_bytes:
                    raise SnapshotError(
                        f"its files come to more than {max_unpacked_bytes / 2**20:,.0f} MB"
                    )
                files.append(Member(path, info.size, bool(info.mode & 0o111)))
    except (tarfile.TarError, EOFError, OSError, gzip.BadGzipFile) as exc:
        raise SnapshotError(f"not a readable .tar.gz archive ({exc})") from None
    paths = {m.path for m in files}
    if len(paths) < len(files):
        twice = next(p for p in paths if sum(m.path == p for m in files) > 1)
        raise SnapshotError(f"{twice!r} appears twice")
    for member in files:
        parents = PurePosixPath(member.path).parents
        clash = next((str(p) for p in parents if str(p) in paths), None)
        if clash is not None:
            raise SnapshotError(f"{clash!r} is a file and also a folder of {member.path!r}")
    return files


def _members(tar: tarfile.TarFile) -> Iterator[tarfile.TarInfo]:
    while (info := tar.next()) is not None:
        yield info


def canonical(archive: IO[bytes], max_unpacked_bytes: int = MAX_UNPACKED_BYTES) -> Packed:
    """The checked archive packed again in canonical form, and its SHA-256. `archive` must be
    seekable (an uploaded file): members are copied one at a time, never all held at once."""
    files = read_members(archive, max_unpacked_bytes)
    archive.seek(0)
    with tarfile.open(fileobj=archive, mode="r:*") as tar:
        regular = {_member_path(info.name): info for info in _members(tar) if info.isreg()}

        def open_member(path: str) -> IO[bytes]:
            extracted = tar.extractfile(regular[path])
            assert extracted is not None
            return extracted

        return _pack(files, open_member)


def pack_folder(folder: Path, max_unpacked_bytes: int = MAX_UNPACKED_BYTES) -> Packed:
    """A folder as a canonical archive (links and special files refused, as on upload)."""
    root = folder.resolve()
    files: list[Member] = []
    total = 0
    for path in sorted(root.rglob("*")):
        relative = path.relative_to(root).as_posix()
        mode = path.lstat().st_mode
        if stat.S_ISDIR(mode):
            continue
        if stat.S_ISLNK(mode):
            raise SnapshotError(f"{relative!r}: a link (links are not taken)")
        if not stat.S_ISREG(mode):
            raise SnapshotError(f"{relative!r}: not a regular file")
        size = path.stat().st_size
        total += size
        if total > max_unpacked_bytes:
            raise SnapshotError(f"its files come to more than {max_unpacked_bytes / 2**20:,.0f} MB")
        files.append(Member(relative, size, bool(mode & 0o111)))
        if len(files) > MAX_MEMBERS:
            raise SnapshotError(f"more than {MAX_MEMBERS:,} files")
    return _pack(files, lambda relative: (root / relative).open("rb"))


def _pack(files: list[Member], open_member: Callable[[str], IO[bytes]]) -> Packed:
    out = io.BytesIO()
    # mtime=0 and no file name in the gzip header: the same files give the same bytes.
    with (
        gzip.GzipFile(filename="", mode="wb", fileobj=out, compresslevel=6, mtime=0) as packed,
        tarfile.open(fileobj=packed, mode="w", format=tarfile.PAX_FORMAT) as tar,
    ):
        for member in sorted(files, key=_path):
            info = tarfile.TarInfo(member.path)
            info.size = member.size
            info.mode = 0o755 if member.executable else 0o644
            info.mtime = 0
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            with open_member(member.path) as data:
                tar.addfile(info, data)
    archive = out.getvalue()
    return Packed(hashlib.sha256(archive).hexdigest(), archive, sorted(files, key=_path))


def _path(member: Member) -> str:
    return member.path


def unpack(archive: Path, destination: Path) -> None:
    """Unpack a checked archive into `destination` (made here; it must not exist yet)."""
    with archive.open("rb") as source:
        read_members(source)  # the agent's own check, before anything is written
    destination.mkdir(parents=True)
    with tarfile.open(archive, mode="r:*") as tar:
        # The "data" filter refuses what escapes the folder, again, and drops owners and
        # special permission bits.
        tar.extractall(destination, filter="data")


class SnapshotCache:
    """An agent's archives, by hash, each fetched from Redis once and checked before use."""

    def __init__(self, client: redis.Redis, directory: Path) -> None:
        self._redis = client
        self.directory = directory
        self._lock = threading.Lock()
        self._fetching: dict[str, threading.Lock] = {}
        self.fetches = 0  # archives read from Redis, as opposed to found in the cache

    def archive(self, sha256: str, should_stop: Callable[[], bool] = lambda: False) -> Path:
        """The archive's path in the cache, fetched first if it is not there."""
        if not is_sha256(sha256):
            raise SnapshotError(f"{sha256[:80]!r} is not a SHA-256")
        path = self.directory / f"{sha256}.tar.gz"
        with self._lock:
            one_fetch = self._fetching.setdefault(sha256, threading.Lock())
        with one_fetch:  # two replicas of a job on this node fetch it once
            if not path.exists():
                self._fetch(sha256, path, should_stop)
        return path

    def checkout(
        self, sha256: str, destination: Path, should_stop: Callable[[], bool] = lambda: False
    ) -> Path:
        """The snapshot unpacked at `destination`, once: replicas and attempts of a job on this
        node share it. Unpacked beside it and renamed, so a half-unpacked folder is never used."""
        if destination.is_dir():
            return destination
        archive = self.archive(sha256, should_stop)
        destination.parent.mkdir(parents=True, exist_ok=True)
        with self._lock:
            one_checkout = self._fetching.setdefault(f"checkout:{destination}", threading.Lock())
        with one_checkout:
            if not destination.is_dir():
                staging = Path(tempfile.mkdtemp(prefix=".code-", dir=destination.parent))
                staging.rmdir()
                unpack(archive, staging)
                # mkdtemp's 0700 would keep out the trainers, which run as the job's user.
                staging.chmod(0o755)
                os.replace(staging, destination)
        return destination

    def _fetch(self, sha256: str, path: Path, should_stop: Callable[[], bool]) -> None:
        key = contract.snapshot_key(sha256)
        deadline = time.monotonic() + FETCH_WAIT_SECONDS
        while not self._redis.exists(key):
            if should_stop():
                raise SnapshotError("stopped while waiting for the code snapshot")
            if time.monotonic() > deadline:
                raise SnapshotError(
                    f"code snapshot {sha256[:12]} is not in Redis (not published, or Redis "
                    f"lost it); waited {FETCH_WAIT_SECONDS:.0f} s"
                )
            time.sleep(0.2)
        self.directory.mkdir(parents=True, exist_ok=True)
        digest = hashlib.sha256()
        with tempfile.NamedTemporaryFile(dir=self.directory, prefix=".fetch-", delete=False) as f:
            temporary = Path(f.name)
            try:
                offset = 0
                while True:
                    chunk = self._redis.getrange(key, offset, offset + READ_CHUNK - 1)
                    if not chunk:
                        break
                    assert isinstance(chunk, bytes)
                    digest.update(chunk)
                    f.write(chunk)
                    offset += len(chunk)
            except BaseException:
                temporary.unlink(missing_ok=True)
                raise
        if digest.hexdigest() != sha256:
            temporary.unlink(missing_ok=True)
            raise SnapshotError(
                f"code snapshot {sha256[:12]} read from Redis does not match its hash "
                f"(got {digest.hexdigest()[:12]}, {offset:,} bytes)"
            )
        os.replace(temporary, path)
        self.fetches += 1
