"""The CLI's own pieces: credentials, job files and flags, what a code upload holds, the API's
refusals as messages, and the follower's no-duplicate rule. tests/integration/test_cli.py runs
the command itself against the real stack."""

import json
import re
import stat
import tarfile
from datetime import UTC, datetime
from io import BytesIO
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.hostile_job_files import UNUSABLE_JOB_FILES
from trainyard_cli import config, jobfile, upload
from trainyard_cli.client import refusal
from trainyard_cli.code_upload import ignored_words
from trainyard_cli.errors import BAD_INPUT, NOT_FOUND, NOT_LOGGED_IN, UNAVAILABLE, CliError
from trainyard_cli.follow import Follower, Line, _relay, websocket_url
from trainyard_cli.main import (
    _print_line,
    metric_tables,
    script_args_as_options,
)
from trainyard_cli.render import (
    ago,
    currency_prefix,
    duration,
    exit_text,
    human_bytes,
    human_number,
    instances,
    money,
    ratio,
)


@pytest.fixture
def config_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "config"
    monkeypatch.setenv(config.CONFIG_DIR_VARIABLE, str(folder))
    monkeypatch.delenv(config.URL_VARIABLE, raising=False)
    monkeypatch.delenv(config.TOKEN_VARIABLE, raising=False)
    return folder


def test_credentials_are_saved_for_their_owner_only_and_the_environment_wins(
    config_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(CliError) as missing:
        config.load()
    assert missing.value.exit_code == NOT_LOGGED_IN
    path = config.save(config.Credentials("https://ty.example.com", "secret-1"))
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(config_dir.stat().st_mode) == 0o700
    assert config.load() == config.Credentials("https://ty.example.com", "secret-1")
    monkeypatch.setenv(config.TOKEN_VARIABLE, "from-ci")
    assert config.load().token == "from-ci"
    monkeypatch.setenv(config.URL_VARIABLE, "http://other:8000/")
    assert config.load().url == "http://other:8000"
    assert config.forget() is True and config.forget() is False


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("http://127.0.0.1:8000/", "http://127.0.0.1:8000"),
        ("https://ty.example.com/api/v1", "https://ty.example.com"),
        ("https://example.com/trainyard/", "https://example.com/trainyard"),
    ],
)
def test_a_console_address_is_kept_without_its_trailing_parts(given: str, expected: str) -> None:
    assert config.normalize_url(given) == expected


@pytest.mark.parametrize("given", ["ty.example.com", "ftp://x", "", "https://"])
def test_what_is_not_a_console_address_is_refused(given: str) -> None:
    with pytest.raises(CliError) as refused:
        config.normalize_url(given)
    assert refused.value.exit_code == BAD_INPUT


def test_flags_override_the_job_file_field_by_field(tmp_path: Path) -> None:
    (tmp_path / "src").mkdir()
    path = tmp_path / "job.yaml"
    path.write_text(
        "name: from-file\nimage: pytorch:2.13-cpu\ncode: src\n"
        "program: {script: train.py, args: [--epochs, '1']}\n"
        "roles: {master: {package: cpu-1, instances: 1}, worker: {package: cpu-1, instances: 1}}\n"
        "env: {A: '1'}\ntime_limit: 1h30m\n"
    )
    draft = jobfile.read(path)
    assert draft.code == (tmp_path / "src").resolve()
    assert "code" not in draft.body  # the CLI's own key never reaches the API
    body = jobfile.apply_flags(
        draft.body,
        name=None,
        image=None,
        script=None,
        args=["--epochs", "3"],
        roles=["worker=cpu-2:3"],
        kvstore=None,
        env=["B=x=y"],
        restart_policy="on-failure",
        max_restarts=2,
    )
    assert body["name"] == "from-file"
    assert body["program"] == {"script": "train.py", "args": ["--epochs", "3"]}
    assert body["roles"] == {
        "master": {"package": "cpu-1", "instances": 1},
        "worker": {"package": "cpu-2", "instances": 3},
    }
    assert body["env"] == {"A": "1", "B": "x=y"}
    assert body["restart"] == {"policy": "on-failure", "max_restarts": 2}
    assert draft.body["roles"]["worker"]["package"] == "cpu-1"  # the file's body is unchanged
    assert body["time_limit"] == "1h30m"  # the console parses it, and says what is wrong
    for flag, sent in (("2h", "2h"), (" 7200 ", 7200)):
        assert jobfile.apply_flags(
            draft.body, name=None, image=None, script=None, args=[], roles=[], kvstore=None,
            env=[], restart_policy=None, max_restarts=None, time_limit=flag,
        )["time_limit"] == sent  # fmt: skip


