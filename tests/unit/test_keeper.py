"""A replica's keeper on its own: it holds no secret of the agent, records exits, stops its
processes when no agent claims it within its grace; and following its files by offset."""

import fcntl
import json
import os
import subprocess
import sys
import termios
import threading
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from tests.conftest import process_alive
from tests.keeper_output import read_output
from tests.tmpfs import fill, small_tmpfs
from tests.unit.test_supervisor import wait_until
from workers import jobenv, keeper
from workers.filetail import FileTail
from workers.keeper import frame, read_frames
from workers.keeperlink import KeeperLink, KeptProcess, SpareKeepers
from workers.logsink import Ledger
from workers.procrecords import ProcRecords

SLEEPER = [sys.executable, "-c", "import time; print('up', flush=True); time.sleep(600)"]


@pytest.fixture
def links() -> Iterator[list[KeeperLink]]:
    made: list[KeeperLink] = []
    yield made
    for link in made:
        for pid in link.pids():
            if process_alive(pid):
                os.kill(pid, 9)
        link.kill()
        link.release(wait=10)


def start(
    tmp_path: Path, argv: list[str], grace: float = 60.0, env: dict[str, str] | None = None
) -> KeeperLink:
    replica = {"spec": {"job_id": 5, "role": "worker", "index": 1}}
    return KeeperLink.start(
        tmp_path / "keeper",
        # As the sandbox builds it: the last step sets the job's environment.
        [KeptProcess(jobenv.command(argv, tmp_path), env or {"TRAINYARD_JOB_ID": "5"}, tmp_path)],
        replica,
        tmp_path / "procs",
        grace_seconds=grace,
        stop_grace_seconds=1.0,
    )


