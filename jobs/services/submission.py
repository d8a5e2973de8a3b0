"""Checking a job request and admitting it against the quota.

`check_job_request` validates (no writes); `submit_job` admits and writes. The API and the
browser form both build the same request and go through here, so they can't disagree.
JSON types are checked by the pydantic schema jobs.schemas.JobIn (by ninja for the API, by
parse_job_request for dicts); here are the checks of meaning: known image and packages, role
rules, paths under the code root, the quota and the nodes' capacity.
Errors are collected per field: {"roles.worker.instances": ["..."]}.
"""

import os
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.contrib.auth.models import User
from django.db import transaction
from pydantic import ValidationError as PydanticValidationError

from jobs import container_refs, text, time_limit_text
from jobs.envvars import MAX_ENV_VARS, env_problems
from jobs.healthrules import RuleError, parse_rules, rules_to_json
from jobs.models import (
    DEFAULT_LOG_LINES_PER_SECOND,
    DEFAULT_LOG_MAX_MB,
    DEFAULT_METRIC_POINTS_PER_SECOND,
    PLATFORM_ROLES,
    RESTART_BACKOFF_DEFAULT_SECONDS,
    CodeSnapshot,
    Framework,
    FrameworkImage,
    Job,
    JobAttempt,
    JobRole,
    KVStoreMode,
    Package,
    PriorityClass,
    Replica,
    RestartPolicy,
    SlurmPool,
)
from jobs.runconfig import config_of
from jobs.schemas import (
    InstanceRangeIn,
    JobIn,
    LogLimitsIn,
    ProgramIn,
    RestartIn,
    RoleIn,
    field_errors,
)
from jobs.services import identity as unix_identity
from jobs.services import quota, run_labels, snapshots
from jobs.services.lifecycle import schedule_requests, transitions
from jobs.services.lifecycle.time_limits import default_for
from jobs.services.scheduler import scheduling
from jobs.services.slurm import slurm_batch, slurm_choices, slurm_client, slurm_identity, slurm_pass
from jobs.services.slurm.slurm_choices import SlurmChoices
from jobs.services.totals import RoleRequest, Totals, compute_totals
from workers import contract, folderaccess, unixids
from workers.metricparse import BadMetric, check_definitions
from workers.programs import (
    BUILTIN_EXAMPLES,
    BUILTIN_FRAMEWORKS,
    ProgramError,
    resolve_under_root,
)

MAX_NAME_LENGTH = 200
MAX_ARGS = 256
MAX_ARG_LENGTH = 4096


@dataclass(frozen=True)
class RestartSettings:
    policy: str = RestartPolicy.NEVER
    max_restarts: int = 0
    backoff_seconds: int = RESTART_BACKOFF_DEFAULT_SECONDS
    exclude_failed_node: bool = False
    args_on_resume: tuple[str, ...] = ()

    @classmethod
    def of_image(cls, image: FrameworkImage) -> "RestartSettings":
        return cls(image.restart_policy, image.max_restarts, image.restart_backoff_seconds)


@dataclass(frozen=True)
class LogLimitSettings:
    """A job's log limits (see FrameworkImage): its image's, or lower ones of its own."""

    lines_per_second: int = DEFAULT_LOG_LINES_PER_SECOND
    max_mb: int = DEFAULT_LOG_MAX_MB
    metric_points_per_second: int = DEFAULT_METRIC_POINTS_PER_SECOND

    @classmethod
    def of_image(cls, image: FrameworkImage) -> "LogLimitSettings":
        return cls(image.log_lines_per_second, image.log_max_mb, image.metric_points_per_second)


class ValidationFailed(Exception):
    def __init__(self, errors: dict[str, list[str]], detail: dict[str, Any] | None = None):
        super().__init__(errors)
        self.errors = errors
        self.detail = detail or {}


