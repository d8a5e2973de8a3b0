"""Following a keeper's output file (workers/keeper.py) from a byte offset, line by line.

The same lines as workers/logship.pump_pipe makes of a pipe (cut at the newline byte, long lines
in pieces, a partial line sent once the file has been quiet a moment), each chunk with the file
offset its last line ends at. That offset is the chunk's sequence number in Redis (its writer
is the file), so a new agent that starts from the offset the last line in Redis or in its spool
ends at sends every line once: none lost, none twice.
"""

import ctypes
import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

from workers.logship import (
    MAX_BATCH_LINES,
    MAX_LINE_CHARS,
    PARTIAL_FLUSH_SECONDS,
    _decode,
    _split_long,
)

log = logging.getLogger(__name__)

READ_BYTES = 256 * 1024
POLL_SECONDS = 0.05
# After this many bytes read, the part of the file whose lines are safely shipped is freed on
# disk: a trainer that floods its output (its lines dropped over its budget) must not fill the
# node's disk through its keeper's files. Offsets stay as they were (a hole reads as zeros).
DISCARD_EVERY_BYTES = 16 * 1024 * 1024
_FALLOC_FL_KEEP_SIZE = 0x01
_FALLOC_FL_PUNCH_HOLE = 0x02
_BLOCK = 4096

# (read time, lines, offset the last of them ends at)
EmitLines = Callable[[float, list[str], int], None]


class FileTail(threading.Thread):
    """Follows `path` from `offset` until `ended()` holds and the file is read to its end."""

    def __init__(
        self,
        path: Path,
        offset: int,
        emit: EmitLines,
        ended: Callable[[], bool],
        name: str = "",
        shipped: Callable[[], int] | None = None,
        discard_every: int = DISCARD_EVERY_BYTES,
    ) -> None:
        super().__init__(name=name or f"tail-{path.name}", daemon=True)
        self.path = path
        self.offset = offset  # where the lines handed on so far end
        # How far the file's lines are in Redis or the spool (what a new agent would not read
        # again): the file's bytes before that may be freed.
        self._shipped = shipped
        self._discard_every = discard_every
        self._read_since_discard = 0
        self.discarded = 0
        self._emit = emit
        self._ended = ended
        self._pending = b""
        self._quiet_since = time.monotonic()
        self._stopping = threading.Event()

    @property
    def read_to(self) -> int:
        """How far into the file it has read: the lines handed on, and a line still open."""
        return self.offset + len(self._pending)

    def stop(self) -> None:
        """Stop following now (the agent hands over): what is not read stays for the next."""
        self._stopping.set()

    def run(self) -> None:
        while not self._stopping.is_set():
            ended = self._ended()  # before the read: whatever it holds at the end is then read
            got = self._read()
            if got:
                continue
            if ended:
                if self._pending:
                    self._emit_lines([_decode(self._pending)], len(self._pending))
                return
            if self._pending and time.monotonic() - self._quiet_since >= PARTIAL_FLUSH_SECONDS:
                self._emit_lines([_decode(self._pending)], len(self._pending))
            self._stopping.wait(POLL_SECONDS)

    def _read(self) -> bool:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset + len(self._pending))
                data = f.read(READ_BYTES)
        except FileNotFoundError:
            return False
        if not data:
            return False
        self._quiet_since = time.monotonic()
        self._read_since_discard += len(data)
        if self._shipped is not None and self._read_since_discard >= self._discard_every:
            self._read_since_discard = 0
            self._discard()
        data = self._pending + data
        self._pending = b""
        lines: list[str] = []
        used = 0  # bytes of `data` the lines in `lines` cover
        start = 0
        while (cut := data.find(b"\n", start)) >= 0:
            lines.extend(_split_long([_decode(data[start:cut])], MAX_LINE_CHARS))
            start = used = cut + 1
            if len(lines) >= MAX_BATCH_LINES:
                self._emit_lines(lines, used)
                data, lines, used, start = data[used:], [], 0, 0
        rest = data[used:]
        if lines:
            self._emit_lines(lines, used)
        if len(rest) > MAX_LINE_CHARS * 4:  # a line with no end in sight: send it in pieces
            pieces = _split_long([_decode(rest)], MAX_LINE_CHARS, last_continues=True)
            self._emit_lines(pieces, len(rest))
            rest = b""
        self._pending = rest
        return True

    def _discard(self) -> None:
        """Free the file's blocks before the shipped offset (best effort: a file system without
        hole punching keeps them)."""
        assert self._shipped is not None
        try:
            upto = min(self._shipped(), self.offset) // _BLOCK * _BLOCK
        except Exception as exc:  # Redis away: next time
            log.debug("not freeing %s now: %s", self.path, exc)
            return
        if upto <= self.discarded:
            return
        libc = ctypes.CDLL(None, use_errno=True)
        flags = _FALLOC_FL_PUNCH_HOLE | _FALLOC_FL_KEEP_SIZE
        fd = os.open(self.path, os.O_WRONLY)
        try:
            if libc.fallocate(fd, flags, ctypes.c_long(0), ctypes.c_long(upto)) == 0:
                self.discarded = upto
        finally:
            os.close(fd)

    def _emit_lines(self, lines: list[str], length: int) -> None:
        """Hand on lines covering `length` bytes after the offset."""
        self.offset += length
        self._pending = b""
        self._emit(time.time(), lines, self.offset)
