"""Code snapshot archives (workers/snapshot.py): canonical packing, every escaping member
refused, safe unpacking, and an agent's cache fed from a real Redis."""

import gzip
import hashlib
import io
import tarfile
import tracemalloc
from collections.abc import Callable
from pathlib import Path

import pytest
import redis

from tests import hostile_archives
from tests.snapshots import snapshot_of
from workers import contract, snapshot
from workers.snapshot import SnapshotCache, SnapshotError


def project(root: Path) -> Path:
    (root / "pkg").mkdir(parents=True)
    (root / "train.py").write_text("import pkg.model\nprint(pkg.model.NAME)\n")
    (root / "train.py").chmod(0o755)
    (root / "pkg" / "__init__.py").write_text("")
    (root / "pkg" / "model.py").write_text("NAME = 'mlp'\n")
    (root / "data.csv").write_text("x,y\n1,2\n")
    return root


def tar_gz(add: Callable[[tarfile.TarFile], None]) -> io.BytesIO:
    data = io.BytesIO()
    with tarfile.open(fileobj=data, mode="w:gz") as tar:
        add(tar)
    data.seek(0)
    return data


def with_member(info: tarfile.TarInfo, content: bytes = b"") -> io.BytesIO:
    def add(tar: tarfile.TarFile) -> None:
        info.size = len(content) if info.isreg() else 0
        tar.addfile(info, io.BytesIO(content) if info.isreg() else None)

    return tar_gz(add)


def member(name: str, kind: bytes = tarfile.REGTYPE, **fields: object) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = kind
    for key, value in fields.items():
        setattr(info, key, value)
    return info


def test_the_same_files_give_the_same_snapshot_however_they_were_packed(tmp_path: Path) -> None:
    folder = project(tmp_path / "proj")
    packed = snapshot_of(folder)
    assert packed.sha256 == hashlib.sha256(packed.archive).hexdigest()
    assert [(m.path, m.executable) for m in packed.files] == [
        ("data.csv", False),
        ("pkg/__init__.py", False),
        ("pkg/model.py", False),
        ("train.py", True),
    ]

    # The same files in another order, under "./", with other times and owners: gzip's own
    # header time differs too.
    def add(tar: tarfile.TarFile) -> None:
        for name in ("train.py", "pkg/model.py", "data.csv", "pkg/__init__.py"):
            info = tar.gettarinfo(str(folder / name), arcname=f"./{name}")
            info.mtime, info.uid, info.uname = 1_700_000_000, 1000, "alice"
            with (folder / name).open("rb") as f:
                tar.addfile(info, f)

    again = snapshot.canonical(tar_gz(add))
    assert again.sha256 == packed.sha256 and again.archive == packed.archive

    (folder / "pkg" / "model.py").write_text("NAME = 'cnn'\n")
    assert snapshot_of(folder).sha256 != packed.sha256


@pytest.mark.parametrize(
    ("info", "why"),
    [
        (member("/etc/cron.d/evil"), "an absolute path"),
        (member("../outside.py"), "contains '..'"),
        (member("pkg/../../outside.py"), "contains '..'"),
        (member("link.py", tarfile.SYMTYPE, linkname="/etc/passwd"), "a link"),
        (member("inside-link.py", tarfile.SYMTYPE, linkname="train.py"), "a link"),
        (member("hard.py", tarfile.LNKTYPE, linkname="train.py"), "a link"),
        (member("tty", tarfile.CHRTYPE, devmajor=5, devminor=0), "not a regular file"),
        (member("disk", tarfile.BLKTYPE, devmajor=8, devminor=0), "not a regular file"),
        (member("pipe", tarfile.FIFOTYPE), "not a regular file"),
    ],
    ids=[
        "absolute",
        "dotdot",
        "nested-dotdot",
        "symlink-out",
        "symlink-in",
        "hardlink",
        "char-device",
        "block-device",
        "fifo",
    ],
)
def test_every_member_that_could_escape_is_refused(
    info: tarfile.TarInfo, why: str, tmp_path: Path
) -> None:
    archive = with_member(info, b"print('pwned')\n")
    with pytest.raises(SnapshotError, match=why):
        snapshot.canonical(archive)
    # An agent handed such an archive anyway refuses it too, and writes nothing.
    path = tmp_path / "given.tar.gz"
    archive.seek(0)
    path.write_bytes(archive.read())
    with pytest.raises(SnapshotError, match=why):
        snapshot.unpack(path, tmp_path / "code")
    assert not (tmp_path / "code").exists()
    assert not (tmp_path / "outside.py").exists()


def test_a_name_given_twice_or_as_file_and_folder_is_refused() -> None:
    def twice(tar: tarfile.TarFile) -> None:
        for text in (b"a", b"b"):
            info = member("train.py", size=1)
            tar.addfile(info, io.BytesIO(text))

    with pytest.raises(SnapshotError, match=r"'train\.py' appears twice"):
        snapshot.canonical(tar_gz(twice))

    def clash(tar: tarfile.TarFile) -> None:
        for name in ("pkg", "pkg/model.py"):
            tar.addfile(member(name, size=1), io.BytesIO(b"x"))

    with pytest.raises(SnapshotError, match="'pkg' is a file and also a folder"):
        snapshot.canonical(tar_gz(clash))