@dataclass(frozen=True)
class JobRequest:
    name: str
    image: FrameworkImage
    program: dict[str, str]
    args: list[str]
    roles: list[RoleRequest]
    totals: Totals
    kvstore: str = ""
    metric_definitions: list[dict[str, str]] = field(default_factory=list)
    restart: RestartSettings = RestartSettings()
    health_rules: list[dict[str, object]] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    log_limits: LogLimitSettings = LogLimitSettings()
    # Seconds; None: the default of whoever submits it (time_limits.default_for).
    time_limit: int | None = None
    priority: PriorityClass | None = None  # None: the default class
    slurm_pool: SlurmPool | None = None  # None: Trainyard's own agents
    slurm_choices: SlurmChoices = field(default_factory=SlurmChoices)  # within the pool's
    one_instance_per_node: bool = False  # no two of its instances on one node
    filing: run_labels.Filing = field(default_factory=run_labels.Filing)  # project, tags, note
    container_image: str = ""  # the OCI image its trainers run in; "": the host's interpreter
    data_folders: tuple[str, ...] = ()  # folders by path it reads (workers/folderaccess.py)
    results_folder: str = ""  # the folder by path it writes its results to; "": none


class _Errors:
    def __init__(self) -> None:
        self.by_field: dict[str, list[str]] = {}

    def add(self, field: str, message: str) -> None:
        self.by_field.setdefault(field, []).append(message)


def _check_name(raw: str, errors: _Errors) -> str:
    name = raw.strip()
    if not name:
        errors.add("name", "Give the job a name.")
    elif len(name) > MAX_NAME_LENGTH:
        errors.add("name", f"The name is {len(name)} characters; at most {MAX_NAME_LENGTH}.")
    elif problem := text.name_problem(name):
        errors.add("name", problem)
    return name


def _check_program(
    raw: ProgramIn, errors: _Errors, owner: User | None
) -> tuple[dict[str, str], list[str]]:
    script, args = raw.script, raw.args
    program: dict[str, str] = {}
    if raw.snapshot is not None:
        program = _check_snapshot_program(script, raw.snapshot, owner, errors)
    elif not script.strip():
        errors.add("program.script", "Pick a built-in example or give a script path.")
    elif script in BUILTIN_EXAMPLES:
        program = {"example": script}
    else:
        try:
            resolve_under_root(settings.TRAINYARD_CODE_ROOT, script)
            program = {"path": script}
        except ProgramError as exc:
            errors.add("program.script", str(exc))
    _check_args("program.args", args, errors)
    return program, list(args)


def _check_args(field: str, args: list[str], errors: _Errors) -> None:
    if len(args) > MAX_ARGS:
        errors.add(field, f"{len(args)} arguments; at most {MAX_ARGS}.")
    if any(len(a) > MAX_ARG_LENGTH for a in args):
        errors.add(field, f"An argument is longer than {MAX_ARG_LENGTH} characters.")
    if any("\x00" in a for a in args):
        errors.add(field, "Arguments may not contain NUL bytes.")


def _check_snapshot_program(
    script: str, sha256: str, owner: User | None, errors: _Errors
) -> dict[str, str]:
    """A script inside a code snapshot the owner uploaded: {"path", "snapshot"}."""
    upload = snapshots.upload_of(owner, sha256) if owner is not None else None
    if upload is None:
        errors.add(
            "program.snapshot",
            f"No code snapshot {sha256[:64]!r} of yours: upload it first (POST /api/v1/snapshots).",
        )
        return {}
    path = script.strip().removeprefix("./")
    if not path:
        errors.add("program.script", "Give the script's path inside the snapshot.")
    elif path not in upload.snapshot.files:
        shown = ", ".join(p for p in upload.snapshot.files if p.endswith(".py"))[:300]
        errors.add(
            "program.script",
            f"No file {path[:200]!r} in code snapshot {sha256[:12]} (its Python files: "
            f"{shown or 'none'}).",
        )
    else:
        return {"path": path, "snapshot": sha256}
    return {}


def _check_env(raw: dict[str, str] | None, errors: _Errors) -> dict[str, str]:
    env = dict(raw or {})
    for problem in env_problems(env):
        errors.add("env", problem)
    return {} if len(env) > MAX_ENV_VARS else env


# Fewest instances of each role the user asks for, per framework; roles not listed are optional.
MIN_INSTANCES: dict[str, dict[str, int]] = {
    Framework.PYTORCH: {"master": 1, "worker": 0},
    Framework.KVSTORE: {"server": 1, "worker": 1},
}


