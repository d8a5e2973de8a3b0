"""Checkpoint resume and SIGTERM checkpointing in the built-in examples.

Real trainer processes (workers/examples/digits_ddp.py and digits_ps.py), started with the
variables the platform sets, killed as the platform kills them (SIGKILL, or SIGTERM to the
process group), and started again on the same checkpoint directory with the next restart count.
Every wait has a deadline that only turns a hang into a failure; nothing asserts on time.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from tests.ps import launcher
from tests.ps.launcher import PS_SCRIPT, Job, free_port, ps_env, spawn
from workers import contract
from workers.examples import digits_ddp

EPOCHS = 8
ARGS = ["--epochs", str(EPOCHS), "--batch-size", "32", "--seed", "0"]
STEPS = 45  # 1437 training rows in batches of 32, for one rank or one worker
# The goal: a resumed run ends within 2 points of an uninterrupted one of the same seed.
TOLERANCE = 0.02
# Only turns a hang into a failure: a run here takes seconds, most of it importing torch.
GUARD_S = 180.0
POLL_S = 0.005  # how often a test looks for a line it waits on, to signal soon after it

EPOCH_LINE = re.compile(r"^epoch=(\d+)/(\d+) loss=([0-9.]+) ")
FINAL = re.compile(r"^final eval_accuracy=([0-9.]+) wall_time_s=[0-9.]+$")
RESUMED = re.compile(
    r"^resumed from checkpoint (\S+) at epoch=(\d+)/(\d+)(?: step=(\d+)/(\d+))? "
    r"\(restart (\d+)\)$"
)
SIGTERM_SAVED = re.compile(r"^SIGTERM: saved checkpoint at epoch=(\d+) step=(\d+)/(\d+); exiting$")


@dataclass
class Run:
    """A finished job: exit codes and stdout lines by process tag ("master", "worker-0", ...)."""

    codes: dict[str, int]
    job: Job

    def lines(self, tag: str) -> list[str]:
        return self.job[tag].stdout_lines()

    def epochs(self, tag: str) -> list[int]:
        return [int(m.group(1)) for m in map(EPOCH_LINE.match, self.lines(tag)) if m]

    def losses(self, tag: str) -> dict[int, float]:
        return {
            int(m.group(1)): float(m.group(3)) for m in map(EPOCH_LINE.match, self.lines(tag)) if m
        }

    def final_accuracy(self, tag: str) -> float:
        found = [float(m.group(1)) for m in map(FINAL.match, self.lines(tag)) if m]
        assert len(found) == 1, self.job.dump()
        return found[0]

    def only(self, tag: str, pattern: re.Pattern[str]) -> re.Match[str]:
        found = [m for m in map(pattern.match, self.lines(tag)) if m]
        assert len(found) == 1, f"expected one line like {pattern.pattern}:\n{self.job.dump()}"
        return found[0]

    def resumed(self, tag: str) -> tuple[int, int, int]:
        """(epochs done, steps done, restart) from the resume line."""
        m = self.only(tag, RESUMED)
        assert int(m.group(3)) == EPOCHS
        return int(m.group(2)), int(m.group(4) or 0), int(m.group(6))


def checkpoint_env(env: dict[str, str], checkpoints: Path, restart: int) -> dict[str, str]:
    env["TRAINYARD_CHECKPOINT_DIR"] = str(checkpoints)
    env["TRAINYARD_RESTART_COUNT"] = str(restart)
    return env


def ddp_job(
    checkpoints: Path, restart: int = 0, ranks: int = 1, metrics_file: Path | None = None
) -> AbstractContextManager[Job]:
    """digits_ddp.py as the platform starts it, on this checkpoint folder and restart count."""
    extra = checkpoint_env({}, checkpoints, restart)
    if metrics_file is not None:
        extra[contract.TRAINYARD_METRICS_FILE] = str(metrics_file)
    return launcher.ddp_job(ranks, ARGS, extra)


@contextmanager
def ps_job(checkpoints: Path, restart: int = 0) -> Iterator[Job]:
    """digits_ps.py with 1 scheduler, 1 server and 1 worker in dist_sync."""
    port = free_port()
    job = Job({})
    try:
        for role, tag in (
            ("scheduler", "scheduler"),
            ("server", "server-0"),
            ("worker", "worker-0"),
        ):
            env = checkpoint_env(ps_env(role, 0, 1, 1, port), checkpoints, restart)
            job.procs[tag] = spawn(tag, PS_SCRIPT, ["--kvstore", "dist_sync", *ARGS], env)
        yield job
    finally:
        job.stop()


def finish(job: Job) -> Run:
    return Run(job.wait(GUARD_S), job)


def signal_after(job: Job, tag: str, needle: str, sig: signal.Signals, targets: list[str]) -> None:
    """As soon as `tag` prints a line starting with `needle`, send `sig` to the process group of
    each of `targets`, in that order (as the platform stops an instance: its whole group)."""
    deadline = time.monotonic() + GUARD_S
    proc = job[tag]
    while not any(line.startswith(needle) for line in proc.stdout_lines()):
        if proc.popen.poll() is not None:
            raise AssertionError(f"{tag} exited before printing {needle!r}:\n{job.dump()}")
        if time.monotonic() > deadline:
            raise AssertionError(f"{tag} never printed {needle!r}:\n{job.dump()}")
        time.sleep(POLL_S)
    for target in targets:
        os.killpg(job[target].popen.pid, sig)


def sigterm_mid_epoch(job: Job, metrics_file: Path, step: int) -> None:
    """SIGTERM the master once its metrics channel reports global step `step` (the loss every 5
    steps): a signal sent on an epoch's line may land before the next epoch's first step, and
    this test wants it to land in the middle of one."""
    deadline = time.monotonic() + GUARD_S
    proc = job["master"]
    while True:
        text = metrics_file.read_text() if metrics_file.exists() else ""
        # Only whole lines: the trainer may be half-way through writing the last one.
        records = [
            json.loads(line) for line in text.splitlines(keepends=True) if line.endswith("\n")
        ]
        if any(r.get("step", -1) >= step and "loss" in r for r in records):
            break
        if proc.popen.poll() is not None:
            raise AssertionError(f"master exited before step {step}:\n{job.dump()}")
        if time.monotonic() > deadline:
            raise AssertionError(f"master never reported step {step}:\n{job.dump()}")
        time.sleep(POLL_S)
    os.killpg(proc.popen.pid, signal.SIGTERM)


def saved_position(checkpoints: Path) -> tuple[int, int]:
    state = torch.load(checkpoints / "latest.pt", map_location="cpu", weights_only=True)
    return int(state["epochs_done"]), int(state["steps_done"])


def temporary_files(checkpoints: Path) -> list[str]:
    return sorted(p.name for p in checkpoints.iterdir() if p.name.endswith(".tmp"))


@pytest.fixture(scope="module")
def baseline(tmp_path_factory: pytest.TempPathFactory) -> tuple[Run, Path]:
    """One uninterrupted single-rank run (and its checkpoint directory) for the module."""
    checkpoints = tmp_path_factory.mktemp("baseline") / "job-1"  # created by the trainer
    with ddp_job(checkpoints) as job:
        return finish(job), checkpoints


@pytest.fixture(scope="module")
def ps_baseline(tmp_path_factory: pytest.TempPathFactory) -> Run:
    with ps_job(tmp_path_factory.mktemp("ps-baseline")) as job:
        return finish(job)


def test_an_uninterrupted_run_saves_every_epoch_and_the_final_weights(
    baseline: tuple[Run, Path],
) -> None:
    run, checkpoints = baseline
    assert run.codes == {"master": 0}, run.job.dump()
    assert run.epochs("master") == list(range(1, EPOCHS + 1))
    assert not any(RESUMED.match(line) for line in run.lines("master"))
    assert saved_position(checkpoints) == (EPOCHS, 0)
    assert (checkpoints / "model.pt").is_file()
    assert temporary_files(checkpoints) == []
    assert run.final_accuracy("master") >= 0.95


def test_a_run_killed_after_an_epoch_resumes_from_it_and_ends_as_an_uninterrupted_one(
    baseline: tuple[Run, Path], tmp_path: Path
) -> None:
    k = 3
    with ddp_job(tmp_path) as job:
        signal_after(job, "master", f"epoch={k}/", signal.SIGKILL, ["master"])
        killed = finish(job)
    assert killed.codes == {"master": -signal.SIGKILL}, killed.job.dump()
    printed = killed.epochs("master")
    assert printed[:k] == list(range(1, k + 1)) and printed[-1] < EPOCHS, killed.job.dump()

    with ddp_job(tmp_path, restart=1) as job:
        resumed = finish(job)
    assert resumed.codes == {"master": 0}, resumed.job.dump()
    epoch, step, restart = resumed.resumed("master")
    # Each epoch's checkpoint is written before its line: every epoch printed was saved, and
    # the kill may have come after the next one's save and before its line.
    assert printed[-1] <= epoch <= printed[-1] + 1
    assert (step, restart) == (0, 1)
    # No epoch before the checkpoint is done again; every later one is, once.
    assert resumed.epochs("master") == list(range(epoch + 1, EPOCHS + 1))

    whole, again = baseline[0].final_accuracy("master"), resumed.final_accuracy("master")
    print(
        f"\nfinal eval_accuracy: uninterrupted {whole:.4f}, killed after epoch {epoch} and "
        f"resumed {again:.4f}"
    )
    assert abs(again - whole) <= TOLERANCE


def test_sigterm_saves_mid_epoch_exits_143_and_the_resumed_run_skips_the_batches_done(
    baseline: tuple[Run, Path], tmp_path: Path
) -> None:
    checkpoints, metrics_file = tmp_path / "job-1", tmp_path / "metrics-0.jsonl"
    with ddp_job(checkpoints, metrics_file=metrics_file) as job:
        sigterm_mid_epoch(job, metrics_file, step=2 * STEPS + 5)  # the 6th batch of epoch 3
        stopped = finish(job)
    assert stopped.codes == {"master": 143}, stopped.job.dump()
    m = stopped.only("master", SIGTERM_SAVED)
    epoch, step = int(m.group(1)), int(m.group(2))
    # Signalled at the 6th batch of epoch 3, the trainer has some 40 batches to go before the
    # epoch ends: it stops, and saves, in the middle of that epoch.
    assert (epoch, int(m.group(3))) == (2, STEPS) and 0 < step < STEPS, stopped.job.dump()
    assert stopped.epochs("master") == list(range(1, epoch + 1))
    assert saved_position(checkpoints) == (epoch, step)

    with ddp_job(checkpoints, restart=1) as job:
        resumed = finish(job)
    assert resumed.codes == {"master": 0}, resumed.job.dump()
    assert resumed.resumed("master") == (epoch, step, 1)
    assert resumed.epochs("master") == list(range(epoch + 1, EPOCHS + 1))
    # The interrupted epoch's loss covers its batches before and after the stop: had the resume
    # redone or skipped the wrong batches, it would differ from the uninterrupted run's.
    first = epoch + 1
    whole_loss = baseline[0].losses("master")[first]
    assert abs(resumed.losses("master")[first] - whole_loss) <= 1e-3, (first, whole_loss)

    whole, again = baseline[0].final_accuracy("master"), resumed.final_accuracy("master")
    print(
        f"\nfinal eval_accuracy: uninterrupted {whole:.4f}, SIGTERM at epoch={epoch} "
        f"step={step}/{STEPS} and resumed {again:.4f}"
    )
    assert abs(again - whole) <= TOLERANCE


def test_leftover_and_truncated_temporary_files_do_not_break_a_resume(
    baseline: tuple[Run, Path], tmp_path: Path
) -> None:
    """What a writer killed mid-save leaves beside a good checkpoint is ignored, then removed."""
    good = baseline[1] / "latest.pt"
    shutil.copy(good, tmp_path / "latest.pt")
    data = good.read_bytes()
    (tmp_path / ".latest.pt.4242-0badc0de.tmp").write_bytes(data[: len(data) // 2])
    (tmp_path / ".latest.pt.4243-00000000.tmp").write_bytes(b"")
    with ddp_job(tmp_path, restart=1) as job:
        run = finish(job)
    assert run.codes == {"master": 0}, run.job.dump()
    # The copied checkpoint is the baseline's last epoch: nothing is left but to evaluate it.
    assert run.resumed("master") == (EPOCHS, 0, 1)
    assert run.epochs("master") == []
    assert run.final_accuracy("master") == baseline[0].final_accuracy("master")
    assert temporary_files(tmp_path) == []


def test_a_temporary_file_alone_means_no_checkpoint_yet(tmp_path: Path) -> None:
    """A job killed during its very first save starts from scratch on its next attempt."""
    (tmp_path / ".latest.pt.4242-0badc0de.tmp").write_bytes(b"\x80\x02half a checkpoint")
    with ddp_job(tmp_path, restart=1) as job:
        signal_after(job, "master", "epoch=1/", signal.SIGKILL, ["master"])
        run = finish(job)
    assert not any(RESUMED.match(line) for line in run.lines("master")), run.job.dump()
    assert "no checkpoint to resume from (restart 1)" in run.lines("master")
    assert temporary_files(tmp_path) == []
    assert saved_position(tmp_path)[0] >= 1


def test_an_unreadable_checkpoint_fails_with_a_message_naming_it(tmp_path: Path) -> None:
    (tmp_path / "latest.pt").write_bytes(b"not a checkpoint")
    with ddp_job(tmp_path, restart=1) as job:
        run = finish(job)
    assert run.codes == {"master": 1}
    assert f"error: cannot read checkpoint {tmp_path / 'latest.pt'}" in run.job["master"].text(
        "stderr"
    )


def test_two_ranks_stopped_by_sigterm_save_once_and_resume(tmp_path: Path) -> None:
    """Both ranks get SIGTERM at once; neither may leave rank 0 stuck in a collective."""
    with ddp_job(tmp_path, ranks=2) as job:
        signal_after(job, "master", "epoch=2/", signal.SIGTERM, ["master", "worker-1"])
        stopped = finish(job)
    assert stopped.codes == {"master": 143, "worker-1": 143}, stopped.job.dump()
    m = stopped.only("master", SIGTERM_SAVED)
    epoch, step = int(m.group(1)), int(m.group(2))
    assert saved_position(tmp_path) == (epoch, step)
    assert any(
        line.startswith("SIGTERM: rank 1 stopping at ") for line in stopped.lines("worker-1")
    )

    with ddp_job(tmp_path, ranks=2, restart=1) as job:
        resumed = finish(job)
    assert resumed.codes == {"master": 0, "worker-1": 0}, resumed.job.dump()
    assert resumed.resumed("master") == (epoch, step, 1)
    assert resumed.epochs("master") == list(range(epoch + 1, EPOCHS + 1))
    assert resumed.final_accuracy("master") >= 0.95


def test_a_parameter_server_job_resumes_after_a_kill_and_after_a_sigterm(
    ps_baseline: Run, tmp_path: Path
) -> None:
    """Attempt 0 is SIGKILLed after epoch 2, attempt 1 resumes and gets SIGTERM two epochs
    later, attempt 2 resumes from what worker 0 saved then and finishes."""
    everyone = ["scheduler", "server-0", "worker-0"]
    with ps_job(tmp_path) as job:
        signal_after(job, "worker-0", "epoch=2/", signal.SIGKILL, everyone)
        killed = finish(job)
    assert killed.codes["worker-0"] == -signal.SIGKILL, killed.job.dump()
    printed = killed.epochs("worker-0")

    with ps_job(tmp_path, restart=1) as job:
        # The worker first: with the servers still up it stops at a step boundary, the path a
        # test can count on (with all signalled at once it may also stop on a failed request).
        # Two epochs past the last one printed before the kill: after the resume, whichever
        # of that epoch and the next one it resumed from.
        signal_after(job, "worker-0", f"epoch={printed[-1] + 2}/", signal.SIGTERM, ["worker-0"])
        job["worker-0"].popen.wait(GUARD_S)
        for tag in ("server-0", "scheduler"):
            os.killpg(job[tag].popen.pid, signal.SIGTERM)
        stopped = finish(job)
    assert stopped.codes["worker-0"] == 143, stopped.job.dump()
    epoch, step, restart = stopped.resumed("worker-0")
    assert printed[-1] <= epoch <= printed[-1] + 1 and (step, restart) == (0, 1)
    m = stopped.only("worker-0", SIGTERM_SAVED)
    stop_epoch, stop_step = int(m.group(1)), int(m.group(2))
    assert stopped.epochs("worker-0") == list(range(epoch + 1, stop_epoch + 1))
    assert saved_position(tmp_path) == (stop_epoch, stop_step)

    with ps_job(tmp_path, restart=2) as job:
        resumed = finish(job)
    assert resumed.codes == {"scheduler": 0, "server-0": 0, "worker-0": 0}, resumed.job.dump()
    assert resumed.resumed("worker-0") == (stop_epoch, stop_step, 2)
    assert resumed.epochs("worker-0") == list(range(stop_epoch + 1, EPOCHS + 1))

    whole, again = ps_baseline.final_accuracy("worker-0"), resumed.final_accuracy("worker-0")
    print(
        f"\nparameter server final eval_accuracy: uninterrupted {whole:.4f}, killed, stopped "
        f"at epoch={stop_epoch} step={stop_step}/{STEPS} and resumed {again:.4f}"
    )
    assert ps_baseline.codes["worker-0"] == 0, ps_baseline.job.dump()
    assert abs(again - whole) <= TOLERANCE


def test_a_paced_epoch_waits_for_its_share_a_step_at_a_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """--min-epoch-seconds: after k of n steps, the epoch waits until k/n of its minimum has
    passed, so a SIGTERM is still noticed at the next step (not at the epoch's end)."""
    slept: list[float] = []
    monkeypatch.setattr(digits_ddp.time, "perf_counter", lambda: 10.5)
    monkeypatch.setattr(digits_ddp.time, "sleep", slept.append)
    digits_ddp.pace(10.0, 2, 4, 2.0)  # half the steps: due at 11.0
    assert slept == [0.5]
    digits_ddp.pace(10.0, 1, 4, 2.0)  # a quarter: due at 10.5, now
    digits_ddp.pace(10.0, 4, 4, 0.0)  # unpaced
    assert slept == [0.5]
    assert digits_ddp.parse_args(["--min-epoch-seconds", "2"]).min_epoch_seconds == 2.0
    with pytest.raises(SystemExit):
        digits_ddp.parse_args(["--min-epoch-seconds", "-1"])