def test_the_priority_flag_wins_over_the_job_files_key(tmp_path: Path) -> None:
    path = tmp_path / "job.yaml"
    path.write_text("name: urgent\npriority: low\n")
    draft = jobfile.read(path)
    assert draft.body["priority"] == "low"  # a job-file key, sent as the API's field
    flags: dict[str, Any] = dict(
        name=None, image=None, script=None, args=[], roles=[], kvstore=None, env=[],
        restart_policy=None, max_restarts=None,
    )  # fmt: skip
    assert jobfile.apply_flags(draft.body, **flags)["priority"] == "low"
    assert jobfile.apply_flags(draft.body, **flags, priority="high")["priority"] == "high"


def test_a_job_without_a_name_is_named_after_its_script() -> None:
    body = jobfile.apply_flags(
        {},
        name=None,
        image="pytorch:2.13-cpu",
        script="models/resnet.py",
        args=[],
        roles=["master=cpu-1"],
        kvstore=None,
        env=[],
        restart_policy=None,
        max_restarts=None,
    )
    assert body["name"] == "resnet"
    assert body["roles"] == {"master": {"package": "cpu-1", "instances": 1}}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("- a list\n", "must be a mapping"),
        ("name: [open\n", "not valid YAML (line 2"),
        ("code: [1]\nname: x\n", "code: must be a folder"),
    ],
)
def test_a_bad_job_file_is_refused_before_anything_is_sent(
    tmp_path: Path, text: str, message: str
) -> None:
    path = tmp_path / "job.yaml"
    path.write_text(text)
    with pytest.raises(CliError) as refused:
        jobfile.read(path)
    assert refused.value.exit_code == BAD_INPUT
    assert message in refused.value.message


@pytest.mark.parametrize(
    ("content", "message", "where"),
    [case[1:] for case in UNUSABLE_JOB_FILES],
    ids=[case[0] for case in UNUSABLE_JOB_FILES],
)
def test_a_job_file_that_is_not_usable_text_is_refused_with_its_line_and_column(
    tmp_path: Path, content: bytes, message: str, where: tuple[int, int]
) -> None:
    path = tmp_path / "job.yaml"
    path.write_bytes(content)
    with pytest.raises(CliError) as refused:
        jobfile.read(path)
    assert refused.value.exit_code == BAD_INPUT
    assert message in refused.value.message
    assert f"(line {where[0]}, column {where[1]})" in refused.value.message


def test_a_job_file_nested_too_deeply_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "job.yaml"
    path.write_text("args: " + "[" * 20_000 + "]" * 20_000 + "\n")
    with pytest.raises(CliError, match="nested too deeply") as refused:
        jobfile.read(path)
    assert refused.value.exit_code == BAD_INPUT


def test_aliases_that_expand_modestly_are_taken(tmp_path: Path) -> None:
    path = tmp_path / "job.yaml"
    path.write_text(
        "common: &env {A: '1', B: '2'}\nenv: *env\nprogram: {script: t.py, args: &a [x, y]}\n"
        'other: *a\nname: "caf\\u00e9 \\t tab"\n'
    )
    body = jobfile.read(path).body
    assert body["env"] == {"A": "1", "B": "2"} and body["name"] == "café \t tab"
    jobfile.check_text(body)


def test_a_flag_that_is_not_text_is_refused_by_its_field() -> None:
    # An argument with bytes that were not UTF-8 reaches Python as lone surrogates.
    body = jobfile.apply_flags(
        {},
        name=None,
        image=None,
        script="train.py",
        args=["--tag", "run\udcff"],
        roles=[],
        kvstore=None,
        env=["NOTE=a\x00b"],
        restart_policy=None,
        max_restarts=None,
    )
    with pytest.raises(CliError, match=r"program\.args\[1\]: character U\+DCFF"):
        jobfile.check_text(body)
    body["program"]["args"] = ["--tag", "ok"]
    with pytest.raises(CliError, match=r"env\.NOTE: character U\+0000"):
        jobfile.check_text(body)


@pytest.mark.parametrize("role", ["worker", "worker=", "=cpu-1", "worker=cpu-1:two"])
def test_a_role_flag_must_name_a_package(role: str) -> None:
    with pytest.raises(CliError, match=r"ROLE=PACKAGE|whole number"):
        jobfile.parse_role(role)


