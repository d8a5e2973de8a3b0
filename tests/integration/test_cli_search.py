"""`trainyard search` against the real stack: the installed console script submits a job file
with a `search:` section (its code folder uploaded once, every trial a job running those
files), follows it to its end, shows it, and pauses, resumes and stops another.

Kept short (issue 48's full 12-trial search is tests/integration/test_experiments.py): a grid
of 3 learning rates over a trainer that reports 2 epochs of a made-up accuracy, and a trainer
that holds before its first, for stop. The grid's trainer ends at once after its last report,
as scripts do: its end may reach the console before that report reaches the database, and the
trial must still be told with it (the driver waits for the job's log to be archived).
"""

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import RunningStack, StackClient, signal_file, wait_until
from tests.integration.test_cli import TRAINYARD, cli_env, logged_in, run_cli

pytestmark = pytest.mark.integration

# What each learning rate scores: the grid's best is the middle one, so "best" means the
# console compared the trials' objectives, not their order.
TRAINER = """\
import argparse, os, pathlib, time
import trainyard_metrics

parser = argparse.ArgumentParser()
parser.add_argument("--lr", type=float, required=True)
parser.add_argument("--epochs", type=int, default=2)
parser.add_argument("--hold-before", default="")
args = parser.parse_args()


def hold(release):
    while release and not pathlib.Path(release).exists():
        time.sleep(0.2)


print("lr", args.lr, "optimizer", os.environ.get("OPTIMIZER"), flush=True)
hold(args.hold_before)
for epoch in range(1, args.epochs + 1):
    accuracy = 0.9 - abs(args.lr - 0.3) + 0.01 * epoch
    trainyard_metrics.report(epoch=epoch, eval_accuracy=accuracy)
"""


def job_file(folder: Path, name: str, search: str, args: str) -> Path:
    (folder / "train.py").write_text(TRAINER)
    path = folder / "search.yaml"
    path.write_text(
        f"name: {name}\n"
        "image: pytorch:2.13-cpu\n"
        "code: .\n"
        "program:\n"
        "  script: train.py\n"
        f"  args: {args}\n"
        "roles:\n"
        "  master: {package: cpu-1, instances: 1}\n"
        "restart: {policy: never}\n"
        "env: {OPTIMIZER: sgd}\n" + search
    )
    return path


