"""The shapes of API v1, one pydantic schema per shape: request bodies are checked against them
(strict JSON types: a package is a string, instances an int and not a bool) and the OpenAPI
document is generated from them. What a value *means* (a known package, role rules, the quota)
is checked by the services layer, not here.

Answer schemas declare every key the API sends and refuse any other: a presenter that adds a
key must declare it here, so the OpenAPI document says all that clients receive (a test calls
the real views and checks their answers against the document).
"""

from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt, StrictStr

from jobs.models import MAX_RESTARTS_LIMIT, RESTART_BACKOFF_MAX_SECONDS, Job, Replica

# --- requests -----------------------------------------------------------------------------------


# A hundred years: a larger number of days is a typo, not a policy.
MAX_RETENTION_DAYS = 36500


class _In(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ProgramIn(_In):
    script: StrictStr = Field(
        description="A built-in example's name, a path under the code root, or (with "
        "`snapshot`) a path inside that code snapshot."
    )
    args: list[StrictStr] = Field(default_factory=list)
    snapshot: StrictStr | None = Field(
        default=None,
        description="The SHA-256 of a code snapshot you uploaded (POST /api/v1/snapshots): the "
        "job runs exactly those files, whatever is uploaded later.",
    )


class InstanceRangeIn(_In):
    min: StrictInt = Field(description="The fewest instances it runs with.")
    max: StrictInt = Field(description="The most instances it runs with.")


class RoleIn(BaseModel):
    # Unknown keys inside a role were always ignored; they still are.
    package: StrictStr = Field(description="A package's name from the catalog.")
    instances: StrictInt | InstanceRangeIn = Field(
        description='A number, or {"min": N, "max": M} for an elastic role (the workers): the '
        "job starts once the minimum fits, grows as room frees and shrinks instead of "
        "stopping when a node is lost (docs/elastic.md)."
    )


class RestartIn(_In):
    policy: StrictStr | None = Field(default=None, description='"never" or "on-failure".')
    max_restarts: StrictInt | None = Field(default=None, ge=0, le=MAX_RESTARTS_LIMIT)
    backoff_seconds: StrictInt | None = Field(default=None, ge=0, le=RESTART_BACKOFF_MAX_SECONDS)
    exclude_failed_node: StrictBool | None = None
    args_on_resume: list[StrictStr] | None = Field(
        default=None,
        description="Arguments every attempt after the first runs with: an option here takes "
        'the place of the same option in program.args, e.g. ["--init_from=resume"].',
    )


class SlurmOptionsIn(_In):
    """A job's own Slurm options, within what its pool allows (the catalog's pools list
    it: `choices`); each absent or "" keeps the pool's."""

    partition: StrictStr | None = Field(default=None, description="One of the pool's partitions.")
    account: StrictStr | None = Field(default=None, description="sbatch --account.")
    qos: StrictStr | None = Field(default=None, description="sbatch --qos.")
    constraint: StrictStr | None = Field(default=None, description="sbatch --constraint.")
    reservation: StrictStr | None = Field(default=None, description="sbatch --reservation.")
    exclusive: StrictBool | None = Field(
        default=None, description="Whole nodes (sbatch --exclusive), where the pool allows it."
    )


class LogLimitsIn(_In):
    lines_per_second: StrictInt | None = Field(
        default=None, ge=1, description="Per instance; at most the image's."
    )
    max_mb: StrictInt | None = Field(
        default=None, ge=1, description="Megabytes of log in all; at most the image's."
    )
    metric_points_per_second: StrictInt | None = Field(
        default=None, ge=1, description="Per instance; at most the image's."
    )


class JobIn(_In):
    """The body of POST /api/v1/jobs."""

    name: StrictStr
    image: StrictStr = Field(description="A framework image's name from the catalog.")
    container_image: StrictStr | None = Field(
        default=None,
        description="An OCI image of your own to run its trainers in, instead of the image's "
        "(the image's framework still decides how they launch): allowed where the catalog's "
        "`user_image_prefixes` of that image has a prefix of it. Absent: the image's own.",
    )
    program: ProgramIn
    roles: dict[str, RoleIn] = Field(description='{ROLE: {"package", "instances"}}')
    kvstore: StrictStr | None = None
    # Checked by their own parsers (workers.metricparse, jobs.healthrules), whose messages
    # say more than a type error would.
    metrics: Any = None
    restart: RestartIn | None = None
    health_rules: Any = None
    log_limits: LogLimitsIn | None = Field(
        default=None,
        description="Lower log limits than the image's (lines over them are dropped and "
        "counted); absent: the image's.",
    )
    # Checked by its own parser (jobs.time_limit_text), whose message names both forms: a
    # union's type errors would come back once per member.
    time_limit: Any = Field(
        default=None,
        json_schema_extra={"anyOf": [{"type": "integer"}, {"type": "string"}, {"type": "null"}]},
        description="How long each attempt may hold its nodes, counted from its placement: "
        'seconds (7200) or text with units ("2h", "90m", "1h30m", "45s", "1d"). Then the job '
        'gets SIGTERM and fails with "time limit of 2 h reached". Absent or null: your '
        "groups' default, else the console's (often none). Answers give seconds.",
    )
    priority: StrictStr | None = Field(
        default=None,
        description='A priority class\'s name from the catalog ("low", "normal", "high"); '
        "absent: the default class. Your quota may cap the highest you may use.",
    )
    pool: StrictStr | None = Field(
        default=None,
        description="Where it runs: a Slurm pool's name from the catalog (GET /api/v1/catalog "
        'lists them), or absent / "" for Trainyard\'s own nodes. The image and every package '
        "must be offered in that pool.",
    )
    slurm: SlurmOptionsIn | None = Field(
        default=None,
        description="Its own Slurm options (partition, account, qos, constraint, reservation, "
        "exclusive), each one the pool allows; only with `pool`.",
    )
    one_instance_per_node: StrictBool = Field(
        default=False,
        description="No two of its instances on one node (Slurm's --ntasks-per-node=1): each "
        "instance gets a node of its own, so multi-node behaviour can be tried with small "
        "packages. A job with more instances than there are nodes that could hold one is "
        "refused.",
    )
    project: StrictStr = Field(
        default="",
        description="A project to file the run under: letters, digits and _ . : / = - (at "
        "most 100); the job list groups and filters by it.",
    )
    tags: list[StrictStr] = Field(
        default_factory=list,
        description="Labels of the run, each letters, digits and _ . : / = - (at most 40, 20 "
        "tags); the job list filters by them (?tag=).",
    )
    note: StrictStr = Field(
        default="", description="What the run is for: plain text, at most 2,000 characters."
    )
    data: list[StrictStr] | StrictStr | None = Field(
        default=None,
        description="Folders of the nodes' file system the job reads, e.g. "
        '["/shared/datasets/vision"]: bound read-only into its sandbox where they are, if your '
        "Unix identity may read them (checked at submission where the console sees them, and "
        "on the node, as you, before the job starts). Needs a Unix identity of yours.",
    )
    results: StrictStr | None = Field(
        default=None,
        description="A folder of the nodes' file system the job writes its results to (your "
        "identity must be allowed to write it); what it writes there is yours, uid and gid.",
    )
    env: dict[StrictStr, StrictStr] | None = Field(
        default=None,
        description="Environment variables for every process of the job, {NAME: value}. Names "
        "the platform sets (MASTER_ADDR, RANK, TRAINYARD_*, TORCHELASTIC_*, DMLC_*, ...) are "
        "refused; values of names with TOKEN, SECRET, PASSWORD or KEY in them are shown masked "
        "to anyone but you.",
    )


class LabelsIn(_In):
    """The body of PATCH /api/v1/jobs/ID/labels: what to change of how the job is filed."""

    add: list[StrictStr] = Field(default_factory=list, description="Tags to add.")
    remove: list[StrictStr] = Field(
        default_factory=list, description="Tags to take off (one it does not have is no error)."
    )
    project: StrictStr | None = Field(
        default=None, description='Its project ("": none); absent or null: as it is.'
    )
    note: StrictStr | None = Field(
        default=None, description='Its note, plain text ("": none); absent or null: as it is.'
    )


class BaselineIn(BaseModel):
    baseline: StrictInt | None = Field(default=None, description="A job id, or null for none.")


class RetentionIn(_In):
    keep: StrictBool = Field(
        default=False, description="Keep the job's log and metrics however old it is."
    )
    days: StrictInt | None = Field(
        default=None,
        ge=0,
        le=MAX_RETENTION_DAYS,
        description="Days its log and metrics are kept after it ends; null: the console's "
        "default; 0: forever.",
    )


class DrainIn(_In):
    evict: StrictBool = False
    grace_seconds: StrictInt | StrictFloat = Field(default=30.0, ge=0, le=3600)


# --- answers ------------------------------------------------------------------------------------


class _Out(BaseModel):
    model_config = ConfigDict(extra="forbid")


# What each state means at a glance, the way the pages' badges colour it: clients (the CLI)
# colour by this and stop waiting at the states the document lists as ended, instead of
# keeping their own copy of the states.
STATE_TONES = {
    "pending": "waiting",
    "queued": "waiting",
    "assigned": "working",
    "running": "working",
    "restarting": "retrying",
    "succeeded": "good",
    "failed": "bad",
    "cancelled": "muted",
    "stopped": "muted",
}


def _states_field(states: Iterable[str], ended: Iterable[str]) -> Any:
    """A state: one of `states` (an enum in the document), with `x-ended` naming those after
    which nothing changes and `x-tones` what each means at a glance."""
    names = [str(s) for s in states]
    extra: dict[str, Any] = {
        "enum": names,
        "x-ended": [str(s) for s in ended],
        "x-tones": {name: STATE_TONES[name] for name in names},
    }
    return Field(json_schema_extra=extra)


class QuotaExcessOut(_Out):
    """How far a job goes over one resource of the tightest quota that binds it."""

    requested: int
    left: int
    limit: int
    over_by: int
    scope: str
    formula: str


class FitsWithOut(_Out):
    role: str
    instances: int = Field(description="The number of this role's instances that would fit.")


class ErrorsOut(_Out):
    """Every refusal: {"errors": {field: [message, ...]}}, plus details for some (quota)."""

    errors: dict[str, list[str]]
    quota: dict[str, QuotaExcessOut] | None = Field(
        default=None,
        description="A job refused for its quota: by resource (cpu, gpus, memory_gb, jobs), "
        "how far it goes over.",
    )
    fits_with: FitsWithOut | None = Field(
        default=None,
        description="A job refused for its quota or for the nodes' room: the count of workers "
        "that neither refuses.",
    )


class ProgramOut(_Out):
    script: str
    args: list[str]
    snapshot: str | None = Field(
        default=None,
        description="The code snapshot it runs; absent for a built-in example or the code root.",
        exclude_if=lambda value: value is None,
    )


class InstanceRangeOut(_Out):
    min: int
    max: int


class RoleOut(_Out):
    package: str
    instances: int | InstanceRangeOut = Field(
        description='A number, or an elastic role\'s {"min": N, "max": M}.'
    )


class TotalsOut(_Out):
    cpu: int
    gpus: int
    memory_gb: int
    price_per_hour: str


class RestartDefaultsOut(_Out):
    """An image's restart defaults, which a job may override."""

    policy: str = Field(description='"never" or "on-failure".')
    max_restarts: int
    backoff_seconds: int


class RestartOut(RestartDefaultsOut):
    exclude_failed_node: bool = False
    args_on_resume: list[str] = Field(
        default_factory=list, description="What every attempt after the first runs with."
    )


def _unless_none(value: object) -> bool:
    return value is None


class LogLimitsOut(_Out):
    lines_per_second: int = Field(description="Per instance.")
    max_mb: int = Field(description="Megabytes of log in all, shared by the instances.")
    metric_points_per_second: int = Field(description="Per instance.")


class RetentionOut(_Out):
    keep: bool
    days: int = Field(description="Days kept after it ends (its own, or the default); 0: forever.")
    own_days: bool = Field(description="Whether `days` is the job's own, not the default.")
    expires: str | None = Field(
        description="When its log and metrics go; null while it runs, for a kept job, or once gone."
    )
    pruned: str | None = Field(description="When retention removed its log and metrics.")


class LogDroppedOut(_Out):
    lines: int
    metric_points: int


def _param(description: str) -> Any:
    """A rule parameter that only some kinds take: left out of the answer when absent, as it
    is from the stored rule, never sent as null."""
    return Field(default=None, description=description, exclude_if=_unless_none)


class MetricDefinitionOut(_Out):
    """A regex metric definition: the first group of `regex` on a log line is `name`'s value."""

    name: str
    regex: str


class HealthRuleOut(_Out):
    """A health rule (jobs.healthrules): `kind` and `action`, and the parameters its kind
    takes. Numbers stay as written (30, not 30.0)."""

    kind: str = Field(
        description='"non-finite", "no-progress", "log-pattern", "throughput-drop" or "gpu-idle".'
    )
    action: str = Field(description='"warn", "stop", "restart" or "restart-exclude-node".')
    name: str | None = _param("Only when not the kind's default name.")
    metric: str | None = _param('A metric name; for non-finite, "*" is any metric.')
    factor: int | float | None = _param("no-progress: no new step for factor × median step time.")
    minutes: int | float | None = _param("no-progress: no new step; gpu-idle: below `below`.")
    min_seconds: int | float | None = _param("no-progress: never less than this.")
    pattern: str | None = _param("log-pattern: a regular expression a line matches.")
    stream: str | None = _param('log-pattern: "stdout", "stderr" or "any".')
    fraction: int | float | None = _param("throughput-drop: below fraction × the recent mean.")
    below: int | float | None = _param("gpu-idle: the metric stayed below this.")


class ReplicaOut(_Out):
    role: str
    index: int
    tag: str
    node: str | None
    state: str = _states_field(Replica.State.values, Replica.FINAL_STATES)
    exit_code: int | None
    signal: str | None = Field(
        default=None,
        description='The signal that killed it by name ("SIGTERM"); null when it exited.',
    )
    reason: str


class SlurmRecordOut(_Out):
    state: str = Field(description="Slurm's final state: COMPLETED, FAILED, NODE_FAIL, …")
    exit_code: str = Field(description='Slurm\'s "status:signal", e.g. "0:0" or "3:0".')
    start: str | None = Field(description="When Slurm started it (UTC, Slurm's clock).")
    end: str | None = Field(description="When it ended (UTC, Slurm's clock).")
    max_rss_mb: float | None = Field(
        description="The peak resident memory of its steps' largest task, in MB."
    )


class AttemptOut(_Out):
    number: int
    started: str | None
    finished: str | None
    nodes: list[str] = Field(description="Where its replicas ran, once all had started.")
    args: list[str] = Field(
        default_factory=list,
        description="The program's arguments in this attempt: later attempts have the job's "
        "restart.args_on_resume in place.",
    )
    reason: str
    counted: bool
    instances: int | None = Field(
        default=None, description="The charged instances it was placed with; null: not placed."
    )
    resize: str = Field(
        default="",
        description="An elastic job's attempt: why its size differs from the one before, e.g. "
        '"grew to 4: room freed on node-1"; "" when it does not.',
    )
    slurm: SlurmRecordOut | None = Field(
        default=None,
        description="A Slurm pool's ended attempt, where the cluster keeps accounting: what "
        "sacct recorded; then started and finished are Slurm's too.",
    )
    slurm_job_id: str = Field(
        default="", description="Its Slurm job's id, once submitted; \"\" on Trainyard's nodes."
    )


class HealthEventOut(_Out):
    at: str
    attempt: int
    rule: str
    action: str
    instance: str
    node: str
    value: int | float | str | None = Field(
        description='What was measured: a number, or "nan", "inf" or "-inf".'
    )
    message: str
    outcome: str


class InstancesOut(_Out):
    total: int = Field(description="Every process the job runs, the platform's own included.")
    trainers: int = Field(description="The instances asked for, over the roles: what is charged.")
    platform: list[str] = Field(
        description='Roles the platform adds, one instance each (a parameter-server "scheduler").'
    )
    text: str = Field(description='As the pages and the CLI say it: "5 (4 trainers + scheduler)".')


class InstanceUsageOut(_Out):
    instance: str = Field(description='As logs tag it: "master", "worker-1".')
    node: str
    package: str
    cores_asked: int = Field(description="The package's cores.")
    cores_used: float = Field(
        description="CPU-seconds over its running time: cores busy at once, on average."
    )
    cpu_seconds: float = Field(description="From its cgroup's counter (cpuacct.usage, cpu.stat).")
    seconds: float = Field(description="How long it ran.")
    cpu_efficiency: float = Field(description="cores_used over cores_asked (0.23: 23 %).")
    memory_asked_gb: float
    memory_peak_gb: float = Field(description="Its cgroup's peak (page cache included).")
    memory_efficiency: float


class UsageOut(_Out):
    """Use against the request, as Slurm's seff shows it (docs/security.md, "Limits")."""

    summary: str = Field(
        description='"CPU efficiency 23 %: asked 8 cores, used 1.9 on average; memory peak 3.1 '
        'of 16 GB"'
    )
    cores_asked: int
    cores_used: float
    cpu_seconds: float
    cpu_efficiency: float
    memory_asked_gb: float
    memory_peak_gb: float = Field(description="The instances' peaks, summed.")
    memory_efficiency: float
    instances: list[InstanceUsageOut]


class MetricSummaryOut(_Out):
    final: float = Field(description="The mean of the reports at its last step.")
    best: float = Field(description="The lowest for a loss or an error, else the highest.")
    minimum: float
    maximum: float
    points: int


class RunAsOut(_Out):
    uid: int
    gid: int
    groups: list[int] = Field(description="Supplementary groups, the primary one first.")


class JobOut(_Out):
    id: int
    name: str
    project: str = Field(description='The project it is filed under; "": none.')
    tags: list[str]
    note: str = Field(description="Its note, plain text.")
    config: dict[str, str | int | float | bool] = Field(
        description='Its arguments and variables as key/values: {"lr": 0.1, "$WARMUP": 500} '
        "(options without a value are true; secret-looking variables are left out)."
    )
    metric_summary: dict[str, MetricSummaryOut] = Field(
        description="Each metric's final and best value so far, by name."
    )
    owner: str
    image: str
    container_image: str = Field(
        description='The OCI image its trainers run in; "": the host\'s interpreter.'
    )
    pool: str = Field(description='The Slurm pool it runs in; "": Trainyard\'s own nodes.')
    run_as: RunAsOut | None = Field(
        description="The owner's own Unix identity its trainers run as, as resolved at "
        "submission; null: none was known, and nodes give them a uid of Trainyard's own."
    )
    data: list[str] = Field(description="Folders by path it reads (read-only).")
    results: str = Field(description='The folder by path it writes its results to; "": none.')
    slurm: dict[str, str | bool] = Field(
        description="The Slurm options it chose (partition, account, qos, …); {}: its pool's."
    )
    program: ProgramOut
    roles: dict[str, RoleOut]
    instances: InstancesOut
    kvstore: str | None
    totals: TotalsOut
    created: str
    log_complete: bool
    log_archived: bool
    log_limits: LogLimitsOut
    retention: RetentionOut
    log_dropped: LogDroppedOut = Field(
        description="Lines and metric points dropped so far for going over the job's log "
        "limits (each drop also has a [trainyard] line in the log); archived a moment after "
        "they happen."
    )
    baseline: int | None
    metrics: list[MetricDefinitionOut]
    restart: RestartOut
    one_instance_per_node: bool = Field(description="No two of its instances share a node.")
    health_rules: list[HealthRuleOut]
    time_limit: int | None = Field(
        description="Seconds each attempt may hold its nodes, from its placement; null: none."
    )
    time_limit_ends: str | None = Field(
        description="When the current attempt reaches its time limit and is stopped; null "
        "while it is not placed, or without a limit."
    )
    env: dict[str, str] = Field(
        default_factory=dict, description="The job's own variables (secret-looking ones masked)."
    )
    priority: str = Field(description="Its priority class's name.")
    priority_value: int = Field(
        description="The class's value when it was admitted: the queue's order, highest first."
    )
    preempted_by: list[int] = Field(
        description="The jobs that preempted it, in order (each attempt they ended says so)."
    )
    state: str = _states_field(Job.State.values, Job.TERMINAL_STATES)
    state_order: list[int] = Field(
        description="[ended (0 or 1), attempt, step in the attempt]: larger (compared as a "
        "list) for every later state, so a client that has seen a newer one drops an older "
        "answer that arrives after it."
    )
    reason: str
    queue_position: int | None
    started: str | None
    finished: str | None
    replicas: list[ReplicaOut]
    attempt: int
    restarts_used: int
    max_restarts: int
    resizes: int = Field(
        default=0, description="An elastic job's changes of size so far (not restarts)."
    )
    restart_at: str | None
    borrowed: bool = Field(
        description="Its current attempt was placed beyond its group's nominal share, on "
        "capacity other groups left unused: it is the first given back when they need it."
    )
    attempts: list[AttemptOut]
    health_events: list[HealthEventOut]
    usage: UsageOut | None = Field(
        description="What the current attempt's ended instances used of what their packages "
        "held, from their cgroups; null until one ends, or where nodes enforce no limits."
    )


class LogLimitsRequestOut(_Out):
    lines_per_second: int | None = _param("Per instance, when lower than the image's.")
    max_mb: int | None = _param("Megabytes of log in all, when lower than the image's.")
    metric_points_per_second: int | None = _param("Per instance, when lower than the image's.")


class JobRequestOut(_Out):
    """The body of POST /api/v1/jobs that submits the job again (a job file's fields):
    `trainyard rerun` and `trainyard show --job-file` read it. Variables whose values are
    masked to you are left out."""

    name: str
    image: str
    container_image: str | None = _param("The image of the owner's own it ran in, if any.")
    program: ProgramOut
    roles: dict[str, RoleOut]
    kvstore: str | None = Field(default=None, exclude_if=_unless_none)
    priority: str
    restart: RestartOut
    health_rules: list[HealthRuleOut]
    metrics: list[MetricDefinitionOut]
    log_limits: LogLimitsRequestOut | None = Field(default=None, exclude_if=_unless_none)
    time_limit: int | None = _param("Seconds, when the job has a time limit.")
    env: dict[str, str] | None = Field(default=None, exclude_if=_unless_none)
    project: str | None = _param("Its project, when it has one.")
    tags: list[str] | None = _param("Its tags, when it has some.")
    data: list[str] | None = _param("The folders by path it reads, when it names some.")
    results: str | None = _param("Its results folder, when it names one.")


class JobListOut(_Out):
    jobs: list[JobOut]
    count: int = Field(
        description="Jobs in all, over every page, counted up to 10,000 (see count_capped)."
    )
    count_capped: bool = Field(
        description="Whether more jobs match than `count` says: counting stops at 10,000."
    )
    limit: int
    offset: int
    next: str | None = Field(
        description="The cursor of the next page (pass it as `cursor`); null on the last."
    )
    previous: str | None = Field(
        description="The cursor of the page before this one; null on the first."
    )


class ImageOut(_Out):
    name: str
    framework: str
    description: str
    roles: list[str]
    kvstore_modes: list[str]
    restart: RestartDefaultsOut
    health_rules: list[HealthRuleOut]
    container_image: str = Field(
        description='The OCI image its jobs run in; "": the host\'s interpreter.'
    )
    user_image_prefixes: list[str] = Field(
        description="Prefixes of images of your own a job on it may name as `container_image`; "
        "[]: none."
    )
    default_env: dict[str, str] = Field(
        description="Variables every trainer of a job on this image gets; a job's own "
        "variable of the same name wins. Taken when the job is submitted (a rerun takes the "
        "image's defaults of its own time)."
    )


class PackageOut(_Out):
    name: str
    cpu: int
    gpus: int
    gpu_model: str
    memory_gb: int
    price_per_hour: str = Field(description="In the catalog's currency.")
    roles: list[str]
    processes: int = Field(description="PyTorch processes per instance (--nproc-per-node).")
    summary: str


class PriorityClassOut(_Out):
    """A priority class (issue 25): waiting jobs go in order of value, highest first."""

    name: str
    value: int
    may_preempt: bool = Field(description="Its jobs may evict lower-priority running jobs.")
    may_be_preempted: bool = Field(description="Its running jobs may be evicted by higher ones.")
    description: str
    default: bool = Field(description="The class a job gets when it names none.")


class ExampleArgumentOut(_Out):
    flag: str = Field(description='"--epochs"')
    value: str = Field(description='What it takes: "N", "RATE", "MODE".')
    default: str
    help: str


class ExampleOut(_Out):
    name: str
    framework: str
    description: str
    arguments: list[ExampleArgumentOut] = Field(description="Its command-line options.")


class ResourcesOut(_Out):
    cpu: int
    gpus: int
    memory_gb: int
    jobs: int = Field(description="Jobs queued or running at once.")


class QuotaScopeOut(_Out):
    """One quota that binds the user, and what its holders use now."""

    kind: str = Field(description='"user", "default" or "group".')
    name: str
    limit: ResourcesOut
    used: ResourcesOut
    left: ResourcesOut = Field(description="limit - used: below 0 where an admin lowered it.")
    max_priority: str | None = Field(
        description="The highest priority class its holders may use; null: any."
    )


class QuotaOut(_Out):
    left: ResourcesOut = Field(description="The room left: the least over every scope.")
    scopes: list[QuotaScopeOut]


class MeOut(_Out):
    """Who the request's token or session belongs to."""

    username: str
    is_staff: bool = Field(description="Staff see every job and manage nodes.")
    quota: QuotaOut | None


class MoneyOut(_Out):
    """How prices are written, as the pages write them, so that every client says "$0.15"."""

    code: str = Field(description="ISO 4217, as `currency`.")
    symbol: str = Field(description='"$"; the code itself where it has no symbol of its own.')
    prefix: str = Field(
        description='What goes before an amount: "$", or "CHF" and a no-break space.'
    )


class SlurmChoicesOut(_Out):
    """What a job of the pool may choose (a job's `slurm`); empty: only the pool's own."""

    partition: list[str] = Field(description="Its partitions, where it has several.")
    account: list[str]
    qos: list[str]
    constraint: list[str]
    reservation: list[str]
    exclusive: bool = Field(description="Whether a job may ask for whole nodes.")


class PoolOut(_Out):
    """A Slurm pool: partitions of a Slurm cluster jobs can run in (docs/slurm.md)."""

    name: str
    partition: str = Field(description="Its partitions, comma-separated as Slurm writes them.")
    images: list[str] = Field(description="The images it runs.")
    packages: list[str] = Field(description="The packages it offers.")
    choices: SlurmChoicesOut


class CatalogOut(_Out):
    images: list[ImageOut]
    packages: list[PackageOut]
    pools: list[PoolOut] = Field(
        description="Slurm pools besides Trainyard's own nodes (a job's `pool`); often none."
    )
    priority_classes: list[PriorityClassOut] = Field(description="Highest value first.")
    examples: list[ExampleOut]
    currency: str = Field(description="The ISO 4217 code prices are in, e.g. USD.")
    money: MoneyOut
    time_zone: str | None = Field(
        description="The IANA time zone the console shows times in; null: each reader's own."
    )
    code_root: str
    max_instances: int
    quota: QuotaOut | None


class LogLineOut(_Out):
    """One line. `attempt` counts from 0 (the job's first run), as the log's separators do.
    `text` is as the trainer wrote it; `shown`, present when that is not how it shows, is what
    the viewer shows: [text, CSS classes] runs (jobs/logshape.py). A search (`q`) answer says
    in `hits` where the matches are: [start, end) code points of the shown text."""

    cursor: int
    role: str
    index: int
    attempt: int
    node: str
    stream: str
    ts: float
    text: str
    shown: list[tuple[str, str]] | None = None
    hits: list[tuple[int, int]] | None = None


class LogPageOut(_Out):
    """A page of lines; a page read backwards (`before=`) also says whether older lines are
    left (`more_before`)."""

    lines: list[LogLineOut]
    next: int
    complete: bool
    more_before: bool | None = None


class MetricPointOut(_Out):
    """One point. A point has a step or an epoch or neither (only its time); a value that was
    not finite is null, with `nonfinite` saying which ("nan", "inf", "-inf")."""

    name: str
    value: float | None
    step: int | None = None
    epoch: float | None = None
    nonfinite: str | None = None
    ts: float
    cursor: int
    role: str
    index: int
    node: str


class MetricPageOut(_Out):
    points: list[MetricPointOut]
    next: int


class ReplicaLineCountOut(_Out):
    tag: str
    role: str
    index: int
    node: str
    stdout: int
    stderr: int


class LogCountsOut(_Out):
    """Lines so far, archived or not: in all, per node, and per instance and stream."""

    total: int
    by_node: dict[str, int]
    replicas: list[ReplicaLineCountOut]


class ThroughputOut(_Out):
    global_sps: float = Field(description="Samples per second, summed over the processes.")
    per_worker_sps: float
    workers_reporting: int


class ProgressOut(_Out):
    fraction: float = Field(description="1 once done.")
    eta_seconds: float | None = Field(description="None once done or once the job has ended.")
    by: str = Field(description="What the fraction counts: epochs (when declared) or steps.")
    reached: float = Field(description="The furthest epoch (or step) any process reported.")
    total: float = Field(description="The declared total epochs (or steps).")
    done: bool = Field(description="The last epoch (or step) was reported, or the job succeeded.")


class VerdictOut(_Out):
    matches: bool | None = Field(description="None: not enough data to say.")
    axis: str
    final_eval_accuracy: float | None
    baseline_eval_accuracy: float | None
    loss_distance: float | None
    lr_distance: float | None
    reasons: list[str]
    curves_judged: bool = Field(
        description="False where the baseline ran another trainer count: its curves differ "
        "by design, and only the final accuracy is judged (`note` says why)."
    )
    note: str | None
    target_eval_accuracy: float | None = Field(
        description="The baseline's final eval accuracy less the tolerance, where curves are "
        "not judged."
    )
    seconds_to_target: float | None
    baseline_seconds_to_target: float | None


class SpeedupOut(_Out):
    baseline_sps: float
    speedup: float | None
    global_speedup: float | None
    efficiency: float | None
    samples_per_dollar_ratio: float | None


class AgainstBaselineOut(_Out):
    id: int
    name: str
    verdict: VerdictOut
    speedup: SpeedupOut | None
    why_no_speedup: str | None


class ScalingRowOut(_Out):
    job_id: int
    workers: int
    global_sps: float
    speedup: float | None
    global_speedup: float | None
    efficiency: float | None
    samples_per_dollar: float | None


class ScalingOut(_Out):
    rows: list[ScalingRowOut]
    hint: str
    has_single_worker_run: bool


class TrainingReportOut(_Out):
    """The training report: throughput, cost, progress, the comparison with the baseline,
    and scaling over the user's runs of the same program."""

    workers: int
    elapsed_seconds: float
    price_per_hour: float
    cost_so_far: float
    reported: bool = Field(description="Whether the trainer has reported any metric yet.")
    throughput: ThroughputOut | None
    samples_per_dollar: float | None
    gpu: str = Field(description='"none" or "present".')
    low_gpu_utilisation: list[str]
    low_gpu_warning: str = Field(
        description="What the job page says about low_gpu_utilisation; empty when it is empty."
    )
    progress: ProgressOut | None
    baseline: AgainstBaselineOut | None
    scaling: ScalingOut


class NodeOut(_Out):
    name: str
    address: str
    status: str
    capacity: dict[str, int]
    used: dict[str, int] = Field(description="What every job here holds, whoever's it is.")
    free: dict[str, int]
    jobs: list[int] = Field(
        description="Ids of the jobs here that you may see: your own (administrators: all)."
    )
    isolated: bool = Field(
        description="Whether its trainers run sandboxed, each seeing nothing of the host but "
        "its own job (docs/security.md). Where this console runs jobs only on isolated nodes, "
        'a node that is not has the status "not isolated" and gets no work.'
    )
    isolation: str = Field(
        description="How, as its agent says: sandbox (a uid per user), sandbox-shared-uid (the "
        "agent's uid), none, or unknown (an agent older than the sandbox)."
    )
    limits_enforced: bool = Field(
        description="Whether each instance there is held to its package by a cgroup of its own "
        '(memory, cores, processes; docs/security.md, "Limits"). Where this console runs '
        'jobs only on isolated nodes, a node that is not has the status "limits not enforced".'
    )
    limits: str = Field(
        description="How, as its agent says: cgroup-v1, cgroup-v2, none, or unknown (an agent "
        "older than limits)."
    )
    limits_reason: str = Field(
        description="What its agent said of its limits: what they hold, or why there are none."
    )
    status_reason: str = Field(
        description='Why it takes no new work where its status ("disk full", "agent too old") '
        'does not say it all: "node-2: no space left on /var/lib/trainyard-agent"; else empty.'
    )
    protocol: int = Field(
        description="The agent protocol its agent speaks (0: older than versioning); below "
        'what this console needs, the node has the status "agent too old" and gets no work.'
    )
    last_heartbeat: str | None


class SnapshotOut(_Out):
    """A code snapshot you uploaded."""

    sha256: str = Field(description="What a job's program.snapshot names.")
    name: str
    size: int = Field(description="Bytes of the stored archive.")
    unpacked_size: int = Field(description="Bytes of its files.")
    file_count: int
    uploaded: str = Field(description="When you last uploaded these files.")


class SnapshotUploadOut(SnapshotOut):
    new: bool = Field(
        description="False: you had uploaded exactly these files before (and still have them)."
    )


class SnapshotDetailOut(SnapshotOut):
    files: list[str] = Field(description="Its files' paths, sorted.")


class SnapshotListOut(_Out):
    snapshots: list[SnapshotOut]


class NodeListOut(_Out):
    nodes: list[NodeOut]


class QueueEntryOut(_Out):
    position: int = Field(description="1 for the job the scheduler tries first.")
    job_id: int | None = Field(
        description="The job's id; null for another user's job (administrators see all)."
    )
    name: str | None = Field(description="null for another user's job.")
    owner: str | None = Field(description="null for another user's job.")
    priority: str = Field(description="Its priority class: higher classes are taken first.")
    cpu: int
    gpus: int
    memory_gb: int
    submitted: str
    reason: str | None = Field(
        description="Why it waits, as its job page says; null for another user's job."
    )
    preempting: list[int] = Field(
        description="The jobs being stopped to make room for it (it preempted them, or they "
        "give its group back borrowed capacity), those you may see; empty for another user's "
        "job."
    )
    preempting_others: int = Field(
        description="How many more such jobs there are, of other users (never named)."
    )
    estimated_start: str | None = Field(
        description="The start the scheduler reserved for it from the running jobs' time "
        "limits (the head of the queue, EASY backfill); null when none is known, and for "
        "another user's job."
    )


class SlurmQueueEntryOut(_Out):
    pool: str = Field(description="The Slurm pool it waits in.")
    place: int | None = Field(
        description="Its place among the jobs waiting in Slurm's queue of the pool's "
        "partition, in the order Slurm's scheduler takes them (1: next), as the console last "
        "saw it; null while it waits to be submitted."
    )
    slurm_job_id: str = Field(description="Slurm's job id; empty for another user's job.")
    job_id: int | None = Field(description="null for another user's job.")
    name: str | None = Field(description="null for another user's job.")
    owner: str | None = Field(description="null for another user's job.")
    cpu: int
    gpus: int
    memory_gb: int
    submitted: str
    reason: str | None = Field(description="Why it waits, in Slurm's words; null for another "
                               "user's job.")  # fmt: skip


class QueueOut(_Out):
    jobs: list[QueueEntryOut] = Field(
        description="Every job waiting for room, in the order the scheduler takes them."
    )
    slurm: list[SlurmQueueEntryOut] = Field(
        description="The jobs waiting in Slurm pools (Slurm, not the console, places them), by "
        "pool and place in Slurm's queue."
    )


class NodeStateOut(_Out):
    node: str
    status: str


class NodeDrainOut(NodeStateOut):
    evicted_jobs: list[int] = Field(description="The ids of the jobs moved away (evict: true).")


# --- pydantic errors as messages a person understands ------------------------------------------

WHOLE_NUMBER = "Give a whole number from {low} to {high}."
# By field path, roles' and variables' names replaced by "*". A path not listed keeps
# pydantic's message.
MESSAGES: dict[str, str] = {
    "request": "The request body must be a JSON object.",
    "name": "Give the job a name.",
    "image": 'Give the framework image\'s name, e.g. "pytorch:2.13-cpu".',
    "program": 'Give the program as {"script": ..., "args": [...]}.',
    "program.script": "Pick a built-in example or give a script path.",
    "program.args": "Arguments must be a list of strings.",
    "program.snapshot": "Give the code snapshot's SHA-256 as a string.",
    "env": "Give the environment as {NAME: value}, values as strings.",
    "env.*": "Values of environment variables are strings.",
    "roles": 'Give each role a package and instances: {"worker": {...}, ...}.',
    "roles.*": 'Give {"package": NAME, "instances": N}.',
    "roles.*.package": 'Give the package\'s name, e.g. "cpu-1".',
    "roles.*.instances": 'Instances must be a whole number, or {"min": N, "max": M} for '
    "elastic workers.",
    "kvstore": "The kvstore mode is a string: dist_sync, dist_device_sync or dist_async.",
    "priority": 'Give a priority class\'s name as a string, e.g. "high".',
    "restart": 'Give {"policy": "never" | "on-failure", "max_restarts": N}.',
    "restart.policy": 'The policy is "never" or "on-failure".',
    "restart.max_restarts": WHOLE_NUMBER.format(low=0, high=MAX_RESTARTS_LIMIT),
    "restart.backoff_seconds": WHOLE_NUMBER.format(low=0, high=RESTART_BACKOFF_MAX_SECONDS),
    "restart.exclude_failed_node": "Give true or false.",
    "one_instance_per_node": "Give true or false.",
    "log_limits": 'Give {"lines_per_second": N, "max_mb": N, "metric_points_per_second": N}.',
    "log_limits.lines_per_second": "Give a whole number of lines per second, at least 1.",
    "log_limits.max_mb": "Give a whole number of megabytes, at least 1.",
    "log_limits.metric_points_per_second": "Give a whole number of points per second, at least 1.",
    "baseline": 'Send {"baseline": JOB_ID} or {"baseline": null}.',
    "evict": "Give true or false.",
    "keep": "Give true or false.",
    "days": "Give a whole number of days from 0 (forever) to 36500, or null for the default.",
    "grace_seconds": "Give seconds from 0 to 3600.",
}


# How pydantic names the branches of a union in an error's location (RoleIn.instances).
UNION_BRANCHES = frozenset({"int", "InstanceRangeIn"})


def field_errors(errors: Iterable[Mapping[str, Any]], strip: int = 0) -> dict[str, list[str]]:
    """pydantic's error list as {"roles.worker.instances": ["Instances must be a whole
    number."]}: one message per field, list indexes folded into their list's field, and
    unknown keys named on their parent ("request" at the top). `strip` drops leading loc
    items (ninja's "body" and the parameter's name)."""
    by_field: dict[str, list[str]] = {}
    unknown: dict[str, list[str]] = {}
    for error in errors:
        loc = [str(p) for p in error.get("loc", ())[strip:] if not isinstance(p, int)]
        branch = next((i for i, p in enumerate(loc) if p in UNION_BRANCHES), None)
        if branch is not None:
            # A value that is none of a union's types: one message for the field, not one
            # per type it might have been.
            loc, error = loc[:branch], {}
        elif error.get("type") == "extra_forbidden" and loc:
            unknown.setdefault(".".join(loc[:-1]) or "request", []).append(loc[-1])
            continue
        field = ".".join(loc) or "request"
        pattern = ".".join("*" if loc[:i] in (["roles"], ["env"]) else p for i, p in enumerate(loc))
        message = MESSAGES.get(pattern or "request") or f"{error.get('msg', 'Invalid value')}."
        if message not in by_field.setdefault(field, []):
            by_field[field].append(message)
    for field, names in unknown.items():
        by_field.setdefault(field, []).append(f"Unknown field(s): {', '.join(sorted(names))}.")
    return by_field


# --- comparing runs -----------------------------------------------------------------------------


class _Declared(BaseModel):
    """An answer whose every field is declared here: nothing reaches a client unannounced."""

    model_config = ConfigDict(extra="forbid")


class CurveFiguresOut(_Declared):
    final: float | None = Field(description="The last value, averaged over the processes.")
    best: float | None = Field(
        description="The lowest loss or the highest eval accuracy; null for other curves."
    )


class CompareFiguresOut(_Declared):
    """The job page's figures for one job (see GET /api/v1/jobs/ID/metrics/summary)."""

    duration_seconds: float | None = Field(description="Null when it never started.")
    cost: float = Field(description="In the console's currency, so far.")
    price_per_hour: float
    global_sps: float | None = Field(description="Samples/s, summed over the processes.")
    per_worker_sps: float | None
    samples_per_dollar: float | None
    baseline: int | None = Field(description="The job its speedup is measured against.")
    speedup: float | None
    global_speedup: float | None
    efficiency: float | None
    progress: float | None = Field(description="0 to 1, by steps or epochs.")
    curves: dict[str, CurveFiguresOut] = Field(description="By metric name.")


class ComparedJobOut(_Declared):
    id: int
    name: str
    state: str
    started: str | None = Field(description="When it first started (ISO 8601); null: never.")
    page: str = Field(description="The job's page.")
    metrics: str = Field(
        description="Where its metric points are: GET it as /api/v1/jobs/ID/metrics."
    )
    metric_names: list[str]
    figures: CompareFiguresOut


class CompareRowOut(_Declared):
    key: str = Field(description='Stable: "program.args", "role.worker", "env.NAME"...')
    label: str
    group: str = Field(description="Job, Program, Roles, Variables or Policies.")
    values: list[str] = Field(description="One per job, in the jobs' order.")
    differs: bool = Field(
        description="The values are not all equal (masked values compare as shown)."
    )


class CompareOut(_Declared):
    """2 to 8 jobs side by side: their figures, the metric names they share (one chart
    each), and their configuration as rows."""

    jobs: list[ComparedJobOut]
    charts: list[str] = Field(description="Metric names every job has, one chart each.")
    rows: list[CompareRowOut]


# A job's artifacts (jobs/api_artifacts.py).


class ArtifactOut(_Out):
    path: str = Field(
        description="checkpoints/… (its checkpoint folder, TRAINYARD_CHECKPOINT_DIR) or "
        "outputs/… (what it wrote in its working folder); GET …/artifacts/PATH downloads it."
    )
    kind: Literal["checkpoint", "output"]
    size: int = Field(description="Bytes.")
    modified: datetime


class RefusedArtifactOut(_Out):
    path: str
    reason: str = Field(description="Why it is not served: a link, a FIFO, a hard link, …")


class ArtifactListOut(_Out):
    """A job's files, as a node that can reach its folders saw them."""

    node: str = Field(description="The node whose agent listed them.")
    files: list[ArtifactOut]
    refused: list[RefusedArtifactOut] = Field(
        description="Entries of the job's folders that are not served, with the reason."
    )
    truncated: bool = Field(description="The listing stopped at its bounds.")
    notes: list[str] = Field(description="What the user should know: files removed, …")


# Experiments: hyperparameter searches whose trials are jobs (jobs/api_experiments.py).


class ExperimentIn(_In):
    """The body of POST /api/v1/experiments. Each part's meaning is checked by
    jobs.services.experiments.space, whose messages name the field (`space.--lr`,
    `budget.parallel`, `template.roles`)."""

    name: Any = None
    template: Any = Field(default=None, description="A job request, as POST /api/v1/jobs takes.")
    space: Any = Field(
        default=None,
        description='{"--lr": {"type": "float", "low": 0.01, "high": 1, "log": true}, '
        '"--batch-size": {"type": "int", "low": 16, "high": 128}, '
        '"$OPTIMIZER": {"type": "choice", "choices": ["sgd", "adam"]}}: an argument of the '
        "program (--flag) or a variable ($NAME) and its distribution.",
    )
    objective: Any = Field(
        default=None, description='{"metric": "eval_accuracy", "goal": "max", "unit": "epoch"}'
    )
    searcher: Any = Field(default=None, description="random, tpe (the default) or grid.")
    pruner: Any = Field(
        default=None, description="none (the default), median, successive_halving or hyperband."
    )
    pruner_options: Any = Field(
        default=None, description='e.g. {"min_resource": 1, "reduction_factor": 3}'
    )
    budget: Any = Field(
        default=None,
        description='{"trials": 12, "parallel": 3, "core_hours": null, "gpu_hours": null}',
    )
    seed: Any = None


class ObjectiveOut(_Out):
    metric: str
    goal: Literal["max", "min"]
    unit: Literal["epoch", "step"]


class ExperimentBudgetOut(_Out):
    trials: int
    parallel: int
    core_hours: float | None
    gpu_hours: float | None


class ExperimentUsedOut(_Out):
    trials: int = Field(description="Trials asked so far, waiting ones included.")
    running: int = Field(description="Trials waiting or running now.")
    core_hours: float
    gpu_hours: float


class BestTrialOut(_Out):
    trial: int
    job: int | None
    value: float
    params: dict[str, Any]


class TrialOut(_Out):
    number: int
    state: Literal["waiting", "running", "completed", "pruned", "failed"]
    params: dict[str, Any]
    job: int | None
    job_state: str | None
    objective_last: float | None
    objective_best: float | None
    judged_through: int | None = Field(
        description="The last epoch (or step) told to the pruner: a resumed trial is judged "
        "only on what it reports after it."
    )
    reason: str
    created: str | None
    ended: str | None
    core_hours: float
    cost: float
    samples_per_dollar: float | None


class ExperimentSummaryOut(_Out):
    id: int
    name: str
    owner: str
    state: Literal["running", "paused", "stopping", "stopped", "finished", "failed"]
    reason: str
    created: str | None
    ended: str | None
    space: dict[str, Any]
    objective: ObjectiveOut
    searcher: str
    pruner: str
    budget: ExperimentBudgetOut
    used: ExperimentUsedOut
    best: BestTrialOut | None


class ExperimentOut(ExperimentSummaryOut):
    trials: list[TrialOut]


class ExperimentListOut(_Out):
    experiments: list[ExperimentSummaryOut]