def test_what_is_not_an_archive_or_unpacks_too_large_is_refused() -> None:
    with pytest.raises(SnapshotError, match=r"not a readable \.tar\.gz archive"):
        snapshot.canonical(io.BytesIO(b"PK\x03\x04 a zip file"))
    with pytest.raises(SnapshotError, match="not a readable"):
        snapshot.canonical(io.BytesIO(gzip.compress(b"not a tar" * 100)))
    # A small archive that unpacks huge (a gzip bomb) is refused by its declared sizes.
    zeros = tar_gz(
        lambda tar: tar.addfile(member("zeros", size=10 * 2**20), io.BytesIO(bytes(10 * 2**20)))
    )
    assert len(zeros.getvalue()) < 100_000
    with pytest.raises(SnapshotError, match="more than 1 MB"):
        snapshot.canonical(zeros, max_unpacked_bytes=2**20)


def test_it_unpacks_files_with_their_modes_and_nothing_else(tmp_path: Path) -> None:
    packed = snapshot_of(project(tmp_path / "proj"))
    archive = tmp_path / "a.tar.gz"
    archive.write_bytes(packed.archive)
    snapshot.unpack(archive, tmp_path / "code")
    unpacked = sorted(
        p.relative_to(tmp_path / "code").as_posix() for p in (tmp_path / "code").rglob("*")
    )
    assert unpacked == ["data.csv", "pkg", "pkg/__init__.py", "pkg/model.py", "train.py"]
    assert (tmp_path / "code" / "train.py").stat().st_mode & 0o777 == 0o755
    assert (tmp_path / "code" / "data.csv").stat().st_mode & 0o777 == 0o644
    assert (tmp_path / "code" / "pkg" / "model.py").read_text() == "NAME = 'mlp'\n"


def test_a_folder_with_a_name_an_upload_may_not_have_is_refused(tmp_path: Path) -> None:
    folder = project(tmp_path / "proj")
    (folder / "notes\n.txt").write_text("x")
    with pytest.raises(SnapshotError, match="not a usable file name"):
        snapshot_of(folder)


# --- an agent's cache, over the unit tests' real Redis ---


@pytest.fixture
def client(redis_server: str) -> redis.Redis:
    client = redis.Redis.from_url(redis_server)
    client.flushdb()
    return client


