"""Following a keeper's output file (workers/keeper.py) from a byte offset, frame by frame.

The keeper writes a rank's stdout and stderr to one file, in the order it read them, as frames
of whole lines of one stream (the keeper holds a partial line until its newline, or cuts it
as workers/logship.pump_pipe would: quiet a moment, too long, the pipe's end). Each frame is
handed on whole, with its stream and the file offset it ends at: consecutive frames of a
stream together, up to MAX_BATCH_LINES lines, in the file's order. That offset is the lines'
sequence number in Redis (their writer is the file), and every offset handed on is the end of
a frame all of whose lines have been handed on, with none of what follows: a new agent that
starts from the offset the last lines in Redis or in its spool end at sends every line once,
none lost, none twice. No partial line is held across frames here, so none can make a resume
skip or repeat bytes.

The file is the node's spool: its bytes are freed only once the log keeper has their lines in
the database (`acked`). If Redis loses lines it had taken (a crash under appendfsync everysec),
its answer to the next batch says so, and the tail reads the file again from where Redis and the
database still have its lines (`rewind`).
"""

import ctypes
import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

from workers.keeper import read_frames
from workers.logship import MAX_BATCH_LINES, MAX_LINE_CHARS, _decode, _split_long
from workers.logsink import Ledger

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

# How long a rewind waits for the log keeper to realign the job's stream with the database
# (a new epoch) before it reads again anyway.
REWIND_WAIT_SECONDS = 30.0
REWIND_POLL_SECONDS = 0.1

# (read time, stream: "out" or "err", lines, offset the frame of the last of them ends at). While
# it runs, the tail's `offset` is where those lines start, and `generation` the reading they
# belong to.
EmitLines = Callable[[float, str, list[str], int], None]


def frame_lines(data: bytes, cut: bool) -> list[str]:
    """A frame's lines: cut at the newline byte, long ones in pieces; a last line with no
    newline is a partial line the keeper flushed (marked as continued if it was `cut`)."""
    if data.endswith(b"\n"):
        pieces, rest = data[:-1].split(b"\n"), b""
    else:
        *pieces, rest = data.split(b"\n")
    lines = _split_long([_decode(piece) for piece in pieces], MAX_LINE_CHARS)
    if rest:
        lines += _split_long([_decode(rest)], MAX_LINE_CHARS, last_continues=cut)
    return lines


