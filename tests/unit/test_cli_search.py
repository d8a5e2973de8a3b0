"""`trainyard search` (trainyard_cli/search.py) and the job file's `search:` section
(trainyard_cli/search_section.py), against a console answered in-process through httpx's mock
transport: what is sent, what is refused before anything is sent, and what is printed. The
section's check is held to the console's own (jobs.services.experiments.space): what one refuses
the other refuses, and the guide's example is taken by both. tests/integration/
test_cli_search.py runs the command against the real stack."""

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from jobs.services.experiments import space as experiment_space
from jobs.services.submission import ValidationFailed
from trainyard_cli import jobfile, main, search, search_section
from trainyard_cli.client import API, Api
from trainyard_cli.config import Credentials
from trainyard_cli.errors import CliError

SHA = "ab" * 32
JOB_PART = (
    "image: pytorch:2.13-cpu\n"
    "code: .\n"
    "program:\n"
    "  script: train.py\n"
    "  args: [--epochs, '2', --lr, '0.1']\n"
    "roles:\n"
    "  master: {package: cpu-1, instances: 1}\n"
    "  worker: {package: cpu-1, instances: 1}\n"
)
SEARCH_PART = (
    "search:\n"
    "  space:\n"
    "    --lr: {type: float, low: 0.01, high: 1.0, log: true}\n"
    "    --batch-size: {type: int, low: 16, high: 128, log: true}\n"
    "    $OPTIMIZER: {type: choice, choices: [sgd, adam]}\n"
    "  objective: {metric: eval_accuracy, goal: max, unit: epoch}\n"
    "  searcher: tpe\n"
    "  pruner: successive_halving\n"
    "  pruner_options: {min_resource: 1, reduction_factor: 3}\n"
    "  budget: {trials: 12, parallel: 3}\n"
    "  seed: 7\n"
)


def trial(number: int, state: str, **fields: Any) -> dict[str, Any]:
    return {
        "number": number,
        "state": state,
        "params": {"--lr": 0.031622776, "--batch-size": 32, "$OPTIMIZER": "adam"},
        "job": 40 + number,
        "job_state": "running",
        "objective_last": None,
        "objective_best": None,
        "judged_through": None,
        "reason": "",
        "created": "2026-11-29T15:00:00Z",
        "ended": None,
        "core_hours": 0.01,
        "cost": "0.0100",
        "samples_per_dollar": None,
        **fields,
    }


def experiment(state: str = "running", trials: list[dict[str, Any]] | None = None) -> dict:
    trials = trials or []
    return {
        "id": 7,
        "name": "digits-search",
        "owner": "ann",
        "state": state,
        "reason": "",
        "created": "2026-11-29T15:00:00Z",
        "ended": None,
        "space": {
            "--lr": {"type": "float", "low": 0.01, "high": 1.0, "log": True},
            "$OPTIMIZER": {"type": "choice", "choices": ["sgd", "adam"]},
        },
        "objective": {"metric": "eval_accuracy", "goal": "max", "unit": "epoch"},
        "searcher": "tpe",
        "pruner": "successive_halving",
        "budget": {"trials": 12, "parallel": 3, "core_hours": 2.0, "gpu_hours": None},
        "used": {
            "trials": len(trials),
            "running": sum(t["state"] == "running" for t in trials),
            "core_hours": 0.5,
            "gpu_hours": 0.0,
        },
        "best": None,
        "trials": trials,
    }


