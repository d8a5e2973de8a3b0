"""`trainyard search`: hyperparameter searches (experiments) over a job file's arguments and
variables, each trial an ordinary job of yours (API v1 /experiments; docs/experiments.md).

    trainyard search submit job.yaml [--follow]    the job file's search: section
    trainyard search ls
    trainyard search show ID
    trainyard search pause|resume|stop ID
"""

import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.text import Text

from trainyard_cli import code_upload, config, jobfile, render, search_section
from trainyard_cli.client import Api
from trainyard_cli.errors import BAD_INPUT, INTERRUPTED, JOB_DID_NOT_SUCCEED, CliError

app = typer.Typer(
    name="search",
    help="Hyperparameter searches (experiments): trials of a job file, each an ordinary job of "
    "yours, the unpromising ones stopped early. The job file's search: section says what to "
    "try (docs/experiments.md).",
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode=None,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)

Json = Annotated[bool, typer.Option("--json", help="Print the API's answer as JSON.")]
ExperimentId = Annotated[
    int,
    typer.Argument(
        metavar="ID", help="The experiment's number, as `trainyard search ls` shows it."
    ),
]

ENDED = ("finished", "stopped", "failed")
FOLLOW_POLL_SECONDS = 2.0


def _api() -> Api:
    return Api(config.load())


@app.command()
def submit(
    job_file: Annotated[
        Path, typer.Argument(help="A job file (YAML) with a search: section.", show_default=False)
    ],
    name: Annotated[
        str | None,
        typer.Option(help="The experiment's name (default: search.name, else the job's)."),
    ] = None,
    code: Annotated[
        Path | None,
        typer.Option(help="The folder to upload as the trials' code (default: this folder)."),
    ] = None,
    no_upload: Annotated[
        bool,
        typer.Option("--no-upload", help="Run a script the console has (built-in examples)."),
    ] = False,
    follow: Annotated[
        bool,
        typer.Option(
            "--follow", "-f", help="Print each trial's start and end until the search ends."
        ),
    ] = False,
    json_output: Json = False,
) -> None:
    """Start an experiment: the job file's job is the template of every trial, its search:
    section says what to try, what to judge by and how much to spend. The code folder is
    uploaded once, as for `trainyard submit`; every trial runs those files."""
    draft = jobfile.read(job_file)
    if not draft.is_experiment:
        raise CliError(
            f"{job_file} has no search: section: `trainyard submit {job_file}` runs it as one "
            "job; docs/experiments.md shows the section.",
            BAD_INPUT,
        )
    template = jobfile.apply_flags(
        draft.body,
        name=None,
        image=None,
        script=None,
        args=[],
        roles=[],
        kvstore=None,
        env=[],
        restart_policy=None,
        max_restarts=None,
    )
    request = search_section.experiment_request(draft.search, template, name, str(job_file))
    # Checked whole before anything is uploaded: a refusal here leaves nothing behind.
    jobfile.check_text(request)
    api = _api()
    folder = code.resolve() if code else draft.code
    experiment = code_upload.send_with_code(
        api,
        template,
        folder,
        no_upload,
        json_output,
        lambda: api.post("/experiments", search_section.renamed, json=request),
    )
    number = experiment["id"]
    if not json_output:
        render.out.print(
            f"Experiment {number} submitted: {experiment['name']} ({experiment['state']}) "
            f"{api.page_url(f'/experiments/{number}/')}"
        )
    if not follow:
        if json_output:
            render.print_json(experiment)
        else:
            render.note(f"`trainyard search show {number}` shows its trials.")
        return
    with _interruptible(number):
        experiment = _follow(api, experiment, quiet=json_output)
    if json_output:
        render.print_json(experiment)
    else:
        render.err.print(Text(_outcome(experiment)))
    if experiment["state"] == "failed":
        raise typer.Exit(JOB_DID_NOT_SUCCEED)


@app.command("ls")
def list_experiments(json_output: Json = False) -> None:
    """Your experiments, newest first (staff see everyone's): state, trials, the best value."""
    api = _api()
    answer = api.get("/experiments")
    experiments = answer["experiments"] if isinstance(answer, dict) else answer
    if json_output:
        render.print_json(experiments)
        return
    if not experiments:
        render.note("No experiments yet: `trainyard search submit FILE` starts one.")
        return
    _console_display(api)
    # Whoever sees others' experiments (staff) sees whose each is.
    with_owner = len({e["owner"] for e in experiments}) > 1
    columns = ["ID", "NAME", "STATE", "TRIALS", "RUNNING", "BEST", "OBJECTIVE", "CREATED"]
    rows = []
    for e in experiments:
        row: list[Any] = [
            e["id"],
            e["name"],
            e["state"],
            f"{e['used']['trials']} of {e['budget']['trials']}",
            e["used"]["running"],
            render.human_number((e.get("best") or {}).get("value")),
            objective_text(e["objective"]),
            render.local_time(e["created"]),
        ]
        if with_owner:
            row.append(e["owner"])
        row.append((e.get("reason") or "").split("\n", 1)[0])  # show ID has the rest
        rows.append(row)
    render.table([*columns, *(["OWNER"] if with_owner else []), "WHY"], rows)


