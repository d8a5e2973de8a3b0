"""A replica's keeper: the small process that holds its trainers while agents come and go.

The role slurmstepd or containerd-shim plays. The supervisor starts one per replica, in a
session of its own and with no death signal, so it outlives the agent. The keeper starts the
replica's processes (each through workers/deathsig.py tied to the keeper, in a process group of
its own), and holds what must not die with an agent:

- the process groups: it is the leaders' parent, so it reads their exits without reaping
  (WNOWAIT) and signals a group only while its leader is unreaped, when the id cannot have been
  reused; it kills what is left in a group once its leader has ended;
- the pipes: one copier per process waits on its stdout and stderr together and appends what
  it reads, in the order it reads it, to `output-R` in its folder as frames (`frame`: a stream
  tag, a length, the bytes), each holding whole lines of one stream (a partial line waits in
  the copier until its newline, or is cut as the agent would: quiet PARTIAL_FLUSH_SECONDS,
  MAX_PARTIAL_BYTES long, or the pipe's end). Agents follow the file by offset, a frame's end
  being a point to resume from (a new agent resumes where the lines that reached Redis or the
  agent's spool end, so none is lost or sent twice);
- the exit statuses: `exit-R` ({"code", "at", "unclaimed": whether the keeper stopped it for
  want of an agent}) once rank R's leader is reaped, then `done` once
  every process has ended and every byte it printed is in the files.

An agent claims the keeper by connecting to the unix socket `sock` in its folder and keeps the
connection open; it sends `term`, `kill` (signal every group still held) or `release` (the
agent has read the outcome: end now); the keeper sends `news` each time it has written an
exit record or `done` (it wakes at a leader's exit through a pidfd), so that the agent reads
them at once rather than at its next poll. When no agent holds the connection for `grace_seconds`,
the keeper stops the processes itself (SIGTERM, SIGKILL after `stop_grace_seconds`), so nothing
is orphaned, and ends once they have.

    python -m workers.keeper FOLDER
    python -m workers.keeper --spare      (then FOLDER on stdin: see wait_as_spare)

FOLDER holds `spec.json` ({"procs": [{"argv", "env", "cwd"}] (argv ends in workers/jobenv.py,
which is given env on stdin: nothing before it runs with the job's variables), "grace_seconds",
"stop_grace_seconds", "records_dir", "job_id", "role", "index"}), written by the agent, which
the keeper removes once read. The keeper writes `state.json` ({"keeper": {"pid",
"create_time"}, "procs": [{"pid", "create_time"}]}) once every process has started (or
{"error": ...} if one could not start). It runs with an environment of its own (the agent's
secrets are not in it, nor the job's variables) and imports the standard library, psutil,
workers.procrecords and workers.jobenv only.
"""

import ctypes
import json
import os
import select
import selectors
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from workers import deathsig, jobenv
from workers.procrecords import ProcRecord, ProcRecords, group_members, reap

SPEC = "spec.json"
STATE = "state.json"
DONE = "done"
SOCKET = "sock"
LOG = "keeper.log"
POLL_SECONDS = 0.1
COPY_BYTES = 256 * 1024
# Room each output file keeps allocated past its end (fallocate KEEP_SIZE), topped up as it
# grows: when the work disk fills, a trainer's last lines (the traceback of the ENOSPC it dies
# of) still go to the file. Past it, a write the disk has no room for is cut back and retried.
OUTPUT_RESERVE_BYTES = 256 * 1024
# How long a copier waits before it tries a full disk again.
NO_ROOM_RETRY_SECONDS = 0.5
# The room an exit record is written into, allocated when the keeper starts.
EXIT_RESERVE_BYTES = 4096
_FALLOC_FL_KEEP_SIZE = 0x01
# After its leader ended, how long the copier of pipes that a leftover process still held
# may take (that process is SIGKILLed first, so this is only a backstop).
COPY_END_SECONDS = 5.0
# How long a rank's exit record waits for the copier of its pipes once its group is gone: the
# agent works out a failure's reason from the output file as soon as the record is there, so
# the traceback printed just before the exit must be in the file by then. Pipes close as soon
# as the group is killed; a process that left the group and holds a pipe delays only this much.
EXIT_AFTER_OUTPUT_SECONDS = 1.0
GRACE_ENV = "TRAINYARD_KEEPER_GRACE_SECONDS"
# Shorter than the console's lost-node time (TRAINYARD_NODE_LOST_SECONDS, 45 s) with the 5 s
# from SIGTERM to SIGKILL to spare: by the time the console gives a node's jobs up and may start
# them again elsewhere, their old trainers are gone, so two attempts never write one checkpoint.
DEFAULT_GRACE_SECONDS = 30.0
# The argument that starts a spare keeper (wait_as_spare) instead of one for a folder.
SPARE = "--spare"
# The commands an agent sends, one per line.
TERM, KILL, RELEASE = b"term", b"kill", b"release"
# What the keeper sends the agent, one per line, when it has written an exit record or `done`.
NEWS = b"news"


