"""The `trainyard` command: log in, submit jobs, follow them, read their logs and metrics.

Every command is a few calls to API v1 (trainyard_cli.client) and a rendering of the answer
(trainyard_cli.render); `--json` prints the API's own answer instead, for scripts.
"""

import shlex
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.text import Text

from trainyard_cli import artifacts, code_upload, config, jobfile, render, search
from trainyard_cli.client import Api
from trainyard_cli.errors import (
    BAD_INPUT,
    EXIT_CODES_HELP,
    INTERRUPTED,
    JOB_DID_NOT_SUCCEED,
    NOT_FOUND,
    CliError,
)
from trainyard_cli.follow import Follower, Line, follow
from trainyard_cli.states import is_older

app = typer.Typer(
    name="trainyard",
    help="Submit and watch distributed training jobs on a Trainyard console.",
    epilog=EXIT_CODES_HELP,
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode=None,  # help texts show [master] and [worker-1] as they are
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)

Json = Annotated[bool, typer.Option("--json", help="Print the API's answer as JSON.")]
JobId = Annotated[
    int, typer.Argument(metavar="JOB", help="The job's number, as `trainyard ls` shows it.")
]
# What `submit` and `rerun` both take.
Restart = Annotated[str | None, typer.Option(help='Restart policy: "never" or "on-failure".')]
MaxRestarts = Annotated[int | None, typer.Option(help="Restarts allowed.")]
ExcludeFailedNode = Annotated[
    bool | None,
    typer.Option(
        "--exclude-failed-node/--any-node",
        help="A restart runs away from the node whose instance failed (default: the image's).",
        show_default=False,
    ),
]
OnResume = Annotated[
    list[str] | None,
    typer.Option(
        "--on-resume",
        help="An argument every later attempt (a restart, a resume after preemption) runs "
        "with, in place of the same option: --on-resume=--init_from=resume; repeatable.",
        show_default=False,
    ),
]
DataFolder = Annotated[
    list[str] | None,
    typer.Option(
        "--data",
        help="A folder of the nodes the job reads (read-only, as you), e.g. "
        "/shared/datasets/vision; repeatable.",
        show_default=False,
    ),
]
ResultsFolder = Annotated[
    str | None,
    typer.Option("--results", help="A folder of the nodes the job writes its results to, as you."),
]
OnePerNode = Annotated[
    bool | None,
    typer.Option(
        "--one-per-node/--share-nodes",
        help="No two instances on one node, however small their packages (Slurm: "
        "--ntasks-per-node=1); --share-nodes lets them share again.",
        show_default=False,
    ),
]
TimeLimit = Annotated[
    str | None,
    typer.Option(
        help="How long each attempt may run, e.g. 2h, 90m, 1h30m or seconds; then it is "
        "stopped and fails. A limit lets a job start sooner (backfill)."
    ),
]
Priority = Annotated[
    str | None,
    typer.Option(help='A priority class: "low", "normal", "high" (`trainyard priorities`).'),
]
Pool = Annotated[
    str | None,
    typer.Option(
        help="Run it in a Slurm pool (`trainyard pools`); default: Trainyard's own nodes."
    ),
]
ContainerImage = Annotated[
    str | None,
    typer.Option(
        help="Run its trainers in an OCI image of your own, where the framework image lets "
        "it in (`trainyard images` says which)."
    ),
]
SlurmOption = Annotated[
    list[str] | None,
    typer.Option(
        "--slurm",
        help="A Slurm option within what the pool allows (`trainyard pools`): partition=, "
        "account=, qos=, constraint=, reservation= or exclusive; repeatable.",
    ),
]
Follow = Annotated[
    bool, typer.Option("--follow", "-f", help="Stream the job's log here until it ends.")
]
Wait = Annotated[
    bool, typer.Option("--wait", help="Wait for the job to end; exit 0 only if it succeeded.")
]

WAIT_POLL_SECONDS = 1.0
MAX_TAIL = 10_000  # the API's largest page of log lines
END_OF_LOG = 2**63 - 1  # a cursor after every line: `before` it means "the last lines"


def _api() -> Api:
    return Api(config.load())


@contextmanager
def _interruptible(job_id: int | None = None) -> Iterator[None]:
    """Ctrl-C stops the command, never the job: say how to stop that."""
    try:
        yield
    except KeyboardInterrupt:
        if job_id is not None:
            render.note(
                f"Stopped watching. Job {job_id} goes on; `trainyard cancel {job_id}` stops it."
            )
        raise typer.Exit(INTERRUPTED) from None


# --- account ------------------------------------------------------------------------------------


@app.command()
def login(
    url: Annotated[str, typer.Argument(help="The console's address, e.g. https://ty.example.com")],
    with_token: Annotated[
        bool, typer.Option("--with-token", help="Read the token from stdin instead of asking.")
    ] = False,
    json_output: Json = False,
) -> None:
    """Save the console's address and your API token (made on the console's API tokens page).

    The token is kept in your config folder, readable only by you.
    """
    url = config.normalize_url(url)
    if with_token:
        token = sys.stdin.readline().strip()
    else:
        render.note(f"Make a token on {url}/account/tokens/ and paste it here.", style="")
        token = typer.prompt("API token", hide_input=True).strip()
    if not token:
        raise CliError("No token given.", BAD_INPUT)
    credentials = config.Credentials(url, token)
    me = Api(credentials, retry_seconds=10).get("/me")
    path = config.save(credentials)
    if json_output:
        render.print_json(me)
        return
    render.out.print(f"Logged in to {url} as {me['username']}.")
    render.note(f"Token saved in {path}.")