def _check_roles(
    raw: dict[str, RoleIn], image: FrameworkImage | None, errors: _Errors
) -> list[RoleRequest]:
    if not raw:
        errors.add("roles", 'Give each role a package and instances: {"worker": {...}, ...}.')
        return []
    if image is None:
        return []
    asked_for = [r for r in image.roles if r not in PLATFORM_ROLES]
    platform = [r for r in raw if r in PLATFORM_ROLES]
    if platform:
        errors.add("roles", f"The platform adds the {', '.join(platform)} itself; leave it out.")
    unknown = [r for r in raw if r not in image.roles]
    if unknown:
        errors.add(
            "roles",
            f"{image.name} has no role {', '.join(map(repr, unknown))}; "
            f"its roles are {', '.join(asked_for)}.",
        )
    packages = {p.name: p for p in Package.objects.filter(enabled=True)}
    roles: list[RoleRequest] = []
    limit = settings.TRAINYARD_MAX_INSTANCES
    minimum = MIN_INSTANCES[image.framework]
    for role in asked_for:
        spec = raw.get(role)
        if spec is None:
            if minimum.get(role, 0) > 0:
                errors.add(f"roles.{role}", f"This job needs at least {minimum[role]} {role}.")
            continue
        package = packages.get(spec.package)
        if package is None:
            errors.add(f"roles.{role}.package", f"Unknown package {spec.package!r}.")
        elif not package.allows_role(role):
            errors.add(
                f"roles.{role}.package",
                f"Package {package.name!r} is for {', '.join(package.roles)}, not {role}.",
            )
        low = minimum.get(role, 0)
        fewest: int | None = None
        if isinstance(spec.instances, InstanceRangeIn):
            fewest, instances = spec.instances.min, spec.instances.max
            why = _elastic_refusal(role, fewest, instances, low, limit)
            if why:
                errors.add(f"roles.{role}.instances", why)
                continue
        else:
            instances = spec.instances
        if role == "master" and instances != 1:
            errors.add("roles.master.instances", "A PyTorch job has exactly 1 master.")
        elif instances < low:
            errors.add(f"roles.{role}.instances", f"Instances must be at least {low}.")
        elif instances > limit:
            errors.add(f"roles.{role}.instances", f"At most {limit} instances per role.")
        elif package is not None and package.allows_role(role):
            roles.append(RoleRequest(role, package, instances, fewest))
    return roles


def _elastic_refusal(role: str, fewest: int, most: int, low: int, limit: int) -> str:
    """Why {"min": fewest, "max": most} is no elastic range for `role`; "" when it is."""
    if role != "worker":
        return (
            "Only the workers may be elastic: the other roles hold the job's state, and it "
            "cannot go on without one of them."
        )
    if fewest < max(low, 1):
        return f"The minimum must be at least {max(low, 1)}."
    if most > limit:
        return f"At most {limit} instances per role."
    if most <= fewest:
        return 'The maximum must be above the minimum (a fixed count is a number: "instances": N).'
    return ""


def _check_kvstore(raw: str | None, image: FrameworkImage | None, errors: _Errors) -> str:
    if image is None:
        return ""
    if image.framework != Framework.KVSTORE:
        if raw is not None:
            errors.add("kvstore", f"{image.name} is not a parameter-server image.")
        return ""
    mode = raw if raw is not None else KVStoreMode.DIST_SYNC
    if mode not in KVStoreMode.values:
        errors.add("kvstore", f"The kvstore mode is one of {', '.join(KVStoreMode.values)}.")
        return ""
    return str(mode)


def _check_program_fits_image(
    program: dict[str, str], image: FrameworkImage | None, errors: _Errors
) -> None:
    example = program.get("example")
    if image is None or example is None:
        return
    wanted = BUILTIN_FRAMEWORKS.get(example)
    if wanted is not None and wanted != image.framework:
        errors.add(
            "program.script",
            f"{example} is a {Framework(wanted).label} program; {image.name} runs "
            f"{Framework(image.framework).label} jobs.",
        )