# A frame of a rank's output file: stream tag, length of the bytes that follow (big-endian).
FRAME_HEADER = struct.Struct(">cI")
# The tags: stdout, stderr; in upper case, the frame's last line was cut for its length and
# continues in the next frame of its stream.
STREAM_TAGS = {b"o": ("out", False), b"e": ("err", False), b"O": ("out", True), b"E": ("err", True)}
_TAG_OF = {(stream, cut): tag for tag, (stream, cut) in STREAM_TAGS.items()}
# A partial line (no newline yet) is written once its pipe has been quiet this long, or once it
# is this long (as workers/logship.py cuts a pipe's lines).
PARTIAL_FLUSH_SECONDS = 0.5
MAX_PARTIAL_BYTES = 64 * 1024


def output_name(rank: int) -> str:
    """`output-0`: the file a rank's stdout and stderr go to, framed."""
    return f"output-{rank}"


def frame(stream: str, data: bytes, cut: bool = False) -> bytes:
    return FRAME_HEADER.pack(_TAG_OF[stream, cut], len(data)) + data


def read_frames(data: bytes) -> tuple[list[tuple[str, bytes, bool, int]], int]:
    """The whole frames at the start of `data`, each (stream, bytes, cut, where it ends in
    `data`), and how many bytes of `data` they take. Raises ValueError on what is no frame."""
    frames = []
    used = 0
    while len(data) - used >= FRAME_HEADER.size:
        tag, length = FRAME_HEADER.unpack_from(data, used)
        if tag not in STREAM_TAGS:
            raise ValueError(f"no frame at {used}: tag {tag!r}")
        end = used + FRAME_HEADER.size + length
        if end > len(data):
            break
        stream, cut = STREAM_TAGS[tag]
        frames.append((stream, data[used + FRAME_HEADER.size : end], cut, end))
        used = end
    return frames, used


def exit_name(rank: int) -> str:
    return f"exit-{rank}"


def write_atomically(path: Path, text: str) -> None:
    temp = _temp_name(path)
    if temp.exists():
        # Room reserved beforehand (reserve_record): written into, then cut to size, so that
        # a full disk does not keep the record from being written.
        with open(temp, "r+b") as f:
            f.write(text.encode())
            f.truncate()
    else:
        temp.write_text(text)
    os.replace(temp, path)