@app.command()
def logout() -> None:
    """Forget the saved token (it stays valid: revoke it on your API tokens page)."""
    if config.forget():
        render.out.print("Logged out; the token is no longer saved here.")
    else:
        render.out.print("Not logged in.")


@app.command()
def whoami(json_output: Json = False) -> None:
    """Who the saved token belongs to, on which console."""
    api = _api()
    me = api.get("/me")
    if json_output:
        render.print_json({**me, "url": api.url})
        return
    staff = " (staff)" if me["is_staff"] else ""
    render.out.print(f"{me['username']}{staff} on {api.url}")


# --- jobs ---------------------------------------------------------------------------------------


class TakesScriptArguments(typer.core.TyperCommand):
    """A command whose script's arguments go after `--`: an option it does not know is most
    often one of the script's, and the usage error says where it belongs."""

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        try:
            return super().parse_args(ctx, args)
        except Exception as exc:
            # Click's NoSuchOption, or the copy of it that Typer ≥ 0.25 carries: by name, as
            # pyproject takes either.
            if type(exc).__name__ != "NoSuchOption":
                raise
            option = getattr(exc, "option_name", "")
            exc.message = (  # type: ignore[attr-defined]
                f"No such option: {option}. Arguments for the script go after `--`: "
                f"trainyard {self.name} … -- {option} …"
            )
            exc.possibilities = None  # type: ignore[attr-defined]
            raise


@app.command(cls=TakesScriptArguments)
def submit(
    job_file: Annotated[
        Path | None, typer.Argument(help="A job file (YAML); flags override its fields.")
    ] = None,
    name: Annotated[str | None, typer.Option(help="The job's name.")] = None,
    image: Annotated[
        str | None, typer.Option(help="A framework image (`trainyard images`).")
    ] = None,
    script: Annotated[str | None, typer.Option(help="The training script to run.")] = None,
    role: Annotated[
        list[str] | None,
        typer.Option(help="ROLE=PACKAGE[:INSTANCES], e.g. worker=cpu-1:2; repeat per role."),
    ] = None,
    kvstore: Annotated[str | None, typer.Option(help="Parameter-server jobs: the mode.")] = None,
    env: Annotated[
        list[str] | None, typer.Option(help="NAME=VALUE for the job's processes; repeatable.")
    ] = None,
    restart: Restart = None,
    max_restarts: MaxRestarts = None,
    exclude_failed_node: ExcludeFailedNode = None,
    on_resume: OnResume = None,
    data: DataFolder = None,
    results: ResultsFolder = None,
    one_per_node: OnePerNode = None,
    time_limit: TimeLimit = None,
    priority: Priority = None,
    pool: Pool = None,
    slurm: SlurmOption = None,
    container_image: ContainerImage = None,
    project: Annotated[str | None, typer.Option(help="The project to file the run under.")] = None,
    tag: Annotated[list[str] | None, typer.Option(help="A tag for the run; repeatable.")] = None,
    arg: Annotated[
        list[str] | None,
        typer.Option(help="One argument for the script; repeatable. Or put them after --."),
    ] = None,
    code: Annotated[
        Path | None,
        typer.Option(help="The folder to upload as the job's code (default: this folder)."),
    ] = None,
    no_upload: Annotated[
        bool,
        typer.Option("--no-upload", help="Run a script the console has (built-in examples)."),
    ] = False,
    follow_log: Follow = False,
    wait: Wait = False,
    json_output: Json = False,
) -> None:
    """Submit a job: from a job file, from flags, or both. Arguments after `--` go to the
    script: `trainyard submit --script train.py --role master=cpu-1 -- --epochs 3`.

    The script's folder is uploaded as the job's code, so it runs exactly the files you have
    here (what .gitignore or .trainyardignore names is left out)."""
    draft = jobfile.read(job_file) if job_file else jobfile.Draft({}, None)
    if draft.is_experiment:
        raise CliError(
            f"{job_file} has a search: section: `trainyard search submit {job_file}` runs it "
            "as an experiment (docs/experiments.md).",
            BAD_INPUT,
        )
    body = jobfile.apply_flags(
        draft.body,
        name=name,
        image=image,
        script=script,
        args=arg or [],
        roles=role or [],
        kvstore=kvstore,
        env=env or [],
        restart_policy=restart,
        max_restarts=max_restarts,
        exclude_failed_node=exclude_failed_node,
        args_on_resume=on_resume,
        data=data,
        results=results,
        one_per_node=one_per_node,
        time_limit=time_limit,
        priority=priority,
        pool=pool,
        slurm=slurm or [],
        container_image=container_image,
        project=project,
        tags=tag or [],
    )
    # The whole request is checked before anything is uploaded: a refusal here leaves nothing
    # on the console (a string the console cannot take would otherwise fail to encode only
    # after the upload).
    jobfile.check_text(body)
    api = _api()
    folder = code.resolve() if code else draft.code
    job = code_upload.send_with_code(
        api, body, folder, no_upload, json_output, lambda: api.post("/jobs", json=body)
    )
    _submitted(api, job, follow_log, wait, json_output)


def _runs_in(job: dict[str, Any]) -> str:
    """Where its trainers run: "container registry.example.com/ml/pytorch:2.13", or the
    host's Python (a Slurm pool's jobs always: pools run no containers)."""
    if job.get("container_image") and not job.get("pool"):
        return f"container {job['container_image']}"
    return "the node's own Python, no container"