def test_the_cache_fetches_once_checks_the_hash_and_checks_out_once(
    client: redis.Redis, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(snapshot, "READ_CHUNK", 64)  # many GETRANGE reads for a small archive
    packed = snapshot_of(project(tmp_path / "proj"))
    client.set(contract.snapshot_key(packed.sha256), packed.archive)
    cache = SnapshotCache(client, tmp_path / "cache")
    first = cache.checkout(packed.sha256, tmp_path / "jobs" / "1" / "code")
    assert (first / "pkg" / "model.py").read_text() == "NAME = 'mlp'\n"
    assert cache.archive(packed.sha256).read_bytes() == packed.archive
    # A second job, with Redis emptied meanwhile: the cache has it, no fetch.
    client.flushdb()
    second = cache.checkout(packed.sha256, tmp_path / "jobs" / "2" / "code")
    assert (second / "train.py").is_file() and cache.fetches == 1
    # The same job's other replica or next attempt: the same folder, not unpacked again.
    (first / "written-by-attempt-0.txt").write_text("kept")
    assert cache.checkout(packed.sha256, first) == first
    assert (first / "written-by-attempt-0.txt").read_text() == "kept"


def test_an_archive_that_does_not_match_its_hash_is_refused(
    client: redis.Redis, tmp_path: Path
) -> None:
    packed = snapshot_of(project(tmp_path / "proj"))
    project(tmp_path / "other")
    (tmp_path / "other" / "train.py").write_text("print('tampered')\n")
    tampered = snapshot_of(tmp_path / "other").archive
    client.set(contract.snapshot_key(packed.sha256), tampered)
    cache = SnapshotCache(client, tmp_path / "cache")
    with pytest.raises(SnapshotError, match=f"{packed.sha256[:12]} read from Redis does not match"):
        cache.checkout(packed.sha256, tmp_path / "code")
    assert list((tmp_path / "cache").iterdir()) == []  # nothing kept, not even the temporary
    assert not (tmp_path / "code").exists()


def test_a_snapshot_missing_from_redis_fails_with_a_reason(
    client: redis.Redis, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(snapshot, "FETCH_WAIT_SECONDS", 0.3)
    cache = SnapshotCache(client, tmp_path / "cache")
    with pytest.raises(SnapshotError, match=f"code snapshot {'ab' * 6} is not in Redis"):
        cache.archive("ab" * 32)
    with pytest.raises(SnapshotError, match="is not a SHA-256"):
        cache.archive("../../etc/passwd")


# --- hostile archives: each refused as it is read, at the cost of its first few headers ---


@pytest.mark.parametrize(
    "typeflag", [tarfile.XHDTYPE, tarfile.GNUTYPE_LONGNAME], ids=["pax", "gnu-longname"]
)
def test_an_extended_header_that_declares_a_gigabyte_is_refused_before_it_is_read(
    typeflag: bytes, tmp_path: Path
) -> None:
    path = hostile_archives.huge_extended_header(tmp_path, typeflag)
    assert path.stat().st_size < 2 * 2**20  # a gigabyte of zeros, gzipped
    tracemalloc.start()
    try:
        with path.open("rb") as archive, pytest.raises(SnapshotError, match="extended header"):
            snapshot.canonical(archive)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 8 * 2**20  # tarfile alone would have read the whole gigabyte into memory


def test_a_name_given_twice_among_the_most_members_allowed_is_refused(tmp_path: Path) -> None:
    path = hostile_archives.many_members_one_duplicate(tmp_path, count=snapshot.MAX_MEMBERS)
    with path.open("rb") as archive, pytest.raises(SnapshotError, match=r"'f00000\.py' appears"):
        snapshot.canonical(archive)


def test_a_file_deeper_than_the_limit_is_refused_at_the_first_one(tmp_path: Path) -> None:
    path = hostile_archives.deep_folders(tmp_path, files=100, depth=snapshot.MAX_DEPTH + 1)
    with path.open("rb") as archive, pytest.raises(SnapshotError, match="folders deep"):
        snapshot.canonical(archive)
    just_deep_enough = hostile_archives.deep_folders(
        tmp_path, files=3, depth=snapshot.MAX_DEPTH - 1
    )
    with just_deep_enough.open("rb") as archive:
        assert len(snapshot.canonical(archive).files) == 3


@pytest.mark.parametrize(("name_id", "name"), hostile_archives.BAD_NAMES)
def test_a_name_that_is_not_printable_utf8_is_refused(
    name_id: str, name: str, tmp_path: Path
) -> None:
    path = hostile_archives.bad_name(tmp_path, name_id, name)
    with path.open("rb") as archive, pytest.raises(SnapshotError, match="not a usable file name"):
        snapshot.canonical(archive)
    # The agent's own check refuses it too, and writes nothing.
    with pytest.raises(SnapshotError, match="not a usable file name"):
        snapshot.unpack(path, tmp_path / "code")
    assert not (tmp_path / "code").exists()


def test_names_in_any_script_and_with_spaces_are_taken() -> None:
    names = ["données/modèle.py", "日本語/訓練.py", "my notes.txt", "emoji-🚂.md"]

    def add(tar: tarfile.TarFile) -> None:
        for name in names:
            tar.addfile(member(name, size=1), io.BytesIO(b"x"))

    assert sorted(m.path for m in snapshot.canonical(tar_gz(add)).files) == sorted(names)


def test_a_file_that_is_also_a_folder_is_found_in_either_order() -> None:
    def folder_first(tar: tarfile.TarFile) -> None:
        for name in ("pkg/sub/model.py", "pkg/sub"):
            tar.addfile(member(name, size=1), io.BytesIO(b"x"))

    with pytest.raises(SnapshotError, match="'pkg/sub' is a file and also a folder"):
        snapshot.canonical(tar_gz(folder_first))

    def declared_folder(tar: tarfile.TarFile) -> None:
        tar.addfile(member("pkg", size=1), io.BytesIO(b"x"))
        tar.addfile(member("pkg", tarfile.DIRTYPE))

    with pytest.raises(SnapshotError, match="'pkg' is a file and also a folder"):
        snapshot.canonical(tar_gz(declared_folder))


def test_a_chain_of_extended_headers_is_refused() -> None:
    """GNU long-name headers in a row: tarfile follows each by recursion, as deep as the chain."""
    chain = b"".join(_long_name_header(b"a" * 100) for _ in range(50))
    body = chain + tarfile.TarInfo("train.py").tobuf(format=tarfile.USTAR_FORMAT) + bytes(1024)
    with pytest.raises(SnapshotError, match="extended headers"):
        snapshot.canonical(io.BytesIO(gzip.compress(body)))


def _long_name_header(name: bytes) -> bytes:
    info = tarfile.TarInfo("././@LongLink")
    info.type = tarfile.GNUTYPE_LONGNAME
    info.size = len(name) + 1
    data = name + b"\0"
    return info.tobuf(format=tarfile.USTAR_FORMAT) + data + bytes(-len(data) % 512)


def test_a_sparse_file_is_refused() -> None:
    def add(tar: tarfile.TarFile) -> None:
        info = member("sparse.bin", size=1)
        info.pax_headers = {"GNU.sparse.major": "1", "GNU.sparse.minor": "0"}
        tar.addfile(info, io.BytesIO(b"x"))

    with pytest.raises(SnapshotError, match="a sparse file"):
        snapshot.canonical(tar_gz(add))


def test_a_check_past_its_cpu_budget_is_refused() -> None:
    archive = with_member(member("train.py"), b"print('hi')\n")
    with pytest.raises(SnapshotError, match="s of CPU time"):
        snapshot.read_members(archive, cpu_seconds=-1.0)
