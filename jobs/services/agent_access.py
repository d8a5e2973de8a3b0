"""What each node agent may touch in Redis, kept in step with the database, and whether a report
really comes from the node it names.

Every agent with credentials has its own Redis ACL user (rules: workers/credentials.py). Its
key patterns are static, so the console rewrites a node's user whenever the set of jobs it may
touch changes: a job is granted from the moment a replica of it is placed on the node (before
the start message is sent) until TRAINYARD_AGENT_GRANT_LINGER_SECONDS after the node's last
replica of it ended (room for the agent's last log lines, even from its disk spool).

`sync()` is idempotent and cheap: it writes a user only when its rules differ from what was
written last into the Redis that runs now. What was written is recorded in Redis itself
(APPLIED_KEY, in the same MULTI as the ACL SETUSER), tagged with the server's run_id: a Redis
that restarted has lost its ACL users (they are configuration, not data) and has a new run_id,
so every user is written again. The reconciliation loop calls it every pass; dispatch calls it
for the nodes it is about to send starts to.
"""

import hashlib
import logging
import urllib.parse
from collections import defaultdict
from collections.abc import Iterable
from datetime import timedelta
from typing import Any

import redis
from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from jobs.models import AgentCredential, Replica
from jobs.redis_client import get_redis
from workers import credentials

log = logging.getLogger(__name__)

# user -> "<run_id> <sha256 of its rules>": what this Redis holds (see the module docstring).
APPLIED_KEY = "trainyard:acl:applied"


def issue(node: str) -> str:
    """Make or rotate the node's credentials; returns the new secret (shown once, never kept).

    The user is written at once where Redis answers (else the next reconciliation pass does
    it), and connections made with an earlier secret are closed.
    """
    credentials.check_node_name(node)
    secret = credentials.new_secret()
    with transaction.atomic():
        _, created = AgentCredential.objects.update_or_create(
            node_name=node,
            defaults={
                "password_sha256": credentials.password_hash(secret),
                "signing_key": credentials.signing_key(secret),
            },
        )
    try:
        sync([node])
        if not created:
            # An agent still connected with the old secret keeps its session otherwise.
            get_redis().execute_command("CLIENT", "KILL", "USER", credentials.user_of(node))
    except redis.RedisError as exc:
        log.warning("Redis did not take %s's ACL user now (%s); reconciliation will", node, exc)
    return secret


def issue_url(node: str, host: str | None = None, port: int | None = None) -> str:
    """issue(), as the agent's REDIS_URL: the console's own Redis address unless told
    otherwise (the host and port as the agent reaches them)."""
    ours = urllib.parse.urlsplit(settings.REDIS_URL or "redis://127.0.0.1:6379/0")
    db = int((ours.path or "/0").lstrip("/") or 0)
    secret = issue(node)
    return credentials.agent_url(
        node,
        secret,
        host or ours.hostname or "127.0.0.1",
        port or ours.port or 6379,
        db,
        ours.scheme,
    )


def granted_jobs(node_names: Iterable[str], now: Any = None) -> dict[str, set[int]]:
    """Per node, the jobs whose keys its agent may touch now."""
    now = now or timezone.now()
    linger = timedelta(seconds=settings.TRAINYARD_AGENT_GRANT_LINGER_SECONDS)
    rows = (
        Replica.objects.filter(node__name__in=list(node_names))
        .filter(Q(state__in=Replica.HOLDING_STATES) | Q(finished__gte=now - linger))
        .values_list("node__name", "job_id")
        .distinct()
    )
    jobs: dict[str, set[int]] = defaultdict(set)
    for node, job_id in rows:
        jobs[node].add(job_id)
    return jobs


