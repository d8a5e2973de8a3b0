"""Answers from a node agent to a console that waits for them (a job's artifacts: listing and
reading its files, which only the agents can reach).

The console sends the request as a Celery task on the node's queue, naming a reply list of
that node's own (`contract.reply_key`, a fresh random name per request), and waits on it with
BLPOP; the agent RPUSHes one message there, which expires soon after if nobody took it. A
message is a JSON header, a newline and the raw bytes that follow it (a file's chunk): bytes
travel as they are, not inflated by base64. An agent may write only its own node's reply lists
(its Redis ACL, workers/credentials.py), so a console that waits on node-1's list hears only
node-1.
"""

import json
import logging
from typing import Any

import redis

from workers import contract

log = logging.getLogger(__name__)

# A reply nobody took (the console gave up) does not outlive this.
REPLY_TTL_SECONDS = 60


def encode(header: dict[str, Any], data: bytes = b"") -> bytes:
    return json.dumps(header, separators=(",", ":")).encode() + b"\n" + data


def decode(message: bytes) -> tuple[dict[str, Any], bytes]:
    """(the header, the bytes after it); ValueError when the message is not one."""
    head, newline, data = message.partition(b"\n")
    header = json.loads(head) if newline else None
    if not isinstance(header, dict):
        raise ValueError("a reply without its JSON header")
    return header, data


def answer(
    client: redis.Redis, node: str, reply_to: str, header: dict[str, Any], data: bytes = b""
) -> bool:
    """Put the answer on the console's reply list; False (and nothing sent) when `reply_to` is
    not one of this node's reply lists."""
    if not isinstance(reply_to, str) or not contract.is_reply_key(reply_to, node):
        log.warning("refused to answer on %r: not a reply list of %s", reply_to, node)
        return False
    pipe = client.pipeline(transaction=True)
    pipe.rpush(reply_to, encode(header, data))
    pipe.expire(reply_to, REPLY_TTL_SECONDS)
    pipe.execute()
    return True