def _submitted(
    api: Api, job: dict[str, Any], follow_log: bool, wait: bool, json_output: bool
) -> None:
    """Say where the new job is; with --follow or --wait, watch it to its end."""
    job_id = job["id"]
    if not json_output:
        render.out.print(
            f"Job {job_id} submitted: {job['name']} ({job['state']}) "
            f"{api.page_url(f'/jobs/{job_id}/')}"
        )
    if not (follow_log or wait):
        if json_output:
            render.print_json(job)
        return
    with _interruptible(job_id):
        if follow_log:
            job = _follow_to_end(api, job, 0, quiet=json_output)
        else:
            job = _wait_for_end(api, job_id, quiet=json_output)
    if json_output:
        render.print_json(job)
    else:
        _say_outcome(api, job)
    if wait and job["state"] != "succeeded":
        raise typer.Exit(JOB_DID_NOT_SUCCEED)


def _say_outcome(api: Api, job: dict[str, Any]) -> None:
    line = Text(f"Job {job['id']} ").append(render.state_text(job["state"], api.states.job))
    seconds = render.job_seconds(job)
    if seconds is not None:
        line.append(f" after {render.duration(seconds)}")
    if job.get("reason") and job["state"] != "succeeded":
        line.append(f": {job['reason']}")
    render.err.print(line)


def _wait_for_end(api: Api, job_id: int, quiet: bool) -> dict[str, Any]:
    """Poll the job until it ends, showing its state on a terminal."""
    last = ""
    status = render.err.status("", spinner="dots") if render.err.is_terminal and not quiet else None
    if status:
        status.start()
    try:
        while True:
            job = api.get(f"/jobs/{job_id}")
            if job["state"] in api.states.job.ended:
                return job
            if job["state"] != last and not quiet and not render.err.is_terminal:
                render.note(f"job {job_id}: {job['state']}")
            last = job["state"]
            if status:
                status.update(_progress_line(job))
            time.sleep(WAIT_POLL_SECONDS)
    finally:
        if status:
            status.stop()


def _progress_line(job: dict[str, Any]) -> str:
    state = job["state"]
    if place := _queue_place(job):
        return f"job {job['id']}: {state}, {place} in the queue"
    seconds = render.job_seconds(job)
    running = f" for {render.duration(seconds)}" if seconds is not None else ""
    return f"job {job['id']}: {state}{running}"


def _print_line(line: dict[str, Any], tags: dict[tuple[str, int], str], as_json: bool) -> None:
    """One log line, from the HTTP API or the websocket, as `[tag] text` or JSON."""
    tag = render.tag_of(line["role"], line["index"], tags)
    if as_json:
        render.print_json_line({**line, "tag": tag})  # the attempt is its own field there
    else:
        render.log_line(
            render.with_attempt(tag, line.get("attempt") or 0),
            line["text"],
            line["stream"],
            line.get("shown"),
        )


def _follow_to_end(
    api: Api,
    job: dict[str, Any],
    after: int,
    quiet: bool = False,
    keep: Callable[[Line], bool] = lambda line: True,
    as_json: bool = False,
) -> dict[str, Any]:
    """Print the log of `job` (the API's answer) from cursor `after` to its end; the job as it
    ended."""
    job_id = job["id"]
    tags = render.tags_of(job)
    newest = [job]  # the newest state heard, and printed when it changed

    def on_line(line: Line) -> None:
        if keep(line):
            _print_line(asdict(line), tags, as_json)

    def on_state(state: dict[str, Any]) -> None:
        if is_older(newest[0], state):
            return  # a late event: a newer state was heard already
        changed = state["state"] != newest[0]["state"]
        newest[0] = state
        tags.update(render.tags_of(state))
        if changed and not quiet:
            render.note(f"job {job_id}: {state['state']}")

    follower = Follower(on_line, on_state, lambda text: render.note(f"trainyard: {text}"))

    def why_refused() -> CliError:
        api.get(f"/jobs/{job_id}")  # raises the API's own reason (token revoked, no such job)
        return CliError(f"The console refused to stream job {job_id}'s log.", NOT_FOUND)

    follow(api.url, api.token, job_id, after, follower, why_refused)
    # The stream ends after the final state; the HTTP answer has every field of the job.
    return dict(api.get(f"/jobs/{job_id}"))


@app.command(cls=TakesScriptArguments)
def rerun(
    job_id: JobId,
    name: Annotated[str | None, typer.Option(help="A new name (default: the job's).")] = None,
    image: Annotated[str | None, typer.Option(help="Another framework image.")] = None,
    script: Annotated[str | None, typer.Option(help="Another script.")] = None,
    role: Annotated[
        list[str] | None,
        typer.Option(help="ROLE=PACKAGE[:INSTANCES], replacing that role's; repeatable."),
    ] = None,
    env: Annotated[
        list[str] | None, typer.Option(help="NAME=VALUE, added or replaced; repeatable.")
    ] = None,
    restart: Restart = None,
    max_restarts: MaxRestarts = None,
    exclude_failed_node: ExcludeFailedNode = None,
    on_resume: OnResume = None,
    one_per_node: OnePerNode = None,
    time_limit: TimeLimit = None,
    priority: Priority = None,
    container_image: ContainerImage = None,
    arg: Annotated[
        list[str] | None,
        typer.Option(help="The script's arguments, replacing the job's; or put them after --."),
    ] = None,
    follow_log: Follow = False,
    wait: Wait = False,
    json_output: Json = False,
) -> None:
    """Run a job again as a new job: the same code snapshot, program, roles, restart policy,
    health rules and variables, with what the flags change. `trainyard rerun 12 -- --lr 0.05`.
    Another user's variables whose values are masked to you are not copied."""
    api = _api()
    body = jobfile.apply_flags(
        api.get(f"/jobs/{job_id}/request"),
        name=name,
        image=image,
        script=script,
        args=arg or [],
        roles=role or [],
        kvstore=None,
        env=env or [],
        restart_policy=restart,
        max_restarts=max_restarts,
        exclude_failed_node=exclude_failed_node,
        args_on_resume=on_resume,
        one_per_node=one_per_node,
        time_limit=time_limit,
        priority=priority,
        container_image=container_image,
    )
    jobfile.check_text(body)
    _submitted(api, api.post("/jobs", json=body), follow_log, wait, json_output)


