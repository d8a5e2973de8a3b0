"""A node agent's credentials: its own Redis ACL user, and the key that signs its reports.

Shared by the console and the agent (no Django here). The console makes an agent's secret once
(`manage.py agent_credentials NODE`) and hands it to the agent inside its REDIS_URL
(`redis://agent-NODE:SECRET@host:port/0`); it keeps only what it needs itself: the SHA-256 of
the secret (Redis's `#<hash>` password form, so the console can re-create the ACL user after
Redis restarts without knowing the secret) and the signing key derived from it.

What an agent's Redis user may do (`acl_rules`), and nothing else:
- its own Celery queue `node.<NODE>` (and kombu's priority sub-lists of it) and its own unacked
  bookkeeping (`unacked.node.<NODE>`, …; `transport_options`): consume, requeue;
- LPUSH onto the console's queue (and nothing else there: it can neither read, empty nor
  replace it); likewise RPUSH onto the console's heartbeat list, and GET or EXISTS of the flag
  that says whether the console drains it (workers/heartbeat_route.py);
- read code snapshots (`trainyard:snapshot:*`);
- RPUSH (and EXPIRE) onto its own reply lists (`trainyard:reply:<NODE>:*`), where it answers
  the console's questions about a job's artifacts (workers/agentreply.py);
- read and write the keys of the jobs it runs replicas of (`trainyard:{job:N}:*`): the console
  adds and removes those patterns as replicas are placed on the node and end (jobs/services/
  agent_access.py);
- no pub/sub channel, no FLUSHALL, CONFIG, ACL, KEYS or SCAN.

Every report and heartbeat carries an HMAC-SHA256 signature (`sign`): all agents push onto the
one console queue, so the queue cannot say who pushed; the signature can.
"""

import hashlib
import hmac
import json
import re
import secrets
import time
import urllib.parse
from typing import Any

from workers import contract

USER_PREFIX = "agent-"
# Node names that are safe inside ACL key patterns (no glob characters) and URLs.
NODE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")
SIGNATURE_FIELD = "signature"
_SIGNING_CONTEXT = b"trainyard agent report signing v1"
# kombu's Redis transport names a queue's priority sub-lists "<queue>\x06\x16<priority>".
KOMBU_PRIORITY_SEP = "\x06\x16"

# Commands an agent uses: the connection, kombu's Redis transport (consume, ack, requeue, its
# unacked mutex: SET NX + a Lua release), the log-append Lua script (and what it calls), the
# rendezvous port and snapshot reads. Keys still limit each of them to the patterns below.
AGENT_COMMANDS = (
    "ping", "echo", "auth", "hello", "select", "quit", "reset",
    "client|setname", "client|getname", "client|id",
    "multi", "exec", "discard", "watch", "unwatch",
    "brpop", "rpop", "lpush", "rpush", "llen",
    "hset", "hget", "hdel", "hmget",
    "zadd", "zrem", "zrange", "zrangebyscore", "zrevrangebyscore",
    "set", "get", "del", "exists", "expire", "pexpire", "getrange", "incrby", "xadd",
    "smembers",
    "evalsha", "eval", "script|load", "script|exists",
)  # fmt: skip


class CredentialError(ValueError):
    pass


def check_node_name(node: str) -> str:
    if not NODE_NAME.match(node):
        raise CredentialError(
            f"{node!r}: a node with credentials needs a name of letters, digits, '.', '_' and "
            "'-' (at most 63, starting with a letter or digit)"
        )
    return node


def user_of(node: str) -> str:
    return USER_PREFIX + check_node_name(node)


def new_secret() -> str:
    return secrets.token_urlsafe(32)  # URL-safe: it goes into the agent's REDIS_URL as it is