@app.command()
def show(experiment_id: ExperimentId, json_output: Json = False) -> None:
    """One experiment: state, budget used and left, the best trial, and every trial with its
    parameters, objective (best and last), job and why it ended."""
    api = _api()
    experiment = api.get(f"/experiments/{experiment_id}")
    if json_output:
        render.print_json(experiment)
        return
    _console_display(api)
    render.table(["", ""], summary_rows(api, experiment), header=False)
    render.out.print()
    trials = experiment.get("trials") or []
    if not trials:
        render.note("No trial has started yet.")
        return
    unit = experiment["objective"].get("unit") or "epoch"
    render.table(
        ["TRIAL", "STATE", "PARAMETERS", "BEST", "LAST", unit.upper(), "JOB", "REASON"],
        [
            [
                t["number"],
                t["state"],
                params_text(t["params"]),
                render.human_number(t["objective_best"]),
                render.human_number(t["objective_last"]),
                "—" if t.get("judged_through") is None else t["judged_through"],
                "—" if t["job"] is None else t["job"],
                t["reason"] or "",
            ]
            for t in trials
        ],
    )


@app.command()
def pause(experiment_id: ExperimentId, json_output: Json = False) -> None:
    """Start no new trial until `resume`; the running ones go on to their end."""
    _act(experiment_id, "pause", json_output)


@app.command()
def resume(experiment_id: ExperimentId, json_output: Json = False) -> None:
    """Start trials again where the budget allows."""
    _act(experiment_id, "resume", json_output)


@app.command()
def stop(experiment_id: ExperimentId, json_output: Json = False) -> None:
    """End the experiment: its running trials are cancelled, and no new one starts."""
    _act(experiment_id, "stop", json_output)


def _act(experiment_id: int, action: str, json_output: bool) -> None:
    experiment = _api().post(f"/experiments/{experiment_id}/{action}")
    if json_output:
        render.print_json(experiment)
        return
    render.out.print(f"Experiment {experiment_id}: {state_with_reason(experiment)}")


def state_with_reason(e: dict[str, Any]) -> str:
    """ "paused by ann", "stopped (experiment stopped by ann)", "running"."""
    state, reason = e["state"], e.get("reason") or ""
    if reason.startswith(state):
        return str(reason)
    return f"{state} ({reason})" if reason else str(state)


# --- what the commands print --------------------------------------------------------------------


def summary_rows(api: Api, e: dict[str, Any]) -> list[tuple[str, str]]:
    budget, used = e["budget"], e["used"]
    trials_left = max(0, budget["trials"] - used["trials"])
    return [
        ("Experiment", f"{e['id']} {e['name']}"),
        ("State", e["state"]),
        ("Reason", e.get("reason") or "—"),
        ("Owner", e["owner"]),
        ("Objective", objective_text(e["objective"])),
        ("Searcher", f"{e['searcher']}, pruner {e['pruner']}"),
        ("Space", space_text(e["space"])),
        (
            "Trials",
            f"{used['trials']} of {budget['trials']} started, "
            f"{used['running']} running or waiting, {trials_left} left; "
            f"at most {budget['parallel']} at once",
        ),
        ("Core-hours", hours_text(used.get("core_hours"), budget.get("core_hours"))),
        ("GPU-hours", hours_text(used.get("gpu_hours"), budget.get("gpu_hours"))),
        ("Best", best_text(e)),
        ("Created", render.local_time(e["created"])),
        ("Ended", render.local_time(e.get("ended"))),
        ("Page", api.page_url(f"/experiments/{e['id']}/")),
    ]


def objective_text(objective: dict[str, Any]) -> str:
    """ "eval_accuracy, highest, by epoch" """
    goal = {"max": "highest", "min": "lowest"}.get(objective.get("goal") or "", "")
    unit = objective.get("unit")
    return ", ".join(p for p in (objective["metric"], goal, f"by {unit}" if unit else "") if p)


def value_text(value: Any) -> str:
    """A parameter's value as the program gets it: 0.0316, 32, adam, true."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return render.human_number(value)
    return str(value)


def params_text(params: dict[str, Any]) -> str:
    """ "--lr=0.0316 --batch-size=32 $OPTIMIZER=adam", in the space's order."""
    return " ".join(f"{key}={value_text(value)}" for key, value in params.items()) or "—"