def sync(node_names: Iterable[str] | None = None, now: Any = None) -> int:
    """Write the ACL user of each named node (all nodes with credentials when None) whose
    rules differ from what Redis holds; returns how many were written. With None, users of
    nodes whose credentials are gone are deleted too. Raises redis.RedisError."""
    wanted = AgentCredential.objects.all()
    if node_names is not None:
        wanted = wanted.filter(node_name__in=list(node_names))
    creds = list(wanted)
    if not creds and node_names is not None:
        return 0  # nodes without credentials: nothing to write (and no need of Redis)
    client = get_redis()
    run_id = str(client.info("server")["run_id"])
    applied = client.hgetall(APPLIED_KEY)
    existing: set[str] | None = None
    if node_names is None:
        # A user deleted by hand (or by ACL LOAD) is written again too.
        existing = set(client.execute_command("ACL", "USERS"))
        applied = {user: mark for user, mark in applied.items() if user in existing}
    jobs = granted_jobs([c.node_name for c in creds], now)
    written = 0
    for cred in creds:
        user = credentials.user_of(cred.node_name)
        rules = credentials.acl_rules(
            cred.node_name, cred.password_sha256, jobs.get(cred.node_name, set())
        )
        mark = f"{run_id} {hashlib.sha256(chr(10).join(rules).encode()).hexdigest()}"
        if applied.get(user) == mark:
            continue
        pipe = client.pipeline(transaction=True)
        pipe.execute_command("ACL", "SETUSER", user, *rules)
        pipe.hset(APPLIED_KEY, user, mark)
        pipe.execute()
        written += 1
    if existing is not None:
        keep = {credentials.user_of(c.node_name) for c in creds}
        for user in existing:
            if user.startswith(credentials.USER_PREFIX) and user not in keep:
                client.execute_command("ACL", "DELUSER", user)  # closes its connections
                client.hdel(APPLIED_KEY, user)
                written += 1
    return written


def sync_quietly() -> None:
    """sync() for the reconciliation loop: a failure is logged, and the next pass tries again."""
    try:
        written = sync()
    except redis.RedisError as exc:
        log.warning("agents' ACL users not checked: %s", exc)
        return
    except Exception:  # reconciliation must go on whatever this is; the next pass tries again
        log.exception("agents' ACL users not checked")
        return
    if written:
        log.info("wrote %s agent ACL users", written)


# --- reports ---


def authentic(task: str, payload: dict[str, Any]) -> bool:
    """Does the report (or heartbeat) come from the node it names? It must be signed with that
    node's key. A node without credentials is believed only where
    TRAINYARD_REQUIRE_AGENT_CREDENTIALS is off (a development set-up whose agents share the
    console's Redis URL). A refusal is logged, naming the node the report claimed to be."""
    node = str(payload.get("node", ""))
    cred = AgentCredential.objects.filter(node_name=node).first()
    return _believed(task, payload, node, cred.signing_key if cred is not None else None)


def authentic_many(task: str, payloads: list[dict[str, Any]]) -> list[bool]:
    """authentic() of each payload, with one query for every node they name (a batch of
    heartbeats: jobs/services/heartbeat_batch.py)."""
    names = {str(payload.get("node", "")) for payload in payloads}
    keys = dict(
        AgentCredential.objects.filter(node_name__in=sorted(names)).values_list(
            "node_name", "signing_key"
        )
    )
    believed = []
    for payload in payloads:
        node = str(payload.get("node", ""))
        believed.append(_believed(task, payload, node, keys.get(node)))
    return believed


def _believed(task: str, payload: dict[str, Any], node: str, key: str | None) -> bool:
    if key is None:
        if not settings.TRAINYARD_REQUIRE_AGENT_CREDENTIALS:
            return True
        problem: str | None = "the node has no credentials (manage.py agent_credentials NODE)"
    else:
        problem = credentials.signature_problem(
            payload, key, task, settings.TRAINYARD_REPORT_MAX_AGE_SECONDS
        )
    if problem is None:
        return True
    log.warning("refused a %s report that claims to come from node %r: %s", task, node, problem)
    return False