def _check_restart(
    raw: RestartIn | None, image: FrameworkImage | None, errors: _Errors
) -> RestartSettings:
    """The job's restart policy; the image's when the request gives none. Types and ranges
    were checked by the schema."""
    default = RestartSettings.of_image(image) if image else RestartSettings()
    if raw is None:
        return default
    policy = raw.policy if raw.policy is not None else default.policy
    if policy not in RestartPolicy.values:
        errors.add("restart.policy", f"The policy is one of {', '.join(RestartPolicy.values)}.")
        policy = default.policy
    max_restarts = raw.max_restarts
    if max_restarts is None:
        max_restarts = default.max_restarts if policy == default.policy else 3
    if policy == RestartPolicy.NEVER:
        max_restarts = 0
    # Kept whatever the policy: an eviction's resume is a later attempt too.
    args_on_resume = list(raw.args_on_resume or [])
    _check_args("restart.args_on_resume", args_on_resume, errors)
    return RestartSettings(
        str(policy),
        max_restarts,
        raw.backoff_seconds if raw.backoff_seconds is not None else default.backoff_seconds,
        bool(raw.exclude_failed_node),
        tuple(args_on_resume),
    )


_LOG_LIMIT_WORDS = {
    "lines_per_second": "lines per second",
    "max_mb": "MB",
    "metric_points_per_second": "points per second",
}


def _check_log_limits(
    raw: LogLimitsIn | None, image: FrameworkImage | None, errors: _Errors
) -> LogLimitSettings:
    """The image's limits, lowered where the request asks. A limit above the image's is
    refused, not cut down: the user should know that they do not get what they asked for."""
    ceiling = LogLimitSettings.of_image(image) if image else LogLimitSettings()
    if raw is None:
        return ceiling
    chosen = {}
    for name, words in _LOG_LIMIT_WORDS.items():
        most = getattr(ceiling, name)
        asked = getattr(raw, name)
        if asked is not None and asked > most:
            errors.add(
                f"log_limits.{name}",
                f"At most {most:,} {words} on {image.name if image else 'this image'}.",
            )
        chosen[name] = most if asked is None or asked > most else asked
    return LogLimitSettings(**chosen)


def _check_priority(raw: str | None, errors: _Errors) -> PriorityClass | None:
    """The priority class the request names (the default one when it names none)."""
    name = raw if raw is not None else PriorityClass.DEFAULT_NAME
    found = PriorityClass.objects.filter(name=name).first()
    if found is None and raw is not None:
        known = ", ".join(PriorityClass.objects.values_list("name", flat=True))
        errors.add("priority", f"Unknown priority class {raw!r}; the classes are: {known}.")
    return found


def _check_pool(
    raw: str | None, image: FrameworkImage | None, roles: list[RoleRequest], errors: _Errors
) -> SlurmPool | None:
    """The Slurm pool the request names (None: the agents), offering its image and packages."""
    if not raw:
        return None
    pool = SlurmPool.objects.filter(name=raw, enabled=True).first()
    if pool is None:
        known = ", ".join(SlurmPool.objects.filter(enabled=True).values_list("name", flat=True))
        errors.add(
            "pool",
            f"Unknown pool {raw!r}; "
            + (
                f"the Slurm pools are: {known}."
                if known
                else "there are no Slurm pools: leave it empty for Trainyard's own nodes."
            ),
        )
        return None
    if image is not None and not image.slurm_pools.filter(pk=pool.pk).exists():
        errors.add("image", f"{image.name} does not run in the Slurm pool {pool.name!r}.")
    for role in roles:
        if not role.package.slurm_pools.filter(pk=pool.pk).exists():
            errors.add(
                f"roles.{role.role}.package",
                f"The Slurm pool {pool.name!r} does not offer {role.package.name!r}.",
            )
    return pool


def _check_container_image(
    raw: str | None, image: FrameworkImage | None, pool: SlurmPool | None, errors: _Errors
) -> str:
    """The OCI image the job's trainers run in: the image's own, or one the user brings that
    the image's allow-list lets in (never one a runtime could read as an option)."""
    own = image.container_image if image is not None else ""
    if not raw or image is None or raw == own:
        return own
    if problem := container_refs.reference_problem(raw):
        errors.add("container_image", problem)
        return own
    prefixes = image.user_image_prefixes or []
    if not prefixes:
        runs_in = f"its own image {own}" if own else "the host's interpreter"
        errors.add(
            "container_image",
            f"{image.name} runs in {runs_in}: its admin lets no image of yours in.",
        )
    elif not container_refs.allowed_by(raw, prefixes):
        errors.add(
            "container_image",
            f"{raw} is not among the images {image.name} lets in: references starting "
            f"with {', '.join(prefixes)}.",
        )
    elif pool is not None:
        errors.add(
            "container_image",
            f"The Slurm pool {pool.name!r} runs the host's interpreter: an image of your own "
            "runs on Trainyard's own nodes (leave the pool empty).",
        )
    return raw


