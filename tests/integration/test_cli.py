"""The `trainyard` command against the real stack: the installed console script, run as a user
runs it, with its own config folder, talking HTTP and the job websocket to uvicorn."""

import json
import os
import re
import stat
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import RunningStack, StackClient, signal_file, wait_until
from tests.hostile_job_files import UNUSABLE_JOB_FILES

pytestmark = pytest.mark.integration

TRAINYARD = Path(sys.executable).with_name("trainyard")
QUOTA = {"cpu": 8, "gpus": 0, "memory_gb": 32, "running_jobs": 4}


def cli_env(config_dir: Path, **extra: str) -> dict[str, str]:
    """This environment without any TRAINYARD_ variable of the test run's own, so that only
    what the test gives the command counts."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRAINYARD_")}
    env.update(TRAINYARD_CONFIG_DIR=str(config_dir), NO_COLOR="1", **extra)
    return env


def run_cli(
    *args: str, config_dir: Path, cwd: Path | None = None, stdin: str | None = None, **env: str
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(TRAINYARD), *args],
        capture_output=True,
        text=True,
        env=cli_env(config_dir, **env),
        cwd=cwd,
        input=stdin,
        check=False,
        timeout=600,  # a hang guard only
    )


def logged_in(stack: RunningStack, username: str, config_dir: Path) -> StackClient:
    client = stack.create_user(username, "a-long-password-1", quota=QUOTA)
    result = run_cli(
        "login", stack.url, "--with-token", config_dir=config_dir, stdin=client.token + "\n"
    )
    assert result.returncode == 0, result.stderr
    return client


@pytest.fixture(scope="module")
def cli(stack: RunningStack, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A user logged in with `trainyard login`, their config folder and API client."""
    config_dir = tmp_path_factory.mktemp("cli-config")
    client = logged_in(stack, "cli-user", config_dir)

    class Cli:
        config = config_dir
        api = client

        @staticmethod
        def __call__(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
            return run_cli(*args, config_dir=config_dir, cwd=cwd)

    yield Cli()


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A user's code folder: a trainer that imports a module beside it, and a data folder
    that .gitignore leaves out of the upload."""
    folder = tmp_path / "project"
    (folder / "data").mkdir(parents=True)
    (folder / "data" / "big.bin").write_bytes(b"\0" * 1000)
    (folder / ".gitignore").write_text("data/\n")
    (folder / "helper.py").write_text('GREETING = "hello from the uploaded helper"\n')
    (folder / "train.py").write_text(
        "import argparse, os\n"
        "import trainyard_metrics\n"
        "from helper import GREETING\n"
        "parser = argparse.ArgumentParser()\n"
        "parser.add_argument('--fail', action='store_true')\n"
        "parser.add_argument('--epochs', type=int, default=1)\n"
        "args = parser.parse_args()\n"
        "print(GREETING, 'rank', os.environ['RANK'], flush=True)\n"
        "for step in range(3):\n"
        "    trainyard_metrics.report(step=step, loss=1.0 / (step + 1), lr=0.1)\n"
        "if args.fail:\n"
        "    raise SystemExit('failing on purpose')\n"
    )
    (folder / "job.yaml").write_text(
        "name: cli-job-file\n"
        "image: pytorch:2.13-cpu\n"
        "code: .\n"
        "program:\n"
        "  script: train.py\n"
        "roles:\n"
        "  master: {package: cpu-1, instances: 1}\n"
        "  worker: {package: cpu-1, instances: 1}\n"
        "restart: {policy: never}\n"
    )
    return folder


def test_login_keeps_the_token_readable_by_its_owner_only(
    stack: RunningStack, cli: Any, tmp_path: Path
) -> None:
    saved = cli.config / "credentials.json"
    assert stat.S_IMODE(saved.stat().st_mode) == 0o600
    assert stat.S_IMODE(cli.config.stat().st_mode) == 0o700
    assert json.loads(saved.read_text()) == {"url": stack.url, "token": cli.api.token}
    me = json.loads(cli("whoami", "--json").stdout)
    assert me["username"] == "cli-user" and me["url"] == stack.url

    # A wrong token is refused at login, and nothing is saved.
    elsewhere = tmp_path / "other-config"
    refused = run_cli(
        "login", stack.url, "--with-token", config_dir=elsewhere, stdin="not-a-token\n"
    )
    assert refused.returncode == 3
    assert "refused the token" in refused.stderr
    assert not (elsewhere / "credentials.json").exists()

    # TRAINYARD_URL and TRAINYARD_TOKEN stand in for a login (a CI job's secrets).
    admin = run_cli(
        "whoami",
        config_dir=elsewhere,
        TRAINYARD_URL=stack.url,
        TRAINYARD_TOKEN=stack.admin.token,
    )
    assert admin.returncode == 0 and admin.stdout.startswith("admin (staff)"), admin.stderr
    nobody = run_cli("ls", config_dir=elsewhere)
    assert nobody.returncode == 3 and "trainyard login URL" in nobody.stderr


def test_a_job_file_with_its_code_folder_runs_to_success(cli: Any, project: Path) -> None:
    result = cli("submit", "job.yaml", "--follow", "--wait", cwd=project)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "[master] hello from the uploaded helper rank 0" in result.stdout
    assert "[worker-1] hello from the uploaded helper rank 1" in result.stdout
    assert "succeeded" in result.stderr
    job_id = int(result.stdout.split()[1])
    job = cli.api.job(job_id)
    assert job["state"] == "succeeded"
    # Exactly the folder's files ran: the upload left out what .gitignore names.
    snapshot = cli.api.http.get(f"/api/v1/snapshots/{job['program']['snapshot']}").json()
    assert snapshot["files"] == [".gitignore", "helper.py", "job.yaml", "train.py"]


def test_a_failing_job_gives_a_non_zero_exit_code(cli: Any, project: Path) -> None:
    result = cli("submit", "job.yaml", "--wait", "--name", "cli-fails", "--", "--fail", cwd=project)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "failed" in result.stderr and "failing on purpose" in result.stderr
    jobs = cli.api.http.get("/api/v1/jobs").json()["jobs"]
    newest = next(j for j in jobs if j["name"] == "cli-fails")
    assert newest["state"] == "failed"
    assert newest["program"]["args"] == ["--fail"]

    # Found again by state and name, with why it failed.
    listed = cli("ls", "--state", "failed", "--name", "CLI-FAILS")
    assert listed.returncode == 0, listed.stderr
    rows = [line for line in listed.stdout.splitlines()[1:] if line.strip()]
    assert [int(r.split()[0]) for r in rows] == [newest["id"]]
    assert "exited with code 1" in rows[0]  # the first line of why it failed

    # Its job file gives the same code and arguments back.
    job_file = cli("show", str(newest["id"]), "--job-file")
    assert job_file.returncode == 0, job_file.stderr
    assert yaml.safe_load(job_file.stdout)["program"] == newest["program"]

    # Run again with its argument changed: the same code, and it succeeds.
    again = cli("rerun", str(newest["id"]), "--wait", "--", "--epochs", "2")
    assert again.returncode == 0, again.stdout + again.stderr
    rerun = cli.api.job(int(again.stdout.split()[1]))
    assert rerun["program"]["args"] == ["--epochs", "2"]
    assert rerun["program"]["snapshot"] == newest["program"]["snapshot"]
    assert rerun["state"] == "succeeded" and rerun["name"] == "cli-fails"


def test_a_bad_job_file_gives_the_apis_field_message_and_exit_2(cli: Any, project: Path) -> None:
    before = cli.api.http.get("/api/v1/jobs").json()["count"]
    (project / "bad.yaml").write_text(
        "name: bad\nimage: pytorch:2.13-cpu\nprogram: {script: train.py}\n"
        "roles:\n  master: {package: cpu-1, instances: 1}\n"
        "  worker: {package: no-such-package, instances: 2}\n"
    )
    # Files new from this user: the upload made for the refused job is taken back.
    (project / "unique.txt").write_text(str(project))
    uploads = cli.api.http.get("/api/v1/snapshots").json()["snapshots"]
    result = cli("submit", "bad.yaml", cwd=project)
    assert result.returncode == 2
    assert "(new)" in result.stderr
    assert cli.api.http.get("/api/v1/snapshots").json()["snapshots"] == uploads
    # The API's own message about the field, word for word.
    direct = cli.api.http.post(
        "/api/v1/jobs",
        json={
            "name": "bad",
            "image": "pytorch:2.13-cpu",
            "program": {"script": "train.py"},
            "roles": {
                "master": {"package": "cpu-1", "instances": 1},
                "worker": {"package": "no-such-package", "instances": 2},
            },
        },
    )
    assert direct.status_code == 400
    [message] = direct.json()["errors"]["roles.worker.package"]
    assert f"roles.worker.package: {message}" in result.stderr
    assert cli.api.http.get("/api/v1/jobs").json()["count"] == before

    (project / "broken.yaml").write_text("name: [unclosed\n")
    broken = cli("submit", "broken.yaml", cwd=project)
    assert broken.returncode == 2 and "not valid YAML (line 2" in broken.stderr
    unknown = cli("submit", "job.yaml", "--role", "worker", cwd=project)
    assert unknown.returncode == 2 and "ROLE=PACKAGE" in unknown.stderr
    assert cli.api.http.get("/api/v1/jobs").json()["count"] == before


@pytest.mark.parametrize(
    "content",
    [case[1] for case in UNUSABLE_JOB_FILES],
    ids=[case[0] for case in UNUSABLE_JOB_FILES],
)
def test_a_job_file_that_is_not_usable_text_leaves_nothing_behind(
    cli: Any, project: Path, content: bytes
) -> None:
    """Each would have uploaded the folder first (its files are new from this user) and then
    failed: with a traceback and exit 1, or, the alias bomb, by never finishing."""
    (project / "unique.txt").write_text(str(project))
    (project / "hostile.yaml").write_bytes(
        b"image: pytorch:2.13-cpu\ncode: .\nprogram: {script: train.py}\n"
        b"roles: {master: {package: cpu-1, instances: 1}}\n" + content
    )
    uploads = cli.api.http.get("/api/v1/snapshots").json()["snapshots"]
    jobs = cli.api.http.get("/api/v1/jobs").json()["count"]
    result = cli("submit", "hostile.yaml", cwd=project)
    assert result.returncode == 2, result.stderr
    assert re.search(r"\(line \d+, column \d+\)", result.stderr), result.stderr
    assert "Traceback" not in result.stderr and "Uploaded" not in result.stderr
    assert cli.api.http.get("/api/v1/snapshots").json()["snapshots"] == uploads
    assert cli.api.http.get("/api/v1/jobs").json()["count"] == jobs


def test_an_argument_that_is_not_text_is_refused_before_the_upload(cli: Any, project: Path) -> None:
    (project / "unique.txt").write_text(str(project))
    uploads = cli.api.http.get("/api/v1/snapshots").json()["snapshots"]
    # Bytes that are not UTF-8 on the command line reach Python as lone surrogates.
    result = cli("submit", "job.yaml", "--", "--tag", "run\udcff", cwd=project)
    assert result.returncode == 2, result.stderr
    assert "program.args[1]: character U+DCFF" in result.stderr
    assert "Traceback" not in result.stderr
    assert cli.api.http.get("/api/v1/snapshots").json()["snapshots"] == uploads


def test_every_listing_prints_json_that_parses(cli: Any, project: Path) -> None:
    submitted = json.loads(cli("submit", "job.yaml", "--wait", "--json", cwd=project).stdout)
    job_id = submitted["id"]
    assert submitted["state"] == "succeeded"
    assert json.loads(cli("show", str(job_id), "--json").stdout)["id"] == job_id
    listed = json.loads(cli("ls", "--json").stdout)
    assert job_id in [j["id"] for j in listed]
    assert {n["name"] for n in json.loads(cli("nodes", "--json").stdout)} >= {"node-1"}
    assert json.loads(cli("quota", "--json").stdout)["left"]["cpu"] <= QUOTA["cpu"]
    assert "pytorch:2.13-cpu" in [i["name"] for i in json.loads(cli("images", "--json").stdout)]
    assert "cpu-1" in [p["name"] for p in json.loads(cli("packages", "--json").stdout)]
    # Other tests' jobs may be waiting on the shared stack: each one is listed once, in order.
    waiting = json.loads(cli("queue", "--json").stdout)
    assert [e["position"] for e in waiting] == list(range(1, len(waiting) + 1))
    assert cli("queue").stdout.startswith("PLACE" if waiting else "No job is waiting.")
    points = json.loads(cli("metrics", str(job_id), "--json").stdout)
    assert {(p["name"], p["step"]) for p in points if p["role"] == "master"} >= {
        ("loss", 0),
        ("loss", 2),
        ("lr", 1),
    }
    lines = [json.loads(s) for s in cli("logs", str(job_id), "--json").stdout.splitlines()]
    assert {"cursor", "tag", "text"} <= set(lines[0])
    assert [line["cursor"] for line in lines] == sorted({line["cursor"] for line in lines})
    # The readable forms carry the same facts.
    table = cli("metrics", str(job_id)).stdout
    assert "loss" in table and "0.3333" in table
    assert cli("metrics", str(job_id), "--csv").stdout.startswith("cursor,role,index,node,name")
    whole = cli("logs", str(job_id)).stdout.splitlines()
    assert len(whole) == 2  # one greeting per instance
    assert cli("logs", str(job_id), "--tail", "1").stdout.splitlines() == whole[-1:]
    # With -f: the last lines, then whatever follows them until the end (nothing more here).
    assert cli("logs", str(job_id), "--tail", "1", "-f").stdout.splitlines() == whole[-1:]
    worker_only = cli("logs", str(job_id), "--role", "worker", "--index", "1").stdout
    assert worker_only.startswith("[worker-1] ") and "[master]" not in worker_only
    row = next(r for r in cli("ls").stdout.splitlines() if r.split()[0] == str(job_id))
    assert row.split()[1:3] == ["cli-job-file", "succeeded"]
    # Counts, money and times as the pages write them: the list's count, "$0.05", "5 s ago".
    assert row.split()[4] == next(j for j in listed if j["id"] == job_id)["instances"]["text"]
    assert re.search(r"\$\d+\.\d{2,4} per hour", cli("show", str(job_id)).stdout)
    packages = cli("packages").stdout
    assert "$" in packages and "USD" not in packages
    nodes = cli("nodes").stdout
    assert re.search(r"\b\d+ s ago\b", nodes)
    assert re.search(r"cgroup-v[12]|not enforced", nodes), nodes  # how it holds jobs to packages
    assert cli("show", "999999").returncode == 4
    assert cli("cancel", str(job_id)).returncode == 2  # it has ended


def test_logs_follow_resumes_across_a_web_server_restart(
    fault_stack: RunningStack, tmp_path: Path
) -> None:
    """`logs -f` loses its websocket when the web server restarts mid-job; it reconnects
    from its last cursor: every line once, in order."""
    config_dir = tmp_path / "config"
    client = logged_in(fault_stack, "cli-follower", config_dir)
    release = signal_file()
    lines = 400
    job = client.submit(
        {
            "name": "cli-follow",
            "image": "pytorch:2.13-cpu",
            "program": {
                "script": "numbered.py",
                "args": ["--lines", str(lines), "--rate", "200", "--hold-at", "100",
                         "--release", str(release)],
            },
            "roles": {"master": {"package": "cpu-1", "instances": 1}},
        }
    )  # fmt: skip
    follower = subprocess.Popen(
        [str(TRAINYARD), "logs", str(job["id"]), "-f"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=cli_env(config_dir),
    )
    seen: list[str] = []
    reader = threading.Thread(target=lambda: seen.extend(follower.stdout or []), daemon=True)
    errors: list[str] = []
    err_reader = threading.Thread(target=lambda: errors.extend(follower.stderr or []), daemon=True)
    reader.start()
    err_reader.start()
    try:
        wait_until("the first 100 lines followed", lambda: len(seen) >= 100)

        def while_down() -> None:
            release.touch()  # the job goes on printing while nobody can stream it
            wait_until(
                "the follower to notice", lambda: any("connection lost" in e for e in errors)
            )

        fault_stack.stack.restart("web", while_down=while_down)
        assert follower.wait(timeout=300) == 0, "".join(errors)
    finally:
        if follower.poll() is None:
            follower.kill()
    reader.join(timeout=30)
    err_reader.join(timeout=30)
    assert any("resuming after line" in e for e in errors)
    # Every line once, and each of the two streams in order (numbered.py prints every tenth
    # line on stderr). The keeper keeps the order in which it read the two pipes
    # (tests/unit/test_keeper.py checks it line by line); a test on a loaded machine cannot be
    # sure that it read each line before the next was written, so this asks for what pipes
    # guarantee whatever the load.
    expected = [f"[master] master-0 {i}\n" for i in range(lines)]
    assert sorted(seen) == sorted(expected)
    for on_stderr in (False, True):
        assert [x for x in seen if x.endswith("9\n") == on_stderr] == [
            x for x in expected if x.endswith("9\n") == on_stderr
        ]


def test_compare_prints_figures_and_marks_the_rows_that_differ(cli: Any, project: Path) -> None:
    """The module's finished jobs where earlier tests left some (they differ in their
    arguments); two short ones of its own otherwise."""
    finished = [
        j for j in cli.api.http.get("/api/v1/jobs", params={"state": "succeeded"}).json()["jobs"]
    ]
    by_args = {tuple(j["program"]["args"]): j["id"] for j in reversed(finished)}
    while len(by_args) < 2:
        args = ["--epochs", str(len(by_args) + 1)]
        submitted = json.loads(
            cli("submit", "job.yaml", "--wait", "--json", "--", *args, cwd=project).stdout
        )
        by_args[tuple(args)] = submitted["id"]
    one, two = list(by_args.values())[:2]

    result = cli("compare", str(one), str(two))
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    [args_row] = [line for line in lines if "Arguments" in line]
    assert args_row.startswith("≠"), args_row
    [image_row] = [line for line in lines if " Image " in line]
    assert not image_row.startswith("≠") and image_row.count("pytorch:2.13-cpu") == 2
    [loss_row] = [line for line in lines if line.startswith("loss, final")]
    assert len(loss_row.split()) == 4  # "loss," "final" and one value per job
    assert "configuration rows differ" in result.stderr

    answer = json.loads(cli("compare", str(one), str(two), "--json").stdout)
    assert [j["id"] for j in answer["jobs"]] == [one, two]
    assert "loss" in answer["charts"]
    rows = {r["key"]: r for r in answer["rows"]}
    assert rows["program.args"]["differs"] and not rows["image"]["differs"]
    only = cli("compare", str(one), str(two), "--differences").stdout
    assert "Arguments" in only and " Image " not in only

    # One job, or one that is not there: the console's words, and nothing printed.
    alone = cli("compare", str(one))
    assert alone.returncode == 2 and "Pick 2 to 8 jobs to compare" in alone.stderr
    missing = cli("compare", str(one), "999999")
    assert missing.returncode == 4 and "No such job: 999999." in missing.stderr
    assert missing.stdout == ""


def test_runs_are_filed_from_a_job_file_and_flags_then_tagged_and_found(
    cli: Any, project: Path
) -> None:
    """Issue 49: `project:`/`tags:`/`note:` in a job file, `--tag` beside them, `trainyard tag`
    adding and taking off tags, and `ls --project --tag` finding the run."""
    job_file = project / "job.yaml"
    job_file.write_text(
        job_file.read_text() + "project: cli-sweep\ntags: [sweep]\nnote: 'first <b>try</b>'\n"
    )
    result = cli(
        "submit", "job.yaml", "--wait", "--tag", "draft", "--", "--epochs", "2", cwd=project
    )
    assert result.returncode == 0, result.stdout + result.stderr
    job_id = int(result.stdout.split()[1])
    job = cli.api.job(job_id)
    filed = ("cli-sweep", ["draft", "sweep"], "first <b>try</b>")
    assert (job["project"], job["tags"], job["note"]) == filed
    assert job["config"] == {"epochs": 2}

    tagged = cli("tag", str(job_id), "+best", "-draft", "--note", "kept", "--json")
    assert tagged.returncode == 0, tagged.stdout + tagged.stderr
    assert json.loads(tagged.stdout) == {
        "id": job_id, "name": "cli-job-file", "project": "cli-sweep", "tags": ["best", "sweep"],
        "note": "kept",
    }  # fmt: skip
    refused = cli("tag", str(job_id), "+no!good", "-sweep")
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert "A tag is letters" in refused.stderr
    assert cli.api.job(job_id)["tags"] == ["best", "sweep"]  # nothing changed

    found = cli("ls", "--project", "cli-sweep", "--tag", "best", "--tag", "sweep", "--json")
    assert found.returncode == 0, found.stderr
    assert [j["id"] for j in json.loads(found.stdout)] == [job_id]
    # The summary of its loss, kept by the log keeper, sorts the list.
    wait_until("its loss summary", lambda: cli.api.job(job_id)["metric_summary"].get("loss"))
    listed = cli("ls", "--sort", "metric:loss:best", "--project", "cli-sweep")
    assert listed.returncode == 0, listed.stderr
    assert "PROJECT" in listed.stdout and "best sweep" in listed.stdout
    assert cli("ls", "--tag", "no such").returncode == 2