@app.command("ls")
def list_jobs(
    limit: Annotated[int, typer.Option(help="How many jobs at most.")] = 20,
    state: Annotated[
        str | None,
        typer.Option(help="Only jobs in this state (queued, running, failed...); several: a,b."),
    ] = None,
    name: Annotated[str | None, typer.Option(help="Only jobs whose name contains this.")] = None,
    user: Annotated[str | None, typer.Option(help="Only this user's jobs (admins).")] = None,
    image: Annotated[str | None, typer.Option(help="Only jobs of this image.")] = None,
    program: Annotated[
        str | None, typer.Option(help="Only jobs of this program (example or script path).")
    ] = None,
    since: Annotated[
        str | None, typer.Option(help="Only jobs submitted on or after this day, YYYY-MM-DD.")
    ] = None,
    until: Annotated[
        str | None, typer.Option(help="Only jobs submitted on or before this day, YYYY-MM-DD.")
    ] = None,
    project: Annotated[str | None, typer.Option(help="Only jobs of this project.")] = None,
    tag: Annotated[
        list[str] | None, typer.Option(help="Only jobs with this tag; repeat: all of them.")
    ] = None,
    sort: Annotated[
        str | None,
        typer.Option(
            help="-submitted (newest first, the default), submitted, -duration, duration; "
            "or a column: -metric:eval_accuracy:best, metric:loss:final, config:lr, project, tags."
        ),
    ] = None,
    json_output: Json = False,
) -> None:
    """Your jobs, newest first (staff see everyone's), filtered by the console; a waiting
    job shows its place in the queue and why it waits, a failed one why it failed."""
    api = _api()
    where = {
        "project": project,
        "tag": ",".join(tag) if tag else None,
        "state": state,
        "name": name,
        "user": user,
        "image": image,
        "program": program,
        "since": since,
        "until": until,
        "sort": sort,
    }
    jobs: list[dict[str, Any]] = []
    cursor: str | None = ""
    while cursor is not None and len(jobs) < limit:
        page = api.get("/jobs", limit=min(200, max(limit, 1)), cursor=cursor or None, **where)
        jobs += page["jobs"]
        cursor = page["next"]
    jobs = jobs[:limit]
    if json_output:
        render.print_json(jobs)
        return
    _console_display(api)
    if not jobs:
        filtered = any(v is not None for v in where.values())
        render.note(
            "No job matches." if filtered else "No jobs yet: `trainyard submit` starts one."
        )
        return
    owners = {j["owner"] for j in jobs}
    columns = ["ID", "NAME", "STATE", "IMAGE", "INSTANCES", "CREATED", "DURATION"]
    # Whoever sees others' jobs sees whose each is, whatever the filter left.
    with_owner = len(owners) > 1 or bool(api.get("/me").get("is_staff"))
    if with_owner:
        columns.append("OWNER")
    filed = any(j.get("project") or j.get("tags") for j in jobs)
    if filed:
        columns += ["PROJECT", "TAGS"]
    columns.append("WHY")
    rows = []
    for j in jobs:
        row: list[Any] = [
            j["id"],
            j["name"],
            _state_with_place(api, j),
            j["image"],
            render.instances(j),
            render.local_time(j["created"]),
            render.duration(render.job_seconds(j)),
        ]
        if with_owner:
            row.append(j["owner"])
        if filed:
            row += [j.get("project") or "", " ".join(j.get("tags") or [])]
        # The reason's first line: why it waits or failed (show JOB has the rest).
        row.append("" if j["state"] in ("succeeded", "running") else _first_line(j["reason"]))
        rows.append(row)
    render.table(columns, rows)


def _queue_place(job: dict[str, Any]) -> str | None:
    """ "number 2" while the job waits for room, as `show` and the job page say it."""
    return f"number {job['queue_position']}" if job.get("queue_position") else None


def _state_with_place(api: Api, job: dict[str, Any]) -> Text:
    place = _queue_place(job)
    return render.state_text(job["state"], api.states.job).append(f" ({place})" if place else "")


def _first_line(text: str) -> str:
    return text.splitlines()[0] if text else ""


