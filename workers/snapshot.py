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
import logging
import os
import tarfile
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import redis

from workers import contract

log = logging.getLogger(__name__)

SHA256_HEX = 64
# Limits of one snapshot, whatever the console's size limit for the archive itself.
MAX_MEMBERS = 20_000
MAX_UNPACKED_BYTES = 2 * 2**30
MAX_NAME_LENGTH = 1_000
MAX_DEPTH = 64  # folders; PATH_MAX allows more, projects need far fewer
# A PAX header holds a member's long name (at most MAX_NAME_LENGTH characters, 4 bytes each in
# UTF-8) and attributes such as macOS's extended attributes; a GNU long name, only the name.
MAX_EXTENDED_HEADER_BYTES = 256 * 2**10
MAX_EXTENDED_BYTES = 16 * 2**20  # all of an archive's extended headers together
MAX_HEADERS_PER_MEMBER = 6  # global PAX, PAX, GNU long name, GNU long link, the member's own
# CPU time one archive's check may take: several times what the largest archive the other
# limits allow needs (20,000 members: about a second), and a ceiling on what one built to be
# slow can cost whatever else it tries.
CHECK_CPU_SECONDS = 10.0
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
    if len(name) > MAX_NAME_LENGTH:
        raise SnapshotError(f"{name[:80]!r}...: a name of more than {MAX_NAME_LENGTH:,} characters")
    if not is_printable_name(name):
        raise SnapshotError(
            f"{name[:200]!r}: not a usable file name (names must be printable UTF-8, without "
            "control characters, direction overrides or backslashes)"
        )
    if name.startswith("/"):
        raise SnapshotError(f"{name!r}: an absolute path (members must be relative)")
    # Plain string work, not PurePosixPath: this runs for every member, 20,000 of them at most.
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise SnapshotError(f"{name!r}: contains '..' (it would leave the folder)")
    if len(parts) > MAX_DEPTH:
        raise SnapshotError(f"{name[:80]!r}...: more than {MAX_DEPTH} folders deep")
    return "/".join(parts)


def is_printable_name(name: str) -> bool:
    """A name a person can read as it is and that means the same on every system: printable
    (which rules out control characters, lone surrogates, i.e. bytes that were not UTF-8, and
    format characters such as direction overrides, that make `exe.py` of `yp.exe`), and no
    backslash, which Windows tools read as a folder separator (`..\\..\\x`)."""
    return name.isprintable() and "\\" not in name and not _BIDI_CONTROLS.intersection(name)


# Unicode's bidirectional controls. str.isprintable() already refuses them (category Cf); the
# list says what the name check is there for, should that ever change.
_BIDI_CONTROLS = frozenset(
    "\u200e\u200f\u061c\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069"
)


class _Budget:
    """What one archive may still cost while it is read: header bytes, members, CPU time."""

    def __init__(self, cpu_seconds: float) -> None:
        # thread_time: the CPU this thread spends; a web server's other requests do not count.
        self.cpu_deadline = time.thread_time() + cpu_seconds
        self.cpu_seconds = cpu_seconds
        self.extended_bytes = 0
        self.headers_of_member = 0

    def check_cpu(self) -> None:
        if time.thread_time() > self.cpu_deadline:
            raise SnapshotError(
                f"checking it took more than {self.cpu_seconds:g} s of CPU time; "
                "send fewer or smaller files"
            )