def test_the_keeper_holds_none_of_the_agents_secrets(
    tmp_path: Path, links: list[KeeperLink], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("REDIS_URL", "redis://node-1:agent-secret@127.0.0.1:1/0")
    link = start(tmp_path, SLEEPER, env={"TRAINYARD_JOB_ID": "5", "PATH": "/usr/bin"})
    links.append(link)
    keeper = psutil.Process(int((link.state() or {})["keeper"]["pid"]))
    assert "REDIS_URL" not in keeper.environ()
    assert "agent-secret" not in " ".join(keeper.cmdline())
    [trainer] = link.pids()
    # Once the chain has become the trainer (the shims before it have an environment of
    # their own, never the job's): what it was given, and nothing else.
    wait_until(lambda: psutil.Process(trainer).cmdline() == SLEEPER, 30, "the trainer")
    given = psutil.Process(trainer).environ()
    assert given == {"TRAINYARD_JOB_ID": "5", "PATH": "/usr/bin"}
    # The spec that carried the trainer's environment is gone once read.
    assert sorted(p.name for p in link.folder.iterdir() if p.name.endswith(".json")) == [
        "replica.json",
        "state.json",
    ]


def test_it_records_the_exit_and_ends_once_released(
    tmp_path: Path, links: list[KeeperLink]
) -> None:
    link = start(tmp_path, [sys.executable, "-c", "import sys; print('bye'); sys.exit(3)"])
    wait_until(link.done, 30, "the keeper to see its process end")
    [exited] = link.exits()
    assert exited is not None and exited["code"] == 3
    assert read_output(link.output(0)) == {"out": b"bye\n", "err": b""}
    assert ProcRecords(tmp_path / "procs").load() == []
    link.release()
    assert not link.alive()


def test_unclaimed_for_its_grace_it_stops_its_processes_and_ends(tmp_path: Path) -> None:
    link = start(tmp_path, SLEEPER, grace=1.0)
    [trainer] = link.pids()
    link.detach()  # as an agent that dies does
    assert process_alive(trainer)
    wait_until(lambda: not process_alive(trainer) and not link.alive(), 10, "the keeper's stop")
    [exited] = link.exits()
    assert exited is not None and exited["code"] == -15  # it obeyed the SIGTERM
    assert exited["unclaimed"] is True
    assert "no agent claimed it within 1 s" in (link.folder / "keeper.log").read_text()


def test_a_file_is_followed_from_an_offset_frame_by_frame(tmp_path: Path) -> None:
    path = tmp_path / "output-0"
    zero, one, three = (
        frame("out", b"zero\n"),
        frame("err", b"one\ntwo\n"),
        frame("out", b"three\n"),
    )
    path.write_bytes(zero + one + three[:7])  # the last frame not whole yet
    got: list[tuple[str, list[str], int]] = []
    ended = threading.Event()
    tail = FileTail(
        path, len(zero), lambda ts, stream, lines, offset: got.append((stream, lines, offset)),
        ended.is_set,
    )  # fmt: skip
    tail.start()
    wait_until(lambda: got, 10, "the first lines")
    assert got == [("err", ["one", "two"], len(zero + one))]
    assert tail.read_to == len(zero + one + three[:7])
    with open(path, "ab") as f:
        f.write(three[7:] + frame("out", b"four"))  # a partial line the keeper flushed
    ended.set()
    tail.join(10)
    assert got[1:] == [("out", ["three", "four"], len(path.read_bytes()))]
    assert json.dumps(got)  # plain data, as the shipper takes it


def test_from_any_offset_handed_on_the_rest_is_read_once(tmp_path: Path) -> None:
    """Each offset handed on is a frame's end with every line before it handed on and none
    after: a new agent resuming from the last one Redis saw sends each line once."""
    path = tmp_path / "output-0"
    frames = [
        frame("out", b"a\nb\n"), frame("err", b"x\n"), frame("out", b"c"),  # c: flushed partial
        frame("out", b"d\n" * 1500), frame("err", b"y" * 70_000, cut=True), frame("err", b"z\n"),
    ]  # fmt: skip
    path.write_bytes(b"".join(frames))

    def follow(offset: int) -> list[tuple[str, str, int]]:
        got: list[tuple[str, str, int]] = []

        def emit(ts: float, stream: str, lines: list[str], end: int) -> None:
            got.extend((stream, line, end) for line in lines)

        FileTail(path, offset, emit, lambda: True).run()
        return got

    everything = follow(0)
    assert [(stream, line[:3]) for stream, line, _ in everything[:4]] == [
        ("out", "a"), ("out", "b"), ("err", "x"), ("out", "c"),
    ]  # fmt: skip
    assert everything[-1][:2] == ("err", "z")
    # Cut for its length: every piece, the last one too, says the line goes on (in "z").
    assert [line[:1] + line[-3:] for _, line, _ in everything[-6:-1]] == ["y ⏎…"] * 5
    ends = sorted({end for _, _, end in everything})
    assert ends[-1] == len(path.read_bytes())
    assert all(end in {sum(map(len, frames[:k])) for k in range(1, 7)} for end in ends)
    for offset in [0, *ends]:
        resumed = follow(offset)
        assert resumed == [entry for entry in everything if entry[2] > offset]


def test_what_the_database_has_of_a_file_is_freed_on_disk(tmp_path: Path) -> None:
    """A flooding trainer must not fill the disk through its keeper's files; a line is freed
    only once the log keeper acknowledges it (here: at once)."""
    path = tmp_path / "output-0"
    one = frame("out", b"x" * 99 + b"\n")
    path.write_bytes(one * 20_000)  # 2 MB
    got: list[int] = []
    acked = lambda: got[-1] if got else 0  # noqa: E731
    tail = FileTail(
        path, 0, lambda ts, stream, lines, offset: got.append(offset), lambda: True,
        ledger=Ledger(seen=acked, acked=acked, epoch=lambda: ""), discard_every=256 * 1024,
    )  # fmt: skip
    tail.run()
    size = len(one) * 20_000
    assert got[-1] == size
    assert tail.discarded > size // 2  # most of it; what was read last is still there
    assert path.stat().st_size == size  # offsets stay valid
    assert path.stat().st_blocks * 512 < size - tail.discarded + 64 * 1024


def test_nothing_the_database_lacks_is_freed_and_a_rewind_reads_it_again(tmp_path: Path) -> None:
    path = tmp_path / "output-0"
    one = frame("out", b"x" * 99 + b"\n")
    path.write_bytes(one * 20_000)  # 2 MB
    got: list[tuple[int, int, int]] = []  # (start, end, generation) of each emit
    holder: list[FileTail] = []

    def emit(ts: float, stream: str, lines: list[str], offset: int) -> None:
        got.append((holder[0].offset, offset, holder[0].generation))

    epochs = iter(["one", "one", "two"])  # the keeper realigns after the first look
    tail = FileTail(
        path, 0, emit, lambda: True, discard_every=256 * 1024,
        ledger=Ledger(seen=lambda: 5 * len(one), acked=lambda: 0, epoch=lambda: next(epochs)),
    )  # fmt: skip
    holder.append(tail)
    tail.rewind(0)  # Redis lost what came after 5 frames
    tail.rewind(0)  # asked again by a later batch of the same reading: one rewind
    tail.run()
    assert tail.discarded == 0  # nothing acknowledged, nothing freed
    assert tail.generation == 1
    assert got[0] == (5 * len(one), got[0][1], 1)  # read again from what Redis still has
    assert [end for _, end, _ in got][-1] == len(one) * 20_000
    assert all(
        start == previous for (start, _, _), (_, previous, _) in zip(got[1:], got[:-1], strict=True)
    )


# Prints `count` numbered lines, alternating stdout and stderr (written straight to the pipes,
# no buffering). With `wait`, before a line on the other stream it waits until the keeper has
# read what it wrote (FIONREAD: the pipe is empty), which is what the keeper's order rests on.
ALTERNATE = (
    "import fcntl, os, sys, termios\n"
    "def unread(fd):\n"
    "    return int.from_bytes(fcntl.ioctl(fd, termios.FIONREAD, bytes(4)), 'little')\n"
    "count, wait = int(sys.argv[1]), sys.argv[2] == 'wait'\n"
    "for i in range(count):\n"
    "    fd = 1 + i % 2\n"
    "    os.write(fd, f'line {i}\\n'.encode())\n"
    "    while wait and unread(fd):\n"
    "        os.sched_yield()\n"
)


def follow_all(path: Path) -> list[tuple[str, str]]:
    got: list[tuple[str, str]] = []
    tail = FileTail(
        path, 0, lambda ts, stream, lines, end: got.extend((stream, line) for line in lines),
        lambda: True,
    )  # fmt: skip
    tail.run()
    return got


def test_stdout_and_stderr_are_shipped_in_the_order_printed(
    tmp_path: Path, links: list[KeeperLink]
) -> None:
    """One copier reads both pipes: a line the keeper read before the trainer wrote the next
    one on the other stream comes before it, with its stream."""
    count = 4000
    link = start(tmp_path, [sys.executable, "-c", ALTERNATE, str(count), "wait"])
    links.append(link)
    wait_until(link.done, 60, "the keeper to see its process end")
    assert follow_all(link.output(0)) == [
        ("out" if i % 2 == 0 else "err", f"line {i}") for i in range(count)
    ]


def test_lines_printed_faster_than_read_keep_their_order_in_each_stream(
    tmp_path: Path, links: list[KeeperLink]
) -> None:
    """Both pipes found ready at once are read one after the other: which line went into them
    first, the pipes cannot tell. What holds then: each stream in its order, every line once,
    each with its stream."""
    count = 20_000
    link = start(tmp_path, [sys.executable, "-c", ALTERNATE, str(count), "nowait"])
    links.append(link)
    wait_until(link.done, 60, "the keeper to see its process end")
    got = follow_all(link.output(0))
    printed = [("out" if i % 2 == 0 else "err", f"line {i}") for i in range(count)]
    assert sorted(got, key=lambda entry: int(entry[1].split()[1])) == printed
    for stream in ("out", "err"):
        assert [e for e in got if e[0] == stream] == [e for e in printed if e[0] == stream]


def test_a_partial_line_waits_in_the_keeper_for_its_end(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A line printed in two writes, with a line on the other stream between them, stays one
    line in one frame (it comes after that other line: it ended after it), so that no frame
    ends inside a line and every frame's end is a point to resume from."""
    monkeypatch.setattr(keeper, "PARTIAL_FLUSH_SECONDS", 3600.0)  # no flush on a quiet pipe
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    path = tmp_path / "output-0"
    pipes = [
        (os.fdopen(out_r, "rb", buffering=0), "out"),
        (os.fdopen(err_r, "rb", buffering=0), "err"),
    ]
    copier = threading.Thread(target=keeper._copy, args=(pipes, path))
    copier.start()

    def written(fd: int, data: bytes) -> None:  # and read by the copier
        os.write(fd, data)
        wait_until(
            lambda: not int.from_bytes(fcntl.ioctl(fd, termios.FIONREAD, bytes(4)), "little"),
            10,
            "the copier to read",
        )

    written(out_w, b"loss")
    written(err_w, b"a warning\n")
    written(out_w, b" 0.5\nstep")
    os.close(out_w)  # the pipe's end flushes what is left
    os.close(err_w)
    copier.join(30)
    frames, used = read_frames(path.read_bytes())
    assert used == path.stat().st_size
    assert [(stream, data) for stream, data, _, _ in frames] == [
        ("err", b"a warning\n"), ("out", b"loss 0.5\n"), ("out", b"step"),
    ]  # fmt: skip


# Fills the disk its argument names, then dies of the ENOSPC (the traceback on stderr).
FILL_AND_DIE = (
    "import sys\n"
    "print('filling', flush=True)\n"
    "with open(sys.argv[1], 'wb', buffering=0) as f:\n"
    "    while True:\n"
    "        f.write(b'x' * 4096)\n"
)


def test_on_a_full_disk_it_still_records_the_exit_and_the_last_lines(
    links: list[KeeperLink],
) -> None:
    """The trainer that fills the keeper's own disk dies of it: its traceback and its exit are
    still written (room reserved beforehand), so the agent can say what killed it."""
    with small_tmpfs("2m") as disk:
        link = start(disk, [sys.executable, "-c", FILL_AND_DIE, str(disk / "blob")])
        links.append(link)
        wait_until(link.done, 30, "the keeper to see its process end")
        [exited] = link.exits()
        assert exited is not None and exited["code"] == 1
        output = read_output(link.output(0))
        assert output["out"] == b"filling\n"
        err = output["err"].decode()
        assert "OSError: [Errno 28] No space left on device" in err
        link.release(wait=10)


def test_on_a_full_disk_output_waits_for_room_and_none_is_lost(
    tmp_path: Path, links: list[KeeperLink]
) -> None:
    """More output than the room reserved for it on a full disk: the trainer waits on its
    pipe (it cannot end: its output does not fit), and once there is room every line is in the
    file, once, in order."""
    go = tmp_path / "go"
    printer = (
        "import pathlib, sys, time\n"
        f"while not pathlib.Path({str(go)!r}).exists(): time.sleep(0.05)\n"
        "for i in range(40000):\n"
        "    print(f'line {i:08d}')\n"
    )
    with small_tmpfs("4m") as disk:
        link = start(disk, [sys.executable, "-c", printer])
        links.append(link)
        filler = fill(disk)
        go.touch()
        out = link.output(0)
        # Most of the room: a frame that does not fit (up to a pipe's worth, 64 KiB) stays out.
        used = keeper.OUTPUT_RESERVE_BYTES // 2
        wait_until(lambda: out.stat().st_size >= used, 30, "the reserved room to be used")
        assert not link.done()
        filler.unlink()
        wait_until(link.done, 30, "the keeper to see its process end")
        [exited] = link.exits()
        assert exited is not None and exited["code"] == 0
        printed = read_output(out)["out"].decode().splitlines()
        assert printed == [f"line {i:08d}" for i in range(40000)]
        link.release(wait=10)


# What a trainer sees of its start: every one of these must be the same whether its keeper was
# started for it (cold) or was a spare waiting for it.
SEEN = """
import json, os, resource, signal, sys
fds = sorted(int(fd) for fd in os.listdir("/proc/self/fd"))
print(json.dumps({
    "argv": sys.argv, "cwd": os.getcwd(), "env": dict(os.environ), "path": sys.path,
    "signals": {s.name: str(signal.getsignal(s)) for s in signal.valid_signals()
                if isinstance(s, signal.Signals) and s not in (signal.SIGKILL, signal.SIGSTOP)},
    "blocked": sorted(int(s) for s in signal.pthread_sigmask(signal.SIG_BLOCK, [])),
    "fds": {fd: os.readlink(f"/proc/self/fd/{fd}").split(":")[0] for fd in fds[:-1]},
    "rlimits": {n: resource.getrlimit(getattr(resource, n))
                for n in dir(resource) if n.startswith("RLIMIT_")},
    "umask": os.umask(0), "session_leader": os.getsid(0) == os.getpid(),
    "group_leader": os.getpgid(0) == os.getpid(),
}), flush=True)
"""


def _seen(link: KeeperLink) -> dict[str, object]:
    wait_until(link.done, 30, "the trainer to end")
    out = read_output(link.output(0))
    assert out["err"] == b"", out["err"]
    seen: dict[str, object] = json.loads(out["out"])
    return seen


def test_a_trainer_from_a_spare_keeper_starts_exactly_as_from_a_cold_one(
    tmp_path: Path, links: list[KeeperLink]
) -> None:
    spares = SpareKeepers()
    try:
        argv = [sys.executable, "-c", SEEN, "--lr", "0.1"]
        env = {"TRAINYARD_JOB_ID": "5", "PATH": "/usr/bin", "OMP_NUM_THREADS": "1"}
        (tmp_path / "cold").mkdir()
        (tmp_path / "warm").mkdir()
        cold = start(tmp_path / "cold", argv, env=env)
        links.append(cold)
        spare_pid = spares.pid()
        assert spare_pid is not None
        warm = KeeperLink.start(
            tmp_path / "warm" / "keeper",
            # The same cwd as the cold one's, and the same last step (as the sandbox builds).
            [KeptProcess(jobenv.command(argv, tmp_path / "cold"), env, tmp_path / "cold")],
            {"spec": {"job_id": 5, "role": "worker", "index": 1}},
            tmp_path / "procs",
            grace_seconds=60.0,
            stop_grace_seconds=1.0,
            spares=spares,
        )
        links.append(warm)
        # It was the spare that kept it, and a new spare waits for the next replica.
        assert (warm.state() or {})["keeper"]["pid"] == spare_pid
        assert spares.pid() not in (None, spare_pid)
        cold_seen, warm_seen = _seen(cold), _seen(warm)
        assert warm_seen == cold_seen
        # And what each saw is what it was given, not something both keepers leak alike.
        assert cold_seen["argv"] == ["-c", "--lr", "0.1"]
        assert cold_seen["cwd"] == str(tmp_path / "cold")
        env_seen = dict(cold_seen["env"])  # type: ignore[call-overload]
        env_seen.pop("LC_CTYPE", None)  # the C locale's coercion by the shim's Python
        assert env_seen == env
        assert cold_seen["fds"] == {"0": "/dev/null", "1": "pipe", "2": "pipe"}
        assert cold_seen["session_leader"] and cold_seen["group_leader"]
        # The spare's own log went where the keeper's log goes.
        assert (warm.folder / keeper.LOG).exists()
    finally:
        spares.close()


def test_replicas_arriving_together_each_get_a_waiting_spare(
    tmp_path: Path, links: list[KeeperLink]
) -> None:
    """With a pool of two, two replicas started back to back both get a keeper that was
    already waiting (before, the second waited for a cold one), and two wait again after."""
    spares = SpareKeepers(count=2)
    try:
        waiting = spares.pids()
        assert len(waiting) == 2 and all(process_alive(p) for p in waiting)
        kept = []
        for name in ("master", "worker"):
            (tmp_path / name).mkdir()
            link = KeeperLink.start(
                tmp_path / name / "keeper",
                [KeptProcess(SLEEPER, {"TRAINYARD_JOB_ID": "5"}, tmp_path / name)],
                {"spec": {"job_id": 5, "role": name, "index": 0}},
                tmp_path / "procs",
                grace_seconds=60.0,
                stop_grace_seconds=1.0,
                spares=spares,
            )
            links.append(link)
            kept.append(int((link.state() or {})["keeper"]["pid"]))
        assert kept == waiting  # the oldest first
        assert len(spares.pids()) == 2 and not set(spares.pids()) & set(waiting)
        left = spares.pids()
    finally:
        spares.close()
    assert spares.pids() == []
    wait_until(lambda: not any(process_alive(pid) for pid in left), 30, "the spares to exit")


def test_a_pool_hands_out_the_next_spare_when_one_has_died(tmp_path: Path) -> None:
    spares = SpareKeepers(count=2)
    try:
        dead, alive = spares.pids()
        os.kill(dead, 9)
        wait_until(lambda: not process_alive(dead), 30, "the first spare to die")
        (tmp_path / "keeper").mkdir()
        proc = spares.take(tmp_path / "keeper")
        assert proc is not None and proc.pid == alive
        assert len(spares.pids()) == 2 and dead not in spares.pids()
        proc.kill()
        proc.wait()
    finally:
        spares.close()


def test_a_spare_keeper_ends_when_its_agent_no_longer_needs_it(tmp_path: Path) -> None:
    spares = SpareKeepers(start=False)
    assert spares.pid() is None  # none until asked for
    spares.replenish()
    pid = spares.pid()
    assert pid is not None and process_alive(pid)
    spares.close()
    assert spares.pid() is None
    wait_until(lambda: not process_alive(pid), 30, "the spare to exit")
    assert spares.take(tmp_path) is None  # a closed one starts no more


def test_a_spare_keeper_whose_agent_died_exits_holding_nothing(tmp_path: Path) -> None:
    # Its stdin ends without a folder, as when the agent that started it is killed.
    proc = subprocess.Popen(
        [sys.executable, "-m", "workers.keeper", keeper.SPARE],
        stdin=subprocess.PIPE, cwd=Path(keeper.__file__).parent.parent,
    )  # fmt: skip
    assert proc.stdin is not None
    proc.stdin.close()
    assert proc.wait(30) == 0


def test_the_keeper_tells_its_agent_when_it_records_an_exit(
    tmp_path: Path, links: list[KeeperLink]
) -> None:
    link = start(tmp_path, [sys.executable, "-c", "import sys; sys.stdin.read()"])
    links.append(link)
    conn = link._conn
    assert conn is not None
    [trainer] = link.pids()
    os.kill(trainer, 9)
    heard = b""
    while heard.count(keeper.NEWS) < 2:  # the exit record, then `done`
        chunk = conn.recv(4096)
        assert chunk, "the keeper closed the connection before its news"
        heard += chunk
    assert heard == keeper.NEWS + b"\n" + keeper.NEWS + b"\n"
    [exited] = link.exits()
    assert exited is not None and exited["code"] == -9
    assert link.done()