class Console:
    """The console's side of each request: `answers[(method, path)]` is a list of (status,
    body) taken in turn (the last one repeats); every request is kept in `sent`."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, str, Any]] = []
        self.answers: dict[tuple[str, str], list[tuple[int, Any]]] = {
            ("GET", "/catalog"): [(200, {"time_zone": "UTC"})],
            ("POST", "/snapshots"): [(201, {"sha256": SHA, "new": True})],
            ("DELETE", f"/snapshots/{SHA}"): [(204, None)],
        }

    def answer(self, method: str, path: str, *replies: tuple[int, Any]) -> None:
        self.answers[(method, path)] = list(replies)

    def __call__(self, request: httpx.Request) -> httpx.Response:
        path = request.url.path.removeprefix(API)
        body: Any = request.content
        if request.headers.get("content-type") == "application/json":
            body = json.loads(request.content)
        self.sent.append((request.method, path, body))
        replies = self.answers.get((request.method, path))
        if not replies:
            return httpx.Response(404, json={"errors": {"request": ["Not found."]}})
        status, reply = replies.pop(0) if len(replies) > 1 else replies[0]
        if reply is None:
            return httpx.Response(status)
        return httpx.Response(status, json=reply)

    def calls(self, method: str | None = None) -> list[tuple[str, str, Any]]:
        return [c for c in self.sent if method is None or c[0] == method]


@pytest.fixture
def console(monkeypatch: pytest.MonkeyPatch) -> Console:
    fake = Console()

    def api() -> Api:
        client = Api(Credentials("http://console.test", "secret"), retry_seconds=0)
        client.http = httpx.Client(
            base_url="http://console.test" + API, transport=httpx.MockTransport(fake)
        )
        return client

    monkeypatch.setattr(search, "_api", api)
    monkeypatch.setattr(main, "_api", api)
    monkeypatch.setattr(search, "FOLLOW_POLL_SECONDS", 0)
    return fake


@pytest.fixture
def project(tmp_path: Path) -> Path:
    (tmp_path / "train.py").write_text("print('training')\n")
    (tmp_path / "job.yaml").write_text("name: digits-search\n" + JOB_PART + SEARCH_PART)
    return tmp_path


@dataclass
class Ran:
    exit_code: int
    output: str  # stdout and stderr, as a terminal shows them


def run(*args: str) -> Ran:
    """The command as `trainyard` runs it: a CliError becomes its message and exit code, as
    main.main() makes it."""
    result = CliRunner().invoke(main.app, list(args), terminal_width=250)
    if isinstance(result.exception, CliError):
        refusal = result.exception
        lines = [f"trainyard: {refusal.message}", *(f"  {line}" for line in refusal.details)]
        return Ran(refusal.exit_code, result.output + "\n".join(lines))
    if result.exception and not isinstance(result.exception, SystemExit):
        raise result.exception
    return Ran(result.exit_code, result.output)


def submitted(project: Path, *extra: str) -> Ran:
    return run("search", "submit", str(project / "job.yaml"), *extra)


def with_section(project: Path, section: str) -> None:
    """The example job file with `section`'s key in place of the search section's own."""
    key = section.strip().split(":", 1)[0]
    kept = []
    skipping = False
    for line in SEARCH_PART.splitlines(keepends=True):
        if line.startswith(f"  {key}:"):
            skipping = True
            continue
        if skipping and line.startswith("    "):
            continue
        skipping = False
        kept.append(line)
    (project / "job.yaml").write_text("name: digits\n" + JOB_PART + "".join(kept) + section)


# Each line replaces the search section's line of the same key (or is added to it); the
# place in the file it is refused by, and words of the message.
BAD_SECTIONS = [
    ("  spaces: {}\n", "search.spaces", "is not a key here"),
    ("  space: {--lr: {type: float, low: 1e-3, high: 1.0}}\n", "search.space.--lr.low",
     "YAML reads 1e-3 as text"),
    ("  space: {--lr: {type: float, low: 1.0, high: 0.1}}\n", "search.space.--lr.high",
     "must be at least low (1.0)"),
    ("  space: {--lr: {type: float, low: 0, high: 1, log: true}}\n", "search.space.--lr.low",
     "must be above 0 on a log scale"),
    ("  space: {--lr: {type: float, low: 0.1, high: 1, lg: true}}\n", "search.space.--lr.lg",
     "is not a key here"),
    ("  space: {--bs: {type: int, low: 16.5, high: 128}}\n", "search.space.--bs.low",
     "must be a whole number"),
    ("  space: {--l=r: {type: float, low: 0.1, high: 1}}\n", "search.space.--l=r",
     "neither an argument of the program"),
    ("  space: {lr: {type: float, low: 0.1, high: 1}}\n", "search.space.lr",
     "neither an argument of the program (--name) nor an environment variable"),
    ("  space: {$OPT: {type: choice, choices: []}}\n", "search.space.$OPT.choices",
     "must be a list of the values to try"),
    ("  space: {--lr: {type: range, low: 0.1, high: 1}}\n", "search.space.--lr.type",
     "'range' is not one of float, int, choice"),
    ("  searcher: bayes\n", "search.searcher", "'bayes' is not one of random, tpe, grid"),
    ("  searcher: grid\n", "search.space.--lr", "needs a step (or a list of choices)"),
    ("  pruner: asha\n", "search.pruner", "'asha' is not one of none, median"),
    ("  objective: {metric: eval_accuracy, goal: maximize}\n", "search.objective.goal",
     "'maximize' is not one of max, min"),
    ("  objective: {goal: max}\n", "search.objective.metric", "must name a metric"),
    ("  budget: {trials: 0}\n", "search.budget.trials", "must be a whole number from 1"),
    ("  budget: {parallel: 2}\n", "search.budget.trials", "is required"),
    ("  budget: {trials: 4, core_hours: -1}\n", "search.budget.core_hours",
     "must be a number above 0, or null"),
    ("  budget: {trials: 4, hours: 3}\n", "search.budget.hours", "is not a key here"),
    ("  seed: lucky\n", "search.seed", "must be a whole number from 0 to 4294967295"),
    ("  space: {--lr: {type: float, low: 0.1, high: 1, log: true, step: 0.1}}\n",
     "search.space.--lr.step", "cannot go with log: true"),
    ("  pruner_options: {reduction_factor: three}\n", "search.pruner_options.reduction_factor",
     "must be a whole number"),
]  # fmt: skip


def test_submit_sends_the_job_part_as_the_template_with_its_uploaded_code(
    console: Console, project: Path
) -> None:
    console.answer("POST", "/experiments", (201, experiment()))
    result = submitted(project)
    assert result.exit_code == 0, result.output
    assert "Experiment 7 submitted: digits-search (running)" in result.output
    assert "http://console.test/experiments/7/" in result.output
    [(_, _, request)] = [c for c in console.calls("POST") if c[1] == "/experiments"]
    # The template is the job request `trainyard submit job.yaml` sends: the code uploaded
    # once and named by its snapshot, without the file's own keys (code:, search:).
    assert request["template"] == {
        "name": "digits-search",
        "image": "pytorch:2.13-cpu",
        "program": {
            "script": "train.py",
            "args": ["--epochs", "2", "--lr", "0.1"],
            "snapshot": SHA,
        },
        "roles": {
            "master": {"package": "cpu-1", "instances": 1},
            "worker": {"package": "cpu-1", "instances": 1},
        },
    }
    assert request["name"] == "digits-search"
    assert request["space"]["--lr"] == {"type": "float", "low": 0.01, "high": 1.0, "log": True}
    assert request["space"]["$OPTIMIZER"] == {"type": "choice", "choices": ["sgd", "adam"]}
    assert request["objective"] == {"metric": "eval_accuracy", "goal": "max", "unit": "epoch"}
    assert (request["searcher"], request["pruner"], request["seed"]) == (
        "tpe",
        "successive_halving",
        7,
    )
    assert request["pruner_options"] == {"min_resource": 1, "reduction_factor": 3}
    assert request["budget"] == {"trials": 12, "parallel": 3}
    assert [c[1] for c in console.sent] == ["/snapshots", "/experiments"]


def test_the_name_is_the_flags_then_the_sections_then_the_jobs(
    console: Console, project: Path
) -> None:
    console.answer("POST", "/experiments", (201, experiment()))
    text = (project / "job.yaml").read_text().replace("  seed: 7\n", "  seed: 7\n  name: lr-bs\n")
    (project / "job.yaml").write_text(text)
    assert submitted(project).exit_code == 0
    assert submitted(project, "--name", "from-flag").exit_code == 0
    names = [(c[2]["name"], c[2]["template"]["name"]) for c in console.calls("POST")[1::2]]
    assert names == [("lr-bs", "digits-search"), ("from-flag", "digits-search")]


@pytest.mark.parametrize(("section", "field", "words"), BAD_SECTIONS)
def test_a_bad_search_section_is_refused_by_its_key_and_nothing_is_sent(
    console: Console, project: Path, section: str, field: str, words: str
) -> None:
    with_section(project, section)
    result = submitted(project)
    assert result.exit_code == 2, result.output
    assert "the search: section cannot be used" in result.output
    assert any(
        line.strip().startswith(f"{field}:") and words in line
        for line in result.output.splitlines()
    ), result.output
    assert console.sent == []  # not even the code was uploaded


def test_every_problem_of_the_section_is_said_at_once(console: Console, project: Path) -> None:
    (project / "job.yaml").write_text(
        JOB_PART + "search:\n  space: {--lr: {type: float}}\n  searcher: bayes\n"
    )
    result = submitted(project)
    assert result.exit_code == 2
    for field in (
        "search.space.--lr.low",
        "search.space.--lr.high",
        "search.searcher",
        "search.objective",
        "search.budget",
    ):
        assert f"  {field}: " in result.output, field
    assert console.sent == []


def test_the_consoles_refusal_names_the_job_files_keys_and_takes_the_code_back(
    console: Console, project: Path
) -> None:
    console.answer(
        "POST",
        "/experiments",
        (
            400,
            {
                "errors": {
                    "template.roles.worker.package": ["Unknown package 'cpu-9'."],
                    "objective.metric": ["The program does not report 'accuracy'."],
                    "pruner_options.eta": ["successive_halving takes min_resource, ..."],
                }
            },
        ),
    )
    result = submitted(project)
    assert result.exit_code == 2, result.output
    assert "roles.worker.package: Unknown package 'cpu-9'." in result.output
    assert "search.objective.metric: The program does not report 'accuracy'." in result.output
    assert "search.pruner_options.eta: successive_halving takes" in result.output
    assert ("DELETE", f"/snapshots/{SHA}", b"") in console.sent  # nothing left behind


def test_submit_of_a_file_with_a_search_section_says_which_command_runs_it(
    console: Console, project: Path
) -> None:
    result = run("submit", str(project / "job.yaml"))
    assert result.exit_code == 2
    assert "has a search: section: `trainyard search submit" in result.output
    assert console.sent == []


def test_search_submit_of_a_plain_job_file_says_what_is_missing(
    console: Console, project: Path
) -> None:
    (project / "job.yaml").write_text("name: digits\n" + JOB_PART)
    result = submitted(project)
    assert result.exit_code == 2
    assert "has no search: section" in result.output
    assert console.sent == []


def test_show_prints_the_budget_the_best_trial_and_each_trial(console: Console) -> None:
    trials = [
        trial(0, "completed", objective_last=0.95, objective_best=0.961, judged_through=2),
        trial(
            1,
            "pruned",
            objective_last=0.61,
            objective_best=0.61,
            judged_through=1,
            reason="stopped early: eval_accuracy 0.61 at epoch 1, below the median 0.83",
            params={"--lr": 0.5, "--batch-size": 128, "$OPTIMIZER": "sgd"},
        ),
        trial(2, "running", job=None),
    ]
    answer = experiment(trials=trials)
    answer["best"] = {"trial": 0, "job": 40, "value": 0.961, "params": trials[0]["params"]}
    console.answer("GET", "/experiments/7", (200, answer))
    result = run("search", "show", "7")
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()

    def line_of(start: str) -> str:
        [found] = [line for line in lines if line.startswith(start)]
        return " ".join(found.split())

    assert line_of("State") == "State running"
    assert line_of("Objective") == "Objective eval_accuracy, highest, by epoch"
    assert (
        line_of("Trials")
        == "Trials 3 of 12 started, 1 running or waiting, 9 left; at most 3 at once"
    )
    assert line_of("Core-hours") == "Core-hours 0.5 of 2 (1.5 left)"
    assert line_of("GPU-hours") == "GPU-hours 0 (no limit)"
    assert line_of("Space") == "Space --lr 0.01 to 1 (log), $OPTIMIZER sgd|adam"
    assert line_of("Best") == (
        "Best trial 0, job 40: eval_accuracy 0.961, --lr=0.03162 --batch-size=32 $OPTIMIZER=adam"
    )
    assert "TRIAL STATE PARAMETERS BEST LAST EPOCH JOB REASON" in " ".join(result.output.split())
    assert line_of("0 ") == (
        "0 completed --lr=0.03162 --batch-size=32 $OPTIMIZER=adam 0.961 0.95 2 40"
    )
    assert line_of("1 ") == (
        "1 pruned --lr=0.5 --batch-size=128 $OPTIMIZER=sgd 0.61 0.61 1 41 stopped early: "
        "eval_accuracy 0.61 at epoch 1, below the median 0.83"
    )
    assert line_of("2 ") == "2 running --lr=0.03162 --batch-size=32 $OPTIMIZER=adam — — — —"


def test_show_json_is_the_apis_answer(console: Console) -> None:
    console.answer("GET", "/experiments/7", (200, experiment(trials=[trial(0, "running")])))
    result = run("search", "show", "7", "--json")
    assert json.loads(result.output) == experiment(trials=[trial(0, "running")])


def test_an_experiment_that_is_not_yours_is_not_found(console: Console) -> None:
    result = run("search", "show", "8")
    assert result.exit_code == 4


def test_ls_lists_each_experiment_with_its_trials_and_best(console: Console) -> None:
    done = experiment("finished", [trial(0, "completed"), trial(1, "pruned")])
    done["best"] = {"trial": 0, "job": 40, "value": 0.97, "params": {}}
    done["reason"] = "the budget of 2 trials is spent\nsecond line"
    listed = [{k: v for k, v in e.items() if k != "trials"} for e in (done, experiment())]
    console.answer("GET", "/experiments", (200, {"experiments": listed}))
    result = run("search", "ls")
    assert result.exit_code == 0, result.output
    rows = [" ".join(line.split()) for line in result.output.splitlines()]
    assert rows[0] == "ID NAME STATE TRIALS RUNNING BEST OBJECTIVE CREATED WHY"
    assert rows[1] == (
        "7 digits-search finished 2 of 12 0 0.97 eval_accuracy, highest, by epoch "
        "2026-11-29 15:00:00 the budget of 2 trials is spent"
    )
    assert rows[2].startswith("7 digits-search running 0 of 12 0 —")

    listed[1]["owner"] = "bob"  # staff see everyone's: whose each is
    console.answer("GET", "/experiments", (200, {"experiments": listed}))
    rows = [" ".join(line.split()) for line in run("search", "ls").output.splitlines()]
    assert rows[0] == "ID NAME STATE TRIALS RUNNING BEST OBJECTIVE CREATED OWNER WHY"
    assert rows[2].endswith("2026-11-29 15:00:00 bob")


@pytest.mark.parametrize("action", ["pause", "resume", "stop"])
def test_pause_resume_and_stop_post_to_the_experiment(console: Console, action: str) -> None:
    state = {"pause": "paused", "resume": "running", "stop": "stopping"}[action]
    console.answer("POST", f"/experiments/7/{action}", (200, experiment(state)))
    result = run("search", action, "7")
    assert result.exit_code == 0, result.output
    assert result.output.strip() == f"Experiment 7: {state}"
    assert console.calls("POST") == [("POST", f"/experiments/7/{action}", b"")]


def test_an_action_says_the_state_with_its_reason_once(console: Console) -> None:
    paused = experiment("paused") | {"reason": "paused by ann"}
    stopped = experiment("stopped") | {"reason": "experiment stopped by ann"}
    console.answer("POST", "/experiments/7/pause", (200, paused))
    console.answer("POST", "/experiments/7/stop", (200, stopped))
    assert run("search", "pause", "7").output.strip() == "Experiment 7: paused by ann"
    assert run("search", "stop", "7").output.strip() == (
        "Experiment 7: stopped (experiment stopped by ann)"
    )


def test_stop_of_an_ended_experiment_gives_the_consoles_reason(console: Console) -> None:
    console.answer(
        "POST",
        "/experiments/7/stop",
        (409, {"errors": {"request": ["Experiment 7 has finished already."]}}),
    )
    result = run("search", "stop", "7")
    assert result.exit_code == 2
    assert "Experiment 7 has finished already." in result.output


@pytest.mark.parametrize(("end", "code"), [("finished", 0), ("stopped", 0), ("failed", 1)])
def test_follow_prints_each_trials_start_and_end_until_the_experiment_ends(
    console: Console, project: Path, end: str, code: int
) -> None:
    pruned_reason = "stopped early: eval_accuracy 0.61 at epoch 1, below the median 0.83"
    last = experiment(
        end,
        [
            trial(0, "completed", objective_last=0.95, objective_best=0.96),
            trial(1, "pruned", reason=pruned_reason),
        ],
    )
    last["best"] = {"trial": 0, "job": 40, "value": 0.96, "params": {"--lr": 0.1}}
    console.answer("POST", "/experiments", (201, experiment()))
    console.answer(
        "GET",
        "/experiments/7",
        (200, experiment(trials=[trial(0, "running"), trial(1, "running")])),
        (200, experiment(trials=[trial(0, "running"), trial(1, "pruned", reason=pruned_reason)])),
        (200, last),
    )
    result = submitted(project, "--follow")
    assert result.exit_code == code, result.output
    out = result.output
    assert "trial 0 running: job 40, --lr=0.03162 --batch-size=32 $OPTIMIZER=adam" in out
    assert out.count("trial 1 running") == 1  # a change is said once
    assert f"trial 1 pruned: {pruned_reason}" in out
    assert "trial 0 completed: eval_accuracy 0.95 (best 0.96)" in out
    assert f"Experiment 7 {end}. Best: trial 0, job 40: eval_accuracy 0.96, --lr=0.1" in out


def test_follow_tells_the_job_of_a_trial_that_began_and_ended_between_two_polls(
    console: Console, project: Path
) -> None:
    ended = trial(2, "completed", objective_last=0.67, objective_best=0.67)
    console.answer("POST", "/experiments", (201, experiment()))
    console.answer("GET", "/experiments/7", (200, experiment("finished", [ended])))
    out = submitted(project, "--follow").output
    ran = "trial 2 ran: job 42, --lr=0.03162 --batch-size=32 $OPTIMIZER=adam"
    assert ran in out
    assert out.index(ran) < out.index("trial 2 completed: eval_accuracy 0.67 (best 0.67)")
    assert "trial 2 running" not in out  # it was never seen running: not said to be


def test_renamed_gives_the_job_files_place_of_a_console_field() -> None:
    assert search_section.renamed("template.program.args") == "program.args"
    assert search_section.renamed("template") == "the job"
    assert search_section.renamed("space.--lr") == "search.space.--lr"
    assert search_section.renamed("budget.parallel") == "search.budget.parallel"
    assert search_section.renamed("request") == "request"


def test_choices_keep_true_and_1_apart() -> None:
    section: dict[str, Any] = {
        "space": {"$FLAG": {"type": "choice", "choices": [True, 1, "1"]}},
        "objective": {"metric": "loss"},
        "budget": {"trials": 3},
    }
    request = search_section.experiment_request(section, {"name": "job"}, None, "job.yaml")
    assert request["space"]["$FLAG"]["choices"] == [True, 1, "1"]
    section["space"]["$FLAG"]["choices"] = ["a", "a"]
    with pytest.raises(CliError) as refused:
        search_section.experiment_request(section, {"name": "job"}, None, "job.yaml")
    assert refused.value.details == ["search.space.$FLAG.choices: 'a' is given twice."]


@pytest.mark.parametrize(("section", "field", "words"), BAD_SECTIONS)
def test_the_console_refuses_what_the_section_check_refuses(
    project: Path, section: str, field: str, words: str
) -> None:
    """The CLI's check only says earlier what the console would say: sent as it is, each bad
    section is refused by the console's own check of an experiment too."""
    with_section(project, section)
    draft = jobfile.read(project / "job.yaml")
    request = {"name": "digits", "template": draft.body, **draft.search}
    with pytest.raises(ValidationFailed):
        experiment_space.parse_request(request)


def test_the_guides_job_file_is_an_experiment_the_console_takes(tmp_path: Path) -> None:
    guide = (Path(__file__).resolve().parents[2] / "docs" / "experiments.md").read_text()
    example = guide.split("```yaml\n# digits-search.yaml\n", 1)[1].split("```", 1)[0]
    (tmp_path / "digits-search.yaml").write_text(example)
    draft = jobfile.read(tmp_path / "digits-search.yaml")
    template = jobfile.apply_flags(
        draft.body, name=None, image=None, script=None, args=[], roles=[], kvstore=None,
        env=[], restart_policy=None, max_restarts=None,
    )  # fmt: skip
    request = search_section.experiment_request(draft.search, template, None, "digits-search")
    spec = experiment_space.parse_request(request)
    assert [d.key for d in spec.dimensions] == ["--lr", "--batch-size"]
    assert (spec.pruner, spec.pruner_options) == (
        "successive_halving",
        {"min_resource": 1, "reduction_factor": 3},
    )
    assert spec.template["program"]["script"] == "digits-ddp"
