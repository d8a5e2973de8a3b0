"""Following a keeper's output file (workers/keeper.py) from a byte offset, line by line.

The same lines as workers/logship.pump_pipe makes of a pipe (cut at the newline byte, long lines
in pieces, a partial line sent once the file has been quiet a moment), each chunk with the file
offset its last line ends at. That offset is the chunk's sequence number in Redis (its writer
is the file), so a new agent that starts from the offset the last line in Redis or in its spool
ends at sends every line once: none lost, none twice.
"""

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

READ_BYTES = 256 * 1024
POLL_SECONDS = 0.05

# (read time, lines, offset the last of them ends at)
EmitLines = Callable[[float, list[str], int], None]


class FileTail(threading.Thread):
    """Follows `path` from `offset` until `ended()` holds and the file is read to its end."""

    def __init__(
        self, path: Path, offset: int, emit: EmitLines, ended: Callable[[], bool], name: str = ""
    ) -> None:
        super().__init__(name=name or f"tail-{path.name}", daemon=True)
        self.path = path
        self.offset = offset  # where the lines handed on so far end
        self._emit = emit
        self._ended = ended
        self._pending = b""
        self._quiet_since = time.monotonic()
        self._stopping = threading.Event()

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

    def _emit_lines(self, lines: list[str], length: int) -> None:
        """Hand on lines covering `length` bytes after the offset."""
        self.offset += length
        self._pending = b""
        self._emit(time.time(), lines, self.offset)