def _check_slurm_choices(body: JobIn, pool: SlurmPool | None, errors: _Errors) -> SlurmChoices:
    """The job's own Slurm options, each one its pool allows."""
    if body.slurm is None:
        return SlurmChoices()
    raw = body.slurm.model_dump(exclude_none=True)
    if pool is None:
        # (An unknown pool has its own error already.)
        if not body.pool and any(value not in ("", False) for value in raw.values()):
            errors.add("slurm", "Slurm options are for a job of a Slurm pool: choose its pool.")
        return SlurmChoices()
    choices, problems = slurm_choices.check(pool, raw)
    for problem in problems:
        errors.add("slurm", problem)
    return choices


def priority_refusals(scopes: list[quota.Scope], asked: PriorityClass | None) -> list[str]:
    """Why a quota refuses the class asked for: each scope that caps its holders below it."""
    if asked is None:
        return []
    found = []
    for scope in scopes:
        cap = scope.quota.max_priority
        if cap is not None and asked.value > cap.value:
            whose = "Your quota" if scope.kind != "group" else f"Group {scope.name}'s quota"
            found.append(
                f"{whose} allows priority up to {cap.name!r}; {asked.name!r} is higher. "
                "Ask an admin, or pick a lower class."
            )
    return found


def _check_health_rules(
    raw: Any, image: FrameworkImage | None, errors: _Errors
) -> list[dict[str, object]]:
    """The job's health rules, normalised; the image's defaults when the request gives none."""
    if raw is None:
        raw = image.health_rules if image else []
    try:
        return rules_to_json(parse_rules(raw))
    except RuleError as exc:
        errors.add("health_rules", f"Health rules: {exc}")
        return []


def parse_job_request(data: Any) -> JobIn:
    """A request dict as the API's schema (JSON types checked); ValidationFailed if it is not.
    The API has ninja do this; the browser form and internal callers come through here."""
    if isinstance(data, JobIn):
        return data
    try:
        return JobIn.model_validate(data)
    except PydanticValidationError as exc:
        raise ValidationFailed(field_errors(exc.errors())) from None


def check_job_request(data: Any, owner: User | None = None) -> JobRequest:
    """Validate a request (a JobIn, or a dict of one); raise ValidationFailed with every
    problem found. Types are the schema's; here is what they mean. A program in a code
    snapshot needs the `owner` who submits it: only their own uploads are theirs to run."""
    body = parse_job_request(data)
    # Text no process, variable or database can hold is refused first: nothing below then
    # looks it up, stores it, or hands it to an agent that would fail the job with it later.
    bad_text = text.problems_by_field(body.model_dump(mode="python"))
    if bad_text:
        raise ValidationFailed(bad_text)
    errors = _Errors()
    name = _check_name(body.name, errors)
    image = FrameworkImage.objects.filter(name=body.image, enabled=True).first()
    if image is None:
        errors.add("image", f"Unknown framework image {body.image!r}.")
    program, args = _check_program(body.program, errors, owner)
    _check_program_fits_image(program, image, errors)
    roles = _check_roles(body.roles, image, errors)
    kvstore = _check_kvstore(body.kvstore, image, errors)
    definitions: list[dict[str, str]] = []
    try:
        definitions = check_definitions(body.metrics)
    except BadMetric as exc:
        errors.add("metrics", f"Metric definitions: {exc}.")
    restart = _check_restart(body.restart, image, errors)
    health_rules = _check_health_rules(body.health_rules, image, errors)
    env = _check_env(body.env, errors)
    log_limits = _check_log_limits(body.log_limits, image, errors)
    time_limit = None
    try:
        time_limit = time_limit_text.parse(body.time_limit)
    except time_limit_text.BadTimeLimit as exc:
        errors.add("time_limit", str(exc))
    priority = _check_priority(body.priority, errors)
    slurm_pool = _check_pool(body.pool, image, roles, errors)
    if slurm_pool is not None and any(r.min_instances is not None for r in roles):
        errors.add(
            "roles.worker.instances",
            "Elastic workers run on the console's own nodes: a Slurm allocation does not grow "
            "or shrink. Give a number of instances.",
        )
    container_image = _check_container_image(body.container_image, image, slurm_pool, errors)
    choices = _check_slurm_choices(body, slurm_pool, errors)
    data_folders, results_folder = _check_folder_names(body.data, body.results, errors)
    filing, filing_errors = run_labels.check_filing(body.tags, body.project, body.note)
    for field_name, messages in filing_errors.items():
        for message in messages:
            errors.add(field_name, message)
    if errors.by_field:
        raise ValidationFailed(errors.by_field)
    assert image is not None
    return JobRequest(
        name,
        image,
        program,
        args,
        roles,
        compute_totals(roles),
        kvstore,
        definitions,
        restart,
        health_rules,
        env,
        log_limits,
        time_limit,
        priority,
        slurm_pool,
        choices,
        bool(body.one_instance_per_node),
        filing,
        container_image,
        data_folders,
        results_folder,
    )