def space_text(space: dict[str, Any]) -> str:
    """ "--lr 0.01 to 1 (log), --batch-size 16 to 128 (log), $OPTIMIZER sgd|adam" """
    parts = []
    for key, d in space.items():
        if d.get("type") == "choice":
            parts.append(f"{key} {'|'.join(value_text(c) for c in d['choices'])}")
            continue
        scale = ["log"] if d.get("log") else []
        if d.get("step") is not None:
            scale.append(f"step {value_text(d['step'])}")
        words = f" ({', '.join(scale)})" if scale else ""
        parts.append(f"{key} {value_text(d['low'])} to {value_text(d['high'])}{words}")
    return ", ".join(parts)


def hours_text(used: float | None, limit: float | None) -> str:
    """ "0.42 of 2 (1.58 left)", or "0.42 (no limit)"."""
    spent = render.human_number(used or 0)
    if limit is None:
        return f"{spent} (no limit)"
    left = render.human_number(max(0.0, limit - (used or 0)))
    return f"{spent} of {render.human_number(limit)} ({left} left)"


def best_text(e: dict[str, Any]) -> str:
    best = e.get("best")
    if not best:
        return "—"
    job = f", job {best['job']}" if best.get("job") is not None else ""
    return (
        f"trial {best['trial']}{job}: {e['objective']['metric']} "
        f"{render.human_number(best['value'])}, {params_text(best['params'])}"
    )


def trial_event(trial: dict[str, Any], metric: str) -> str:
    """One line of `submit --follow` when a trial starts or ends."""
    head = f"trial {trial['number']} {trial['state']}"
    if trial["state"] in ("waiting", "running"):
        return f"{head}{_job_and_params(trial)}"
    if trial["state"] == "completed":
        return (
            f"{head}: {metric} {render.human_number(trial['objective_last'])} "
            f"(best {render.human_number(trial['objective_best'])})"
        )
    return f"{head}: {trial.get('reason') or '—'}"


def trial_ran(trial: dict[str, Any]) -> str:
    """The start line of a trial that began and ended between two polls (a short trial, or a
    follower started late): its job and values are told all the same, in the past tense."""
    return f"trial {trial['number']} ran{_job_and_params(trial)}"


def _job_and_params(trial: dict[str, Any]) -> str:
    job = f": job {trial['job']}" if trial.get("job") is not None else ""
    return f"{job}, {params_text(trial['params'])}"


def _outcome(e: dict[str, Any]) -> str:
    """ "Experiment 4 finished: 12 trials, 5 completed, 7 stopped early, 0 failed. Best: …" """
    reason = (e.get("reason") or "").removeprefix(f"{e['state']}: ")
    return (
        f"Experiment {e['id']} {e['state']}{': ' + reason if reason else ''}. Best: {best_text(e)}"
    )


def _follow(api: Api, experiment: dict[str, Any], quiet: bool) -> dict[str, Any]:
    """Poll the experiment until it ends, printing each trial's changes; the experiment as it
    ended. Polling, not a stream: a trial changes state every few minutes at most."""
    number = experiment["id"]
    metric = experiment["objective"]["metric"]
    seen: dict[int, tuple[str, Any]] = {}
    state = experiment["state"]
    while True:
        for trial in experiment.get("trials") or []:
            now = (trial["state"], trial.get("job"))
            before = seen.get(trial["number"])
            if before != now:
                seen[trial["number"]] = now
                if quiet:
                    continue
                told_its_job = before is not None and before[1] == now[1]
                if trial["state"] not in ("waiting", "running") and not told_its_job:
                    if now[1] is not None:
                        render.out.print(Text(trial_ran(trial)))
                render.out.print(Text(trial_event(trial, metric)))
        if experiment["state"] != state and not quiet:
            render.note(f"experiment {number}: {experiment['state']}")
        state = experiment["state"]
        if state in ENDED:
            return experiment
        time.sleep(FOLLOW_POLL_SECONDS)
        experiment = api.get(f"/experiments/{number}")


@contextmanager
def _interruptible(experiment_id: int) -> Iterator[None]:
    """Ctrl-C stops the watching, never the experiment: say how to stop that."""
    try:
        yield
    except KeyboardInterrupt:
        render.note(
            f"Stopped watching. Experiment {experiment_id} goes on; "
            f"`trainyard search stop {experiment_id}` stops it."
        )
        raise typer.Exit(INTERRUPTED) from None


def _console_display(api: Api) -> None:
    """Times in the console's time zone, as the pages write them (main._console_display)."""
    render.show_times_in(api.get("/catalog").get("time_zone"))