@app.command()
def show(
    job_id: JobId,
    job_file: Annotated[
        bool,
        typer.Option(
            "--job-file",
            help="Print the job as a job file (YAML) that `trainyard submit` takes: "
            "`trainyard show 12 --job-file > job.yaml`.",
        ),
    ] = False,
    json_output: Json = False,
) -> None:
    """One job: state, resources, times and each instance; or the job file that submits it
    again."""
    api = _api()
    if job_file:
        body = api.get(f"/jobs/{job_id}/request")
        if json_output:
            render.print_json(body)
        else:
            sys.stdout.write(jobfile.dump(body, f"job {job_id}"))
        return
    job = api.get(f"/jobs/{job_id}")
    if json_output:
        render.print_json(job)
        return
    currency = _console_display(api)
    totals = job["totals"]
    roles = ", ".join(
        f"{name} {render.count_of(r['instances'])} × {r['package']}"
        for name, r in job["roles"].items()
    )
    program = job["program"]
    code = f" (code {program['snapshot'][:12]})" if program.get("snapshot") else ""
    fields = [
        ("Job", f"{job['id']} {job['name']}"),
        ("State", render.state_text(job["state"], api.states.job)),
        ("Reason", job["reason"] or "—"),
        ("Owner", job["owner"]),
        ("Project", job.get("project") or "—"),
        ("Tags", " ".join(job.get("tags") or []) or "—"),
        ("Image", job["image"] + (f", kvstore {job['kvstore']}" if job["kvstore"] else "")),
        ("Runs in", _runs_in(job)),
        ("Program", " ".join([program["script"], *program["args"]]) + code),
        ("Roles", roles),
        (
            "Resources",
            f"{totals['cpu']} CPU, {totals['gpus']} GPU, {totals['memory_gb']} GB, "
            f"{render.money(totals['price_per_hour'], currency)} per hour",
        ),
        ("Use", (job.get("usage") or {}).get("summary") or "—"),
        ("Created", render.local_time(job["created"])),
        ("Started", render.local_time(job["started"])),
        ("Ended", render.local_time(job["finished"])),
        ("Duration", render.duration(render.job_seconds(job))),
        ("Priority", _priority_text(job)),
        ("Runs on", f"Slurm pool {job['pool']}" if job.get("pool") else "Trainyard's nodes"),
        (
            "Placement",
            "one instance per node" if job.get("one_instance_per_node") else "instances may share",
        ),
        ("Restarts", f"{job['restarts_used']} of {job['max_restarts']}"),
        ("Time limit", _time_limit_text(job)),
        ("Retention", _retention_text(job.get("retention"))),
        ("Page", api.page_url(f"/jobs/{job_id}/")),
    ]
    if place := _queue_place(job):
        fields.insert(3, ("Queue", place))
    # A console older than the arguments for later attempts has none to say.
    if resume_args := (job.get("restart") or {}).get("args_on_resume"):
        fields.insert(-3, ("Later attempts", "run with " + shlex.join(resume_args)))
    render.table(["", ""], fields, header=False)
    render.out.print()
    if len(job["attempts"]) > 1:
        # After a restart the instances below are the new attempt's (not placed yet, right
        # after a kill): the attempts say what became of the earlier ones, and with which
        # arguments where later attempts run with others.
        with_args = len({shlex.join(a.get("args", [])) for a in job["attempts"]}) > 1
        render.table(
            [
                "ATTEMPT",
                "STARTED",
                "ENDED",
                "NODES",
                *(["ARGUMENTS"] if with_args else []),
                "WHY IT ENDED",
            ],
            [
                [
                    str(a["number"]),
                    render.local_time(a["started"]),
                    render.local_time(a["finished"]),
                    ", ".join(a["nodes"]) or "—",
                    *([shlex.join(a.get("args", []))] if with_args else []),
                    (a["reason"] or "").split("\n", 1)[0] or ("—" if a["finished"] else "running"),
                ]
                for a in job["attempts"]
            ],
        )
        render.out.print()
        render.out.print(f"Instances of attempt {job['attempt'] + 1}:")
    render.table(
        ["INSTANCE", "NODE", "STATE", "EXIT", "REASON"],
        [
            [
                r["tag"],
                r["node"] or "—",
                render.state_text(r["state"], api.states.replica),
                render.exit_text(r),
                r["reason"],
            ]
            for r in job["replicas"]
        ],
    )


@app.command()
def compare(
    job_ids: Annotated[
        list[int], typer.Argument(help="2 to 8 job numbers, as `trainyard ls` shows them.")
    ],
    differences: Annotated[
        bool, typer.Option("--differences", help="Only the configuration rows that differ.")
    ] = False,
    json_output: Json = False,
) -> None:
    """Jobs side by side: their figures, then their configuration with the rows that differ
    marked `≠` (the console decides which: the compare page marks the same rows)."""
    api = _api()
    answer = api.get("/compare", jobs=",".join(str(i) for i in job_ids))
    if json_output:
        render.print_json(answer)
        return
    jobs = answer["jobs"]
    heads = [f"#{j['id']} {j['name']}" for j in jobs]
    figure_rows = _figure_rows(answer, _console_display(api))
    render.table(
        ["FIGURE", *heads],
        [[label, *(cell(j["figures"]) for j in jobs)] for label, cell in figure_rows],
    )
    render.out.print()
    rows = [r for r in answer["rows"] if r["differs"] or not differences]
    render.table(
        ["", "CONFIGURATION", *heads],
        [["≠" if r["differs"] else "", r["label"], *r["values"]] for r in rows],
    )
    differing = sum(r["differs"] for r in answer["rows"])
    render.note(f"{differing} of {len(answer['rows'])} configuration rows differ.")
    render.note(f"Curves: {api.page_url('/compare/?jobs=' + ','.join(str(j['id']) for j in jobs))}")


def _figure_rows(
    answer: dict[str, Any], currency: str
) -> list[tuple[str, Callable[[dict[str, Any]], str]]]:
    """The compare page's figures table, row by row: a label and how to read it of a job."""

    def curve(name: str, which: str) -> Callable[[dict[str, Any]], str]:
        return lambda f: render.human_number((f["curves"].get(name) or {}).get(which))

    def ratio(key: str) -> Callable[[dict[str, Any]], str]:
        return lambda f: render.ratio(f[key])

    rows: list[tuple[str, Callable[[dict[str, Any]], str]]] = [
        ("duration", lambda f: render.duration(f["duration_seconds"]))
    ]
    for name in answer["charts"]:
        rows.append((f"{name}, final", curve(name, "final")))
        if any(
            (j["figures"]["curves"].get(name) or {}).get("best") is not None for j in answer["jobs"]
        ):
            rows.append((f"{name}, best", curve(name, "best")))
    rows += [
        ("samples/s, global", lambda f: render.human_number(f["global_sps"])),
        ("samples/s, per trainer", lambda f: render.human_number(f["per_worker_sps"])),
        ("speedup vs baseline", ratio("speedup")),
        ("scaling efficiency", ratio("efficiency")),
        ("cost", lambda f: render.money(f["cost"], currency)),
        (
            f"samples per {currency or 'unit'}",
            lambda f: render.human_number(f["samples_per_dollar"]),
        ),
    ]
    return rows