class FileTail(threading.Thread):
    """Follows `path` from `offset` (a frame's end) until `ended()` holds and the file is read
    to its end."""

    def __init__(
        self,
        path: Path,
        offset: int,
        emit: EmitLines,
        ended: Callable[[], bool],
        name: str = "",
        ledger: Ledger | None = None,
        discard_every: int = DISCARD_EVERY_BYTES,
        drained: Callable[[], bool] | None = None,
    ) -> None:
        super().__init__(name=name or f"tail-{path.name}", daemon=True)
        self.path = path
        self.offset = offset  # where the frames handed on so far end
        # How far the file's lines are in the database (ledger.acked): the file's bytes before
        # that may be freed, and a rewind never goes back past it.
        self._ledger = ledger
        self.acked = 0
        self.generation = 0  # one more at each rewind
        self._rewind_of: int | None = None  # the generation a gap was answered to
        self._lock = threading.Lock()
        self._epoch = self._read_epoch()
        # True once every line handed on is in Redis (waiting a while at most): at the file's
        # end, Redis's answers to the last lines may still ask for a rewind.
        self._drained = drained
        self._discard_every = discard_every
        self._read_since_discard = 0
        self.discarded = 0
        self._emit = emit
        self._ended = ended
        self._pending = b""  # the start of a frame not yet whole in the file
        self._stopping = threading.Event()

    @property
    def read_to(self) -> int:
        """How far into the file it has read: the frames handed on, and one still open."""
        return self.offset + len(self._pending)

    def stop(self) -> None:
        """Stop following now (the agent hands over): what is not read stays for the next."""
        self._stopping.set()

    @property
    def rewound(self) -> bool:
        """Whether Redis lost lines of this file (it is read again, or will be)."""
        return self.generation > 0 or self._rewind_of is not None

    def rewind(self, generation: int) -> None:
        """Redis does not have lines of reading `generation` that came before some it was sent:
        read the file again from what it has (once per reading; any thread)."""
        with self._lock:
            if generation == self.generation and self._rewind_of is None:
                self._rewind_of = generation

    def run(self) -> None:
        while not self._stopping.is_set():
            if self._rewind_of is not None:
                self._rewind()
            try:
                got, ended = self._read(), False
                if not got:
                    # Whether the writer has ended is asked only when a read finds nothing (a
                    # stat per idle turn, not per read), and is followed by a read: whatever
                    # the file held when it ended is then read.
                    ended = self._ended()
                    got = ended and self._read()
            except ValueError as exc:
                log.error("%s: stops following it: %s", self.path, exc)
                return
            if got:
                continue
            if ended:
                if self._drained is not None and not self._drained():
                    continue  # Redis away: its answers to the last lines are still to come
                if self._rewind_of is None:
                    return
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
        self._read_since_discard += len(data)
        if self._ledger is not None and self._read_since_discard >= self._discard_every:
            self._read_since_discard = 0
            self._discard()
        data = self._pending + data
        if self._rewind_of is not None:
            return True  # read again from elsewhere first
        try:
            frames, used = read_frames(data)
        except ValueError as exc:
            raise ValueError(f"at offset {self.offset}: {exc}") from None
        self._pending = data[used:]
        start = self.offset  # where `data` begins in the file
        # Consecutive frames of one stream go together; the offset is always a frame's end.
        stream, end = "", 0
        lines: list[str] = []
        for frame_stream, payload, cut, frame_end in frames:
            if lines and (frame_stream != stream or len(lines) >= MAX_BATCH_LINES):
                self._emit_lines(stream, lines, start + end)
                lines = []
            stream = frame_stream
            lines.extend(frame_lines(payload, cut))
            end = frame_end
        if frames:
            self._emit_lines(stream, lines, start + end)
        return True

    def _read_epoch(self) -> str:
        if self._ledger is None:
            return ""
        try:
            return self._ledger.epoch()
        except Exception as exc:  # Redis away: any epoch found later counts as new
            log.debug("%s: no log epoch now: %s", self.path, exc)
            return ""

    def _rewind(self) -> None:
        """Once the log keeper has realigned the stream with the database (a new epoch; waited
        for a while at most), go back to where the lines Redis and the database hold end."""
        assert self._ledger is not None
        waited = time.monotonic() + REWIND_WAIT_SECONDS
        while not self._stopping.is_set():
            epoch = self._read_epoch()
            if (epoch and epoch != self._epoch) or time.monotonic() > waited:
                try:
                    target = max(self._ledger.seen(), self._ledger.acked(), self.acked, 0)
                except Exception as exc:  # Redis away again: wait for it
                    log.debug("%s: rewind waits for Redis: %s", self.path, exc)
                    self._stopping.wait(REWIND_POLL_SECONDS)
                    continue
                with self._lock:
                    log.warning(
                        "%s: Redis lost lines after offset %s (read to %s): reading them again",
                        self.path, target, self.offset,
                    )  # fmt: skip
                    self.offset = target
                    self._pending = b""
                    self.generation += 1
                    self._rewind_of = None
                    self._epoch = epoch
                return
            self._stopping.wait(REWIND_POLL_SECONDS)

    def _discard(self) -> None:
        """Free the file's blocks before the offset the database has its lines to (best
        effort: a file system without hole punching keeps them)."""
        assert self._ledger is not None
        try:
            acked = self._ledger.acked()
        except Exception as exc:  # Redis away: next time
            log.debug("not freeing %s now: %s", self.path, exc)
            return
        # A rewind never goes back before an acknowledged offset: the bytes there are gone.
        self.acked = max(self.acked, min(acked, self.offset))
        upto = self.acked // _BLOCK * _BLOCK
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

    def _emit_lines(self, stream: str, lines: list[str], end: int) -> None:
        """Hand on lines whose frames end at `end` in the file."""
        if lines:
            self._emit(time.time(), stream, lines, end)
        self.offset = end  # after: once read_to is at the end, its lines are handed on