def _check_folder_names(
    data: list[str] | str | None, results: str | None, errors: _Errors
) -> tuple[tuple[str, ...], str]:
    """The folders a job names by path, as names: absolute, in their plain form, each once.
    Whether its owner may have them is asked in submit_job (folder_refusals)."""
    named = [data] if isinstance(data, str) else list(data or [])
    for path in named:
        if problem := folderaccess.shape_problem(path):
            errors.add("data", f"Data folder: {problem}.")
    if len(set(named)) != len(named):
        errors.add("data", "A data folder is named twice.")
    if results and (problem := folderaccess.shape_problem(results)):
        errors.add("results", f"Results folder: {problem}.")
    if len(named) + bool(results) > folderaccess.MAX_FOLDERS:
        errors.add("data", f"At most {folderaccess.MAX_FOLDERS} folders.")
    return tuple(named), results or ""


def check_job_shape(
    image_name: str, roles: dict[str, RoleIn]
) -> tuple[FrameworkImage, list[RoleRequest]]:
    """The image and roles of a request on their own, checked as `check_job_request` checks
    them: what the New-job form's preview needs before the rest is filled in."""
    errors = _Errors()
    image = FrameworkImage.objects.filter(name=image_name, enabled=True).first()
    if image is None:
        errors.add("image", f"Unknown framework image {image_name!r}.")
    checked = _check_roles(roles, image, errors)
    if errors.by_field:
        raise ValidationFailed(errors.by_field)
    assert image is not None
    return image, checked


def submit_job(user: User, request: JobRequest) -> Job:
    """Admit the request and write the job, or raise ValidationFailed with every reason.

    Admission asks two things: does every quota that binds the user have room, and could the
    nodes ever hold every instance at once (a job that never could would wait forever).

    The check and the write share one transaction that holds the quota rows locked (on SQLite
    the IMMEDIATE transaction holds the whole database), so two racing submissions can never
    both take the last of a quota.
    """
    # What depends on no quota is read before the lock is taken, so that it does not lengthen
    # every submission's turn with it: whether the nodes could ever hold the job, its default
    # time limit, its code snapshot.
    time_limit = (
        request.time_limit
        if request.time_limit is not None
        else default_for(user, request.priority)
    )
    never = _why_never_runs(user, request, time_limit)
    try:
        identity = unix_identity.unix_identity_of(user)
    except unix_identity.NoUnixIdentity as exc:
        raise ValidationFailed({"identity": [f"{exc}."]}) from None
    never.update(folder_refusals(request, identity))
    snapshot = None
    if "snapshot" in request.program:
        sha256 = request.program["snapshot"]
        snapshot = CodeSnapshot.objects.defer("archive").get(sha256=sha256)
    with transaction.atomic():
        try:
            scopes = quota.scopes_for(user, lock=True)
        except quota.NoQuota as exc:
            raise ValidationFailed({"quota": [str(exc)]}) from None
        capped = priority_refusals(scopes, request.priority)
        if capped:
            raise ValidationFailed({"priority": capped})
        over = quota.excesses(scopes, request.totals)
        if over or never:
            raise _admission_failure(request, scopes, over, never)
        job = create_job(user, request, time_limit, snapshot, identity)
        # Placement runs in the console worker: this request holds the write lock only for
        # the quota check and the rows it writes.
        if request.slurm_pool is not None:
            slurm_pass.request_pass()
        else:
            schedule_requests.request_schedule()
    return job