def _time_limit_text(job: dict[str, Any]) -> str:
    """ "2 h 00 min per attempt, stopped at 16:05:00" (the console gives seconds)."""
    seconds = job.get("time_limit")
    if seconds is None:
        return "none"
    ends = job.get("time_limit_ends")
    until = f", stopped at {render.local_time(ends)}" if ends else ""
    return f"{render.duration(seconds)} per attempt{until}"


def _priority_text(job: dict[str, Any]) -> str:
    """ "low, preempted by job 12": its class, and the jobs that preempted it (each attempt
    they ended says so on its page)."""
    by = job.get("preempted_by") or []
    jobs = ", ".join(f"job {j}" for j in by)
    return f"{job.get('priority', '?')}, preempted by {jobs}" if by else job.get("priority", "?")


def _retention_text(retention: dict[str, Any] | None) -> str:
    """What happens to the job's log and metrics, and when."""
    if not retention:
        return "—"  # a console older than retention
    if retention["pruned"]:
        return f"log and metrics removed {render.local_time(retention['pruned'])}"
    if retention["keep"]:
        return "kept (log and metrics are never removed)"
    if retention["days"] == 0:
        return "log and metrics kept forever"
    if retention["expires"]:
        return f"log and metrics removed after {render.local_time(retention['expires'])}"
    return f"log and metrics removed {retention['days']} days after it ends"


@app.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": True})
def tag(
    job_id: JobId,
    changes: Annotated[
        list[str] | None,
        typer.Argument(help="+TAG adds a tag (so does a bare TAG), -TAG takes one off."),
    ] = None,
    project: Annotated[
        str | None, typer.Option(help='File the run under this project ("": none).')
    ] = None,
    note: Annotated[str | None, typer.Option(help='Its note, plain text ("": none).')] = None,
    json_output: Json = False,
) -> None:
    """Tag a job, and set its project or note: `trainyard tag 12 +best -draft --project
    resnet`. Without changes, show how it is filed."""
    add = [c[1:] if c.startswith("+") else c for c in changes or [] if not c.startswith("-")]
    remove = [c[1:] for c in changes or [] if c.startswith("-")]
    body: dict[str, Any] = {"add": add, "remove": remove}
    if project is not None:
        body["project"] = project
    if note is not None:
        body["note"] = note
    api = _api()
    changing = add or remove or project is not None or note is not None
    job = api.patch(f"/jobs/{job_id}/labels", json=body) if changing else api.get(f"/jobs/{job_id}")
    if json_output:
        render.print_json({k: job[k] for k in ("id", "name", "project", "tags", "note")})
        return
    render.out.print(
        f"Job {job_id}: project {job['project'] or '(none)'}, "
        f"tags {' '.join(job['tags']) or '(none)'}"
    )
    if job["note"]:
        render.out.print(Text(job["note"]))


@app.command(name="retention")
def set_retention(
    job_id: JobId,
    keep: Annotated[
        bool | None,
        typer.Option("--keep/--no-keep", help="Keep its log and metrics however old it is."),
    ] = None,
    days: Annotated[
        int | None,
        typer.Option(min=0, help="Days its log and metrics are kept after it ends; 0: forever."),
    ] = None,
    default_days: Annotated[
        bool, typer.Option("--default-days", help="Back to the console's number of days.")
    ] = False,
    json_output: Json = False,
) -> None:
    """Keep a job's log and metrics, or say how long they stay; without options, show it."""
    if days is not None and default_days:
        raise CliError("Give --days or --default-days, not both.", BAD_INPUT)
    body: dict[str, Any] = {}
    if keep is not None:
        body["keep"] = keep
    if default_days or days is not None:
        body["days"] = days
    api = _api()
    job = api.post(f"/jobs/{job_id}/retention", json=body) if body else api.get(f"/jobs/{job_id}")
    if json_output:
        render.print_json(job)
        return
    _console_display(api)
    render.out.print(f"Job {job_id}: {_retention_text(job.get('retention'))}")


def _console_display(api: Api) -> str:
    """Write as the console's settings say, through its catalog: times in its time zone (if it
    names one); the answer is the prefix render.money writes before a price."""
    catalog = api.get("/catalog")
    render.show_times_in(catalog.get("time_zone"))
    return render.currency_prefix(catalog)


@app.command()
def cancel(job_id: JobId, json_output: Json = False) -> None:
    """Stop every process of the job."""
    job = _api().post(f"/jobs/{job_id}/cancel")
    if json_output:
        render.print_json(job)
        return
    render.out.print(f"Job {job_id}: {job['state']}")