class _CheckedTarInfo(tarfile.TarInfo):
    """tarfile's reader with limits on what it reads before it hands a member over.

    tarfile reads a PAX or GNU extended header (long names and links) into memory whole, as
    large as the header says, and follows chains of them; a 1 MB upload can declare a
    gigabyte. `_proc_member` is tarfile's documented hook for subclasses: every header passes
    through it, before its data is read."""

    def _proc_member(self, tarfile_: tarfile.TarFile) -> tarfile.TarInfo:
        assert isinstance(tarfile_, _CheckedTarFile)
        budget = tarfile_.budget
        budget.check_cpu()
        budget.headers_of_member += 1
        if budget.headers_of_member > MAX_HEADERS_PER_MEMBER:
            raise SnapshotError(
                f"a member with more than {MAX_HEADERS_PER_MEMBER - 1} extended headers"
            )
        if self.type == tarfile.GNUTYPE_SPARSE:
            raise SnapshotError(f"{self.name[:200]!r}: a sparse file (not taken)")
        if self.type in _EXTENDED_HEADERS:
            if self.size > MAX_EXTENDED_HEADER_BYTES:
                raise SnapshotError(
                    f"an extended header (PAX or GNU long name) of {self.size:,} bytes; "
                    f"at most {MAX_EXTENDED_HEADER_BYTES:,}"
                )
            budget.extended_bytes += self.size
            if budget.extended_bytes > MAX_EXTENDED_BYTES:
                raise SnapshotError(
                    f"its extended headers come to more than {MAX_EXTENDED_BYTES:,} bytes"
                )
        return super()._proc_member(tarfile_)  # type: ignore[misc]

    # GNU sparse files described in PAX headers: version 1.0's map is read by a loop that
    # never ends on a truncated archive. Snapshots hold plain files only.
    def _proc_gnusparse_00(self, *args: object) -> None:
        raise SnapshotError(f"{self.name[:200]!r}: a sparse file (not taken)")

    _proc_gnusparse_01 = _proc_gnusparse_00
    _proc_gnusparse_10 = _proc_gnusparse_00


_EXTENDED_HEADERS = frozenset(
    (
        tarfile.GNUTYPE_LONGNAME,
        tarfile.GNUTYPE_LONGLINK,
        tarfile.XHDTYPE,
        tarfile.XGLTYPE,
        tarfile.SOLARIS_XHDTYPE,
    )
)


class _CheckedTarFile(tarfile.TarFile):
    tarinfo = _CheckedTarInfo

    members: list[tarfile.TarInfo]  # tarfile's list of the members read (typeshed lacks it)

    def __init__(self, *args: Any, budget: _Budget, **kwargs: Any) -> None:
        self.budget = budget  # before super().__init__, which reads the first member
        super().__init__(*args, **kwargs)

    def next(self) -> tarfile.TarInfo | None:
        self.budget.headers_of_member = 0
        info = super().next()
        # tarfile keeps every member it has read (for getmember); our callers keep what they
        # need themselves, so memory stays flat however many members an archive has.
        self.members.clear()
        return info


def _open_checked(archive: IO[bytes], budget: _Budget) -> tarfile.TarFile:
    """A .tar.gz or plain .tar (nothing else is taken: no bzip2 or xz to decompress), read
    through the checks above."""
    magic = archive.read(2)
    archive.seek(0)
    stream: IO[bytes] | gzip.GzipFile = archive
    if magic == b"\x1f\x8b":
        stream = gzip.GzipFile(fileobj=archive, mode="rb")
    # Names are UTF-8 whatever this host's locale; bytes that are not become lone surrogates,
    # which the name check refuses.
    return _CheckedTarFile(
        fileobj=stream, mode="r", encoding="utf-8", errors="surrogateescape", budget=budget
    )


class _Tree:
    """The paths seen so far, to find a name given twice or a file that is also a folder in
    time linear in the archive's size: one set lookup per path and per new folder."""

    def __init__(self) -> None:
        self.files: set[str] = set()
        self.folders: set[str] = set()

    def add_file(self, path: str) -> None:
        if path in self.files:
            raise SnapshotError(f"{path!r} appears twice")
        if path in self.folders:
            raise SnapshotError(f"{path!r} is a file and also a folder of other members")
        self._add_parents(path)
        self.files.add(path)

    def add_folder(self, path: str) -> None:
        if path in self.files:
            raise SnapshotError(f"{path!r} is a file and also a folder")
        self._add_parents(path)
        self.folders.add(path)

    def _add_parents(self, path: str) -> None:
        cut = path.rfind("/")
        while cut > 0:
            parent = path[:cut]
            if parent in self.files:
                raise SnapshotError(f"{parent!r} is a file and also a folder of {path!r}")
            if parent in self.folders:
                return  # and so are its own parents, checked when it was added
            self.folders.add(parent)
            cut = path.rfind("/", 0, cut)