def folder_refusals(request: JobRequest, identity: unix_identity.Resolved | None) -> dict[str, str]:
    """Why the owner may not have the folders the job names, by field; {} when they may.
    Checked here by the permission bits where this host sees the folder (the nodes check
    again, as the owner, before the job starts: the last word is theirs)."""
    wanted = folderaccess.requests(request.data_folders, request.results_folder)
    if not wanted:
        return {}
    if identity is None:
        return {
            "data": "Folders by path are read and written as your own Unix identity, and the "
            "console knows none of yours: sign in through the directory, or an admin sets one "
            "(admin → Unix accounts)."
        }
    if request.slurm_pool is not None and not request.slurm_pool.run_as_owner:
        return {"data": "Folders by path need a pool that runs jobs as their owners."}
    user = unixids.own_user(identity.uid, identity.gid, identity.groups)
    refusals: dict[str, str] = {}
    for path, writable in wanted:
        if not os.path.lexists(path) and folderaccess.may_look_where(path, user):
            continue  # not on this host: the nodes answer
        try:
            folderaccess.check(path, user, writable, as_kernel=False)
        except folderaccess.FolderRefused as exc:
            field_name = "results" if writable else "data"
            refusals.setdefault(field_name, f"{exc}.")
    return refusals


def _why_never_runs(user: User, request: JobRequest, time_limit: int | None) -> dict[str, str]:
    """Why the request could never start where it asks to run, by field; {} when it could."""
    if request.slurm_pool is None:
        return scheduling.why_never_placeable(request.roles, request.one_instance_per_node)
    if request.slurm_pool.run_as_owner:
        try:
            slurm_identity.identity_of(user)
        except slurm_identity.NoIdentity as exc:
            return {"pool": f"{exc}."}
    # Slurm places it: its partition's configuration says whether it ever could.
    target = slurm_batch.target_of(request.slurm_pool)
    try:
        refusal = slurm_batch.why_never_runs(
            request.roles,
            bool(request.kvstore),
            target,
            time_limit,
            request.slurm_choices.partition,
            request.one_instance_per_node,
        )
    except slurm_client.SlurmUnavailable:
        # Slurm away is no reason to refuse: the job waits, saying so, and the Slurm pass
        # checks it again before its sbatch.
        return {}
    return {"roles": refusal} if refusal else {}