@app.command()
def logs(
    job_id: JobId,
    follow_log: Annotated[
        bool, typer.Option("--follow", "-f", help="Keep printing new lines until the job ends.")
    ] = False,
    role: Annotated[str | None, typer.Option(help="Only this role's lines.")] = None,
    index: Annotated[int | None, typer.Option(help="Only this instance of the role.")] = None,
    since: Annotated[
        int, typer.Option(help="Only lines after this cursor (from an earlier --json).")
    ] = 0,
    tail: Annotated[
        int | None, typer.Option(help="Only the last N lines (then new ones, with -f).")
    ] = None,
    json_output: Annotated[
        bool, typer.Option("--json", help="One JSON object per line, with its cursor.")
    ] = False,
) -> None:
    """The job's log, each line tagged with its instance ([master], [worker-1], ...)."""
    if since < 0:
        raise CliError("--since must be a cursor: a whole number from 0.", BAD_INPUT)
    if tail is not None and not 1 <= tail <= MAX_TAIL:
        raise CliError(f"--tail must be from 1 to {MAX_TAIL}.", BAD_INPUT)
    api = _api()
    job = api.get(f"/jobs/{job_id}")
    tags = render.tags_of(job)

    def keep(line: Line) -> bool:
        return (role is None or line.role == role) and (index is None or line.index == index)

    with _interruptible(job_id if follow_log else None):
        after = since
        if tail is not None:
            # The last lines before the end of the stream, then (with -f) what follows them.
            page = api.get(
                f"/jobs/{job_id}/logs", before=END_OF_LOG, limit=tail, role=role, index=index
            )
            lines = [line for line in page["lines"] if line["cursor"] > since]
            for line in lines:
                _print_line(line, tags, json_output)
            after = lines[-1]["cursor"] if lines else since
            if not follow_log:
                return
        if follow_log:
            _follow_to_end(api, job, after, quiet=json_output, keep=keep, as_json=json_output)
            return
        while True:
            page = api.get(
                f"/jobs/{job_id}/logs", after=after, role=role, index=index, limit=10_000
            )
            for line in page["lines"]:
                _print_line(line, tags, json_output)
            if page["complete"] or page["next"] == after:
                return
            after = page["next"]


@app.command()
def metrics(
    job_id: JobId,
    csv: Annotated[bool, typer.Option("--csv", help="Every point as CSV.")] = False,
    name: Annotated[str | None, typer.Option(help="Only this metric.")] = None,
    last: Annotated[int, typer.Option(help="Rows of the table: the latest steps.")] = 20,
    json_output: Json = False,
) -> None:
    """The job's metrics: a table of the latest steps of its first instance, or every point
    of every instance as CSV or JSON."""
    api = _api()
    if csv:
        for chunk in api.stream_text(f"/jobs/{job_id}/metrics.csv"):
            sys.stdout.write(chunk)
        return
    points: list[dict[str, Any]] = []
    after = 0
    while True:
        page = api.get(f"/jobs/{job_id}/metrics", after=after, name=name)
        points += page["points"]
        if not page["points"] or page["next"] == after:
            break
        after = page["next"]
    if json_output:
        render.print_json(points)
        return
    if not points:
        render.note(f"Job {job_id} has reported no metrics yet.")
        return
    job = api.get(f"/jobs/{job_id}")
    tags = render.tags_of(job)

    def rank(p: dict[str, Any]) -> tuple[bool, str, int]:  # master first, then by role, index
        return (p["role"] != "master", p["role"], p["index"])

    first = min(rank(p) for p in points)
    chosen = [p for p in points if rank(p) == first]
    tag = render.tag_of(chosen[0]["role"], chosen[0]["index"], tags)
    # Metrics reported by step (loss each step) and those reported by epoch alone (eval
    # accuracy once an epoch) are two tables: in one, step 3 and epoch 3 shared a row, and
    # each kind's columns stood empty on the other's rows.
    for unit, table_rows in metric_tables(chosen, last).items():
        names = sorted({name for row in table_rows.values() for name in row})
        render.table(
            [unit.upper(), *names],
            [[k, *(row.get(n, "") for n in names)] for k, row in table_rows.items()],
            title=f"Job {job_id}, [{tag}], the last {len(table_rows)} {unit}s",
        )


def metric_tables(points: list[dict[str, Any]], last: int) -> dict[str, dict[Any, dict[str, str]]]:
    """One instance's points as rows of the latest `last` steps, and of the latest epochs for
    metrics that have no step: {"step": {3: {"loss": "0.52"}}, "epoch": {…}}."""
    by: dict[str, dict[Any, dict[str, str]]] = {"step": {}, "epoch": {}}
    for p in points:
        unit = "step" if p["step"] is not None else "epoch"
        key = p[unit]
        if key is None:
            continue
        by[unit].setdefault(key, {})[p["name"]] = p["nonfinite"] or render.human_number(p["value"])
    return {unit: {k: rows[k] for k in sorted(rows)[-last:]} for unit, rows in by.items() if rows}


# A job's checkpoints and outputs, listed or downloaded (trainyard_cli/artifacts.py).
app.command()(artifacts.artifacts)

# Hyperparameter searches over a job file (trainyard_cli/search.py).
app.add_typer(search.app)


# --- the cluster and the catalog ----------------------------------------------------------------


@app.command()
def nodes(json_output: Json = False) -> None:
    """The nodes: status, what they hold and what is free, and your jobs there (an admin's: all)."""
    answer = _api().get("/nodes")["nodes"]
    if json_output:
        render.print_json(answer)
        return

    def use(n: dict[str, Any], resource: str) -> str:
        return f"{n['used'].get(resource, 0)} / {n['capacity'].get(resource, 0)}"

    render.table(
        [
            "NODE",
            "STATUS",
            "ADDRESS",
            "CPU",
            "GPUS",
            "MEMORY GB",
            "JOBS",
            "LIMITS",
            "LAST HEARTBEAT",
        ],
        [
            [
                n["name"],
                n["status"],
                n["address"],
                use(n, "cpu"),
                use(n, "gpus"),
                use(n, "memory_gb"),
                ", ".join(str(j) for j in n["jobs"]) or "—",
                # How the node holds jobs to their packages (a cgroup per instance), or not.
                n.get("limits", "unknown") if n.get("limits_enforced") else "not enforced",
                render.ago(n["last_heartbeat"]),
            ]
            for n in answer
        ],
    )