@pytest.fixture(scope="module")
def user(stack: RunningStack, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    config_dir = tmp_path_factory.mktemp("search-config")
    client = logged_in(stack, "cli-searcher", config_dir)

    class User:
        api: StackClient = client
        config = config_dir

        @staticmethod
        def run(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
            return run_cli(*args, config_dir=config_dir, cwd=cwd)

        @staticmethod
        def named(name: str) -> dict[str, Any] | None:
            result = run_cli("search", "ls", "--json", config_dir=config_dir)
            assert result.returncode == 0, result.stderr
            return next((e for e in json.loads(result.stdout) if e["name"] == name), None)

        @staticmethod
        def shown(experiment_id: int) -> dict[str, Any]:
            result = run_cli("search", "show", str(experiment_id), "--json", config_dir=config_dir)
            assert result.returncode == 0, result.stderr
            answer: dict[str, Any] = json.loads(result.stdout)
            return answer

    yield User()


def test_a_search_is_submitted_followed_to_its_end_and_shown(user: Any, tmp_path: Path) -> None:
    path = job_file(
        tmp_path,
        "cli-grid",
        "search:\n"
        "  space:\n"
        "    --lr: {type: choice, choices: [0.05, 0.3, 0.9]}\n"
        "    $OPTIMIZER: {type: choice, choices: [adam]}\n"
        "  objective: {metric: eval_accuracy, goal: max, unit: epoch}\n"
        "  searcher: grid\n"
        "  budget: {trials: 3, parallel: 3}\n",
        args="[--lr, '0.05']",
    )
    follower = subprocess.run(
        [str(TRAINYARD), "search", "submit", str(path), "--follow"],
        capture_output=True,
        text=True,
        env=cli_env(user.config),
        cwd=tmp_path,
        timeout=600,  # a hang guard only
    )
    out, err = follower.stdout, follower.stderr
    assert follower.returncode == 0, out + err
    assert "Uploaded" in err  # the code folder, once for every trial
    head = out.splitlines()[0]
    assert head.startswith("Experiment ") and "submitted: cli-grid" in head
    number = int(head.split()[1])
    for trial in range(3):
        # A trial may begin and end between two of the follower's polls: then it "ran".
        assert f"trial {trial} running: job " in out or f"trial {trial} ran: job " in out, out
        assert f"trial {trial} completed: eval_accuracy" in out, out
    assert f"Experiment {number} finished: 3 trials, 3 completed" in err, err

    experiment = user.shown(number)
    assert experiment["state"] == "finished"
    assert sorted(t["params"]["--lr"] for t in experiment["trials"]) == [0.05, 0.3, 0.9]
    assert experiment["best"]["params"]["--lr"] == 0.3
    assert experiment["best"]["value"] == pytest.approx(0.92)
    # Each trial is a job of the user running the uploaded files with its own values.
    snapshots = set()
    for trial in experiment["trials"]:
        job = user.api.job(trial["job"])
        assert job["owner"] == "cli-searcher" and job["state"] == "succeeded"
        lr = str(trial["params"]["--lr"])
        assert job["program"]["args"] == ["--lr", lr]
        snapshots.add(job["program"]["snapshot"])
        lines = [line["text"] for line in user.api.logs(trial["job"])]
        assert f"lr {trial['params']['--lr']} optimizer adam" in lines
    assert len(snapshots) == 1 and None not in snapshots

    shown = user.run("search", "show", str(number))
    assert shown.returncode == 0, shown.stderr
    rows = [" ".join(line.split()) for line in shown.stdout.splitlines()]
    assert "State finished" in rows
    assert "Trials 3 of 3 started, 0 running or waiting, 0 left; at most 3 at once" in rows
    best_job = experiment["best"]["job"]
    assert f"Best trial {experiment['best']['trial']}, job {best_job}: eval_accuracy 0.92, " \
        "--lr=0.3 $OPTIMIZER=adam" in rows  # fmt: skip
    assert any(r.startswith("TRIAL STATE PARAMETERS BEST LAST EPOCH JOB") for r in rows)
    for trial in experiment["trials"]:
        assert any(
            r.startswith(f"{trial['number']} completed --lr=") and r.endswith(f" 2 {trial['job']}")
            for r in rows
        ), rows


def test_a_search_is_paused_resumed_and_stopped(user: Any, tmp_path: Path) -> None:
    release = signal_file()
    path = job_file(
        tmp_path,
        "cli-held",
        "search:\n"
        "  space: {--lr: {type: float, low: 0.01, high: 1.0, log: true}}\n"
        "  objective: {metric: eval_accuracy}\n"
        "  searcher: random\n"
        "  budget: {trials: 3, parallel: 2}\n"
        "  seed: 3\n",
        args=f"[--lr, '0.05', --hold-before, '{release}']",
    )
    try:
        submitted = user.run("search", "submit", str(path), "--json", cwd=tmp_path)
        assert submitted.returncode == 0, submitted.stderr
        number = json.loads(submitted.stdout)["id"]

        def two_running() -> dict[str, Any] | None:
            e = user.shown(number)
            jobs = [t["job"] for t in e["trials"] if t["state"] == "running" and t["job"]]
            running = [j for j in jobs if user.api.job(j)["state"] == "running"]
            return e if len(running) == 2 else None

        wait_until("two trials running", two_running)
        paused = user.run("search", "pause", str(number))
        assert paused.returncode == 0, paused.stderr
        assert paused.stdout.strip() == f"Experiment {number}: paused by cli-searcher"
        assert user.run("search", "pause", str(number)).returncode == 2  # paused already
        resumed = user.run("search", "resume", str(number))
        assert resumed.stdout.strip() == f"Experiment {number}: running", resumed.stderr

        stopped = user.run("search", "stop", str(number))
        assert stopped.returncode == 0, stopped.stderr
        assert stopped.stdout.strip() == (
            f"Experiment {number}: stopped (experiment stopped by cli-searcher)"
        )

        def ended() -> dict[str, Any] | None:
            e = user.shown(number)
            jobs = [user.api.job(t["job"]) for t in e["trials"] if t["job"]]
            done = e["state"] == "stopped" and all(j["state"] == "cancelled" for j in jobs)
            return e if done and jobs else None

        experiment = wait_until("the experiment stopped", ended)
        assert experiment["used"]["trials"] == 2  # none started after the stop
        for trial in experiment["trials"]:
            assert "stopped by cli-searcher" in user.api.job(trial["job"])["reason"]
        listed = user.run("search", "ls")
        assert listed.returncode == 0, listed.stderr
        row = next(r for r in listed.stdout.splitlines() if r.split()[:1] == [str(number)])
        assert row.split()[1:5] == ["cli-held", "stopped", "2", "of"], row
        assert user.run("search", "stop", str(number)).returncode == 2  # ended already
    finally:
        release.touch()