def password_hash(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def signing_key(secret: str) -> str:
    """The report-signing key, derived from the agent's secret (so the agent needs one secret)
    and different from the Redis password (so the console never stores the password)."""
    return hmac.new(secret.encode(), _SIGNING_CONTEXT, hashlib.sha256).hexdigest()


def agent_url(
    node: str, secret: str, host: str, port: int, db: int = 0, scheme: str = "redis"
) -> str:
    netloc = f"{user_of(node)}:{urllib.parse.quote(secret, safe='')}@{host}:{port}"
    return f"{scheme}://{netloc}/{db}"


def secret_from_url(url: str) -> tuple[str, str] | None:
    """(node, secret) when `url` carries an agent's credentials, else None."""
    parts = urllib.parse.urlsplit(url)
    user = urllib.parse.unquote(parts.username or "")
    if not user.startswith(USER_PREFIX) or not parts.password:
        return None
    return user.removeprefix(USER_PREFIX), urllib.parse.unquote(parts.password)


# --- kombu's keys for a node's queue ---


def unacked_keys(node: str) -> dict[str, str]:
    """kombu transport options that give each node its own unacked bookkeeping: the shared
    default `unacked` hash holds every consumer's in-flight messages (start specs with the
    jobs' variables), which one node must not read of another."""
    queue = contract.node_queue(node)
    return {
        "unacked_key": f"unacked.{queue}",
        "unacked_index_key": f"unacked_index.{queue}",
        "unacked_mutex_key": f"unacked_mutex.{queue}",
    }


def transport_options(node: str) -> dict[str, str]:
    return unacked_keys(node)


def job_key_pattern(job_id: int) -> str:
    return f"trainyard:{{job:{int(job_id)}}}:*"


def acl_rules(node: str, hashed_password: str, job_ids: list[int] | set[int]) -> list[str]:
    """The whole ACL of a node's user, from scratch (`reset` first): applying it twice is
    applying it once."""
    queue = contract.node_queue(check_node_name(node))
    own = [queue, f"{queue}{KOMBU_PRIORITY_SEP}*", *unacked_keys(node).values()]
    rules = ["reset", "on", f"#{hashed_password}", "resetchannels", "-@all"]
    rules += [f"+{command}" for command in AGENT_COMMANDS]
    rules += [f"%RW~{key}" for key in own]
    rules += [
        f"%R~_kombu.binding.{queue}",  # a requeued message is routed by its queue's binding
        f"%R~{contract.snapshot_key('*')}",
    ]
    rules += [f"~{job_key_pattern(job_id)}" for job_id in sorted(set(job_ids))]
    # The console's queue: LPUSH and nothing else (a selector, Redis 7: its command and key go
    # together). Write access to the key alone would also let DEL, SET or PEXPIRE destroy it,
    # and with it every other node's reports; read access would show them.
    rules.append(f"(+lpush %W~{contract.CONSOLE_QUEUE})")
    # Heartbeats past Celery (workers/heartbeat_route.py), as narrowly: RPUSH onto the list
    # (never LRANGE or LPOP: other nodes' heartbeats list what they run), and GET or EXISTS of
    # the flag that says whether the console drains it (never SET or DEL: an agent must not
    # send the others to a list no console reads, nor take them off it).
    rules.append(f"(+rpush %W~{contract.HEARTBEATS_KEY})")
    rules.append(f"(+get +exists %R~{contract.HEARTBEATS_DRAINED_KEY})")
    # Answers to the console (a job's artifacts, workers/agentreply.py): onto this node's own
    # reply lists, and nothing else there (the console reads and removes them).
    rules.append(f"(+rpush +expire %W~{contract.reply_key_prefix(node)}*)")
    return rules


# --- signing reports ---


def canonical(payload: dict[str, Any]) -> bytes:
    body = {k: v for k, v in payload.items() if k != SIGNATURE_FIELD}
    return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def _mac(key: str, task: str, ts: float, payload: dict[str, Any]) -> str:
    message = f"{task}\n{ts!r}\n".encode() + canonical(payload)
    return hmac.new(key.encode(), message, hashlib.sha256).hexdigest()


def sign(payload: dict[str, Any], key: str, task: str, now: float | None = None) -> dict[str, Any]:
    """`payload` with a signature over it, the task it is for and the time (bounds replay)."""
    ts = float(time.time() if now is None else now)
    # Through JSON first, as the console will see it (tuples become lists, and so on).
    plain = json.loads(json.dumps({k: v for k, v in payload.items() if k != SIGNATURE_FIELD}))
    return dict(plain, **{SIGNATURE_FIELD: {"ts": ts, "mac": _mac(key, task, ts, plain)}})


def signature_problem(
    payload: dict[str, Any], key: str, task: str, max_age: float, now: float | None = None
) -> str | None:
    """Why the payload's signature does not hold with `key`, or None when it does."""
    signature = payload.get(SIGNATURE_FIELD)
    if not isinstance(signature, dict):
        return "it is not signed"
    ts, mac = signature.get("ts"), signature.get("mac")
    if not isinstance(ts, int | float) or not isinstance(mac, str):
        return "its signature is malformed"
    if not hmac.compare_digest(mac, _mac(key, task, float(ts), payload)):
        return "its signature does not match the node's key"
    age = (time.time() if now is None else now) - float(ts)
    if abs(age) > max_age:
        return f"it was signed {age:.0f} s ago (more than {max_age:.0f} s)"
    return None