def read_members(
    archive: IO[bytes],
    max_unpacked_bytes: int = MAX_UNPACKED_BYTES,
    cpu_seconds: float = CHECK_CPU_SECONDS,
) -> list[Member]:
    """Check every member of a .tar.gz (or plain .tar) and list its files; SnapshotError on
    the first one that is not a plain file or folder inside the archive's root.

    One pass, as the members are read: every limit (header sizes, members, depth, total size,
    CPU time) is checked before the next member is read, so a hostile archive costs at most
    what the limits allow, whatever it declares."""
    budget = _Budget(cpu_seconds)
    files: list[Member] = []
    tree = _Tree()
    total = 0
    try:
        with _open_checked(archive, budget) as tar:
            for count, info in enumerate(_members(tar), start=1):
                if count > MAX_MEMBERS:
                    raise SnapshotError(f"more than {MAX_MEMBERS:,} members")
                path = _member_path(info.name)
                if info.isdir():
                    if path:
                        tree.add_folder(path)
                    continue
                if info.issym() or info.islnk():
                    raise SnapshotError(f"{info.name!r}: a link (links are not taken)")
                if not info.isreg() or info.sparse is not None:
                    raise SnapshotError(f"{info.name!r}: not a regular file (a device or FIFO)")
                if not path:
                    raise SnapshotError(f"{info.name!r}: a file without a name")
                tree.add_file(path)
                total += info.size
                if total > max_unpacked_bytes:
                    raise SnapshotError(
                        f"its files come to more than {max_unpacked_bytes / 2**20:,.0f} MB"
                    )
                files.append(Member(path, info.size, bool(info.mode & 0o111)))
    except (tarfile.TarError, EOFError, OSError, gzip.BadGzipFile) as exc:
        raise SnapshotError(f"not a readable .tar.gz archive ({exc})") from None
    return files


def _members(tar: tarfile.TarFile) -> Iterator[tarfile.TarInfo]:
    while (info := tar.next()) is not None:
        yield info


def canonical(archive: IO[bytes], max_unpacked_bytes: int = MAX_UNPACKED_BYTES) -> Packed:
    """The checked archive packed again in canonical form, and its SHA-256. `archive` must be
    seekable (an uploaded file): members are copied one at a time, never all held at once."""
    files = read_members(archive, max_unpacked_bytes)
    archive.seek(0)
    with _open_checked(archive, _Budget(CHECK_CPU_SECONDS)) as tar:
        regular = {_member_path(i.name): i for i in _members(tar) if i.isreg()}

        def open_member(path: str) -> IO[bytes]:
            extracted = tar.extractfile(regular[path])
            assert extracted is not None
            return extracted

        return _pack(files, open_member)


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
    with tarfile.open(archive, mode="r:*", encoding="utf-8", errors="surrogateescape") as tar:
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

    def unpack_into(
        self, sha256: str, destination: Path, should_stop: Callable[[], bool] = lambda: False
    ) -> None:
        """The snapshot unpacked into `destination`, a folder that must not exist yet (a job's
        working folder's staging folder: workers/workfolder.py makes it atomic)."""
        unpack(self.archive(sha256, should_stop), destination)

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
        # Here, where the one fetch is, not in the replicas that wait for it: compared before
        # and after by each replica, the count logged one fetch once per replica starting then.
        log.info("fetched code snapshot %s (%s bytes)", sha256, f"{offset:,}")
