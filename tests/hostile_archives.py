"""Hostile code-snapshot archives, small on disk, for the tests that show each is refused cheaply.

Each builder writes a .tar.gz into a folder and returns its path. The ones that declare a huge
extended header really carry that many bytes (zeros), as an attacker's would: gzip squeezes a
gigabyte of zeros into about a megabyte, so only the declared size says what it would cost.
"""

import gzip
import io
import tarfile
import zlib
from pathlib import Path

BLOCK = 512
ZEROS_CHUNK = 2**20


def _header(name: str, typeflag: bytes, size: int) -> bytes:
    info = tarfile.TarInfo(name)
    info.type = typeflag
    info.size = size
    return info.tobuf(format=tarfile.USTAR_FORMAT)


def huge_extended_header(folder: Path, typeflag: bytes, declared: int = 2**30) -> Path:
    """An archive whose first header is an extended one (PAX `x`, GNU long name `L`, ...)
    declaring `declared` bytes, followed by those bytes (zeros) and one small file.

    The gzip stream is written chunk by chunk with full flushes, so the gigabyte of zeros is
    compressed once (one chunk) and its bytes repeated: building it costs well under a second."""
    typename = {tarfile.XHDTYPE: "pax", tarfile.GNUTYPE_LONGNAME: "gnu-longname"}.get(
        typeflag, "extended"
    )
    path = folder / f"{typename}-{declared}.tar.gz"
    head = _header("././@LongLink" if typeflag != tarfile.XHDTYPE else "pax", typeflag, declared)
    tail_file = _header("train.py", tarfile.REGTYPE, 3) + b"ok\n".ljust(BLOCK, b"\0")
    tail = tail_file + bytes(2 * BLOCK)
    crc, length = 0, 0
    raw = zlib.compressobj(6, zlib.DEFLATED, -15)
    with path.open("wb") as out:
        out.write(b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\xff")  # gzip header, mtime 0
        out.write(raw.compress(head) + raw.flush(zlib.Z_FULL_FLUSH))
        crc, length = zlib.crc32(head, crc), length + len(head)
        zeros = bytes(ZEROS_CHUNK)
        packed_zeros = raw.compress(zeros) + raw.flush(zlib.Z_FULL_FLUSH)
        left = declared + (-declared % BLOCK)
        while left >= ZEROS_CHUNK:
            out.write(packed_zeros)  # after a full flush, equal input packs to equal bytes
            crc = zlib.crc32(zeros, crc)
            length += ZEROS_CHUNK
            left -= ZEROS_CHUNK
        rest = bytes(left) + tail
        out.write(raw.compress(rest) + raw.flush(zlib.Z_FINISH))
        crc, length = zlib.crc32(rest, crc), length + len(rest)
        out.write(crc.to_bytes(4, "little") + (length % 2**32).to_bytes(4, "little"))
    return path


def _tar_gz(path: Path, members: list[tuple[str, bytes]], fmt: int = tarfile.PAX_FORMAT) -> Path:
    with (
        gzip.GzipFile(path, "wb", compresslevel=6, mtime=0) as packed,
        tarfile.open(
            fileobj=packed, mode="w", format=fmt, encoding="utf-8", errors="surrogateescape"
        ) as tar,
    ):
        for name, content in members:
            info = tarfile.TarInfo(name)
            info.size = len(content)
            tar.addfile(info, io.BytesIO(content))
    return path


def many_members_one_duplicate(folder: Path, count: int = 20_000) -> Path:
    """`count` files, the last one named like the first."""
    names = [f"f{i:05d}.py" for i in range(count - 1)] + ["f00000.py"]
    return _tar_gz(folder / "duplicate.tar.gz", [(n, b"") for n in names])


def deep_folders(folder: Path, files: int = 19_999, depth: int = 450) -> Path:
    """`files` files, each `depth` folders down."""
    prefix = "d/" * depth
    return _tar_gz(folder / "deep.tar.gz", [(f"{prefix}f{i}", b"") for i in range(files)])


# Names that an upload must refuse: (id, name as tarfile writes it with surrogateescape).
BAD_NAMES = [
    ("newline", "train\n.py"),
    ("invalid-utf8", "train\udcff.py"),  # the raw byte 0xff, not UTF-8
    ("backslash-dotdot", "..\\..\\evil.py"),
    ("bidi-override", "train\u202eyp.exe"),
    ("escape-control", "log\x1b[2J.py"),
]


def bad_name(folder: Path, name_id: str, name: str) -> Path:
    """A small, otherwise good archive with one file of that name. Written in the GNU format,
    whose headers carry a name's bytes as they are (PAX would mark them as binary)."""
    members = [("train.py", b"print('hi')\n"), (name, b"x\n")]
    return _tar_gz(folder / f"bad-{name_id}.tar.gz", members, fmt=tarfile.GNU_FORMAT)