def create_job(
    owner: User,
    request: JobRequest,
    time_limit: int | None,
    snapshot: CodeSnapshot | None,
    identity: unix_identity.Resolved | None = None,
) -> Job:
    """Write an admitted job with one replica row per instance, in state queued.

    The caller has checked the quota inside the same transaction. The job keeps the value its
    priority class has now (0 where the console has no default class), and the image's
    default environment as it is now.
    """
    restart = request.restart
    log_limits = request.log_limits
    priority = request.priority
    roles = request.roles
    job = Job.objects.create(
        owner=owner,
        name=request.name,
        image_id=request.image.pk,
        container_image=request.container_image,
        slurm_pool=request.slurm_pool,
        slurm_options=request.slurm_choices.stored(),
        program=request.program,
        snapshot=snapshot,
        args=request.args,
        env=request.env,
        config=config_of(request.args, request.env),
        project=request.filing.project,
        note=request.filing.note,
        image_env=request.image.default_env,
        state=Job.State.PENDING,
        cpu_total=request.totals.cpu,
        gpus_total=request.totals.gpus,
        memory_gb_total=request.totals.memory_gb,
        price_per_hour=request.totals.price_per_hour,
        kvstore=request.kvstore,
        metric_definitions=request.metric_definitions,
        restart_policy=restart.policy,
        max_restarts=restart.max_restarts,
        restart_backoff_seconds=restart.backoff_seconds,
        exclude_failed_node=restart.exclude_failed_node,
        args_on_resume=list(restart.args_on_resume),
        one_instance_per_node=request.one_instance_per_node,
        run_uid=identity.uid if identity is not None else None,
        run_gid=identity.gid if identity is not None else None,
        run_groups=list(identity.groups) if identity is not None else [],
        data_folders=list(request.data_folders),
        results_folder=request.results_folder,
        health_rules=request.health_rules,
        log_lines_per_second=log_limits.lines_per_second,
        log_max_mb=log_limits.max_mb,
        metric_points_per_second=log_limits.metric_points_per_second,
        time_limit=time_limit,
        min_size=sum(r.instances if r.min_instances is None else r.min_instances for r in roles),
        max_size=sum(r.instances for r in roles),
        priority_class=priority,
        priority=priority.value if priority is not None else 0,
    )
    JobAttempt.objects.create(job=job, number=0)
    run_labels.file_new_job(job, request.filing)
    JobRole.objects.bulk_create(
        JobRole(
            job=job,
            role=role.role,
            package=role.package,
            instances=role.instances,
            min_instances=role.min_instances,
        )
        for role in request.roles
    )
    replicas = []
    if request.kvstore:
        # The platform's scheduler: one, uncharged, placed beside server-0.
        replicas.append(Replica(job=job, role="scheduler", index=0, package=None))
    for role in request.roles:
        first = contract.first_index(role.role, bool(request.kvstore))
        replicas.extend(
            Replica(job=job, role=role.role, index=i, package=role.package)
            for i in range(first, first + role.instances)
        )
    Replica.objects.bulk_create(replicas)
    # Nobody can be watching a job that did not exist a moment ago: no event to build.
    waits_for = (
        f"waiting to be submitted to Slurm ({request.slurm_pool.name})"
        if request.slurm_pool is not None
        else "waiting for room on the nodes"
    )
    transitions.move_job(job, Job.State.QUEUED, waits_for, announce=False)
    return job


def _admission_failure(
    request: JobRequest,
    scopes: list[quota.Scope],
    over: list[quota.Excess],
    never: dict[str, str],
) -> ValidationFailed:
    errors = {field: [message] for field, message in never.items()}
    detail: dict[str, Any] = {"quota": {}}
    if over:
        errors["quota"] = [e.message for e in over]
        # The tightest scope per resource is the one to report in the machine-readable part.
        for e in sorted(over, key=lambda e: -e.over_by):
            detail["quota"].setdefault(e.resource, e.as_dict())
    advice = fits_advice(
        request.roles,
        request.image.framework,
        scopes,
        over,
        never,
        one_instance_per_node=request.one_instance_per_node,
    )
    if advice is not None:
        errors.setdefault("quota" if over else "roles", []).append(advice.message)
        detail["fits_with"] = {"role": "worker", "instances": advice.workers}
    return ValidationFailed(errors, detail)


@dataclass(frozen=True)
class FitsAdvice:
    """The count of workers that gets a refused request in."""

    workers: int
    instances: int  # in all, the other roles included

    @property
    def message(self) -> str:
        plural = "s" if self.workers != 1 else ""
        return f"It fits with {self.workers} worker{plural} ({self.instances} instances in all)."


def fits_advice(
    roles: list[RoleRequest],
    framework: str,
    scopes: list[quota.Scope],
    over: list[quota.Excess],
    never: dict[str, str],
    one_instance_per_node: bool = False,
) -> FitsAdvice | None:
    """Too much for the quota, or more instances than the nodes could ever hold together: the
    count of workers that neither refuses is the one change that gets the job in. None when
    the request is not refused for either, or no count the framework accepts fits. Submission
    says it with its refusal, the New-job form's preview before Launch."""
    if not over and "roles" not in never:
        return None
    fits = quota.largest_fitting(
        roles,
        scopes,
        placeable=lambda tried: not scheduling.why_never_placeable(tried, one_instance_per_node),
    )
    asked = next((r.instances for r in roles if r.role == "worker"), 0)
    least = MIN_INSTANCES[framework].get("worker", 0)
    if fits is None or not least <= fits < asked:
        return None
    others = sum(r.instances for r in roles if r.role != "worker")
    return FitsAdvice(fits, fits + others)
