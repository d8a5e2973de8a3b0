"""Running a job again: the request that would submit it once more.

One definition for the job page's "Run again" and "Edit and run again", the API's
`GET /api/v1/jobs/ID/request` and so `trainyard rerun` and `trainyard show --job-file`: the
body of `POST /api/v1/jobs` (jobs.schemas.JobIn) as the job was submitted, its code snapshot
included. The new job goes through the same checks as any other (quota, snapshot ownership).
It carries the job's own variables, not its image's defaults: the new job takes the image's
defaults as they are when it is submitted, like any other job. It keeps the job's project and
tags, not its note.
"""

from typing import Any

from django.contrib.auth.models import AnonymousUser, User

from jobs import container_refs
from jobs.healthrules import RuleError, parse_rules, rules_to_json
from jobs.models import Job


def request_of(job: Job, viewer: User | AnonymousUser) -> dict[str, Any]:
    """The job's request as `viewer` may copy it. Its owner gets every variable; anyone else
    (an admin) gets none of those whose values are masked to them: a mask is not a value, and
    the secret itself is never theirs to copy."""
    program: dict[str, Any] = {"script": job.script, "args": list(job.args)}
    if job.program.get("snapshot"):
        program["snapshot"] = job.program["snapshot"]
    env = copyable_env(job, viewer)
    body: dict[str, Any] = {
        "name": job.name,
        "image": job.image.name,
        "program": program,
        "roles": {
            r.role: {"package": r.package.name, "instances": r.asked}
            for r in job.roles.select_related("package").order_by("id")
        },
        "restart": {
            "policy": job.restart_policy,
            "max_restarts": job.max_restarts,
            "backoff_seconds": job.restart_backoff_seconds,
            "exclude_failed_node": job.exclude_failed_node,
        },
        "priority": job.priority_name,
        "health_rules": list(job.health_rules),
        "metrics": list(job.metric_definitions),
    }
    if job.args_on_resume:
        body["restart"]["args_on_resume"] = list(job.args_on_resume)
    if job.data_folders:
        body["data"] = list(job.data_folders)
    if job.results_folder:
        body["results"] = job.results_folder
    if brought := brought_image(job):
        body["container_image"] = brought
    limits = {
        "lines_per_second": (job.log_lines_per_second, job.image.log_lines_per_second),
        "max_mb": (job.log_max_mb, job.image.log_max_mb),
        "metric_points_per_second": (
            job.metric_points_per_second,
            job.image.metric_points_per_second,
        ),
    }
    # Only limits the job set lower than its image's are its own; the others follow the image.
    own_limits = {name: mine for name, (mine, image) in limits.items() if mine < image}
    if own_limits:
        body["log_limits"] = own_limits
    if job.time_limit is not None:
        body["time_limit"] = job.time_limit
    if job.slurm_pool is not None:
        body["pool"] = job.slurm_pool.name
        if job.slurm_options:
            body["slurm"] = dict(job.slurm_options)
    if job.kvstore:
        body["kvstore"] = job.kvstore
    if job.one_instance_per_node:
        body["one_instance_per_node"] = True
    if env:
        body["env"] = env
    # Filed where the job is: a run again belongs with it. Its note is about that run, not
    # this one, and stays behind.
    if job.project:
        body["project"] = job.project
    if tags := sorted(job.tags.values_list("label", flat=True)):
        body["tags"] = tags
    return body


def copyable_env(job: Job, viewer: User | AnonymousUser) -> dict[str, str]:
    """The job's variables that `viewer` may copy into a job of their own: all of them for its
    owner; for anyone else (an admin), none of those whose values are masked to them: a mask
    is not a value, and the secret itself is never theirs to copy."""
    own = getattr(viewer, "pk", None) == job.owner_id
    seen = job.env_seen_by(viewer)
    return {k: v for k, v in job.env.items() if own or seen.get(k) == v}


def has_image_health_rules(job: Job) -> bool:
    """Whether the job's health rules are its image's defaults (as submission normalised
    them): the form then leaves its rules empty, which means exactly that."""
    try:
        return bool(rules_to_json(parse_rules(job.image.health_rules)) == job.health_rules)
    except RuleError:
        return False


def brought_image(job: Job) -> str:
    """The container image the job ran in when it is not its image's own and the image lets it
    in now: the owner's own, or the image's reference of before an admin moved it to a new tag
    (a copy then runs in the very image that ran). "" otherwise: a copy runs in the image's."""
    ran_in, own = job.container_image, job.image.container_image
    if not ran_in or ran_in == own:
        return ""
    return ran_in if container_refs.allowed_by(ran_in, job.image.user_image_prefixes or []) else ""