@app.command()
def queue(json_output: Json = False) -> None:
    """The jobs waiting for room, in the order the scheduler takes them, and why yours wait
    (another user's job shows only its place, size and submission time)."""
    entries = _api().get("/queue")["jobs"]
    if json_output:
        render.print_json(entries)
        return
    if not entries:
        render.out.print("No job is waiting.")
        return
    render.table(
        [
            "PLACE",
            "ID",
            "NAME",
            "OWNER",
            "PRIORITY",
            "CPU/GPU/GB",
            "SUBMITTED",
            "STARTS",
            "WHY IT WAITS",
        ],
        [
            [
                str(e["position"]),
                "—" if e["job_id"] is None else str(e["job_id"]),
                e["name"] or "another user's job",
                e["owner"] or "—",
                e["priority"],
                f"{e['cpu']} / {e['gpus']} / {e['memory_gb']}",
                render.local_time(e["submitted"]),
                render.local_time(e["estimated_start"]) if e.get("estimated_start") else "—",
                e["reason"] or "—",
            ]
            for e in entries
        ],
    )


@app.command()
def quota(json_output: Json = False) -> None:
    """What you may still start: every quota that binds you, used against its limit."""
    summary = _api().get("/me")["quota"]
    if json_output:
        render.print_json(summary)
        return
    if summary is None:
        render.out.print("No quota applies to you: ask an admin to set one before you submit.")
        return
    terms = ("cpu", "gpus", "memory_gb", "jobs")
    rows = [
        [
            f"{s['kind']} {s['name']}" if s["kind"] == "group" else s["kind"],
            *(f"{s['used'][t]} / {s['limit'][t]}" for t in terms),
        ]
        for s in summary["scopes"]
    ]
    rows.append(["left", *(str(summary["left"][t]) for t in terms)])
    render.table(["QUOTA", "CPU", "GPUS", "MEMORY GB", "JOBS"], rows)


@app.command()
def images(json_output: Json = False) -> None:
    """The framework images jobs can use, with their roles."""
    answer = _api().get("/catalog")["images"]
    if json_output:
        render.print_json(answer)
        return
    render.table(
        ["IMAGE", "FRAMEWORK", "ROLES", "RUNS IN", "YOURS MAY START WITH", "DESCRIPTION"],
        [
            [
                i["name"],
                i["framework"],
                ", ".join(i["roles"]),
                i.get("container_image") or "the node's Python",
                ", ".join(i.get("user_image_prefixes") or []) or "—",
                i["description"],
            ]
            for i in answer
        ],
    )


@app.command()
def pools(json_output: Json = False) -> None:
    """The Slurm pools jobs can run in besides Trainyard's own nodes (--pool)."""
    answer = _api().get("/catalog").get("pools", [])
    if json_output:
        render.print_json(answer)
        return
    if not answer:
        print("No Slurm pools: every job runs on Trainyard's own nodes.")
        return
    render.table(
        ["POOL", "PARTITION", "IMAGES", "PACKAGES", "A JOB MAY CHOOSE (--slurm)"],
        [
            [
                p["name"],
                p["partition"],
                ", ".join(p["images"]),
                ", ".join(p["packages"]),
                _slurm_choices_words(p.get("choices") or {}),
            ]
            for p in answer
        ],
    )


def _slurm_choices_words(choices: dict[str, Any]) -> str:
    """ "qos=normal|high; exclusive" or "-" for a pool that lets a job choose nothing."""
    words = [
        f"{name}={'|'.join(values)}"
        for name, values in choices.items()
        if isinstance(values, list) and values
    ]
    if choices.get("exclusive"):
        words.append("exclusive")
    return "; ".join(words) or "-"


@app.command()
def packages(json_output: Json = False) -> None:
    """The resource packages an instance can take."""
    catalog = _api().get("/catalog")
    answer = catalog["packages"]
    if json_output:
        render.print_json(answer)
        return
    render.table(
        ["PACKAGE", "CPU", "GPUS", "MEMORY GB", "PROCESSES", "PRICE / HOUR", "ROLES"],
        [
            [
                p["name"],
                p["cpu"],
                f"{p['gpus']} {p['gpu_model']}".strip() if p["gpus"] else "0",
                p["memory_gb"],
                p["processes"],
                render.money(p["price_per_hour"], render.currency_prefix(catalog)),
                ", ".join(p["roles"]) or "any",
            ]
            for p in answer
        ],
    )


@app.command()
def priorities(json_output: Json = False) -> None:
    """The priority classes a job may name (--priority), highest first."""
    answer = _api().get("/catalog")["priority_classes"]
    if json_output:
        render.print_json(answer)
        return
    render.table(
        ["CLASS", "VALUE", "PREEMPTS", "PREEMPTIBLE", "DESCRIPTION"],
        [
            [
                c["name"] + (" (default)" if c["default"] else ""),
                c["value"],
                "yes" if c["may_preempt"] else "no",
                "yes" if c["may_be_preempted"] else "no",
                c["description"],
            ]
            for c in answer
        ],
    )


def script_args_as_options(argv: list[str]) -> list[str]:
    """`submit ... -- --epochs 3` → `submit ... --arg=--epochs --arg=3`: what follows `--`
    belongs to the script, and click would otherwise give its first word to JOB_FILE."""
    command = next((c for c in ("submit", "rerun") if c in argv), None)
    if command is None or "--" not in argv[argv.index(command) :]:
        return argv
    cut = argv.index("--", argv.index(command))
    return argv[:cut] + [f"--arg={word}" for word in argv[cut + 1 :]]


def main() -> None:
    """The console script: a CliError becomes its message on stderr and its exit code; click
    turns usage errors into exit code 2 itself."""
    try:
        app(args=script_args_as_options(sys.argv[1:]), prog_name="trainyard")
    except CliError as exc:
        render.err.print(Text(f"trainyard: {exc.message}", style="red"))
        for line in exc.details:
            render.err.print(Text(f"  {line}"))
        sys.exit(exc.exit_code)


if __name__ == "__main__":
    main()