def test_an_upload_leaves_out_tool_folders_ignored_files_and_links(tmp_path: Path) -> None:
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "model.py").write_text("x = 1\n")
    (tmp_path / "train.py").write_text("print(1)\n")
    for left_out in (".git/HEAD", "__pycache__/a.pyc", ".venv/bin/python", "data/set.bin"):
        (tmp_path / left_out).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / left_out).write_text("x")
    (tmp_path / "notes.log").write_text("x")
    (tmp_path / ".gitignore").write_text("data/\n")
    (tmp_path / ".trainyardignore").write_text("*.log\n")
    (tmp_path / "outside").symlink_to("/etc/hostname")
    packed = upload.pack(tmp_path)
    assert packed.files == [".gitignore", ".trainyardignore", "pkg/model.py", "train.py"]
    assert packed.skipped_links == ["outside"]
    with tarfile.open(fileobj=BytesIO(packed.archive)) as archive:
        assert sorted(archive.getnames()) == packed.files
        member = archive.extractfile("pkg/model.py")
        assert member is not None and member.read() == b"x = 1\n"
    # What the folder's own ignore files left out is said; tool folders go without a word.
    assert packed.ignored == ["data/", "notes.log"]


def test_what_git_ignores_is_uploaded_when_trainyardignore_brings_it_back(
    tmp_path: Path,
) -> None:
    """nanoGPT's prepared data is in its .gitignore: the upload says so, and a `!` line in
    .trainyardignore (read after .gitignore) brings it back."""
    (tmp_path / "train.py").write_text("print(1)\n")
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "train.bin").write_bytes(b"\0" * 8)
    (tmp_path / ".gitignore").write_text("*.bin\n")
    left_out = upload.pack(tmp_path)
    assert "data/train.bin" not in left_out.files and left_out.ignored == ["data/train.bin"]
    words = ignored_words(left_out.ignored)
    assert "data/train.bin" in words and "`!data/train.bin` to .trainyardignore" in words
    (tmp_path / ".trainyardignore").write_text("!data/train.bin\n")
    brought_back = upload.pack(tmp_path)
    assert "data/train.bin" in brought_back.files and brought_back.ignored == []


def test_an_empty_folder_is_not_uploaded(tmp_path: Path) -> None:
    with pytest.raises(CliError, match="no files"):
        upload.pack(tmp_path)


def test_what_follows_the_double_dash_belongs_to_the_script() -> None:
    argv = ["submit", "job.yaml", "--wait", "--", "--epochs", "3", "--"]
    assert script_args_as_options(argv) == [
        "submit", "job.yaml", "--wait", "--arg=--epochs", "--arg=3", "--arg=--",
    ]  # fmt: skip
    assert script_args_as_options(["logs", "3", "--", "x"]) == ["logs", "3", "--", "x"]


def _response(status: int, body: Any) -> httpx.Response:
    return httpx.Response(status, json=body, request=httpx.Request("GET", "http://x/api/v1/jobs"))


def test_the_apis_refusals_become_messages_and_exit_codes() -> None:
    one = refusal(_response(400, {"errors": {"roles.worker.package": ["Unknown package 'x'."]}}))
    assert (one.message, one.exit_code) == ("roles.worker.package: Unknown package 'x'.", 2)
    several = refusal(_response(400, {"errors": {"name": ["Give a name."], "image": ["No."]}}))
    assert several.details == ["name: Give a name.", "image: No."]
    assert refusal(_response(401, {"errors": {"auth": ["x"]}})).exit_code == NOT_LOGGED_IN
    assert refusal(_response(404, {"errors": {"job": ["No such job."]}})).exit_code == NOT_FOUND
    assert refusal(_response(502, None)).exit_code == UNAVAILABLE


def test_a_line_received_again_after_a_reconnection_is_not_shown_twice() -> None:
    shown: list[int] = []
    follower = Follower(lambda line: shown.append(line.cursor))
    batch = {"first": 1, "role": "master", "index": 0, "node": "n", "stream": "stdout", "ts": 0.0}
    _relay({**batch, "lines": ["a", "b", "c"]}, follower)
    _relay({**batch, "first": 2, "lines": ["b", "c", "d"]}, follower)  # resent from 2
    assert shown == [1, 2, 3, 4]
    assert follower.cursor == 4
    assert isinstance(Line(1, "master", 0, "n", "stdout", 0.0, "a"), Line)


