"""The Redis user of one Slurm job's instances: that job's keys and nothing else.

An agent's Redis user may touch the keys of the jobs it runs (workers/credentials.py); a Slurm
job has no agent, so its step wrappers get a user of their own, `slurmjob-<job id>`, made when
the attempt is submitted and deleted once the job has no attempt left in Slurm. Its rules are
an agent's commands on the job's own keys only (`trainyard:{job:N}:*`): no queue, no other
job's log, no snapshot, no pub/sub. Its URL goes to the nodes in a file only the job's Slurm
user can read (`credentials.url` beside the plan, mode 0600), never on a command line.
"""

import logging
import urllib.parse

import redis
from django.conf import settings

from jobs.redis_client import get_redis
from workers import credentials

log = logging.getLogger(__name__)

USER_PREFIX = "slurmjob-"


def user_of(job_id: int) -> str:
    return f"{USER_PREFIX}{int(job_id)}"


def rules(job_id: int, hashed_password: str) -> list[str]:
    """The whole ACL of the job's user, from scratch (`reset` first)."""
    return [
        "reset", "on", f"#{hashed_password}", "resetchannels", "-@all",
        *(f"+{command}" for command in credentials.AGENT_COMMANDS),
        f"~{credentials.job_key_pattern(job_id)}",
    ]  # fmt: skip


def grant(job_id: int, host: str = "") -> tuple[str, str]:
    """Make (or remake, with a new secret) the job's user: its REDIS_URL, with `host` as the
    nodes reach Redis (the console's own host when empty), and the secret's hash (which
    `restore` needs). Raises redis.RedisError."""
    secret = credentials.new_secret()
    hashed = credentials.password_hash(secret)
    restore(job_id, hashed)
    ours = urllib.parse.urlsplit(settings.REDIS_URL or "redis://127.0.0.1:6379/0")
    netloc = (
        f"{urllib.parse.quote(user_of(job_id))}:{urllib.parse.quote(secret, safe='')}"
        f"@{host or ours.hostname or '127.0.0.1'}:{ours.port or 6379}"
    )
    return f"{ours.scheme}://{netloc}{ours.path or '/0'}", hashed


def restore(job_id: int, hashed_password: str) -> None:
    """Write the job's user with the secret it already has: after a Redis restart (ACLs live
    in memory) its step wrappers' lines wait in their spools until this. Raises RedisError."""
    get_redis().execute_command("ACL", "SETUSER", user_of(job_id), *rules(job_id, hashed_password))


def revoke(job_id: int) -> None:
    """Delete the job's user, which also closes its connections; quiet when Redis is away
    (the Slurm pass tries again)."""
    try:
        get_redis().execute_command("ACL", "DELUSER", user_of(job_id))
    except redis.RedisError as exc:
        log.warning("could not delete %s now (%s)", user_of(job_id), exc)


def granted() -> set[int]:
    """The jobs that have a user now."""
    users = get_redis().execute_command("ACL", "USERS")
    found = set()
    for user in users:
        name = user.decode() if isinstance(user, bytes) else str(user)
        if name.startswith(USER_PREFIX) and name.removeprefix(USER_PREFIX).isdigit():
            found.add(int(name.removeprefix(USER_PREFIX)))
    return found