def reserve_record(path: Path, size: int = EXIT_RESERVE_BYTES) -> None:
    """Allocate now the room write_atomically(path, ...) will write into (best effort)."""
    fd = os.open(_temp_name(path), os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError:
        pass  # no room now, or a file system without it: written the ordinary way later
    finally:
        os.close(fd)


def _temp_name(path: Path) -> Path:
    return path.with_name(f".{path.name}.tmp")


def _reserve_ahead(fd: int, end: int) -> None:
    """Keep OUTPUT_RESERVE_BYTES allocated past `end`, the file's size (best effort)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.fallocate(
        fd, _FALLOC_FL_KEEP_SIZE, ctypes.c_long(end), ctypes.c_long(OUTPUT_RESERVE_BYTES)
    )


@dataclass
class _Kept:
    rank: int
    proc: subprocess.Popen[bytes]
    record: ProcRecord
    copiers: list[threading.Thread] = field(default_factory=list)
    code: int | None = None  # once the leader has ended
    reaped: bool = False
    # Readable once the leader has ended (os.pidfd_open), so that the keeper wakes at the exit
    # rather than at its next poll; None where the kernel has no pidfds (it polls, as before).
    exit_watch: int | None = None


def _copy(pipes: list[tuple[Any, str]], path: Path) -> None:
    """A rank's pipes to its file, framed, in the order they are read: one thread waits on both,
    so what the trainer printed on stdout and stderr keeps its order in the file as far as the
    reads can tell (a line read before the next one on the other pipe was written comes before
    it; two pipes found ready at once are read one after the other). Each frame holds whole
    lines (see PARTIAL_FLUSH_SECONDS); flushed at once (the agent follows the file); not
    fsynced: a reboot ends the trainers and the keeper with them.

    The file keeps room allocated past its end, so that a full disk still takes a trainer's
    last lines. A frame the disk has no room for even so is cut back to where it began (the
    agent never reads part of it) and tried again until there is room; meanwhile the pipes are
    not read, so the trainer waits on its output rather than lose any."""
    with open(path, "ab", buffering=0) as out, selectors.DefaultSelector() as selector:
        _reserve_ahead(out.fileno(), out.tell())
        reserved_to = out.tell() + OUTPUT_RESERVE_BYTES
        told = False

        def write(stream: str, data: bytes, cut: bool = False) -> None:
            nonlocal reserved_to, told
            if not data:
                return
            framed = frame(stream, data, cut)
            while not _append(out, framed):
                if not told:
                    _say(f"no room for {path.name} on its disk: its output waits until there is")
                    told = True
                time.sleep(NO_ROOM_RETRY_SECONDS)
            if out.tell() + OUTPUT_RESERVE_BYTES // 2 > reserved_to:
                _reserve_ahead(out.fileno(), out.tell())
                reserved_to = out.tell() + OUTPUT_RESERVE_BYTES

        partial = {stream: b"" for _, stream in pipes}
        last_read = {stream: time.monotonic() for _, stream in pipes}
        for pipe, stream in pipes:
            selector.register(pipe, selectors.EVENT_READ, stream)
        while selector.get_map():
            waiting = [last_read[s] + PARTIAL_FLUSH_SECONDS for s, held in partial.items() if held]
            timeout = max(0.0, min(waiting) - time.monotonic()) if waiting else None
            for key, _ in selector.select(timeout):
                stream = key.data
                data = os.read(key.fd, COPY_BYTES)
                if not data:
                    selector.unregister(key.fileobj)
                    write(stream, partial[stream])
                    partial[stream] = b""
                    continue
                last_read[stream] = time.monotonic()
                data = partial[stream] + data
                whole = data.rfind(b"\n") + 1
                if len(data) - whole > MAX_PARTIAL_BYTES:  # a line with no end in sight
                    write(stream, data, cut=True)
                    partial[stream] = b""
                else:
                    write(stream, data[:whole])
                    partial[stream] = data[whole:]
            now = time.monotonic()
            for stream, held in partial.items():
                if held and now - last_read[stream] >= PARTIAL_FLUSH_SECONDS:
                    write(stream, held)
                    partial[stream] = b""
    for pipe, _ in pipes:
        pipe.close()


def _append(out: Any, data: bytes) -> bool:
    """All of `data` at the end of `out`, or none of it (False: no room)."""
    start = out.tell()
    view = memoryview(data)
    try:
        while view:
            view = view[out.write(view) or 0 :]
    except OSError:
        try:
            os.ftruncate(out.fileno(), start)
            out.seek(start)
        except OSError:
            pass
        return False
    return True


def _say(message: str) -> None:
    """A line in the keeper's log; a log it cannot write (a full disk) is no reason to fail."""
    try:
        print(f"trainyard keeper {os.getpid()}: {message}", file=sys.stderr, flush=True)
    except OSError:
        pass


def _exit_watch(pid: int) -> int | None:
    """A descriptor that becomes readable when `pid` (our unreaped child) ends, or None."""
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None


def _leader_exit(proc: subprocess.Popen[bytes]) -> int | None:
    """The leader's exit code (negative: killed by that signal), without reaping it."""
    try:
        status = os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return proc.poll()
    if status is None:
        return None
    return status.si_status if status.si_code == os.CLD_EXITED else -status.si_status


class Keeper:
    def __init__(self, folder: Path) -> None:
        self.folder = folder
        spec = json.loads((folder / SPEC).read_text())
        (folder / SPEC).unlink()  # the trainers' environment need not stay on disk
        self.spec = spec
        self.grace = float(spec.get("grace_seconds", DEFAULT_GRACE_SECONDS))
        self.stop_grace = float(spec.get("stop_grace_seconds", 5.0))
        self.records = ProcRecords(Path(spec["records_dir"]))
        self.kept: list[_Kept] = []
        self.agent: socket.socket | None = None
        self.alone_since: float | None = time.monotonic()  # until the first agent connects
        self.stopping_since: float | None = None
        self.killed = False
        self.released = False
        self.unclaimed_stop = False  # it stopped them itself: no agent came within the grace
        self.done = False
        me = psutil.Process()
        self.identity = {"pid": me.pid, "create_time": me.create_time()}

    def say(self, message: str) -> None:
        _say(message)

    def start(self) -> None:
        for rank, entry in enumerate(self.spec["procs"]):
            # The job's variables go on stdin to the chain's last step (workers/jobenv.py),
            # which runs as the job's uid: everything before it, this keeper's root or agent's
            # uid included, runs with an environment of ours.
            job_env = jobenv.stdin_for(entry["env"])
            try:
                proc = subprocess.Popen(
                    # Dies with this keeper, inside the instance's cgroups.
                    deathsig.command(
                        list(entry["argv"]),
                        cgroups=list(entry.get("cgroups", [])),
                        oom_score_adj=entry.get("oom_score_adj"),
                    ),
                    env=jobenv.privileged_env(),
                    cwd=entry["cwd"],
                    stdin=job_env,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    start_new_session=True,  # its own group: a stop reaches its children
                )
            finally:
                os.close(job_env)
            record = ProcRecord(
                int(self.spec["job_id"]),
                str(self.spec["role"]),
                int(self.spec["index"]),
                proc.pid,
                pgid=proc.pid,
                create_time=psutil.Process(proc.pid).create_time(),
                keeper_pid=int(self.identity["pid"]),
                keeper_create_time=float(self.identity["create_time"]),
            )
            self.records.write(record)  # while the leader is our unreaped child
            kept = _Kept(rank, proc, record, exit_watch=_exit_watch(proc.pid))
            reserve_record(self.folder / exit_name(rank))
            pipes = [(proc.stdout, "out"), (proc.stderr, "err")]
            # The output's room is taken now, before state.json says the processes run, not
            # whenever the copier's thread gets to it: a disk that fills meanwhile still takes
            # the trainer's last lines.
            with open(self.folder / output_name(rank), "ab") as out:
                _reserve_ahead(out.fileno(), out.tell())
            copier = threading.Thread(
                target=_copy, args=(pipes, self.folder / output_name(rank)), daemon=True
            )
            copier.start()
            kept.copiers.append(copier)
            self.kept.append(kept)

    def write_state(self, error: str | None = None) -> None:
        state: dict[str, Any] = {"keeper": self.identity}
        if error is not None:
            state["error"] = error
        state["procs"] = [
            {"pid": k.proc.pid, "create_time": k.record.create_time} for k in self.kept
        ]
        write_atomically(self.folder / STATE, json.dumps(state))

    def signal_all(self, sig: int) -> None:
        for kept in self.kept:
            if not kept.reaped:  # unreaped leader: the group id is still ours
                try:
                    os.killpg(kept.proc.pid, sig)
                except ProcessLookupError:
                    pass

    # --- the agent's connection ---

    def serve(self, listener: socket.socket) -> None:
        while not (self.done and (self.released or self._alone_too_long())):
            readable: list[Any] = [listener] + ([self.agent] if self.agent is not None else [])
            # A leader's exit wakes the loop at once: its record is written, and the agent
            # told, without waiting for the poll.
            readable += [k.exit_watch for k in self.kept if k.exit_watch is not None]
            for ready in select.select(readable, [], [], POLL_SECONDS)[0]:
                if ready is listener:
                    self._accept(listener)
                elif ready is self.agent:
                    self._read_commands()
            self._tend()

    def _accept(self, listener: socket.socket) -> None:
        conn, _ = listener.accept()
        if self.agent is not None:
            self.agent.close()  # one agent per work dir: a new connection is its successor
        self.agent = conn
        self.alone_since = None
        if self.stopping_since is None:
            self.say("claimed by an agent")

    def _read_commands(self) -> None:
        assert self.agent is not None
        try:
            data = self.agent.recv(4096)
        except OSError:
            data = b""
        if not data:
            self.agent.close()
            self.agent = None
            self.alone_since = time.monotonic()
            if not self.done:
                self.say(f"no agent holds it now; it stops the processes in {self.grace:g} s")
            return
        for command in data.split():
            if command == TERM:
                self._begin_stop()
            elif command == KILL:
                self.killed = True
                self.signal_all(signal.SIGKILL)
            elif command == RELEASE:
                self.released = True

    def _alone_too_long(self) -> bool:
        return self.alone_since is not None and time.monotonic() - self.alone_since >= self.grace

    def _begin_stop(self) -> None:
        if self.stopping_since is None:
            self.stopping_since = time.monotonic()
        self.signal_all(signal.SIGTERM)

    # --- the processes ---

    def _tend(self) -> None:
        if not self.done and self._alone_too_long() and self.stopping_since is None:
            self.say(f"no agent claimed it within {self.grace:g} s: stopping its processes")
            self.unclaimed_stop = True
            self._begin_stop()
        if (
            self.stopping_since is not None
            and not self.killed
            and time.monotonic() - self.stopping_since >= self.stop_grace
        ):
            self.killed = True
            self.signal_all(signal.SIGKILL)
        for kept in self.kept:
            if kept.reaped:
                continue
            code = _leader_exit(kept.proc)
            if code is None:
                continue
            # What the leader left in its group goes with it (data-loader workers and the like),
            # before the leader is reaped and the group id may name a stranger's group.
            try:
                os.killpg(kept.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            kept.proc.wait()
            kept.reaped = True
            kept.code = code
            ends = time.monotonic() + EXIT_AFTER_OUTPUT_SECONDS
            for copier in kept.copiers:
                copier.join(max(0.0, ends - time.monotonic()))
            ended = {"code": code, "at": time.time(), "unclaimed": self.unclaimed_stop}
            write_atomically(self.folder / exit_name(kept.rank), json.dumps(ended))
            if kept.exit_watch is not None:
                os.close(kept.exit_watch)
                kept.exit_watch = None
            self._tell_agent()
        if not self.done and all(k.reaped for k in self.kept):
            self._finish()

    def _finish(self) -> None:
        ends = time.monotonic() + COPY_END_SECONDS
        for kept in self.kept:
            for copier in kept.copiers:
                copier.join(max(0.0, ends - time.monotonic()))
            if not group_members(kept.record.pgid) or reap(kept.record) is not None:
                self.records.remove(kept.record)
        write_atomically(self.folder / DONE, "")
        self.done = True
        self._tell_agent()

    def _tell_agent(self) -> None:
        """Wake the agent that holds this keeper: an exit record or `done` is on disk. The
        files stay the record (an agent that was not connected reads them when it comes); this
        only spares the agent its poll."""
        if self.agent is None:
            return
        try:
            self.agent.sendall(NEWS + b"\n")
        except OSError:
            pass  # gone: _read_commands sees the end of the connection


def wait_as_spare() -> Path | None:
    """A spare keeper (`--spare`): started ahead of any replica, with its interpreter up and its
    modules imported, it waits for the folder of the replica it is to keep, one line on stdin,
    from the agent that started it. None when stdin ends first: that agent no longer needs it
    (it stopped, or died), and a spare holds nothing to outlive it for.

    Once it has its folder it is the keeper `python -m workers.keeper FOLDER` would have been:
    stdin becomes /dev/null, and stdout and stderr go to the folder's log."""
    line = sys.stdin.buffer.readline()
    if not line.endswith(b"\n"):
        return None
    folder = Path(os.fsdecode(line[:-1])).resolve()
    with open(os.devnull, "rb") as devnull, open(folder / LOG, "ab") as log:
        os.dup2(devnull.fileno(), 0)
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
    return folder


def main(args: list[str]) -> int:
    if len(args) != 1:
        print("usage: python -m workers.keeper FOLDER | --spare", file=sys.stderr)
        return 2
    if args[0] == SPARE:
        found = wait_as_spare()
        if found is None:
            return 0
        folder = found
    else:
        folder = Path(args[0]).resolve()
    os.chdir(folder)  # the socket's name is relative: a unix socket path has 108 bytes at most
    keeper = Keeper(folder)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    Path(SOCKET).unlink(missing_ok=True)
    listener.bind(SOCKET)
    listener.listen(4)
    try:
        keeper.start()
    except OSError as exc:
        keeper.say(f"could not start the processes: {exc}")
        keeper.signal_all(signal.SIGKILL)
        keeper.write_state(error=str(exc))
    else:
        keeper.write_state()
    keeper.serve(listener)
    listener.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