def test_the_websocket_address_follows_the_consoles_scheme_and_prefix() -> None:
    assert websocket_url("https://ty.example.com/p", 7, 12) == (
        "wss://ty.example.com/p/ws/jobs/7/?after=12"
    )
    assert websocket_url("http://127.0.0.1:8000", 7, 0) == "ws://127.0.0.1:8000/ws/jobs/7/?after=0"


def test_numbers_and_durations_read_well() -> None:
    assert human_number(350_000_000) == "350 M"
    assert human_number(1234.5) == "1.23 k"
    assert human_number(None) == "—"
    assert human_bytes(778) == "778 B"
    assert duration(9.9) == "9 s"  # as the pages count: whole seconds elapsed
    assert duration(252) == "4 min 12 s"
    assert duration(3 * 3600 + 300) == "3 h 05 min"


def test_prices_read_as_the_pages_write_them_in_the_consoles_currency() -> None:
    """`$0.15`, as the web says, never `USD 0.15`: the prefix is the console's (its catalog)."""
    dollars = currency_prefix({"currency": "USD", "money": {"code": "USD", "prefix": "$"}})
    assert dollars == "$"
    assert money("0.0500", dollars) == "$0.05"
    assert money("3.0000", dollars) == "$3.00"
    assert money("0.1234", dollars) == "$0.1234"
    assert money("1234.5000", dollars) == "$1,234.50"
    assert money(0.0500000001, dollars) == "$0.05"  # a figure's float, as compare has it
    assert money(None, dollars) == "—"
    assert ratio(1.849) == "1.85" and ratio(None) == "—"
    assert money("0.0500", currency_prefix({"money": {"prefix": "CHF\u00a0"}})) == "CHF\u00a00.05"
    # A console from before it said how it writes money: its code, as a page would for CHF.
    assert money("0.0500", currency_prefix({"currency": "USD"})) == "USD\u00a00.05"


def test_how_long_ago_reads_as_the_pages_say_it() -> None:
    now = datetime(2026, 11, 25, 12, 0, 5, tzinfo=UTC)
    assert ago("2026-11-25T12:00:00+00:00", now) == "5 s ago"  # never "0 minutes ago"
    assert ago("2026-11-25T11:56:55+00:00", now) == "3 min 10 s ago"
    assert ago("2026-11-25T12:00:05.500000+00:00", now) == "0 s ago"  # a clock a little ahead
    assert ago(None, now) == "never"


def test_instances_are_counted_as_the_console_counts_them() -> None:
    ps_job = {
        "roles": {"server": {"instances": 2}, "worker": {"instances": 2}},
        "instances": {"total": 5, "trainers": 4, "platform": ["scheduler"],
                      "text": "5 (4 trainers + scheduler)"},
    }  # fmt: skip
    assert instances(ps_job) == "5 (4 trainers + scheduler)"
    assert instances({"roles": {"master": {"instances": 1}, "worker": {"instances": 2}}}) == "3"


def test_the_cli_needs_nothing_of_the_console() -> None:
    """`pip install '.[cli]'` on a laptop gets no Django, Celery or torch: the command must not
    import them (nor the console's own packages)."""
    import subprocess
    import sys

    probe = (
        "import sys, trainyard_cli.main; "
        "print(sorted({m.split('.')[0] for m in sys.modules} & "
        "{'django', 'celery', 'kombu', 'redis', 'torch', 'jobs', 'workers', 'console', 'stack'}))"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "[]"


def test_a_restarted_jobs_later_attempts_are_tagged_as_the_page_tags_them(
    capsys: pytest.CaptureFixture[str],
) -> None:
    tags = {("worker", 1): "worker-1"}
    for attempt in (0, 1):
        line = {"role": "worker", "index": 1, "attempt": attempt, "stream": "stdout"}
        _print_line({**line, "text": f"step in run {attempt}"}, tags, as_json=False)
    _print_line({**line, "text": "as JSON"}, tags, as_json=True)
    printed = capsys.readouterr().out.splitlines()
    assert printed[:2] == ["[worker-1] step in run 0", "[worker-1 · attempt 2] step in run 1"]
    assert json.loads(printed[2])["tag"] == "worker-1"  # --json: the attempt is its own field
    assert json.loads(printed[2])["attempt"] == 1


def test_a_job_file_from_show_is_read_back_as_the_same_request(tmp_path: Path) -> None:
    body = {
        "name": "yes",  # YAML 1.1 would read a bare yes as true
        "image": "pytorch:2.13-cpu",
        "program": {"script": "train.py", "args": ["--lr", "0.1", "1e3"], "snapshot": "ab" * 32},
        "roles": {"master": {"package": "cpu-1", "instances": 1}},
        "env": {"NOTE": "on"},
    }
    path = tmp_path / "job.yaml"
    path.write_text(jobfile.dump(body, "job 12"))
    assert jobfile.read(path).body == body
    assert script_args_as_options(["rerun", "12", "--", "--lr", "0.2"]) == [
        "rerun",
        "12",
        "--arg=--lr",
        "--arg=0.2",
    ]


def test_a_terminal_gets_the_line_as_the_console_shaped_it_and_a_pipe_as_printed(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from io import StringIO

    from rich.console import Console

    from trainyard_cli import render

    raw = "epoch 1 10%\repoch 1 \x1b[31m100%\x1b[0m \x1b]0;pwned\x07"
    # As the console sends it (jobs/logshape.py): the last state, escapes gone, colours apart.
    shown = [["epoch 1 ", ""], ["100%", "ansi-red"], [" ", ""]]
    # The websocket carries it per batch, under the line's number.
    seen: list[Line] = []
    follower = Follower(on_line=seen.append, on_state=lambda job: None, on_note=lambda text: None)
    batch = {"first": 7, "role": "master", "index": 0, "node": "n", "stream": "stdout", "ts": 0.0}
    _relay({**batch, "lines": ["plain", raw], "shown": {"1": shown}}, follower)
    assert [line.shown for line in seen] == [None, shown]

    terminal = StringIO()
    monkeypatch.setattr(render, "out", Console(file=terminal, force_terminal=True, width=200))
    render.log_line("master", raw, "stdout", shown)
    written = terminal.getvalue()
    assert "epoch 1 100%" in written and "10%" not in written and "pwned" not in written
    assert "\x1b]0;" not in written and "\r" not in written

    monkeypatch.setattr(render, "out", Console(file=StringIO(), force_terminal=False))
    render.log_line("master", raw, "stdout", shown)
    assert capsys.readouterr().out == f"[master] {raw}\n"  # into a file: every byte printed


def test_an_instance_killed_by_a_signal_shows_the_signal_by_name() -> None:
    assert exit_text({"exit_code": -15, "signal": "SIGTERM"}) == "SIGTERM"
    assert exit_text({"exit_code": 3, "signal": None}) == "3"
    assert exit_text({"exit_code": None, "signal": None}) == ""


@pytest.mark.parametrize("command", [["rerun", "7"], ["submit", "--script", "train.py"]])
def test_an_option_the_command_does_not_know_is_said_to_belong_after_the_double_dash(
    command: list[str],
) -> None:
    from typer.testing import CliRunner

    from trainyard_cli.main import app

    answer = CliRunner().invoke(app, [*command, "--steps", "5"])
    assert answer.exit_code == 2
    said = " ".join(answer.output.split())
    assert "No such option: --steps. Arguments for the script go after `--`" in said, said
    assert f"trainyard {command[0]} … -- --steps …" in said, said


def test_a_restart_away_from_the_failed_node_is_a_flag() -> None:
    body = jobfile.apply_flags(
        {"restart": {"policy": "on-failure", "max_restarts": 2}},
        name=None, image=None, script=None, args=[], roles=[], kvstore=None, env=[],
        restart_policy=None, max_restarts=None, exclude_failed_node=True,
    )  # fmt: skip
    assert body["restart"] == {
        "policy": "on-failure",
        "max_restarts": 2,
        "exclude_failed_node": True,
    }


def test_arguments_for_later_attempts_are_a_repeatable_flag(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`--on-resume=--init_from=resume` reaches restart.args_on_resume, beside the file's
    restart settings; the value may itself start with dashes."""
    from typer.testing import CliRunner

    from trainyard_cli import main

    sent: list[dict[str, Any]] = []

    def send_with_code(api: object, body: dict[str, Any], *rest: object) -> dict[str, Any]:
        sent.append(body)
        return {}

    monkeypatch.setattr(main, "_api", lambda: None)
    monkeypatch.setattr(main.code_upload, "send_with_code", send_with_code)
    monkeypatch.setattr(main, "_submitted", lambda *given: None)
    answer = CliRunner().invoke(
        main.app,
        ["submit", "--no-upload", "--script", "digits-ddp", "--role", "master=cpu-1",
         "--restart", "on-failure", "--on-resume=--init_from=resume", "--on-resume", "--x=1"],
    )  # fmt: skip
    assert answer.exit_code == 0, answer.output
    assert sent[0]["restart"] == {
        "policy": "on-failure",
        "args_on_resume": ["--init_from=resume", "--x=1"],
    }


def test_metrics_by_step_and_by_epoch_are_two_tables_with_no_empty_column() -> None:
    def point(name: str, value: float, step: int | None, epoch: float | None) -> dict[str, Any]:
        return {"name": name, "value": value, "step": step, "epoch": epoch, "nonfinite": None}

    points = [point("loss", 2.0 - s / 10, s, s / 3) for s in range(1, 7)]
    points += [point("eval_accuracy", 0.5 + e / 10, None, e) for e in (1, 2)]
    tables = metric_tables(points, last=4)
    assert list(tables) == ["step", "epoch"]
    assert list(tables["step"]) == [3, 4, 5, 6]  # the latest steps; step 3 is not epoch 3
    assert all(set(row) == {"loss"} for row in tables["step"].values())
    assert tables["epoch"] == {1: {"eval_accuracy": "0.6"}, 2: {"eval_accuracy": "0.7"}}


def test_follow_drops_a_state_that_arrives_after_a_newer_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`running → queued → running` for a job of one attempt: its `queued` event came late."""
    from trainyard_cli import main

    def state(name: str, order: list[int]) -> dict[str, Any]:
        return {"id": 5, "state": name, "state_order": order, "replicas": []}

    heard = [
        state("queued", [0, 0, 2]),  # sent by the web process before the worker's `running`
        state("running", [0, 0, 3]),
        state("succeeded", [1, 0, 0]),
    ]

    def fake_follow(url: str, token: str, job_id: int, after: int, follower: Any, *_: Any) -> None:
        for job in heard:
            follower.on_state(job)

    class FakeApi:
        url, token = "http://console", "t"

        def get(self, path: str) -> dict[str, Any]:
            return heard[-1]

    notes: list[str] = []
    monkeypatch.setattr(main, "follow", fake_follow)
    monkeypatch.setattr(main.render, "note", notes.append)
    main._follow_to_end(FakeApi(), state("running", [0, 0, 3]), 0)  # type: ignore[arg-type]
    assert notes == ["job 5: succeeded"]


def test_show_after_a_restart_says_what_became_of_the_earlier_attempt(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Right after a trainer was killed, the new attempt's instances are not placed yet: the
    attempts say that the first ended and why, so `pending` and `—` read as what they are."""
    from typer.testing import CliRunner

    from trainyard_cli import main
    from trainyard_cli.states import States, Vocabulary

    job = {
        "id": 6, "name": "digits", "state": "restarting", "reason": "restart 1 of 2 in 5 s",
        "owner": "ann", "image": "pytorch:2.13-cpu", "kvstore": None, "project": "digits",
        "tags": ["baseline", "cpu"],
        "program": {"script": "digits-ddp", "args": []},
        "roles": {"master": {"package": "cpu-1", "instances": 1}},
        "totals": {"cpu": 1, "gpus": 0, "memory_gb": 2, "price_per_hour": "0.05"},
        "created": "2026-11-29T15:00:00Z", "started": "2026-11-29T15:00:01Z", "finished": None,
        "priority": "normal", "restarts_used": 1, "max_restarts": 2, "attempt": 1,
        "attempts": [
            {"number": 1, "started": "2026-11-29T15:00:01Z", "finished": "2026-11-29T15:00:09Z",
             "nodes": ["node-1"], "reason": "master on node-1: killed by signal SIGKILL"},
            {"number": 2, "started": None, "finished": None, "nodes": [], "reason": ""},
        ],
        "replicas": [{"tag": "master", "node": None, "state": "pending", "exit_code": None,
                      "signal": None, "reason": ""}],
    }  # fmt: skip

    class FakeApi:
        states = Vocabulary(States(frozenset(), {}), States(frozenset(), {}))

        def get(self, path: str, **params: Any) -> dict[str, Any]:
            return {"currency": "USD"} if path == "/catalog" else job

        def page_url(self, path: str) -> str:
            return "http://console" + path

    monkeypatch.setattr(main, "_api", FakeApi)
    shown = CliRunner().invoke(main.app, ["show", "6"], terminal_width=200)
    assert shown.exit_code == 0, shown.output
    assert re.search(r"1 .* node-1 .* master on node-1: killed by signal SIGKILL", shown.output)
    assert re.search(r"2 .* running", shown.output)
    assert "Instances of attempt 2:" in shown.output
    assert re.search(r"Placement +instances may share", shown.output)
    assert re.search(r"Project +digits", shown.output)
    assert re.search(r"Tags +baseline cpu", shown.output)
